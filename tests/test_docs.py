"""The documentation site (docs/, mkdocs.yml): the generated pages are what
scripts/gen_docs.py writes now, the site builds with `mkdocs build --strict` (no broken link
or anchor, every nav page present), and the README keeps its two commands first and links
only to pages that exist."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def gen_docs():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_generated_pages_are_up_to_date():
    gen = gen_docs()
    expected = gen.pages()
    assert {"reference/cli.md", "reference/api.md", "results/index.md"} <= set(expected)
    # every result file has its page, and every sub-command its section
    results = {f"results/{p.name}" for p in (ROOT / "benchmarks" / "results").glob("*.md")}
    assert results <= set(expected)
    from memgnn.cli import COMMANDS

    cli = expected["reference/cli.md"]
    assert all(f"\n## memgnn {name}\n" in cli for name in COMMANDS)
    assert "\n## memgnn snapshot replay\n" in cli
    assert gen.stale(expected) == [], "run: python scripts/gen_docs.py"


def test_a_stale_page_is_found(tmp_path, monkeypatch):
    gen = gen_docs()
    monkeypatch.setattr(gen, "DOCS", tmp_path)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "gone.md").write_text("# a result file that no longer exists\n")
    expected = {"reference/cli.md": "new\n", "results/a.md": "a\n"}
    (tmp_path / "reference").mkdir()
    (tmp_path / "reference" / "cli.md").write_text("old\n")
    (tmp_path / "results" / "a.md").write_text("a\n")
    assert gen.stale(expected) == ["reference/cli.md", "results/gone.md"]


def test_the_readme_starts_with_the_two_commands():
    first = re.search(r"```bash\n(.*?)```", README, re.S).group(1).splitlines()
    assert [line.split("#")[0].strip() for line in first] == [
        "bash scripts/setup.sh && .venv/bin/memgnn demo",
        "bash scripts/test.sh",
    ]
    assert len(README.splitlines()) < 150


def test_the_readme_links_to_pages_that_exist():
    links = re.findall(r"\]\((docs/[^)#]+)", README)
    assert len(links) > 20
    assert [link for link in links if not (ROOT / link).is_file()] == []


def test_the_site_builds_strict(tmp_path):  # 2.4 s
    site = tmp_path / "site"
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    home = (site / "index.html").read_text()
    assert "bash scripts/setup.sh" in home
    for page in ("tutorials/will-it-fit.html", "reference/cli.html", "results/index.html"):
        assert (site / page).is_file(), page


def test_the_readme_commands_parse():
    """Every `memgnn ...` command the README lists is one the CLI accepts as written."""
    import shlex

    from memgnn.cli import build_parser

    block = re.search(r"## The commands people need\n\n```bash\n(.*?)```", README, re.S).group(1)
    text = block.replace("\\\n", " ")
    commands = [
        part.strip()
        for line in text.splitlines()
        for part in line.split("#")[0].split(";")
        if part.strip()
    ]
    assert len(commands) >= 10 and all(c.startswith("memgnn ") for c in commands)
    for command in commands:
        argv = shlex.split(command)[1:]
        args = build_parser(argv[0]).parse_args(argv)  # exits 2 on an unknown flag or value
        assert args.command == argv[0]

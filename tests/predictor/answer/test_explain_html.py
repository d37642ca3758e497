"""`render_html`: the explain document as one self-contained, escaped HTML page
(`predictor.answer.explain_html`)."""

from __future__ import annotations

import copy
import re
import shutil
import subprocess
from html.parser import HTMLParser

import pytest
from memgnn.predictor.answer.backend import LocalBackend
from memgnn.predictor.answer.explain import ExplainRequest, explain
from memgnn.predictor.answer.explain_html import render_html
from memgnn.predictor.answer.types import ModelRef, QueryConfig
from tiny_models import tiny_gpt_bundle

HOSTILE = '<script>alert("x")</script>'
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class TinyBackend(LocalBackend):
    def __init__(self) -> None:
        super().__init__(use_cache=False)

    def bundle(self, ref: ModelRef):
        assert ref.spec == "tiny-gpt"
        return tiny_gpt_bundle()


@pytest.fixture(scope="module")
def doc() -> dict:
    req = ExplainRequest(model=ModelRef(spec="tiny-gpt"), config=QueryConfig(sizes={"B": 8,
                         "S": 128}), top=5, whatifs=("expandable_segments",))  # fmt: skip
    return explain(req, TinyBackend()).to_dict()


class _Collect(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.scripts = 0

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self.scripts += tag == "script"


def test_the_page_is_self_contained(doc):
    page = render_html(doc)
    assert "http://" not in page and "https://" not in page
    p = _Collect()
    p.feed(page)
    names = {t for t, _ in p.tags}
    assert {"svg", "polyline", "table", "style"} <= names
    assert "link" not in names and "img" not in names and "iframe" not in names
    for _, attrs in p.tags:
        assert "src" not in attrs and "href" not in attrs


def test_the_page_shows_the_peak_the_tables_and_the_timeline(doc):
    page = render_html(doc)
    peak = doc["prediction"]["predicted_peak_bytes"]
    mib = f"{peak / (1 << 20):.2f} MiB"
    assert mib in page  # the peak card and the timeline's peak label
    assert re.search(r"peak reserved [0-9.]+ MiB \((forward|backward|optimizer), event \d+\)",
                     page)  # fmt: skip
    for row in doc["by_module"][:3] + doc["by_layer_module"][:3]:
        assert f">{row['name']}<" in page
    for span in {s["phase"] for s in doc["timeline"]["phases"]}:
        assert f"{span}</text>" in page or f"{span}: events" in page
    assert "expandable_segments:True" in page and "What-ifs" in page


def test_user_text_is_escaped(doc):
    bad = copy.deepcopy(doc)
    bad["by_module"][0]["name"] = HOSTILE
    bad["peak"]["module"] = HOSTILE
    bad["largest"][0]["source"] = f"{HOSTILE}.py:1"
    bad["timeline"]["phases"][0]["step"] = "</script><script>alert(1)//"
    page = render_html(bad)
    assert HOSTILE not in page and "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in page
    assert "</script><script>alert(1)" not in page
    p = _Collect()
    p.feed(page)
    assert p.scripts == 2  # the timeline's data and its hover read-out, nothing injected


def test_a_cpu_document_has_no_timeline_but_renders(doc):
    cpu = copy.deepcopy(doc)
    cpu["timeline"] = None
    cpu["peak"]["reserved_bytes"] = cpu["peak"]["cached_free_bytes"] = None
    page = render_html(cpu)
    assert "<svg" not in page and "no caching allocator" in page


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (CI has none)")
def test_headless_chromium_draws_the_page(doc, tmp_path):
    """The page loads offline in a real browser and paints something (a screenshot with
    more than a blank page's colours)."""
    html = tmp_path / "r.html"
    html.write_text(render_html(doc), encoding="utf-8")
    png = tmp_path / "r.png"
    subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         f"--screenshot={png}", "--window-size=1280,1800", f"file://{html}"],
        check=True, capture_output=True, timeout=120,
    )  # fmt: skip
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 20_000

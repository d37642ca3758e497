"""/docs renders offline (issue 12 item 11): Swagger UI's assets come from the app, and a
real headless browser, with every host but loopback unresolvable, draws the operations."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from memgnn.serving.app import create_app
from memgnn.serving.client import local_server
from memgnn.serving.config import ServeConfig

BROWSERS = ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")


def test_docs_pages_reference_only_local_assets(tmp_path):
    with TestClient(create_app(ServeConfig(model="analytic", state_dir=tmp_path))) as c:
        for page in ("/docs", "/redoc"):
            html = c.get(page).text
            assert not re.findall(r"https?://", html), page  # no CDN, no fonts
            assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css))"', html)
            assert assets, page
            for url in assets:
                r = c.get(url)
                assert r.status_code == 200 and len(r.content) > 10_000, url


def _browser() -> str | None:
    return next((path for b in BROWSERS if (path := shutil.which(b))), None)


@pytest.mark.skipif(_browser() is None, reason=f"no headless browser installed ({BROWSERS})")
def test_swagger_ui_renders_in_a_headless_browser_offline(tmp_path):
    shot = tmp_path / "docs.png"
    with local_server(ServeConfig(model="analytic", state_dir=tmp_path / "s")) as url:
        args = [
            _browser(),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",  # offline
            "--virtual-time-budget=20000",
            "--window-size=1280,1400",
        ]
        dom = subprocess.run(
            [*args, "--dump-dom", f"{url}/docs"], capture_output=True, text=True, timeout=120
        ).stdout
        subprocess.run([*args, f"--screenshot={shot}", f"{url}/docs"], timeout=120, check=False)
    # Swagger UI has drawn the title and one block per operation from /openapi.json
    assert 'class="title"' in dom and "memgnn" in dom
    for path in ("/graphs", "/predict", "/plan", "/samples"):
        assert f'data-path="{path}"' in dom, path
    assert shot.exists() and shot.stat().st_size > 20_000
    shutil.copy(shot, tmp_path.parent / "memgnn-docs.png")  # kept for a look by hand


def _doc_examples() -> list[tuple[str, dict, dict]]:
    """(path, request, answer excerpt) from docs/how-to/service.md's JSON blocks: each
    "Request `POST /x`:" block is followed by its answer's block."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "how-to" / "service.md").read_text()
    pattern = r"Request `POST (/\w+)`:\s*```json\n(.*?)```.*?```json\n(.*?)```"
    return [(p, json.loads(req), json.loads(ans)) for p, req, ans in
            re.findall(pattern, text, flags=re.S)]  # fmt: skip


def _subset(shown: object, got: object, where: str = "") -> None:
    if isinstance(shown, dict):
        assert isinstance(got, dict), where
        for key, value in shown.items():
            assert key in got, f"{where}.{key} missing"
            _subset(value, got[key], f"{where}.{key}")
    else:
        assert shown == got, f"{where}: the docs show {shown!r}, the service answers {got!r}"


@pytest.mark.slow
def test_the_service_docs_request_bodies_work_as_shown(tmp_path):
    """The serving docs showed no request bodies, and `{"model": "gpt2"}` was a 422. The
    documented bodies are sent as written; each answer has the documented fields and
    values."""
    examples = _doc_examples()
    assert {p for p, _, _ in examples} == {"/predict", "/plan"}
    with TestClient(create_app(ServeConfig(model="analytic", state_dir=tmp_path))) as c:
        for path, request, shown in examples:
            r = c.post(path, json=request)
            assert r.status_code == 200, (path, r.text)
            got = r.json()["predictions"][0] if path == "/predict" else r.json()["best"]
            _subset(shown, got, path)

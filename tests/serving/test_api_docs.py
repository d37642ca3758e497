"""/docs renders offline (issue 12 item 11): Swagger UI's assets come from the app, and a
real headless browser, with every host but loopback unresolvable, draws the operations."""

from __future__ import annotations

import re
import shutil
import subprocess

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

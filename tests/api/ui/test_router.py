"""The admin UI's routes: the page, its files, and the headers that keep it self-contained."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.ui.router import STATIC
from api.settings import Settings


@pytest.fixture
def client(tmp_path):
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'ui.db'}"), admin_key="ui-test-key")
    with TestClient(app) as client:
        yield client


def test_page_is_served_at_root_without_a_key_and_holds_no_data(client):
    response = client.get("/")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/html")
    assert 'id="signin-form"' in response.text
    # The page is the same for everyone: the data arrive later through the API, with a key.
    assert client.get("/api/v1/participants").status_code == 401


def test_page_headers_forbid_inline_code_framing_and_caching(client):
    headers = client.get("/").headers
    policy = headers["content-security-policy"]
    for directive in ("default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"):
        assert directive in policy
    assert "unsafe-inline" not in policy
    assert headers["referrer-policy"] == "no-referrer"
    assert headers["cache-control"] == "no-store"


def test_page_has_no_inline_script_or_style_that_the_policy_would_block():
    html = (STATIC / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)[^>]*>", html), "inline <script> found"
    assert "<style" not in html and " style=" not in html
    for script in STATIC.glob("*.js"):
        assert "innerHTML" not in script.read_text(), f"{script.name} writes markup; build nodes instead"


def test_sign_in_form_posts_so_a_key_never_lands_in_a_url():
    html = (STATIC / "index.html").read_text()
    form = re.search(r"<form id=\"signin-form\"[^>]*>", html).group(0)
    assert 'method="post"' in form
    assert 'type="password"' in html


def test_every_file_the_page_loads_is_served_with_its_type(client):
    html = client.get("/").text
    wanted = set(re.findall(r'(?:src|href)="(/ui/static/[^"]+)"', html))
    # Modules import each other by relative path.
    for script in STATIC.glob("*.js"):
        wanted |= {f"/ui/static/{name}" for name in re.findall(r"from '\./([\w.-]+)'", script.read_text())}
    assert {"/ui/static/app.js", "/ui/static/app.css", "/ui/static/charts.js", "/ui/static/dom.js", "/ui/static/format.js"} <= wanted
    for path in wanted:
        response = client.get(path)
        assert response.status_code == 200, path
        expected = "text/javascript" if path.endswith(".js") else "text/css"
        assert response.headers["content-type"].startswith(expected), path
        assert response.headers["x-content-type-options"] == "nosniff"


@pytest.mark.parametrize("path", ["/ui/static/missing.js", "/ui/static/index.html", "/ui/static/__init__.py", "/ui/static/..%2Frouter.py", "/ui/static/../router.py"])
def test_only_shipped_assets_are_served(client, path):
    response = client.get(path)
    assert response.status_code == 404
    assert "APIRouter" not in response.text


def test_ui_routes_stay_out_of_the_api_schema(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert "/" not in paths
    assert not any(p.startswith("/ui/") for p in paths)

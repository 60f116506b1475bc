"""The reference page at /ui and the docs at /docs: served from app/ui/, nothing from another origin.

The page's behaviour is tested in a real browser (tests/browser/); here, what the server sends: the files,
a content security policy that lets the page load only its own origin, 404 for anything else, the icons
with their types, and the setting that turns the page off."""

from __future__ import annotations

import re

import httpx
import pytest

from app.api.ui import ASSETS, PAGE_POLICY, SWAGGER_ASSETS, UI_DIR
from app.settings import Settings
from tests.support.server import LiveServer, live_server

pytestmark = pytest.mark.anyio

# Any absolute URL in a src= or href= attribute would be a file loaded from elsewhere.
EXTERNAL = re.compile(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", re.IGNORECASE)


async def test_the_page_and_its_assets_come_from_this_origin_only(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        page = await client.get("/ui")
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert page.headers["content-security-policy"] == PAGE_POLICY
        assert "connect-src 'self'" in PAGE_POLICY and "script-src 'self'" in PAGE_POLICY
        assert not EXTERNAL.search(page.text)
        for name in ASSETS:
            response = await client.get(f"/ui/assets/{name}")
            assert response.status_code == 200, name
            assert response.content == (UI_DIR / "assets" / name).read_bytes()
            assert response.headers["content-type"] == ASSETS[name], name
            assert f"/ui/assets/{name}" in page.text
        for path in ("/ui/assets/../index.html", "/ui/assets/nope.js", "/ui/assets/%2e%2e%2fsettings.py"):
            assert (await client.get(path)).status_code == 404, path


async def test_favicon_ico_is_an_icon_and_the_page_links_its_icons(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        icon = await client.get("/favicon.ico")
        assert icon.status_code == 200 and icon.headers["content-type"] == "image/vnd.microsoft.icon"
        assert icon.content[:4] == b"\x00\x00\x01\x00"  # an ICO directory, type 1 (icon)
        assert icon.content == (UI_DIR / "favicon.ico").read_bytes()
        page = (await client.get("/ui")).text
        assert re.search(r'<link rel="icon" href="/favicon.ico"', page)
        assert re.search(r'<link rel="icon" href="/ui/assets/parley.svg" type="image/svg\+xml">', page)
        svg = await client.get("/ui/assets/parley.svg")
        assert svg.status_code == 200 and svg.headers["content-type"] == "image/svg+xml"
        assert svg.text.startswith("<svg ")


async def test_docs_load_swagger_ui_from_here_not_a_cdn(server: LiveServer) -> None:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
        docs = await client.get("/docs")
        assert docs.status_code == 200
        assert "cdn" not in docs.text.lower() and not EXTERNAL.search(docs.text)
        for name in SWAGGER_ASSETS:
            assert f"/docs/assets/{name}" in docs.text
            asset = await client.get(f"/docs/assets/{name}")
            assert asset.status_code == 200 and len(asset.content) > 100, name
        assert (await client.get("/docs/assets/LICENSE")).status_code == 404
        assert (await client.get("/redoc")).status_code == 404  # it loaded from a CDN: not served


async def test_parley_ui_0_turns_the_page_off_and_keeps_the_docs(database_url: str) -> None:
    with live_server(Settings(database_url=database_url, ui=False)) as server:
        async with httpx.AsyncClient(base_url=server.base_url, timeout=30) as client:
            assert (await client.get("/ui")).status_code == 404
            assert (await client.get("/ui/assets/parley.js")).status_code == 404
            assert (await client.get("/docs")).status_code == 200
            assert (await client.get("/favicon.ico")).status_code == 200  # browsers ask on every page

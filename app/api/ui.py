"""The reference chat page at /ui and the interactive docs at /docs, both from assets in app/ui/ (built from
clients/typescript by `make ui` and committed): nothing loads from a CDN, so both work offline.

The page is static: everything it does goes through the public API with the key its user enters, so
serving it grants nothing. `PARLEY_UI=0` turns /ui off; /docs and /favicon.ico stay."""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse

from app.errors import NotFound

UI_DIR = Path(__file__).resolve().parents[1] / "ui"
# Each asset with its type, stated rather than guessed from the platform's mime tables.
ASSETS = {
    "parley.js": "text/javascript; charset=utf-8",
    "parley.css": "text/css; charset=utf-8",
    "parley.svg": "image/svg+xml",
}
FAVICON_TYPE = "image/vnd.microsoft.icon"
SWAGGER_ASSETS = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon-32x32.png")
# The page loads only its own files and talks only to this origin.
PAGE_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
_NO_STORE = {"Cache-Control": "no-cache"}

router = APIRouter(include_in_schema=False)
docs_router = APIRouter(include_in_schema=False)


@router.get("/ui")
async def page() -> FileResponse:
    """The reference chat page."""
    headers = {**_NO_STORE, "Content-Security-Policy": PAGE_POLICY, "X-Content-Type-Options": "nosniff"}
    return FileResponse(UI_DIR / "index.html", media_type="text/html; charset=utf-8", headers=headers)


@router.get("/ui/assets/{name}")
async def asset(name: str) -> FileResponse:
    """The page's script and style sheet; any other name is a 404."""
    if name not in ASSETS:
        raise NotFound(f"No asset {name[:100]!r}.")
    return FileResponse(
        UI_DIR / "assets" / name,
        media_type=ASSETS[name],
        headers={**_NO_STORE, "X-Content-Type-Options": "nosniff"},
    )


@docs_router.get("/favicon.ico")
async def favicon() -> FileResponse:
    """Parley's icon, which browsers ask for on any page of this origin (so it is served with /ui off too)."""
    headers = {"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"}
    return FileResponse(UI_DIR / "favicon.ico", media_type=FAVICON_TYPE, headers=headers)


@docs_router.get("/docs")
async def docs() -> HTMLResponse:
    """Swagger UI, with its script and style served from here rather than a CDN."""
    return get_swagger_ui_html(
        openapi_url="/openapi.json",
        title="Parley - API docs",
        swagger_js_url="/docs/assets/swagger-ui-bundle.js",
        swagger_css_url="/docs/assets/swagger-ui.css",
        swagger_favicon_url="/docs/assets/favicon-32x32.png",
    )


@docs_router.get("/docs/assets/{name}")
async def docs_asset(name: str) -> FileResponse:
    """Swagger UI's assets (swagger-ui-dist, pinned in clients/typescript/package-lock.json)."""
    if name not in SWAGGER_ASSETS:
        raise NotFound(f"No asset {name[:100]!r}.")
    return FileResponse(UI_DIR / "swagger" / name, headers={"Cache-Control": "public, max-age=86400"})

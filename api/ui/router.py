"""Routes of the admin UI: the page at `/` and its static files under `/ui/static/`.

The page holds no data and no secret: it signs in with a key kept in the browser's
sessionStorage and reads everything from `/api/v1` with that key in the Authorization
header, so the JSON API stays the only source of truth.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from api.errors import NotFound

STATIC = Path(__file__).with_name("static")
MEDIA_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8", ".css": "text/css; charset=utf-8"}

# Only files shipped with the package are served, looked up by exact name, so no request
# path can reach outside the folder.
ASSETS = {p.name: p for p in STATIC.iterdir() if p.suffix in MEDIA_TYPES and p.name != "index.html"}

# Everything the page loads comes from this origin; nothing inline, no framing.
CONTENT_SECURITY_POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self' data:",
        "connect-src 'self'",
        "base-uri 'none'",
        "form-action 'self'",
        "frame-ancestors 'none'",
    ]
)
PAGE_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-store",
}

router = APIRouter(include_in_schema=False)


@router.get("/")
def admin_page() -> FileResponse:
    """The admin UI: sign in with a key, then watch and act on the federation."""
    return FileResponse(STATIC / "index.html", media_type=MEDIA_TYPES[".html"], headers=PAGE_HEADERS)


@router.get("/ui/static/{name}")
def admin_asset(name: str) -> FileResponse:
    """A script or style sheet of the admin UI."""
    path = ASSETS.get(name)
    if path is None:
        raise NotFound(f"no UI file named {name!r}")
    # Revalidate on every load so a new release's files are picked up at once.
    headers = {"Cache-Control": "no-cache", "X-Content-Type-Options": "nosniff"}
    return FileResponse(path, media_type=MEDIA_TYPES[path.suffix], headers=headers)

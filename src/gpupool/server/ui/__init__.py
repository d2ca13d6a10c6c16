"""The web dashboard: static pages under /ui (and / sends there), served with a strict CSP.

The pages are a client of /api/v1 like any other (same routes, same tokens): the page asks for a
token, keeps it in the tab's sessionStorage and sends it as a bearer header; nothing here reads a
token or serves data. Every answer under /ui carries a Content-Security-Policy that allows scripts,
styles and requests from this server only and no inline script, so a workload name or a log line
shown on the page can never run as code even if a renderer slipped.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse, RedirectResponse
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

STATIC_DIR = Path(__file__).parent / "static"
UI_PREFIX = "/ui"

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; font-src 'self'; base-uri 'none'; form-action 'self'; "
       "frame-ancestors 'none'")
SECURITY_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-cache"),  # revalidate: a new server version's files are picked up at once
]


class Secured:
    """ASGI middleware adding SECURITY_HEADERS to every answer whose path is under /ui or is /."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "") if scope["type"] == "http" else ""
        if not (path == "/" or path == UI_PREFIX or path.startswith(UI_PREFIX + "/")):
            await self.app(scope, receive, send)
            return

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                names = {name for name, _ in SECURITY_HEADERS}
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in names]
                message = {**message, "headers": kept + SECURITY_HEADERS}
            await send(message)

        await self.app(scope, receive, send_secured)


def install(app: FastAPI) -> None:
    """Serve the dashboard: / redirects to /ui/, /ui/assets/* are its files, any other /ui/... path
    is the one page (the page's script draws the view the path names, without a reload)."""
    app.mount(f"{UI_PREFIX}/assets", StaticFiles(directory=STATIC_DIR), name="ui-assets")
    index = STATIC_DIR / "index.html"

    @app.get("/", include_in_schema=False)
    def root() -> RedirectResponse:
        return RedirectResponse(f"{UI_PREFIX}/", status_code=307)

    @app.get(UI_PREFIX, include_in_schema=False)
    @app.get(UI_PREFIX + "/", include_in_schema=False)
    @app.get(UI_PREFIX + "/{page:path}", include_in_schema=False)
    def page(page: str = "") -> FileResponse:
        return FileResponse(index, media_type="text/html")

    app.add_middleware(Secured)

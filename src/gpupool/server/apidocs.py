"""The API's own documentation pages, /docs (Swagger UI) and /redoc, served without internet.

FastAPI's pages load their JavaScript and CSS from a CDN, so on a cluster without internet they
are blank. fastapi-offline ships those files (MIT); they are served here under /docs-assets, and
the pages reference only this server. /openapi.json answers at the root as well as under /api/v1.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/docs-assets"


def _assets_dir() -> Path:
    import fastapi_offline

    return Path(fastapi_offline.__file__).parent / "static"


def install(app: FastAPI, openapi_url: str) -> None:
    """Add /docs, /redoc, /openapi.json and the assets they load (none of them in the schema)."""
    app.mount(ASSETS_URL, StaticFiles(directory=_assets_dir()), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def swagger_ui(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_swagger_ui_html(
            openapi_url=f"{root}{openapi_url}", title=f"{app.title} API",
            swagger_js_url=f"{root}{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{root}{ASSETS_URL}/favicon.png",
            swagger_ui_parameters={"validatorUrl": None},  # no badge fetched from a validator service
        )

    @app.get("/redoc", include_in_schema=False)
    def redoc(request: Request) -> HTMLResponse:
        root = request.scope.get("root_path", "")
        return get_redoc_html(
            openapi_url=f"{root}{openapi_url}", title=f"{app.title} API",
            redoc_js_url=f"{root}{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{root}{ASSETS_URL}/favicon.png", with_google_fonts=False,
        )

    if openapi_url != "/openapi.json":

        @app.get("/openapi.json", include_in_schema=False)
        def openapi() -> JSONResponse:
            return JSONResponse(app.openapi())

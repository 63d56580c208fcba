"""``/docs``: Swagger UI from the ``swagger-ui-bundle-v2`` package, never a CDN.

FastAPI's own ``/docs`` page loads its script and styles from jsDelivr, so it
is blank on a host without the internet (most fleet hosts). Here the page is
FastAPI's, and its assets are files of an installed package, served by the
API under ``/docs/assets``.
"""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs/assets"


def assets_folder() -> str:
    from swagger_ui_bundle import swagger_ui_path

    return str(swagger_ui_path)


def install(app: FastAPI) -> None:
    app.mount(ASSETS, StaticFiles(directory=assets_folder()), name="docs-assets")

    @app.get("/docs", include_in_schema=False)
    def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url,
            title=f"{app.title} API",
            swagger_js_url=f"{ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS}/favicon-32x32.png",
        )

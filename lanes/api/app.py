"""The HTTP API as a FastAPI application (``lanes api`` serves it with uvicorn).

Every endpoint is a thin shell over the operations the CLI calls
(:mod:`lanes.ops`, :class:`lanes.routing.client.LanesClient`). Handlers are
plain functions, which FastAPI runs on its thread pool: the operations
block on Redis and the database, and one slow call must not hold up the rest.
One :class:`LanesClient` per application holds the connections (Redis,
catalog engine, Celery); it is closed when the application shuts down.
"""

from __future__ import annotations

import contextlib
import importlib

from fastapi import FastAPI

from lanes.api import docs, errors, pools, service, tasks
from lanes.api.gate import RequestGate
from lanes.routing.client import LanesClient
from lanes.settings import Settings, load_settings


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or load_settings()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        try:
            yield
        finally:
            app.state.client.close()

    app = FastAPI(
        title="Lanes",
        version=_version(),
        summary="Submit routed work, watch it, and operate the lanes of an LLM inference fleet.",
        lifespan=lifespan,
        # Served from a package (lanes.api.docs), not a CDN: /docs works offline.
        docs_url=None,
        redoc_url=None,
    )
    app.state.client = LanesClient(settings)
    errors.install(app)
    app.include_router(tasks.router)
    app.include_router(pools.router)
    app.include_router(service.router)
    docs.install(app)
    # Outermost: a request is refused before its body is read (lanes.api.gate).
    app.add_middleware(RequestGate)
    install_metrics(settings)
    return app


def install_metrics(settings: Settings) -> bool:
    """Register the lane collector with the default registry, once ``lanes.metrics`` exists.

    The one place the API hooks metrics in: until that module lands,
    ``/metrics`` serves the default registry (process and Python metrics).
    """
    try:
        metrics = importlib.import_module("lanes.metrics")
    except ModuleNotFoundError as exc:
        if exc.name != "lanes.metrics":
            raise  # lanes.metrics exists but is broken: say so at start, not silently
        return False
    install = getattr(metrics, "install", None)
    if install is None:
        return False
    install(settings)
    return True


def _version() -> str:
    from lanes import __version__

    return __version__

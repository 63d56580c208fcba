"""The HTTP API against real services.

Unit-level checks use FastAPI's TestClient on an application whose catalog
(SQLite, and PostgreSQL where the engine matters) and Redis are real; the
end-to-end tests serve the same application with uvicorn on a free port and
talk to it over a socket, with a real worker fleet and the HTTP simulator.
"""

from __future__ import annotations

import threading

import pytest
import redis
import uvicorn
from fastapi.testclient import TestClient

from lanes.api import create_app
from lanes.catalog import apply_document, load_routing, open_catalog
from lanes.embedded import free_port
from lanes.routing.runtime import provision_lanes
from tests.polling import eventually

TOKEN = "tok-4f9a2c71e8b3d605"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}

DOCUMENT = {
    "pools": [
        {"name": "gpu-a", "width": 2, "ceiling": 8},
        {"name": "gpu-b", "width": 3, "floor": 2, "ceiling": 6, "controller": {"kind": "overload"}},
    ],
    "models": [
        {"name": "a", "base_url": "http://127.0.0.1:9/v1", "pool": "gpu-a"},
        {"name": "b", "base_url": "http://127.0.0.1:9/v1", "pool": "gpu-b"},
        {"name": "e", "base_url": "http://127.0.0.1:9/v1", "kind": "embedding", "pool": "gpu-b"},
    ],
    "workflows": [
        {"name": "chat", "priority": "interactive", "reserve_ms": 200, "deadline_ms": 30000, "candidates": ["a", "b"]},
        {"name": "embed", "priority": "background", "candidates": ["e"]},
    ],
}


def fresh_document() -> dict:
    import copy

    return copy.deepcopy(DOCUMENT)


@pytest.fixture
def make_api(tmp_path, one_redis_url):
    """An application over a real catalog (``database_url``) and Redis, lanes provisioned."""
    from lanes.settings import Settings

    built = []

    def build(*, database_url: str | None = None, api_token: str | None = TOKEN, redis_url: str | None = None,
              **overrides) -> TestClient:
        settings = Settings(
            state_dir=tmp_path / "state",
            redis_url=redis_url or one_redis_url,
            database_url=database_url or f"sqlite:///{tmp_path / 'catalog.db'}",
            api_token=api_token,
            **overrides,
        )
        engine = open_catalog(settings)
        try:
            apply_document(engine, fresh_document())
            if redis_url is None:  # a Redis of the test's own may be down on purpose
                provision_lanes(redis.Redis.from_url(settings.redis_url), settings, load_routing(engine))
        finally:
            engine.dispose()
        client = TestClient(create_app(settings), raise_server_exceptions=False)
        client.__enter__()
        built.append(client)
        return client

    yield build
    for client in built:
        client.__exit__(None, None, None)


@pytest.fixture
def api(make_api) -> TestClient:
    return make_api()


class Served:
    """An application served by uvicorn on a free port, in a thread of this process."""

    def __init__(self, app) -> None:
        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="uvicorn", daemon=True)
        self.thread.start()
        eventually(lambda: self.server.started, timeout=20, what="uvicorn to listen")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(20)

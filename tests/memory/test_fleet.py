"""The memory fleet follows the memory primary's width when the catalog changes."""

from __future__ import annotations

import threading

import pytest

from lanes.catalog import apply_document, open_catalog
from lanes.settings import load_settings
from tests.polling import eventually
from workers.memory_fleet import MemorySupervisor

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def catalog(width: int) -> dict:
    return {
        "pools": [{"name": "gpu2", "width": width, "ceiling": 16}],
        "models": [{"name": "u", "base_url": "http://127.0.0.1:9/v1", "pool": "gpu2"}],
        "workflows": [{"name": "memory_extraction", "priority": "background", "candidates": ["u"]}],
    }


def test_the_supervisor_restarts_the_memory_worker_at_the_new_size(isolated_env, one_redis_url, monkeypatch):
    monkeypatch.setenv("LANES_REDIS_URL", one_redis_url)
    settings = load_settings()
    engine = open_catalog(settings)
    apply_document(engine, catalog(2))
    said: list[str] = []
    supervisor = MemorySupervisor(settings, poll_seconds=0.2, echo=said.append)
    thread = threading.Thread(target=supervisor.run)
    thread.start()
    try:
        eventually(lambda: said, timeout=30, what="the first plan")
        assert said[0] == "memory fleet: 4 worker threads for gpu2 width 2"
        first = eventually(lambda: supervisor._child, timeout=30, what="the first worker")
        apply_document(engine, catalog(5))
        eventually(lambda: len(said) >= 3, timeout=60, what="the restart at the new size")
        assert said[1:3] == ["memory fleet: the catalog changed its size; restarting the worker",
                             "memory fleet: 10 worker threads for gpu2 width 5"]
        eventually(lambda: supervisor._child is not first, timeout=30, what="the new worker")
        assert first.poll() is not None and supervisor._child.poll() is None
    finally:
        supervisor.stop()
        thread.join(60)
        engine.dispose()
    assert supervisor._child.poll() is not None

"""The memory fleet, kept by the fleet supervisor, follows the memory primary's width when the catalog changes."""

from __future__ import annotations

import threading

import pytest

from lanes.catalog import apply_document, open_catalog
from lanes.settings import load_settings
from tests.polling import eventually
from workers.memory.fleet import MemorySupervisor

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def catalog(width: int) -> dict:
    return {
        "pools": [{"name": "gpu2", "width": width, "ceiling": 16}],
        "models": [{"name": "u", "base_url": "http://127.0.0.1:9/v1", "pool": "gpu2"}],
        "workflows": [{"name": "memory_extraction", "priority": "background", "candidates": ["u"]}],
    }


def test_the_supervisor_replaces_the_memory_worker_at_the_new_size(isolated_env, one_redis_url, monkeypatch):
    monkeypatch.setenv("LANES_REDIS_URL", one_redis_url)
    settings = load_settings()
    engine = open_catalog(settings)
    apply_document(engine, catalog(2))
    said: list[str] = []
    supervisor = MemorySupervisor(settings, poll_seconds=0.2, echo=said.append)

    def worker():
        return supervisor._children.get("memory")

    thread = threading.Thread(target=supervisor.run)
    thread.start()
    try:
        eventually(lambda: said, timeout=30, what="the first plan")
        assert said[0] == "memory fleet: 4 worker threads for gpu2 width 2"
        first = eventually(worker, timeout=30, what="the first worker")
        assert first.lanes_hostname.startswith("memory@")
        apply_document(engine, catalog(5))
        eventually(lambda: len(said) >= 3, timeout=60, what="the replacement at the new size")
        assert said[1:3] == ["fleet memory: catalog changed the fleet; replacing its worker",
                             "memory fleet: 10 worker threads for gpu2 width 5"]
        eventually(lambda: worker() is not first, timeout=90, what="the new worker")
        # The old worker winds down after the new one answers (side by side, as every fleet's).
        eventually(lambda: first.poll() is not None, timeout=90, what="the old worker's exit")
        assert worker().poll() is None
        assert worker().lanes_hostname != first.lanes_hostname
        assert not any("did not answer" in line for line in said), said  # the new worker answered a ping
    finally:
        supervisor.stop()
        thread.join(90)
        engine.dispose()
    assert worker().poll() is not None


def test_the_memory_fleet_checks_the_lane_config_at_its_start_and_on_every_reload(isolated_env, one_redis_url,
                                                                                  monkeypatch):
    # Seed 004: every process compares its pools with the farm at start and on reload.
    from lanes.catalog import recent_events
    from lanes.ops.lanecheck import EVENT_KIND

    monkeypatch.setenv("LANES_REDIS_URL", one_redis_url)
    settings = load_settings()
    engine = open_catalog(settings)

    def with_service(width: int) -> dict:
        doc = catalog(width)
        doc["models"][0]["service"] = "s2"
        doc["services"] = [{"name": "s2", "limit": 4}]
        return doc

    apply_document(engine, with_service(6))  # wider than its service
    said: list[str] = []
    supervisor = MemorySupervisor(settings, poll_seconds=0.2, echo=said.append)
    thread = threading.Thread(target=supervisor.run)
    thread.start()
    try:
        eventually(lambda: any(line.startswith("lane config (fleet memory start): pool 'gpu2' has width 6")
                               for line in said), timeout=60, what="the check at start")
        apply_document(engine, with_service(2))  # now narrower than its service
        eventually(lambda: any(line.startswith("lane config (fleet memory reload): pool 'gpu2' is narrower")
                               for line in said), timeout=60, what="the check on reload")
    finally:
        supervisor.stop()
        thread.join(60)
    events = [(e.detail["state"], e.detail["key"]) for e in reversed(recent_events(engine, kind=EVENT_KIND))]
    assert events == [("appeared", "pool_over_services:gpu2"), ("appeared", "pool_under_services:gpu2"),
                      ("cleared", "pool_over_services:gpu2")]
    engine.dispose()

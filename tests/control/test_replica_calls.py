"""Calls to a pool that lists its replicas, through the walker in-process: real Redis, a
SQLite catalog, two simulators (one of them gone)."""

from __future__ import annotations

import time

import redis

from lanes import Priority
from lanes.catalog import apply_document, load_routing, open_catalog
from lanes.embedded import free_port
from lanes.routing.request import RouteRequest
from lanes.routing.runtime import Runtime, provision_lanes
from lanes.routing.walker import Walker
from lanes.sim import SimModel, Simulator

CHAT = {"messages": [{"role": "user", "content": "x"}]}


def request():
    return RouteRequest(task_id=f"t-{time.monotonic_ns()}", workflow="chat", payload=CHAT,
                        priority=Priority.INTERACTIVE, deadline=time.time() + 30, submitted_at=time.time())


def test_a_replica_that_refuses_the_connection_is_skipped_at_once_and_marked_down(make_settings, one_redis_url):
    live = Simulator([SimModel(name="m", capacity=4, tokens=1, per_token_ms=5.0)], port=0).start()
    dead = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    settings = make_settings(redis_url=one_redis_url)
    engine = open_catalog(settings)
    apply_document(engine, {
        "pools": [{"name": "p", "width": 2, "endpoints": [dead, live.base_url]}],
        "models": [{"name": "m", "base_url": dead, "pool": "p"}],
        "workflows": [{"name": "chat", "candidates": ["m"]}],
    })
    provision_lanes(redis.Redis.from_url(one_redis_url), settings, load_routing(engine))
    rt = Runtime(settings, redis_url=one_redis_url, engine=engine)
    try:
        pool = rt.table().pools["p"]
        for _ in range(6):
            result = Walker(rt).walk(request())
            assert result.trace.served_by == "m"
        # Every call was served by the live replica; the dead one was tried once, then marked down.
        assert live.stats()["m"]["served"] == 6
        assert dead in rt.replicas.down(pool.id)
        assert rt.replicas.in_flight(pool.id) == {}  # every call counted out again
    finally:
        rt.close()
        live.stop()

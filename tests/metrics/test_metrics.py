"""Process metrics and lane gauges against real parts: Redis lanes, a SQLite
catalog, the HTTP simulator, the walker. No Celery here (see tests/e2e for a
scraped worker).

The default registry is shared by the whole test process, so every test
names its own pools and models and compares counts before and after.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from datetime import datetime, timezone

import pytest
import redis
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from lanes import CandidatesExhausted, CapacityWaitTimeout, Priority
from lanes.catalog import apply_document, load_routing, open_catalog
from lanes.catalog.pools import set_pool_width
from lanes.errors import AcquireCancelled
from lanes.memory import add_messages, ensure_memory_schema
from lanes.memory.lifecycle import claim_run, complete_run, fail_run
from lanes.memory.runs import enqueue_runs
from lanes.metrics import LaneCollector, install, retried_walk, status_class
from lanes.namespace import Namespace
from lanes.routing.observers import Attempt
from lanes.routing.request import RouteRequest
from lanes.routing.runtime import Runtime, provision_lanes
from lanes.routing.walker import Walker
from lanes.sim import SimModel, Simulator
from workers.memgate import MemoryGate

CHAT = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 4}

# Every family of the metric name contract (the failover ones but the share
# itself are lanes/routing/share_metrics.py's).
CONTRACT = {
    "lanes_failover_share": "gauge", "lanes_failover_window_samples": "gauge",
    "lanes_failover_breach_rate": "gauge", "lanes_failover_active": "gauge",
    "lanes_failover_unknown_outcomes": "counter", "lanes_failover_first_token_seconds": "histogram",
    "lanes_lane_width": "gauge", "lanes_lane_configured_width": "gauge", "lanes_lane_in_flight": "gauge",
    "lanes_lane_queued": "gauge", "lanes_lane_grants": "counter", "lanes_lane_expired_leases": "counter",
    "lanes_breaker_state": "gauge", "lanes_lane_config_mismatches": "gauge",
    "lanes_lane_wait_seconds": "histogram", "lanes_lane_hold_seconds": "histogram",
    "lanes_lane_timeouts": "counter", "lanes_lane_cancellations": "counter", "lanes_bypasses": "counter",
    "lanes_backend_requests": "counter", "lanes_retries": "counter", "lanes_first_token_seconds": "histogram",
    "lanes_width_changes": "counter", "lanes_memory_gate_engaged": "gauge",
    "lanes_memory_gate_usage_ratio": "gauge", "lanes_memory_runs": "counter",
    "lanes_lane_collector_up": "gauge", "lanes_events_dropped": "counter",
    "lanes_handback_possibly_lost": "counter",
}


def value(name: str, **labels) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@pytest.fixture(scope="module")
def sim():
    models = [SimModel(name="m", capacity=4, service_ms=5.0), SimModel(name="n", capacity=4, service_ms=5.0),
              SimModel(name="bad", capacity=4, service_ms=5.0)]
    with Simulator(models, port=0) as server:
        yield server


@pytest.fixture
def fleet(make_settings, one_redis_url, sim):
    """A catalog whose pools and workflows are named anew for each test (the
    registry outlives each test); the models are the simulator's."""
    tag = uuid.uuid4().hex[:8]
    names = {"p": f"p-{tag}", "q": f"q-{tag}", "m": "m", "n": "n", "bad": "bad"}
    settings = make_settings(redis_url=one_redis_url, admission_cap_seconds=0.5)
    engine = open_catalog(settings)
    base = sim.base_url
    apply_document(engine, {
        "pools": [{"name": names["p"], "width": 1}, {"name": names["q"], "width": 3, "ceiling": 8}],
        "models": [
            {"name": "m", "base_url": base, "pool": names["p"]},
            {"name": "n", "base_url": base, "pool": names["q"]},
            {"name": "bad", "base_url": base, "pool": names["q"]},
        ],
        "workflows": [
            {"name": f"chat-{tag}", "priority": "interactive", "reserve_ms": 1000, "candidates": ["m", "n"]},
            {"name": f"solo-{tag}", "priority": "interactive", "candidates": ["m"]},
            {"name": f"broken-{tag}", "priority": "interactive", "candidates": ["bad"]},
        ],
    })
    provision_lanes(redis.Redis.from_url(one_redis_url), settings, load_routing(engine))
    rt = Runtime(settings, redis_url=one_redis_url, engine=engine)
    rt.names = names
    rt.tag = tag
    yield rt
    rt.close()


def request(workflow, priority=Priority.INTERACTIVE, deadline=None):
    return RouteRequest(task_id=f"t-{time.monotonic_ns()}", workflow=workflow, payload=CHAT, priority=priority,
                        deadline=deadline, submitted_at=time.time())


def test_status_classes_are_bounded():
    assert status_class(200, "served") == "2xx"
    assert status_class(None, "served") == "2xx"
    assert status_class(429, "failed") == "4xx"
    assert status_class(529, "failed") == "5xx"
    assert status_class(None, "timeout") == "timeout"
    assert status_class(None, "abandoned") == "timeout"
    assert status_class(None, "failed") == "error"
    assert status_class(302, "failed") == "error"


def test_a_served_walk_counts_its_call_wait_hold_and_first_token(fleet):
    p, m = fleet.names["p"], fleet.names["m"]
    before = value("lanes_backend_requests_total", pool=p, model=m, status_class="2xx")
    for _ in range(3):
        Walker(fleet).walk(request(f"solo-{fleet.tag}"))
    assert value("lanes_backend_requests_total", pool=p, model=m, status_class="2xx") == before + 3
    assert value("lanes_lane_wait_seconds_count", pool=p, priority="interactive") == 3
    assert value("lanes_lane_hold_seconds_count", pool=p) == 3
    assert value("lanes_first_token_seconds_count", pool=p, model=m) == 3
    assert value("lanes_lane_hold_seconds_sum", pool=p) > 0


def test_a_wait_that_times_out_and_one_that_is_cancelled_are_counted(fleet):
    p = fleet.names["p"]
    lane = fleet.lane(fleet.table().pools[p])
    with lane.acquire(Priority.INTERACTIVE, timeout=5):
        with pytest.raises(CapacityWaitTimeout):
            Walker(fleet).walk(request(f"solo-{fleet.tag}"))
        assert value("lanes_lane_timeouts_total", pool=p, priority="interactive") == 1

        cancel = threading.Event()
        threading.Timer(0.3, cancel.set).start()
        with pytest.raises(AcquireCancelled):
            Walker(fleet).walk(request(f"solo-{fleet.tag}", Priority.BACKGROUND), cancel=cancel)
    assert value("lanes_lane_cancellations_total", pool=p) == 1
    assert value("lanes_lane_timeouts_total", pool=p, priority="background") == 0


def test_a_candidate_passed_over_is_counted_by_reason(fleet):
    p, m, n = fleet.names["p"], fleet.names["m"], fleet.names["n"]
    lane = fleet.lane(fleet.table().pools[p])
    with lane.acquire(Priority.INTERACTIVE, timeout=5):
        # 0.5 s to the deadline with 1 s kept for the fallback: no time to wait for the busy primary.
        result = Walker(fleet).walk(request(f"chat-{fleet.tag}", deadline=time.time() + 0.5))
    assert result.trace.served_by == n
    assert value("lanes_bypasses_total", workflow=f"chat-{fleet.tag}", model=m, reason="budget_spent") == 1


def test_a_failed_call_is_counted_by_status_class_and_its_retry_by_status_code(fleet, sim):
    q, bad = fleet.names["q"], fleet.names["bad"]
    sim.configure("bad", fail_next=1, fail_status=529)
    walker = Walker(fleet)
    with pytest.raises(CandidatesExhausted):
        walker.walk(request(f"broken-{fleet.tag}"))
    assert value("lanes_backend_requests_total", pool=q, model=bad, status_class="5xx") == 1
    before = value("lanes_retries_total", pool=q, reason="candidates_exhausted", status_code="529")
    retried_walk(walker.trace.steps, "candidates_exhausted", fallback_pool="unused")
    assert value("lanes_retries_total", pool=q, reason="candidates_exhausted", status_code="529") == before + 1


def test_a_width_set_in_the_catalog_is_counted_once_per_change(fleet):
    q = fleet.names["q"]
    lane = fleet.lane(fleet.table().pools[q])
    set_pool_width(fleet.engine, q, 5)
    pool = load_routing(fleet.engine).pools[q]
    assert fleet.authority.sync(pool, lane) == 5
    assert fleet.authority.sync(pool, lane) is None  # already there: nothing more to count
    set_pool_width(fleet.engine, q, 2)
    assert fleet.authority.sync(load_routing(fleet.engine).pools[q], lane) == 2
    assert value("lanes_width_changes_total", pool=q, controller="configured", direction="up") == 1
    assert value("lanes_width_changes_total", pool=q, controller="configured", direction="down") == 1


# --- lane gauges ------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def families(collector) -> dict[str, list]:
    return {metric.name: [(s.labels, s.value) for s in metric.samples] for metric in collector.collect()}


def test_the_collector_reads_every_pool_and_breaker_from_redis_and_caches_the_reading(fleet):
    p, q = fleet.names["p"], fleet.names["q"]
    clock = Clock()
    collector = LaneCollector(fleet.settings, fleet.client, fleet.table, cache_seconds=2.0, clock=clock)
    lane = fleet.lane(fleet.table().pools[p])
    with lane.acquire(Priority.INTERACTIVE, timeout=5):
        waiter = threading.Thread(target=lambda: lane.acquire(Priority.BACKGROUND, timeout=2).release())
        waiter.start()
        deadline = time.monotonic() + 5
        while lane.stats().queued_total == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        found = families(collector)
    waiter.join()
    assert ({"pool": p}, 1) in found["lanes_lane_width"]
    assert ({"pool": q}, 3) in found["lanes_lane_configured_width"]
    assert ({"pool": p}, 1) in found["lanes_lane_in_flight"]
    assert ({"pool": p, "priority": "background"}, 1) in found["lanes_lane_queued"]
    assert ({"pool": p, "priority": "interactive"}, 0) in found["lanes_lane_queued"]
    grants = dict((labels["pool"], v) for labels, v in found["lanes_lane_grants"] if "pool" in labels)
    assert grants[p] >= 1
    assert sorted(labels["model"] for labels, _ in found["lanes_breaker_state"]) == ["bad", "m", "n"]
    assert found["lanes_lane_config_mismatches"] == []  # no check has run: no sample, not a made-up 0
    assert found["lanes_lane_collector_up"] == [({}, 1)]
    # The failover share: only workflows with a fallback have one; 1.0 before any request.
    assert found["lanes_failover_share"] == [({"workflow": f"chat-{fleet.tag}"}, 1.0)]

    # Within the cache period a scrape costs Redis nothing; after it, a new reading.
    fleet.client.set(Namespace(fleet.settings.key_prefix).lane_config,
                     json.dumps({"mismatches": [{"key": "a"}, {"key": "b"}]}))
    readings = collector.readings
    assert families(collector)["lanes_lane_config_mismatches"] == []
    assert collector.readings == readings
    clock.now += 2.0
    assert families(collector)["lanes_lane_config_mismatches"] == [({}, 2)]
    assert collector.readings == readings + 1


@pytest.mark.slow
def test_a_scrape_with_redis_gone_answers_with_empty_lane_families(fleet):
    gone = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.5, socket_timeout=0.5)
    collector = LaneCollector(fleet.settings, gone, fleet.table)
    found = families(collector)
    assert set(found) >= {"lanes_lane_width", "lanes_lane_in_flight", "lanes_breaker_state"}
    # The lane families are empty (nothing half-read), and the success gauge says why.
    assert found.pop("lanes_lane_collector_up") == [({}, 0)]
    assert all(samples == [] for samples in found.values())


def test_routing_events_dropped_while_redis_refuses_them_are_exported(fillable_redis):
    from lanes.errors import RedisUnavailable
    from lanes.routing.events import EventLog

    url, admin = fillable_redis
    admin.config_set("maxmemory", 1)  # a full no-eviction Redis: every write refused
    before = value("lanes_events_dropped_total")
    log = EventLog(redis.Redis.from_url(url, socket_timeout=5), prefix=f"t{uuid.uuid4().hex[:6]}",
                   max_buffer=3, flush_interval=3600)  # only this test flushes
    try:
        for n in range(10):
            log.record("lane_wait", pool="p", n=n)
        with pytest.raises(RedisUnavailable):
            log.flush()
        assert log.dropped >= 7  # never more than three kept in the process
        assert value("lanes_events_dropped_total") - before == log.dropped
    finally:
        log.enabled = False
        admin.config_set("maxmemory", 0)
        log.close()


def test_install_registers_once_and_the_default_exposition_names_every_contract_family(fleet, one_redis_url):
    # In a process of its own: install() is once per process, on the default registry (the API's exposition).
    code = (
        "import sys\n"
        "from lanes.settings import Settings\n"
        "from lanes import metrics\n"
        f"settings = Settings(redis_url={one_redis_url!r}, database_url={fleet.settings.catalog_url()!r})\n"
        "first = metrics.install(settings)\n"
        "assert metrics.install(settings) is first\n"
        "sys.stdout.write(metrics.render()[0].decode())\n"
    )
    text = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    found = {family.name: family for family in text_string_to_metric_families(text)}
    for name, kind in CONTRACT.items():
        assert name in found, name
        assert found[name].type == kind, name
    widths = {s.labels["pool"]: s.value for s in found["lanes_lane_width"].samples}
    assert widths[fleet.names["p"]] == 1 and widths[fleet.names["q"]] == 3


def test_the_collector_shows_the_share_every_worker_shares(fleet):
    route = fleet.workflow(f"chat-{fleet.tag}")
    generation = fleet.shares.choose(route).generation
    for _ in range(20):  # 20 slow first tokens on the primary: one cut
        fleet.shares.observe(route, Attempt(workflow=route.name, model="m", pool=fleet.names["p"], pool_id=None,
                                            priority=Priority.INTERACTIVE, outcome="served", ttft_seconds=30.0,
                                            share_generation=generation))
    found = families(LaneCollector(fleet.settings, fleet.client, fleet.table))
    assert found["lanes_failover_share"] == [({"workflow": route.name}, pytest.approx(0.8))]


# --- the memory gate and memory runs -----------------------------------------------------


def test_the_memory_gate_reports_whether_it_holds_and_how_full_memory_is():
    readings = iter([0.5, 0.95, 0.85, 0.4])
    gate = MemoryGate(0.9, 0.6, read=lambda: next(readings))
    seen = []
    for _ in range(4):
        gate.update(in_flight=10)
        seen.append((value("lanes_memory_gate_engaged"), value("lanes_memory_gate_usage_ratio")))
    assert seen == [(0, 0.5), (1, 0.95), (1, 0.85), (0, 0.4)]


def test_memory_runs_are_counted_by_the_status_they_enter(tmp_path):
    from lanes.catalog import make_engine

    engine = make_engine(f"sqlite:///{tmp_path / 'memory.db'}")
    ensure_memory_schema(engine)
    at = datetime(2026, 1, 5, 10, 30, tzinfo=timezone.utc)
    add_messages(engine, [{"chat_id": f"c{i}", "at": at, "role": "user", "text": "hi"} for i in range(3)])
    before = {s: value("lanes_memory_runs_total", status=s) for s in ("queued", "running", "done", "failed")}
    created = enqueue_runs(engine, now=datetime(2026, 1, 5, 12, 5, tzinfo=timezone.utc), full=False,
                           retention_days=7, daily_cap=100).created
    assert len(created) == 3
    now = datetime(2026, 1, 5, 12, 6, tzinfo=timezone.utc)
    claims = [claim_run(engine, run.id, now=now, lease_seconds=60).claim for run in created]
    complete_run(engine, created[0].id, ["moved"], claim=claims[0], now=now)
    fail_run(engine, created[1].id, "gave up", claim=claims[1], now=now)
    after = {s: value("lanes_memory_runs_total", status=s) - before[s] for s in before}
    assert after == {"queued": 3, "running": 3, "done": 1, "failed": 1}
    engine.dispose()

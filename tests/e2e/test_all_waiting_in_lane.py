"""All waiting work is in the lane: a fleet worker takes every message as it
arrives (up to its bound) and parks it as a lane waiter, so priority, shares,
deadline minus reserve and the fallbacks act on all of it, with more work
than a thread pool would hold. Real Redis, real Celery workers, the simulator.

Assertions are about outcomes and order, never durations.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from lanes.celery_client import broker_queued
from lanes.sim import SimModel
from tests.e2e.harness import deploy
from tests.e2e.test_routing_e2e import CHAT, actions
from tests.polling import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

DOCUMENT = {
    "pools": [
        {"name": "dialog", "width": 2},
        {"name": "utility", "width": 6},
        {"name": "tools", "width": 2},
        {"name": "drain", "width": 2},
    ],
    "models": [
        {"name": "primary", "base_url": "{sim}", "pool": "dialog", "timeout_ms": 20000},
        {"name": "utility-14b", "base_url": "{sim}", "pool": "utility", "timeout_ms": 20000},
        # A hosted API: no pool, bounded by its own concurrency limit fleet-wide.
        {"name": "hosted-fallback", "base_url": "{sim}", "concurrency": 4, "timeout_ms": 20000},
        {"name": "tool-model", "base_url": "{sim}", "pool": "tools"},
        {"name": "drain-model", "base_url": "{sim}", "pool": "drain"},
    ],
    "workflows": [
        {"name": "dialog", "priority": "interactive", "reserve_ms": 4000,
         "candidates": ["primary", "utility-14b", "hosted-fallback"]},
        {"name": "burst", "priority": "user_tool", "candidates": ["tool-model"]},
        {"name": "small", "priority": "user_tool", "candidates": ["tool-model"]},
        {"name": "bulk", "priority": "interactive", "candidates": ["drain-model"]},
    ],
}

SIM_MODELS = [
    SimModel(name="primary", capacity=2, service_ms=3000.0),
    SimModel(name="utility-14b", capacity=6, service_ms=1000.0),
    SimModel(name="hosted-fallback", capacity=64, service_ms=1000.0),
    SimModel(name="tool-model", capacity=2, service_ms=1000.0),
    SimModel(name="drain-model", capacity=2, service_ms=50.0),
]


@pytest.fixture(scope="module")
def dep(tmp_path_factory, embedded_redis):
    url = embedded_redis.url.rsplit("/", 1)[0] + "/12"
    redis.Redis.from_url(url).flushdb()
    deployment = deploy(
        tmp_path_factory.mktemp("in-lane"), url, json.loads(json.dumps(DOCUMENT)), SIM_MODELS,
        ["dialog", "tools", "drain"], lease_seconds=3.0, fleet_pool="gevent",
        # A dead worker's messages come back after this (the workers refresh theirs every 2 s).
        extra_env={"LANES_MESSAGE_LEASE_SECONDS": "6"},
    )
    yield deployment
    deployment.close()


def wait_all(dep, results, timeout=180.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    for result in results:
        result.get(timeout=max(1.0, deadline - time.monotonic()), propagate=False)
    return [dep.client.result(result.id) for result in results]


def walk_of(report: dict, since: float) -> list:
    """A report's steps, each with its time from ``since``: what a failure shows."""
    return [report.get("error")] + [
        {k: (round(v - since, 2) if k.endswith("_at") and isinstance(v, float) else v) for k, v in step.items()}
        for attempt in report["attempts"] for step in attempt["steps"]]


def served_model(report: dict) -> str | None:
    served = [model for model, action in actions(report) if action == "served"]
    return served[-1] if served else None


def test_a_burst_beyond_the_primary_is_answered_in_deadline_through_its_fallbacks(dep):
    dep.sim.reset()
    # A running fleet knows its lanes' hold times (the forecast reads them).
    for result in [dep.client.submit("dialog", CHAT, deadline=60) for _ in range(3)]:
        result.get(timeout=60, propagate=False)
    dep.sim.reset()

    submitted = time.time()
    results = [dep.client.submit("dialog", CHAT, deadline=10.0) for _ in range(40)]
    reports = wait_all(dep, results)
    ended = [dep.client.celery.AsyncResult(r.id).date_done for r in results]

    served = [r for r in reports if r["state"] == "SUCCESS"]
    in_deadline = [d for d in ended if d is not None and d.timestamp() <= submitted + 10.0 + 0.5]
    stats = dep.sim.stats()
    late = [r for r, d in zip(reports, ended)
            if r["state"] != "SUCCESS" or d is None or d.timestamp() > submitted + 10.5]
    # The benchmark's mark is 39 of 40 (bench/bench_waiting.py, docs/BENCHMARKS.md);
    # a shared CI machine slows the worker's own steps, so the test keeps room
    # for a few late answers. Waiting in the broker, 11 to 15 of 40 made it.
    assert len(served) >= 37 and len(in_deadline) >= 37, [walk_of(r, submitted) for r in late]
    # The primary was never above its width; the hosted candidate within its own limit.
    assert stats["primary"]["max_in_flight"] <= 2
    assert stats["hosted-fallback"]["max_in_flight"] <= 4
    models = {served_model(r) for r in served}
    assert "utility-14b" in models  # the idle fallback took the work the primary could not


def test_a_small_workflow_gets_its_share_behind_a_burst_of_the_same_priority(dep):
    dep.sim.reset()
    with ThreadPoolExecutor(8) as pool:
        burst = list(pool.map(lambda _: dep.client.submit("burst", CHAT), range(60)))
    # Every burst message reaches the worker and waits in the lane, not in the broker.
    eventually(lambda: sum(broker_queued(redis.Redis.from_url(dep.redis_url), "tools").values()) == 0,
               timeout=60, what="the burst taken from the broker")
    small_from = time.time()
    small = [dep.client.submit("small", CHAT) for _ in range(10)]
    reports = wait_all(dep, small + burst, timeout=240)
    assert all(r["state"] == "SUCCESS" for r in reports), [r.get("error") for r in reports]
    small_ids = {r.id for r in small}
    later = sorted((r for r in reports if served_at(r) >= small_from), key=served_at)
    burst_left = sum(1 for r in later if r["task_id"] not in small_ids)
    assert burst_left >= 25, "the burst must still be waiting when small arrives, or nothing is shown"
    small_last = max(i for i, r in enumerate(later) if r["task_id"] in small_ids)
    burst_before = sum(1 for r in later[:small_last] if r["task_id"] not in small_ids)
    # Each workflow is owed half the width (1 of 2 slots): small's ten are
    # admitted alternating with the burst, about ten burst calls among them,
    # not after the whole burst left (first in first out: all of burst_left).
    assert burst_before <= 14, (burst_before, burst_left)


def served_at(report: dict) -> float:
    steps = [s for attempt in report["attempts"] for s in attempt["steps"] if s["action"] == "served"]
    return steps[-1]["admitted_at"] if steps else float("inf")


def test_a_killed_worker_holding_hundreds_of_waiters_loses_nothing(dep):
    dep.sim.reset()
    client = redis.Redis.from_url(dep.redis_url)
    lane = dep.lane("drain")
    # The test holds both slots, so every message the worker takes waits in the lane.
    held = [lane.acquire("interactive", timeout=30) for _ in range(2)]
    results = [dep.client.submit("bulk", CHAT) for _ in range(600)]
    # Every message taken from the broker and parked in the lane when the worker
    # dies (one taken at that instant would be recorded too: lanes/broker.py,
    # tests/e2e/test_receive_window.py).
    eventually(lambda: sum(broker_queued(client, "drain").values()) == 0
               and sum(lane.stats().queued.values()) >= 598, timeout=400,
               what="all 600 messages taken and parked in the lane")
    foreground = [pid for pid in dep.worker_children("drain")
                  if b"--foreground" in open(f"/proc/{pid}/cmdline", "rb").read()]
    assert len(foreground) == 1
    # The test's slots held (renewed by its lane): no call has begun.
    assert not [c for c in dep.sim.calls() if c["model"] == "drain-model"]
    os.kill(foreground[0], signal.SIGKILL)
    for permit in held:
        lane.release(permit)

    # The dead worker's messages come back after the message lease (6 s here),
    # not after a visibility timeout of hours; its waiters' places lapse with their lease.
    reports = wait_all(dep, results, timeout=300)
    states = [r["state"] for r in reports]
    assert states.count("SUCCESS") == 600, [r.get("error") for r in reports if r["state"] != "SUCCESS"][:5]
    assert dep.sim.stats()["drain-model"]["max_in_flight"] <= 2
    # Nothing was in a call at the kill: every message reached the backend
    # exactly once. (The sweeps that give the dead worker's messages back once
    # copied a message a live worker had taken again: lanes/broker.py,
    # restore_if_stale.)
    calls = Counter(c["task_id"] for c in dep.sim.calls() if c["model"] == "drain-model")
    assert set(calls) == {r.id for r in results}
    assert [task_id for task_id, n in calls.items() if n > 1] == []
    # The lane is back to its width: no slot or place stayed with the dead process.
    eventually(lambda: lane.stats().in_flight == 0 and sum(lane.stats().queued.values()) == 0
               and lane.stats().width == 2, timeout=30, what="the lane idle at its width")

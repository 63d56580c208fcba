"""Accepted work outlives outages (issue 33): a Redis restart while tasks wait in
a lane or call a backend, and a primary that answers 500 for a while.

Real parts: a private redis-server (the embedded default: an append-only file),
the HTTP simulator, a supervised fleet worker, a SQLite catalog.
"""

from __future__ import annotations

import json
import time
from collections import Counter

import pytest

from lanes.embedded import EmbeddedRedis
from lanes.sim import SimModel
from tests.e2e.harness import deploy
from tests.polling import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}

DOC = {
    "pools": [{"name": "gpu", "width": 1}],
    "models": [{"name": "m", "base_url": "{sim}", "pool": "gpu", "timeout_ms": 20_000}],
    "workflows": [
        {"name": "w", "priority": "interactive", "candidates": ["m"]},
        {"name": "notes", "priority": "background", "candidates": ["m"]},
    ],
}


def _deploy(tmp_path, server, service_ms: float, **env):
    url = server.ensure()
    return deploy(tmp_path / "state", url, json.loads(json.dumps(DOC)),
                  [SimModel(name="m", capacity=4, service_ms=service_ms)], ["gpu"],
                  lease_seconds=2.0, visibility_timeout_seconds=600, redis_timeout_seconds=1.0,
                  extra_env=env)


def _ended(dep, tasks, timeout: float) -> list[str]:
    give_up = time.monotonic() + timeout
    states = {}
    while time.monotonic() < give_up:
        for task in tasks:
            if task.id not in states:
                report = dep.client.wait(task.id, 0.01)
                if report is not None:
                    states[task.id] = report["state"]
        if len(states) == len(tasks):
            break
        time.sleep(0.5)
    return [states.get(task.id, "NOT ENDED") for task in tasks]


def test_tasks_waiting_in_a_lane_or_calling_when_redis_restarts_are_all_answered(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis")
    dep = _deploy(tmp_path, server, service_ms=1_500.0)
    try:
        # Width 1: one task calls, the others wait in the lane.
        tasks = [dep.client.submit("w", CHAT, deadline=240) for _ in range(5)]
        eventually(lambda: dep.sim.stats()["m"]["in_flight"] == 1, timeout=60, what="the first call")
        eventually(lambda: dep.lane("gpu").stats().queued_total >= 1, timeout=60,
                   what="tasks waiting in the lane")

        server.stop()       # a restart: every connection drops, the AOF keeps queues and results
        time.sleep(10.0)    # longer than a lease and the Redis timeout
        server.ensure()

        states = _ended(dep, tasks, timeout=240)
        assert states == ["SUCCESS"] * 5, states
        calls = Counter(c["task_id"] for c in dep.sim.calls())
        # At most once more for a call the outage cut short; never more.
        assert all(calls[task.id] <= 2 for task in tasks), calls
        assert dep.sim.stats()["m"]["max_in_flight"] <= 1, "width 1 held across the restart"
    finally:
        dep.close()
        server.stop()


def test_background_work_waits_out_a_primary_outage_and_interactive_work_fails_fast(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis")
    dep = _deploy(tmp_path, server, service_ms=20.0,
                  LANES_BACKGROUND_RETRY_SECONDS="0.5", LANES_BACKGROUND_RETRY_CAP_SECONDS="2")
    try:
        dep.sim.configure("m", down=True)        # a dead engine: 500 to every request
        background = [dep.client.submit("notes", CHAT) for _ in range(12)]
        urgent = dep.client.submit("w", CHAT, deadline=60)

        urgent_report = dep.client.wait(urgent.id, 120)
        assert urgent_report is not None and urgent_report["state"] == "FAILURE", urgent_report
        assert urgent_report["error"]["type"] == "CandidatesExhausted"
        eventually(lambda: len(dep.client_events(kind="outage_retry")) >= 12, timeout=120,
                   what="every background task retried at least once")
        time.sleep(3.0)                            # the outage lasts a while longer
        dep.sim.configure("m", down=False)

        states = _ended(dep, background, timeout=240)
        assert states == ["SUCCESS"] * 12, states
        retries = dep.client_events(kind="outage_retry")
        assert {event.detail["task_id"] for event in retries} == {task.id for task in background}
        assert all(event.workflow == "notes" for event in retries)
    finally:
        dep.close()
        server.stop()

"""The failover share and the capacity requeue live: Redis, Celery workers, ``lanes sim``.

The primary's first-token time is raised past the budget at runtime through
the simulator's admin endpoint; the share falls and work moves to the
fallback; the latency comes back and so does the share. Small parameters
(a catalog override) make it take seconds.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from lanes import CapacityWaitTimeout, Priority
from lanes.namespace import Namespace
from lanes.routing.share import ShareStore
from lanes.sim import SimModel
from tests.e2e.harness import deploy
from tests.e2e.test_routing_e2e import CHAT, actions, finish
from tests.polling import eventually

# One test here is the feature's end-to-end path in the fast tier; the rest are slow.
pytestmark = [pytest.mark.timeout(240)]

FAILOVER = {"latency_budget_ms": 300, "min_samples": 4, "window_samples": 10, "dwell_ms": 400,
            "share_decay": 0.5, "share_step": 0.25, "share_floor": 0.25, "idle_recovery_ms": 0}

DOCUMENT = {
    "pools": [{"name": "p-slow", "width": 8}, {"name": "p-fast", "width": 8}, {"name": "p-one", "width": 1}],
    "models": [
        {"name": "slow", "base_url": "{sim}", "pool": "p-slow", "timeout_ms": 5000},
        {"name": "fast", "base_url": "{sim}", "pool": "p-fast"},
        {"name": "solo", "base_url": "{sim}", "pool": "p-one"},
    ],
    "workflows": [
        {"name": "shared", "priority": "interactive", "candidates": ["slow", "fast"], "failover": FAILOVER},
        {"name": "solo", "priority": "interactive", "candidates": ["solo"]},
    ],
}

SIM_MODELS = [
    SimModel(name="slow", capacity=16, ttft_ms=20.0, per_token_ms=5.0),
    SimModel(name="fast", capacity=16, service_ms=20.0),
    SimModel(name="solo", capacity=4, service_ms=20.0),
]


@pytest.fixture(scope="module")
def dep(tmp_path_factory, embedded_redis):
    url = embedded_redis.url.rsplit("/", 1)[0] + "/9"
    redis.Redis.from_url(url).flushdb()
    deployment = deploy(
        tmp_path_factory.mktemp("shares"), url, json.loads(json.dumps(DOCUMENT)), SIM_MODELS, ["p-slow", "p-one"],
        extra_env={"LANES_ADMISSION_CAP_SECONDS": "1.5", "LANES_CAPACITY_REQUEUES": "2",
                   "LANES_CAPACITY_REQUEUE_SECONDS": "0.2"},
    )
    yield deployment
    deployment.close()


def share(dep) -> float:
    state = ShareStore(redis.Redis.from_url(dep.redis_url), Namespace(dep.settings.key_prefix)).read("shared")
    return 1.0 if state is None else state.share


def batch(dep, size: int = 8) -> list[str]:
    """Submit ``size`` requests at once; the model that served each."""
    with ThreadPoolExecutor(size) as pool:
        reports = list(pool.map(lambda _: finish(dep, dep.client.submit("shared", CHAT, deadline=30)), range(size)))
    assert all(r["state"] == "SUCCESS" for r in reports), [r.get("error") for r in reports]
    return [actions(r)[-1][0] for r in reports]


@pytest.mark.end_to_end
def test_a_slow_primary_loses_its_share_to_the_fallback_and_wins_it_back(dep):
    # The first calls of a fresh deployment pay for cold connections and imports, and on
    # a busy machine a batch can breach the budget by that alone (a hiccup halves the
    # share); the claim is about a warm primary: a whole batch served by it at full share.
    eventually(lambda: set(batch(dep)) == {"slow"} and share(dep) == 1.0, timeout=120, interval=0,
               what="a warm primary serving a whole batch at full share")

    dep.sim.configure("slow", ttft_ms=700.0)  # past the 300 ms budget, at runtime
    eventually(lambda: batch(dep) and share(dep) <= 0.25, timeout=90, interval=0, what="the share to fall")
    served = [model for _ in range(3) for model in batch(dep)]
    assert served.count("fast") > served.count("slow"), served  # most work now starts at the fallback
    changes = [e.detail["change"] for e in dep.client_events(kind="share_change")]
    assert "decrease" in changes

    dep.sim.configure("slow", ttft_ms=20.0)  # the primary is quick again
    eventually(lambda: batch(dep) and share(dep) == 1.0, timeout=120, interval=0, what="the share to recover")
    assert "increase" in [e.detail["change"] for e in dep.client_events(kind="share_change")]


@pytest.mark.slow
def test_a_capacity_timeout_is_requeued_with_backoff_then_fails_naming_why(dep):
    lane = dep.lane("p-one")
    hold = lane.acquire(Priority.INTERACTIVE, timeout=5)
    try:
        report = finish(dep, dep.client.submit("solo", CHAT), timeout=60)
    finally:
        hold.release()
    assert report["state"] == "FAILURE"
    assert report["error"]["type"] == CapacityWaitTimeout.__name__
    assert "gave up after 2 capacity requeues" in report["error"]["message"]
    assert actions(report) == [("solo", "wait_timeout")] * 3  # the first run and two requeues


@pytest.mark.slow
def test_a_requeued_task_is_served_once_the_lane_frees(dep):
    lane = dep.lane("p-one")
    hold = lane.acquire(Priority.INTERACTIVE, timeout=5)
    threading.Timer(2.5, hold.release).start()  # after the first 1.5 s wait timed out
    report = finish(dep, dep.client.submit("solo", CHAT), timeout=60)
    assert report["state"] == "SUCCESS"
    assert actions(report)[0] == ("solo", "wait_timeout") and actions(report)[-1] == ("solo", "served")

"""A Redis that refuses writes when a task's answer must be recorded.

A call answered while Redis refuses writes (a full no-eviction server): the
task's result cannot be stored. Celery then logs "Exception raised outside
body" and acknowledges the message anyway, so the task was gone, left
STARTED with no answer and no trace (what the fault harness saw as a task
that never ended). The worker's result backend now waits for Redis
(workers/outcome.py).
"""

from __future__ import annotations

import json
import threading

import pytest
import redis

from lanes.embedded import EmbeddedRedis
from lanes.sim import SimModel
from tests.e2e.harness import deploy
from tests.polling import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}

DOC = {
    "pools": [{"name": "gpu", "width": 1}],
    "models": [{"name": "m", "base_url": "{sim}", "pool": "gpu", "timeout_ms": 10_000}],
    "workflows": [{"name": "w", "priority": "interactive", "candidates": ["m"]}],
}


@pytest.fixture
def dep(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.ensure()
    redis.Redis.from_url(url).config_set("maxmemory-policy", "noeviction")
    # Leases of 30 s: no renewal falls inside the few seconds of refused writes.
    deployment = deploy(tmp_path / "state", url, json.loads(json.dumps(DOC)),
                        [SimModel(name="m", capacity=4, service_ms=2_000.0)], ["gpu"],
                        lease_seconds=30.0, visibility_timeout_seconds=600, redis_timeout_seconds=2.0)
    yield deployment
    deployment.close()
    server.stop()


def test_an_answer_that_arrives_while_redis_refuses_writes_is_stored_once_it_can(dep):
    admin = redis.Redis.from_url(dep.redis_url)
    task = dep.client.submit("w", CHAT)
    eventually(lambda: dep.sim.stats()["m"]["in_flight"] == 1, timeout=30, what="the call to start")

    # Redis refuses every write from now until 3 s after the call answered.
    admin.config_set("maxmemory", 1)
    threading.Timer(5.0, admin.config_set, args=("maxmemory", 0)).start()

    assert task.get(timeout=60)["model"] == "m"
    assert [c["model"] for c in dep.sim.calls() if c["task_id"] == task.id] == ["m"]

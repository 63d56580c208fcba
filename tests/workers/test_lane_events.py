"""A fleet worker's lane events go out the way Celery's own task events do: in their batches, on either pool.

Real parts: a supervised fleet worker, Redis, the HTTP simulator. The test
reads the event exchange itself (Redis pub/sub, as every event consumer does)
and looks at how each ``task-lane-admitted`` event travelled.
"""

from __future__ import annotations

import base64
import json
import time

import pytest
import redis

from lanes.flower import lane_events
from lanes.sim import SimModel
from tests.e2e.harness import deploy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

CHAT = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
DOCUMENT = {
    "pools": [{"name": "gpu", "width": 2}],
    "models": [{"name": "m", "base_url": "{sim}", "pool": "gpu", "timeout_ms": 60_000}],
    "workflows": [{"name": "dialog", "priority": "interactive", "candidates": ["m"]}],
}


def events_in(message: dict) -> tuple[str, list[dict]]:
    """The routing key of one published event message, and the events it carries."""
    envelope = json.loads(message["data"])
    body = envelope["body"]
    if envelope.get("properties", {}).get("body_encoding") == "base64":
        body = base64.b64decode(body)
    payload = json.loads(body)
    routing_key = message["channel"].decode().rsplit("/", 1)[-1]
    return routing_key, payload if isinstance(payload, list) else [payload]


@pytest.mark.parametrize("pool", ["gevent", "threads"])
def test_lane_admissions_travel_with_the_task_events_of_their_batch(tmp_path, embedded_redis, pool):
    url = embedded_redis.url.rsplit("/", 1)[0] + "/6"
    redis.Redis.from_url(url).flushdb()
    dep = deploy(tmp_path, url, json.loads(json.dumps(DOCUMENT)), [SimModel(name="m", capacity=2, service_ms=20.0)],
                 ["gpu"], fleet_pool=pool)
    listener = redis.Redis.from_url(url).pubsub()
    try:
        listener.psubscribe("*celeryev*")
        assert listener.get_message(timeout=5)["type"] == "psubscribe"
        results = [dep.client.submit("dialog", CHAT) for _ in range(3)]
        task_ids = {r.id for r in results}
        for r in results:
            r.get(timeout=60)

        admitted: dict[str, str] = {}  # task id -> routing key of the message that carried it
        task_events = 0
        task_keys: set[str] = set()  # how Celery's own task events travelled
        deadline = time.monotonic() + 20
        while set(admitted) != task_ids and time.monotonic() < deadline:
            message = listener.get_message(timeout=1)
            if message is None or message["type"] != "pmessage":
                continue
            routing_key, events = events_in(message)
            for event in events:
                if event.get("type") == lane_events.ADMITTED:
                    admitted[event["uuid"]] = routing_key
                    assert event["pool"] == "gpu" and event["outcome"] == "served", event
                elif event.get("type", "").startswith("task-"):
                    task_events += 1
                    task_keys.add(routing_key)
    finally:
        listener.close()
        dep.close()

    assert set(admitted) == task_ids, f"lane events seen for {sorted(admitted)}, tasks {sorted(task_ids)}"
    # Both pools batch task events (the gevent pool through workers/green_events.py):
    # a lane event is one more entry in the worker's task batch, never a message of its own.
    assert "task.multi" in task_keys, task_keys
    assert set(admitted.values()) == {"task.multi"}, admitted
    assert task_events >= len(task_ids), "Celery's own task events were not seen beside them"

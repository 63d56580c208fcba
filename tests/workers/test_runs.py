"""The run claim: one script call that checks the task has not ended, takes
its run lease and stores STARTED as Celery's tracer would (real Redis, the
route task of a real worker app and its own result backend)."""

from __future__ import annotations

import os

import pytest
import redis
from celery import states
from celery.result import AsyncResult

from lanes.celery_client import ROUTE_TASK
from workers.app import _started, create_app
from workers.runs import Claim, RunLeases


@pytest.fixture
def route(one_redis_url, make_settings):
    url = one_redis_url
    redis.Redis.from_url(url).flushdb()
    app = create_app(make_settings(redis_url=url))
    task = app.tasks[ROUTE_TASK]
    task.push_request(id="task-1", hostname="gpu@host", retries=0, called_directly=False,
                      delivery_info={"routing_key": "q"})
    yield task, redis.Redis.from_url(url)
    task.pop_request()
    app.close()


def test_the_route_task_leaves_started_to_the_claim(route):
    task, _ = route
    assert task.track_started is False  # else Celery's tracer stores it again, two round trips more


def test_a_first_delivery_takes_the_lease_and_the_result_says_started(route):
    task, client = route
    leases = RunLeases(client, prefix="lanes", ttl_seconds=60)
    listener = client.pubsub()
    listener.subscribe(task.backend.get_key_for_task("task-1"))
    listener.get_message(timeout=1)  # the subscription's confirmation

    claim = leases.claim("task-1", _started(task))

    assert claim.token and claim.finished is None
    assert client.get("lanes:run:task-1").decode() == claim.token
    assert 60_000 < client.pttl("lanes:run:task-1") <= 65_000
    result = AsyncResult("task-1", app=task.app)
    assert result.state == states.STARTED
    assert result.info == {"pid": os.getpid(), "hostname": "gpu@host"}  # what Celery's tracer stores
    key = task.backend.get_key_for_task("task-1")
    assert 0 < client.ttl(key) <= task.backend.expires
    # Published as Celery's Redis backend publishes every state (result.get() listens there).
    message = listener.get_message(timeout=2)
    assert message and task.backend.decode(message["data"])["status"] == states.STARTED
    listener.close()


def test_a_second_delivery_finds_the_lease_taken_and_writes_nothing(route):
    task, client = route
    leases = RunLeases(client, prefix="lanes", ttl_seconds=60)
    first = leases.claim("task-1", _started(task))
    task.backend.store_result("task-1", {"progress": 1}, "PROGRESS")  # the first delivery's own state

    second = leases.claim("task-1", _started(task))

    assert second.token is None and second.finished is None
    assert client.get("lanes:run:task-1").decode() == first.token
    assert AsyncResult("task-1", app=task.app).state == "PROGRESS"


@pytest.mark.parametrize("end", [states.SUCCESS, states.FAILURE, states.REVOKED])
def test_a_copy_of_an_ended_task_takes_no_lease_and_leaves_its_result(route, end):
    task, client = route
    result = {states.SUCCESS: {"answer": "kept"}, states.FAILURE: ValueError("boom"),
              states.REVOKED: None}[end]
    task.backend.store_result("task-1", result, end)
    before = client.get(task.backend.get_key_for_task("task-1"))

    claim = RunLeases(client, prefix="lanes", ttl_seconds=60).claim("task-1", _started(task))

    assert claim.token is None and claim.finished == end
    assert client.get("lanes:run:task-1") is None
    assert client.get(task.backend.get_key_for_task("task-1")) == before


def test_a_task_revoked_through_lanes_takes_no_lease_and_writes_nothing(route):
    task, client = route
    client.set("lanes:revoked:task-1", 1)  # what LanesClient.revoke leaves for later deliveries

    claim = RunLeases(client, prefix="lanes", ttl_seconds=60).claim("task-1", _started(task))

    assert claim == Claim(revoked=True)
    assert client.get("lanes:run:task-1") is None
    assert client.get(task.backend.get_key_for_task("task-1")) is None  # the worker stores REVOKED


def test_an_ended_task_stays_ended_when_revoked_afterwards(route):
    task, client = route
    task.backend.store_result("task-1", {"answer": "kept"}, states.SUCCESS)
    client.set("lanes:revoked:task-1", 1)

    claim = RunLeases(client, prefix="lanes", ttl_seconds=60).claim("task-1", _started(task))

    assert claim == Claim(finished=states.SUCCESS)


def test_a_released_lease_lets_the_next_delivery_run(route):
    task, client = route
    leases = RunLeases(client, prefix="lanes", ttl_seconds=60)
    first = leases.claim("task-1", _started(task))
    leases.release("task-1", "not-the-token")  # a stale holder ends nothing
    assert leases.claim("task-1", _started(task)).token is None
    leases.release("task-1", first.token)
    assert leases.claim("task-1", _started(task)).token


def test_a_lease_whose_task_ended_is_kept_until_the_outcome_is_stored_and_then_lapses(route):
    task, client = route
    leases = RunLeases(client, prefix="lanes", ttl_seconds=60)
    first = leases.claim("task-1", _started(task))
    # The task returned; Celery stores its result only after that. A copy
    # delivered in between must not find a free lease beside a STARTED result.
    leases.release("task-1", first.token, ended=True)
    assert leases.claim("task-1", _started(task)) == Claim()
    assert client.get("lanes:run:task-1").decode() == first.token
    assert leases.renew_all() == 0  # no longer renewed: it lapses on its own
    task.backend.store_result("task-1", {"answer": "once"}, states.SUCCESS)
    assert leases.claim("task-1", _started(task)).finished == states.SUCCESS

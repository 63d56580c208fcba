"""A retry Redis refuses to queue is tried again, then handed back: never dropped.

Real Celery, real Redis (a private server made to refuse writes the way a
full no-eviction server does: ``maxmemory 1``).
"""

from __future__ import annotations

import threading

import pytest
import redis
from celery.exceptions import Reject, Retry

from lanes.celery_client import make_celery
from workers.outcome import PatientRedisBackend, patient_backend_url, publish_retry


@pytest.fixture
def full_redis(fillable_redis):
    return fillable_redis


@pytest.fixture
def retrying_task(full_redis, make_settings):
    url, _ = full_redis
    app = make_celery(make_settings(redis_url=url), url)

    @app.task(bind=True, name="t", max_retries=None)
    def t(self):
        return None

    t.push_request(id="task-1", retries=0, called_directly=False, delivery_info={"routing_key": "q"})
    yield t
    t.pop_request()
    app.close()


def test_a_refused_retry_is_queued_once_redis_takes_writes_again(full_redis, retrying_task):
    url, admin = full_redis
    admin.config_set("maxmemory", 1)
    threading.Timer(1.0, admin.config_set, args=("maxmemory", 0)).start()
    with pytest.raises(Retry):
        publish_retry(retrying_task, countdown=0, queue="q", pauses=(0.3,) * 20)
    assert admin.llen("q") == 1


def test_a_retry_refused_for_good_hands_the_message_back(full_redis, retrying_task):
    _, admin = full_redis
    admin.config_set("maxmemory", 1)
    # Celery's own retry drops the delivery when its publish is refused ...
    with pytest.raises(Reject) as dropped:
        retrying_task.retry(countdown=0, queue="q")
    assert dropped.value.requeue is False
    # ... this one gives the message back to the broker instead.
    with pytest.raises(Reject) as handed_back:
        publish_retry(retrying_task, countdown=0, queue="q", pauses=(0.05, 0.05))
    assert handed_back.value.requeue is True
    assert admin.llen("q") == 0


def test_the_result_backend_retries_a_full_redis(full_redis):
    url, admin = full_redis
    assert patient_backend_url(url) == f"workers.outcome:PatientRedisBackend+{url}"
    backend = PatientRedisBackend(app=make_celery_for(url), url=url)
    assert backend.exception_safe_to_retry(redis.exceptions.OutOfMemoryError("full"))
    assert backend.exception_safe_to_retry(redis.exceptions.ConnectionError("gone"))
    assert not backend.exception_safe_to_retry(ValueError("a bug"))


def make_celery_for(url):
    from lanes.settings import Settings

    return make_celery(Settings(redis_url=url), url)


@pytest.fixture
def stored(redis_url):
    """A worker app's result backend on ``redis_url`` (both Redis versions), and a client of that database."""
    app = make_celery_for(redis_url)
    app.conf.update(result_backend=patient_backend_url(redis_url), result_expires=600)
    client = redis.Redis.from_url(redis_url)
    yield app.backend, client
    client.close()
    app.close()


def test_a_stored_success_is_never_overwritten(stored):
    backend, client = stored
    backend.mark_as_done("task-a", {"answer": 1})
    # A late copy of the task (its worker was lost) ends later, another way.
    backend.mark_as_failure("task-a", ValueError("late copy"))
    backend.mark_as_retry("task-a", ValueError("late copy"))
    meta = backend.get_task_meta("task-a")
    assert meta["status"] == "SUCCESS" and meta["result"] == {"answer": 1}
    # Any other state is replaced, as Celery's own store does.
    backend.mark_as_retry("task-b", ValueError("busy"))
    backend.mark_as_done("task-b", 2)
    assert backend.get_task_meta("task-b")["status"] == "SUCCESS"


def test_a_state_is_stored_with_its_expiry_and_told_to_waiting_clients(stored):
    backend, client = stored
    key = backend.get_key_for_task("task-c")
    listener = client.pubsub()
    listener.subscribe(key)
    assert listener.get_message(timeout=5)["type"] == "subscribe"
    backend.mark_as_done("task-c", "ok")
    told = listener.get_message(timeout=5)
    listener.close()
    assert told is not None and told["data"] == client.get(key)
    assert 590_000 < client.pttl(key) <= 600_000
    assert backend.get_task_meta("task-c")["result"] == "ok"


def test_a_state_is_stored_in_one_round_trip(stored, embedded_redis):
    backend, client = stored
    if client.connection_pool.connection_kwargs.get("port") != redis.Redis.from_url(embedded_redis.url).connection_pool.connection_kwargs.get("port"):
        pytest.skip("counts the server's commands: only on the tests' own server")
    backend.mark_as_done("task-warm", 0)  # loads the script
    before = client.info("commandstats")
    backend.mark_as_done("task-d", 1)
    after = client.info("commandstats")
    calls = {name: after[name]["calls"] - before.get(name, {}).get("calls", 0) for name in after
             if name != "cmdstat_info"}  # the count itself
    # Celery's own store reads the state first (a GET), then writes it (a
    # pipeline: SETEX, PUBLISH). Here one script does all three on the server
    # (the commands it runs are counted too, hence the GET and the SET).
    assert calls.get("cmdstat_evalsha", 0) == 1, calls
    assert calls.get("cmdstat_setex", 0) == 0, calls
    assert {name for name, n in calls.items() if n} == {"cmdstat_evalsha", "cmdstat_get", "cmdstat_set",
                                                       "cmdstat_publish"}, calls

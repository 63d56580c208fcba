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

"""The broker transport keeps one Redis client per channel, and a new one after a reconnect.

Real Celery, real Redis: a task published, consumed and acknowledged late.
"""

from __future__ import annotations

import redis
from kombu import Consumer, Producer, Queue

from lanes.broker import Channel, Transport
from lanes.celery_client import make_celery


def counting_clients(monkeypatch) -> list:
    made = []
    original = redis.Redis.__init__

    def init(self, *args, **kwargs):
        made.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(redis.Redis, "__init__", init)
    return made


def test_a_redis_broker_uses_the_lanes_transport(one_redis_url, make_settings):
    app = make_celery(make_settings(redis_url=one_redis_url), one_redis_url)
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, Transport)
    app.close()


def test_publishing_and_acknowledging_reuse_one_client(one_redis_url, make_settings, monkeypatch):
    app = make_celery(make_settings(redis_url=one_redis_url), one_redis_url)
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        assert isinstance(channel, Channel)
        queue = Queue("lanes-broker-test")
        producer = Producer(channel)
        made = counting_clients(monkeypatch)
        for n in range(20):
            producer.publish({"n": n}, routing_key="lanes-broker-test", declare=[queue])
        received = []
        with Consumer(channel, queues=[queue],
                               callbacks=[lambda body, message: (received.append(body), message.ack())],
                               accept=["json"]):
            while len(received) < 20:
                conn.drain_events(timeout=5)
        assert [body["n"] for body in received] == list(range(20))
        # kombu's own transport builds a client per publish, per delivery and per ack (60+ here).
        assert len(made) <= 2, f"{len(made)} redis clients built for 20 publishes and acks"
        assert channel.client.ping()
    app.close()


def test_a_closed_pool_gets_a_new_client(one_redis_url, make_settings):
    app = make_celery(make_settings(redis_url=one_redis_url), one_redis_url)
    with app.connection_for_write() as conn:
        channel = conn.default_channel
        first = channel._create_client()
        assert channel._create_client() is first
        channel._pool = None  # what kombu does when the connection is lost and reopened
        second = channel._create_client()
        assert second is not first and second.connection_pool is channel.pool
        assert second.ping()
    app.close()

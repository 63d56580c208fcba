"""The stale sweep gives back only what is still stale (lanes/broker.py).

Every worker sweeps the one unacknowledged index, and a message keeps its
delivery tag when it goes back to its queue. A sweep that read a tag as stale
must not restore it once another sweep gave it back and a live worker took it
again under that tag: that copied a live delivery into the queue (the same
task twice in flight; a fleet worker killed with 600 waiters saw seven tasks
called twice). Real Redis, kombu consumers on Lanes' transport.
"""

from __future__ import annotations

import time

import pytest
import redis
from kombu import Connection, Consumer, Producer, Queue

from lanes.broker import refresh_held, restore_if_stale, restore_stale

QUEUE = "lanes.stale-test"
OPTIONS = {"priority_steps": [0, 3, 6], "sep": ":", "queue_order_strategy": "priority"}
TRANSPORT = "lanes.broker:Transport"


@pytest.fixture
def connect(redis_url):
    opened: list[Connection] = []

    def open_one() -> Connection:
        connection = Connection(redis_url, transport=TRANSPORT, transport_options=OPTIONS)
        opened.append(connection)
        return connection

    yield open_one
    for connection in opened:
        connection.release()


def take_one(connection: Connection):
    """The next message of the queue, taken and held (not acknowledged)."""
    taken: list = []
    with Consumer(connection, queues=[Queue(QUEUE)], callbacks=[lambda body, message: taken.append(message)],
                  accept=["json"]):
        deadline = time.monotonic() + 10
        while not taken:
            connection.drain_events(timeout=max(0.1, deadline - time.monotonic()))
    return taken[0]


def age(client: redis.Redis, tag: str, seconds: float) -> None:
    """The holder of ``tag`` last refreshed it ``seconds`` ago."""
    client.zadd("unacked_index", {tag: time.time() - seconds})


def test_a_tag_given_back_and_taken_again_meanwhile_is_not_restored_a_second_time(redis_url, connect):
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    publisher, dead, live = connect(), connect(), connect()
    Producer(publisher.channel()).publish({"n": 1}, routing_key=QUEUE, exchange="", serializer="json",
                                          declare=[Queue(QUEUE)])
    tag = take_one(dead).delivery_tag
    age(client, tag, 60)
    cutoff = time.time() - 30
    # Two sweeps read the same stale tag; the first gives the message back and
    # a live worker takes it again, under the same tag.
    assert client.zrangebyscore("unacked_index", "-inf", cutoff) == [tag.encode()]
    assert restore_stale(publisher.default_channel, 30, time.time()) == 1
    assert take_one(live).delivery_tag == tag
    assert client.llen(QUEUE) == 0

    # The second sweep comes to the tag it read: the live delivery stays alone.
    channel = publisher.default_channel
    assert restore_if_stale(channel, client, tag, cutoff) is False
    assert client.llen(QUEUE) == 0
    assert client.hexists("unacked", tag) and client.zscore("unacked_index", tag) > cutoff

    # What kombu's restore_by_tag does there: a copy of the live delivery in the queue.
    channel.qos.restore_by_tag(tag, client)
    assert client.llen(QUEUE) == 1


def test_a_holder_that_refreshes_before_the_restore_keeps_its_message(redis_url, connect):
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    publisher, holder = connect(), connect()
    Producer(publisher.channel()).publish({"n": 2}, routing_key=QUEUE, exchange="", serializer="json",
                                          declare=[Queue(QUEUE)])
    tag = take_one(holder).delivery_tag
    age(client, tag, 60)
    cutoff = time.time() - 30
    # A slow holder (its refresh came late) refreshes after the sweep read its tag.
    assert refresh_held(holder.default_channel, [tag], time.time()) == 1
    assert restore_if_stale(publisher.default_channel, client, tag, cutoff) is False
    assert client.llen(QUEUE) == 0 and client.hexists("unacked", tag)

    # Left unrefreshed past the lease, it goes back (once).
    age(client, tag, 60)
    assert restore_if_stale(publisher.default_channel, client, tag, cutoff) is True
    assert client.llen(QUEUE) == 1 and not client.hexists("unacked", tag)
    assert restore_if_stale(publisher.default_channel, client, tag, cutoff) is False
    assert client.llen(QUEUE) == 1


def test_kombus_periodic_sweep_on_lanes_transport_checks_staleness_too(redis_url, connect):
    """Workers with an event loop sweep through the QoS (``restore_visible``)."""
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    publisher, dead, live = connect(), connect(), connect()
    for n in (1, 2):
        Producer(publisher.channel()).publish({"n": n}, routing_key=QUEUE, exchange="", serializer="json",
                                              declare=[Queue(QUEUE)])
    stale_tag = take_one(dead).delivery_tag
    fresh_tag = take_one(live).delivery_tag
    qos = publisher.default_channel.qos
    age(client, stale_tag, qos.visibility_timeout + 60)

    qos.restore_visible(num=10, interval=1)

    assert client.llen(QUEUE) == 1 and not client.hexists("unacked", stale_tag)
    assert client.hexists("unacked", fresh_tag)

"""A message a worker receives is never outside Redis unrecorded (lanes/broker.py).

kombu's Redis channel pops a message (BRPOP) and records it as unacknowledged
with a second command; a consumer killed between the two lost the message.
Lanes' channel takes and records it in one script and waits for a publish on
its queues' bells. Real parts: Redis 6.2 (embedded) and 7 (the machine's),
kombu consumers on Lanes' transport, one of them a process SIGKILLed in that
instant.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
import redis
from kombu import Connection, Consumer, Producer, Queue

from lanes.broker import bell_key, restore_stale

QUEUE = "lanes.receive-test"
OTHER = "lanes.receive-test-other"
# Lanes' broker options that shape the keys and their order (lanes/celery_client.py).
OPTIONS = {"priority_steps": [0, 3, 6], "sep": ":", "queue_order_strategy": "priority"}
TRANSPORT = "lanes.broker:Transport"

# A consumer that dies the instant after the broker's reply is read, before the
# delivery reaches kombu's QoS: where kombu's two-step receive had popped the
# message and not yet recorded it. kombu builds the delivered Message right
# there (virtual Channel.basic_consume's callback, then qos.append).
KILLED_ON_RECEIPT = r"""
import json, os, signal, sys
from kombu import Connection, Consumer, Queue
from kombu.transport.virtual import base

def killed_on_receipt(self, payload, channel=None, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

base.Message.__init__ = killed_on_receipt
url, transport, queue = sys.argv[1:4]
options = {"priority_steps": [0, 3, 6], "sep": ":", "queue_order_strategy": "priority",
           **json.loads(sys.argv[4] if len(sys.argv) > 4 else "{}"), "brpop_timeout": 30}
with Connection(url, transport=transport, transport_options=options) as connection:
    with Consumer(connection, queues=[Queue(queue)], callbacks=[lambda body, message: None], accept=["json"]):
        try:
            connection.drain_events(timeout=1)  # the first take finds nothing: now it waits
        except TimeoutError:
            pass
        print("waiting", flush=True)
        connection.drain_events(timeout=60)
"""


@pytest.fixture
def connection(redis_url):
    with Connection(redis_url, transport=TRANSPORT, transport_options=OPTIONS) as conn:
        yield conn


def publish(connection, body, *, queue: str = QUEUE, priority: int = 0) -> None:
    Producer(connection.channel()).publish(body, routing_key=queue, exchange="", serializer="json",
                                           priority=priority, declare=[Queue(queue)])


def receive(connection, queues, count: int, *, ack: bool = True, timeout: float = 10.0) -> list:
    received: list = []

    def on_message(body, message) -> None:
        received.append(body)
        if ack:
            message.ack()

    with Consumer(connection, queues=[Queue(q) for q in queues], callbacks=[on_message], accept=["json"]):
        deadline = time.monotonic() + timeout
        while len(received) < count:
            connection.drain_events(timeout=max(0.1, deadline - time.monotonic()))
    return received


def test_a_consumer_killed_between_receipt_and_record_loses_nothing(redis_url, connection):
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    child = subprocess.Popen([sys.executable, "-c", KILLED_ON_RECEIPT, redis_url, TRANSPORT, QUEUE],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "waiting"
        time.sleep(0.2)  # its wait on the queue's bell is sent
        publish(connection, {"n": "the one"})
        assert child.wait(30) == -9  # killed on receipt: the message had left its queue
    finally:
        if child.poll() is None:
            child.kill()
    assert client.llen(QUEUE) == 0
    assert client.hlen("unacked") == 1  # recorded as held, by a worker that no longer refreshes it

    # A live worker gives back what its holder stopped refreshing (HeldMessages' sweep).
    assert restore_stale(connection.default_channel, 0.0, time.time() + 1) == 1
    assert receive(connection, [QUEUE], 1) == [{"n": "the one"}]
    assert client.hlen("unacked") == 0 and client.zcard("unacked_index") == 0


def test_messages_come_in_priority_then_queue_then_arrival_order_and_are_recorded_until_acked(redis_url, connection):
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    for name, queue, priority in [("a", QUEUE, 6), ("b", QUEUE, 0), ("c", OTHER, 3), ("d", OTHER, 0),
                                  ("e", QUEUE, 3), ("f", QUEUE, 0), ("g", OTHER, 6)]:
        publish(connection, {"n": name}, queue=queue, priority=priority)

    # kombu's order for a consumer of two queues: each priority step, in it each
    # queue (as listed), in it the oldest first.
    held = receive(connection, [QUEUE, OTHER], 7, ack=False)
    assert [body["n"] for body in held] == ["b", "f", "d", "e", "c", "a", "g"]
    assert client.hlen("unacked") == 7 and client.zcard("unacked_index") == 7
    connection.default_channel.qos.restore_unacked()  # what a closing channel does with what it holds
    again = receive(connection, [QUEUE, OTHER], 7)
    assert sorted(body["n"] for body in again) == sorted(body["n"] for body in held)
    assert client.hlen("unacked") == 0


def test_a_waiting_consumer_is_woken_by_a_publish_and_a_forgotten_script_is_sent_again(redis_url):
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    received: list = []
    # The wait ends on its own only after 30 s; a publish wakes it.
    options = {**OPTIONS, "brpop_timeout": 30}
    with Connection(redis_url, transport=TRANSPORT, transport_options=options) as conn, \
            Connection(redis_url, transport=TRANSPORT, transport_options=OPTIONS) as other:
        with Consumer(conn, queues=[Queue(QUEUE)], accept=["json"],
                      callbacks=[lambda body, message: (received.append(body), message.ack())]):
            with pytest.raises(TimeoutError):
                conn.drain_events(timeout=0.5)  # took nothing, now waits on the bell
            publish(other, {"n": 1}, priority=3)
            conn.drain_events(timeout=10)
            assert received == [{"n": 1}]
            assert client.xlen(bell_key(QUEUE, ":")) == 1  # a bell keeps one entry

            client.script_flush()  # as a restarted Redis would have
            publish(other, {"n": 2})
            while len(received) < 2:
                conn.drain_events(timeout=10)
            assert received == [{"n": 1}, {"n": 2}]


def test_a_consumer_without_acknowledgements_leaves_no_record(redis_url, connection):
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    publish(connection, {"n": 1})
    received: list = []
    with Consumer(connection, queues=[Queue(QUEUE)], callbacks=[lambda body, message: received.append(body)],
                  accept=["json"], no_ack=True):
        while not received:
            connection.drain_events(timeout=10)
    assert received == [{"n": 1}]
    assert client.hlen("unacked") == 0 and client.zcard("unacked_index") == 0

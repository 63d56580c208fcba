"""A task handed back at shutdown leaves the next holder's record alone (workers/handback.py).

``hand_back_at_front`` restores a cancelled task's message to the front of
its queue, and the task then ends with ``Ignore``, which Celery acknowledges.
A message keeps its delivery tag across deliveries, so when another worker
had taken the message back in between (it waits on the queue's bell), that
acknowledgement deleted the new holder's record of it; the new holder's own
hand-back then found nothing to put back and the task was gone. Real parts:
Redis, Lanes' broker transport, a Celery request built as the worker builds
it; the other worker's take is made between the two steps on purpose.
"""

from __future__ import annotations

import threading
import time

import pytest
import redis
from celery import Celery
from celery.worker import state as worker_state
from celery.worker.request import Request
from kombu import Connection, Consumer, Queue

from workers.handback import hand_back_at_front

QUEUE = "lanes.handback-ack-test"
TASK = "lanes.test.handback-ack"
OPTIONS = {"priority_steps": [0, 3, 6], "sep": ":", "queue_order_strategy": "priority"}
TRANSPORT = "lanes.broker:Transport"


@pytest.fixture
def app(redis_url):
    app = Celery("handback-ack", broker=redis_url, set_as_current=False)
    app.conf.update(broker_transport=TRANSPORT, broker_transport_options=OPTIONS, task_acks_late=True)

    @app.task(name=TASK, shared=False)
    def ended() -> None:
        return None

    yield app
    app.close()


def connection(redis_url) -> Connection:
    return Connection(redis_url, transport=TRANSPORT, transport_options=OPTIONS)


def take(conn: Connection, timeout: float = 10.0):
    taken: list = []
    consumer = Consumer(conn, queues=[Queue(QUEUE)], callbacks=[lambda body, message: taken.append(message)],
                        accept=["json"])
    consumer.consume()
    deadline = time.monotonic() + timeout
    while not taken:
        conn.drain_events(timeout=max(0.1, deadline - time.monotonic()))
    consumer.cancel()
    return taken[0]


def celery_request(app, message) -> Request:
    """The request Celery's worker builds for ``message``: its acknowledgement acks the message."""
    return Request(message, app=app, task=app.tasks[TASK],
                   on_ack=lambda logger, errors: message.ack_log_error(logger, errors))


def test_a_handed_back_task_taken_again_keeps_its_new_record_when_the_first_delivery_ends(app, redis_url):
    client = redis.Redis.from_url(redis_url)
    app.send_task(TASK, queue=QUEUE)
    with connection(redis_url) as stopping, connection(redis_url) as other:
        first = take(stopping)
        tag = first.delivery_tag
        unacked = first.channel.unacked_key
        request = celery_request(app, first)
        not_taking = threading.Event()
        not_taking.set()
        worker_state.active_requests.add(request)
        try:
            assert hand_back_at_front(request.id, not_taking, wait=1.0)
        finally:
            worker_state.active_requests.discard(request)
        assert not client.hexists(unacked, tag), "the hand-back gives the record back with the message"

        second = take(other)  # the fleet's other worker, at once
        assert second.delivery_tag == tag
        assert client.hexists(unacked, tag)

        request.acknowledge()  # what Celery does when the handed-back task ends with Ignore
        assert client.hexists(unacked, tag), "the first delivery's end deleted the new holder's record"
        qos = first.channel.qos
        qos._flush()
        assert tag not in qos._delivered, "the stopping worker still counts the message as held"

        # The other worker is stopped too: its hand-back finds the record and puts the message back.
        other_request = celery_request(app, second)
        worker_state.active_requests.add(other_request)
        try:
            assert hand_back_at_front(other_request.id, not_taking, wait=1.0)
        finally:
            worker_state.active_requests.discard(other_request)
        other_request.acknowledge()
        queued = sum(client.llen(key) for key in client.keys(f"{QUEUE}*") if client.type(key) == b"list")
        assert queued == 1
        assert not client.hexists(unacked, tag)

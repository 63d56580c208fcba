"""A shutdown hand-back that may have lost a message says so (workers/handback.py).

``finish_pending_brpop`` reads the reply of a stopping worker's pending
BRPOP. When that reply cannot be read after the server popped a message
into it, the message is gone from its queue with no other trace: the
hand-back logs it and counts it in ``lanes_handback_possibly_lost_total``.
Real parts: a private redis-server, kombu's Redis transport, and the fault
proxy of the lane tests between them, which lets the reply arrive in part.
"""

from __future__ import annotations

import logging
import os
import time

import pytest
import redis
from kombu import Connection
from prometheus_client import REGISTRY

from lanes.broker import TAKE, restore_stale
from lanes.embedded import EmbeddedRedis
from tests.lane.faultproxy import FaultProxy
from workers.handback import finish_pending_brpop

QUEUE = "handback-loss"


def lost(reason: str) -> float:
    return REGISTRY.get_sample_value("lanes_handback_possibly_lost_total", {"reason": reason}) or 0.0


@pytest.fixture
def server(tmp_path):
    redis_server = EmbeddedRedis(tmp_path / "redis")
    redis_server.ensure()
    yield redis_server
    redis_server.stop()


@pytest.fixture
def proxy(server):
    fault = FaultProxy("127.0.0.1", server.port)
    yield fault
    fault.close()


@pytest.fixture
def stopping_channel(proxy):
    """A channel through the proxy that consumed ``QUEUE`` and was then
    cancelled (as StopTaking does), with its BRPOP still pending."""
    connection = Connection(proxy.url(0), transport_options={"brpop_timeout": 1})
    channel = connection.channel()
    channel.queue_declare(QUEUE)
    channel.basic_consume(QUEUE, False, lambda message: None, "handback-test")

    def send_brpop() -> None:
        # What the worker's event loop does for a consuming channel: connect
        # its BRPOP connection and send the BRPOP.
        connection.transport.cycle._register_BRPOP(channel)
        assert channel._in_poll

    channel.send_brpop = send_brpop
    channel.cancel = lambda: channel.basic_cancel("handback-test")
    yield channel
    try:
        connection.release()
    except Exception:  # noqa: BLE001 - its socket may be the one the proxy cut
        pass


def publish(url: str, body: dict) -> None:
    with Connection(url) as producer_connection:
        producer_connection.Producer().publish(body, routing_key=QUEUE, exchange="", serializer="json")


def wait_until(predicate, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def queued(client: redis.Redis) -> int:
    return sum(client.llen(key) for key in client.scan_iter(match=f"{QUEUE}*") if client.type(key) == b"list")


def test_a_reply_lost_mid_read_after_the_pop_is_logged_and_counted(server, proxy, stopping_channel, caplog):
    direct = redis.Redis.from_url(server.url, socket_timeout=5)
    proxy.cut_mid_reply_to(b"BRPOP")
    stopping_channel.send_brpop()
    stopping_channel.cancel()
    before = lost("reply_unread")
    publish(server.url, {"task": "handed back"})
    wait_until(lambda: queued(direct) == 0)  # the server popped it into the pending BRPOP's reply

    with caplog.at_level(logging.WARNING, logger="lanes.worker"):
        finish_pending_brpop(stopping_channel)

    assert lost("reply_unread") == before + 1
    assert "may have lost a message" in caplog.text and "reply_unread" in caplog.text
    assert queued(direct) == 0  # the loss is real: the message is nowhere in its queue


def test_a_reply_read_whole_puts_the_message_back_and_counts_nothing(server, stopping_channel, caplog):
    direct = redis.Redis.from_url(server.url, socket_timeout=5)
    stopping_channel.send_brpop()
    stopping_channel.cancel()
    before = (lost("reply_unread"), lost("reply_unanswered"))
    publish(server.url, {"task": "handed back"})
    wait_until(lambda: queued(direct) == 0)

    with caplog.at_level(logging.WARNING, logger="lanes.worker"):
        finish_pending_brpop(stopping_channel)

    assert queued(direct) == 1  # kombu requeued the undeliverable message
    assert (lost("reply_unread"), lost("reply_unanswered")) == before
    assert "may have lost" not in caplog.text


@pytest.fixture
def crowded_fds():
    """Over a thousand open files first, as a long-running worker may hold:
    the next sockets are numbered past select.select's limit (1024)."""
    files = [open(os.devnull) for _ in range(1100)]
    yield
    for f in files:
        f.close()


def test_a_reply_on_a_socket_numbered_past_1024_puts_the_message_back(crowded_fds, server, stopping_channel, caplog):
    direct = redis.Redis.from_url(server.url, socket_timeout=5)
    stopping_channel.send_brpop()
    stopping_channel.cancel()
    assert stopping_channel.client.connection._sock.fileno() > 1024
    publish(server.url, {"task": "handed back"})
    wait_until(lambda: queued(direct) == 0)

    with caplog.at_level(logging.WARNING, logger="lanes.worker"):
        finish_pending_brpop(stopping_channel)

    assert queued(direct) == 1  # read and put back, not skipped
    assert "may have lost" not in caplog.text


def test_an_empty_reply_counts_nothing(stopping_channel):
    stopping_channel.send_brpop()
    stopping_channel.cancel()
    before = (lost("reply_unread"), lost("reply_unanswered"))
    finish_pending_brpop(stopping_channel)  # the server answers nil after brpop_timeout (1 s)
    assert (lost("reply_unread"), lost("reply_unanswered")) == before
    assert not stopping_channel._in_poll


@pytest.mark.slow
def test_a_reply_that_never_comes_is_logged_and_counted(proxy, stopping_channel, caplog):
    # A BRPOP of 5 s: the silence below must begin before the server's empty
    # answer (with the fixture's 1 s, a test thread held up for a second let it through).
    stopping_channel.brpop_timeout = 5
    stopping_channel.send_brpop()
    stopping_channel.cancel()
    proxy.blackhole(True)  # the BRPOP's answer is held: the connection went silent
    before = lost("reply_unanswered")
    try:
        with caplog.at_level(logging.WARNING, logger="lanes.worker"):
            finish_pending_brpop(stopping_channel)  # waits brpop_timeout + 1 s, then gives up
    finally:
        proxy.blackhole(False)
    assert lost("reply_unanswered") == before + 1
    assert "reply_unanswered" in caplog.text


def test_on_the_lanes_transport_a_take_cut_mid_reply_loses_nothing_and_counts_nothing(server, proxy, caplog):
    """Lanes' transport records what it takes in the same step (lanes/broker.py):
    the message of a reply that cannot be read is in the unacked record, and a
    live worker gives it back (HeldMessages' sweep)."""
    direct = redis.Redis.from_url(server.url, socket_timeout=5)
    direct.script_load(TAKE)  # as a running deployment has it (a first take would be refused NOSCRIPT)
    publish(server.url, {"task": "taken"})
    connection = Connection(proxy.url(0), transport="lanes.broker:Transport", transport_options={"brpop_timeout": 1})
    try:
        channel = connection.channel()
        channel.queue_declare(QUEUE)
        channel.basic_consume(QUEUE, False, lambda message: None, "handback-test")
        proxy.cut_mid_reply_to(b"EVALSHA")
        connection.transport.cycle._register_BRPOP(channel)  # sends the take
        channel.basic_cancel("handback-test")
        wait_until(lambda: queued(direct) == 0)
        before = (lost("reply_unread"), lost("reply_unanswered"))
        with caplog.at_level(logging.WARNING, logger="lanes.worker"):
            finish_pending_brpop(channel)
        assert (lost("reply_unread"), lost("reply_unanswered")) == before
        assert "may have lost" not in caplog.text
    finally:
        try:
            connection.release()
        except Exception:  # noqa: BLE001 - its socket is the one the proxy cut
            pass
    assert direct.hlen("unacked") == 1
    with Connection(server.url, transport="lanes.broker:Transport") as live:
        assert restore_stale(live.default_channel, 0.0, time.time() + 1) == 1
    assert queued(direct) == 1

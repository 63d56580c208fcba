"""The doorbell's lean reply read (lanes/lane/wire.py) against real Redis."""

from __future__ import annotations

import threading

import pytest
import redis
from redis._parsers import _RESP2Parser

from lanes import Priority
from lanes.lane.hub import close_hubs
from lanes.lane.wire import READ_SIZE, read_reply
from tests.polling import eventually


@pytest.fixture
def client(one_redis_url):
    client = redis.Redis.from_url(one_redis_url, socket_timeout=5)
    yield client
    client.close()


def subscribed(client, channel):
    pubsub = client.pubsub()
    pubsub.subscribe(channel)
    assert pubsub.get_message(timeout=5)["type"] == "subscribe"
    return pubsub


@pytest.mark.parametrize("protocol", [2, 3])
def test_reads_a_published_message_off_the_hiredis_reader(one_redis_url, protocol):
    client = redis.Redis.from_url(one_redis_url, socket_timeout=5, protocol=protocol)
    pubsub = subscribed(client, "lanes:test:wire")
    try:
        buffer = bytearray(READ_SIZE)

        def not_this_path(*args, **kwargs):
            raise AssertionError("the hiredis connection must be read off its reader directly")

        pubsub.connection.read_response = not_this_path
        client.publish("lanes:test:wire", "w1 5 6")
        client.publish("lanes:test:wire", "w2 5 7")
        # The second may arrive in the same read: it is kept in the reader.
        assert read_reply(pubsub.connection, buffer) == [b"message", b"lanes:test:wire", b"w1 5 6"]
        assert read_reply(pubsub.connection, buffer) == [b"message", b"lanes:test:wire", b"w2 5 7"]
        # Anything else (here a subscription's confirmation) is still read
        # whole and handed over as redis-py would.
        pubsub.connection.send_command("SUBSCRIBE", "lanes:test:wire-2")
        assert read_reply(pubsub.connection, buffer)[:2] == [b"subscribe", b"lanes:test:wire-2"]
    finally:
        pubsub.close()
        client.close()


def test_an_error_reply_is_raised_and_the_connection_stays_usable(client):
    conn = client.connection_pool.get_connection()
    try:
        buffer = bytearray(READ_SIZE)
        conn.send_command("LPUSH")  # wrong number of arguments
        with pytest.raises(redis.ResponseError, match="wrong number of arguments"):
            read_reply(conn, buffer)
        conn.send_command("PING")
        assert read_reply(conn, buffer) in (b"PONG", "PONG", True)
    finally:
        client.connection_pool.release(conn)


def test_a_connection_closed_by_the_server_raises_and_is_dropped(client):
    pubsub = subscribed(client, "lanes:test:wire-kill")
    try:
        conn = pubsub.connection
        host, port = conn._sock.getsockname()[:2]
        client.client_kill_filter(addr=f"{host}:{port}")
        with pytest.raises(redis.ConnectionError):
            read_reply(conn, bytearray(READ_SIZE))
        assert conn._sock is None, "dropped, so the next get_message reconnects"
    finally:
        pubsub.close()


def test_a_client_with_the_pure_python_parser_takes_redis_pys_own_read(one_redis_url, make_lane):
    client = redis.Redis.from_url(one_redis_url, socket_timeout=5, parser_class=_RESP2Parser)
    try:
        lane = make_lane(width=1, client=client)
        holder = lane.acquire(Priority.INTERACTIVE, 1.0)
        got = {}
        waiter = threading.Thread(target=lambda: got.setdefault("p", lane.acquire(Priority.BACKGROUND, 10.0)))
        waiter.start()
        eventually(lambda: lane.stats().queued_total == 1, what="the waiter queued")
        holder.release()
        waiter.join(5)
        assert got["p"].generation > holder.generation
        assert got["p"].release()
    finally:
        close_hubs(client)
        client.close()

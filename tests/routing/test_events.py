"""The routing event log: batched writes, capped length, filters."""

import threading
import time

import redis

from lanes.embedded import EmbeddedRedis
from lanes.routing.events import EventLog
from tests.lane.faultproxy import FaultProxy
from tests.polling import eventually


def test_events_are_written_in_the_background_and_listed_newest_first(one_redis_url):
    log = EventLog(redis.Redis.from_url(one_redis_url), prefix="lanes:test", flush_interval=0.02)
    log.record("lane_wait", pool="p1", workflow="w", wait_ms=1.5)
    log.record("lane_bypass", pool="p2", workflow="w", reason="forecast")
    deadline = time.monotonic() + 5
    while log.count() < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    events = log.list()
    assert [e.kind for e in events] == ["lane_bypass", "lane_wait"]
    assert events[1].detail == {"wait_ms": 1.5}
    assert [e.pool for e in log.list(kind="lane_wait")] == ["p1"]
    assert [e.kind for e in log.list(pool="p2")] == ["lane_bypass"]
    log.close()


def test_a_flush_that_returns_has_written_what_the_background_flusher_was_writing(tmp_path):
    # The background flusher takes the buffer and writes it over a silent link; a flush
    # called meanwhile finds the buffer empty, and must still return only once those
    # events are in the stream (a reader right after it saw none).
    server = EmbeddedRedis(tmp_path / "redis")
    server.ensure()
    proxy = FaultProxy("127.0.0.1", server.port)
    try:
        client = redis.Redis.from_url(proxy.url(0))
        client.ping()  # connected before the link goes silent
        log = EventLog(client, prefix="lanes:test", flush_interval=3600)
        log.record("share_change", workflow="w", change="held")
        proxy.blackhole(True)  # the other flush's write is held on its way to Redis
        background = threading.Thread(target=log.flush)
        background.start()
        eventually(lambda: not log._buffer, timeout=5, interval=0.005, what="the batch taken by the other flush")
        threading.Timer(0.5, proxy.blackhole, args=(False,)).start()
        log.flush()
        direct = EventLog(redis.Redis.from_url(server.url), prefix="lanes:test")
        assert [e.detail["change"] for e in direct.list(kind="share_change")] == ["held"]
        background.join(5)
        log.close()
    finally:
        proxy.close()
        server.stop()


def test_the_log_is_capped(one_redis_url):
    log = EventLog(redis.Redis.from_url(one_redis_url), prefix="lanes:test", max_len=100)
    for i in range(1000):
        log.record("lane_wait", pool="p", n=i)
    log.flush()
    # Approximate trimming keeps a little more than the cap, never the whole history.
    assert 100 <= log.count() < 1000
    assert log.list(limit=1)[0].detail == {"n": 999}


def test_disabled_events_write_nothing(one_redis_url):
    log = EventLog(redis.Redis.from_url(one_redis_url), prefix="lanes:test", enabled=False)
    log.record("lane_wait", pool="p")
    assert log.flush() == 0
    assert log.count() == 0


def test_since_and_limit_filter_the_listing(one_redis_url):
    log = EventLog(redis.Redis.from_url(one_redis_url), prefix="lanes:test")
    for i in range(30):
        log.record("lane_wait", pool="p", n=i)
    log.flush()
    assert len(log.list(limit=7)) == 7
    assert log.list(since=time.time() + 60) == []


def fill_to_the_limit(client) -> None:
    """Make a no-eviction Redis refuse every write (OutOfMemoryError)."""
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", int(client.info("memory")["used_memory"]) + 200_000)
    block = "x" * 50_000
    for i in range(100):
        try:
            client.set(f"ballast:{i}", block)
        except redis.exceptions.OutOfMemoryError:
            return
    raise AssertionError("Redis never reached its memory limit")


def test_the_flusher_outlives_a_full_redis_with_a_bounded_buffer_and_a_quiet_close(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis")  # private: its memory limit is ours to change
    client = redis.Redis.from_url(server.ensure(), socket_timeout=5)
    try:
        log = EventLog(client, prefix="lanes:test", flush_interval=0.02, max_len=100, max_buffer=50)
        fill_to_the_limit(client)
        for i in range(200):
            log.record("lane_wait", pool="p", n=i)
        assert len(log._buffer) <= 50 and log.dropped >= 150  # bounded in record() itself
        eventually(lambda: log._thread is not None and log.dropped >= 150, what="a failed flush")
        time.sleep(0.1)  # a few flush rounds against the full Redis
        assert log._thread.is_alive()
        client.config_set("maxmemory", 0)  # room again
        log.record("lane_wait", pool="p", n="after")
        eventually(lambda: [e.detail for e in log.list(limit=1)] == [{"n": "after"}],
                   what="the flusher to write again")
        fill_to_the_limit(client)
        log.record("lane_wait", pool="p", n="at close")
        log.close()  # never raises, whatever Redis says
    finally:
        client.close()
        server.stop()

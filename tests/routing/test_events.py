"""The routing event log: batched writes, capped length, filters."""

import time

import redis

from lanes.routing.events import EventLog


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

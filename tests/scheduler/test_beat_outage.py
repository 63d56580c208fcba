"""A beat outlives Redis: every beat stands by while Redis is away and comes
back in the role the lock gives it; a failed lock request never makes a
standby active. Real Redis servers that the tests stop and start again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import redis

from lanes.catalog import make_engine
from lanes.clock import SystemClock
from lanes.embedded import EmbeddedRedis
from lanes.memory import ensure_memory_schema, list_runs
from lanes.namespace import Namespace
from scheduler.role import BeatRole
from tests.memory.conftest import say
from tests.polling import eventually

KEY = "lanes:v2:beat:lock"


@pytest.fixture
def restartable_redis(tmp_path):
    """A private Redis (no persistence) on a port of its own that a test may stop and start again."""
    server = EmbeddedRedis(tmp_path / "restartable-redis", extra_args=("--appendonly", "no"))
    server.ensure()
    yield server
    server.stop()


def role(url: str, owner: str) -> BeatRole:
    client = redis.Redis.from_url(url, socket_timeout=0.5, socket_connect_timeout=0.5)
    return BeatRole(client, key=KEY, timeout_seconds=5, owner=owner)


def test_a_failed_lock_request_leaves_a_standby_standing_by_and_the_lock_decides_after(restartable_redis):
    url = restartable_redis.url
    a, b = role(url, "a"), role(url, "b")
    assert a.request() is True and b.request() is False
    restartable_redis.stop()
    # Requests fail: neither is active, nothing raises.
    assert [a.request(), b.request(), a.request(), b.request()] == [False, False, False, False]
    assert not a.active and not b.active
    restartable_redis.ensure()  # back, empty: the lock is free again
    assert b.request() is True and a.request() is False
    assert b.request() is True and a.request() is False


def test_the_holder_resumes_when_redis_comes_back_with_its_lock(restartable_redis):
    url = restartable_redis.url
    a, b = role(url, "a"), role(url, "b")
    assert a.request() is True
    admin = redis.Redis.from_url(url, socket_timeout=5)
    admin.execute_command("CLIENT", "PAUSE", 2000, "ALL")  # Redis keeps its data but answers nobody
    assert a.request() is False and not a.active  # it cannot know it still holds the lock: not active
    assert b.request() is False
    eventually(lambda: a.request(), timeout=20, what="the holder renewing its lock after the pause", interval=0.2)
    assert b.request() is False
    admin.close()


def start_beat(env: dict, log_path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "scheduler.main", "--loglevel", "INFO"], env=env,
                            stdout=subprocess.DEVNULL, stderr=open(log_path, "w"), start_new_session=True)


@pytest.mark.slow
def test_two_beats_survive_a_redis_outage_and_one_becomes_active_again(sqlite_url, restartable_redis, tmp_path):
    engine = make_engine(sqlite_url)
    ensure_memory_schema(engine)
    now = SystemClock().now()
    say(engine, "a", (now - timedelta(hours=2)).isoformat())
    url = restartable_redis.url
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANES_") or k.startswith("LANES_TEST_")}
    env.update(LANES_REDIS_URL=url, LANES_DATABASE_URL=sqlite_url, LANES_STATE_DIR=str(tmp_path / "state"),
               LANES_BEAT_LOCK_SECONDS="5", LANES_REDIS_TIMEOUT_SECONDS="1")
    names = Namespace("lanes:v2")
    logs = [tmp_path / f"beat-{i}.log" for i in range(2)]
    beats = [start_beat(env, path) for path in logs]

    def client() -> redis.Redis:
        return redis.Redis.from_url(url, socket_timeout=5)

    def owner():
        c = client()
        try:
            return c.hget(names.beat_active, "owner")
        except redis.RedisError:
            return None
        finally:
            c.close()

    def became_active() -> int:
        return sum(path.read_text().count("active: start-up scan") for path in logs)

    try:
        first = eventually(owner, timeout=60, what="an active beat", interval=0.2)
        eventually(lambda: len(list_runs(engine)) == 1, timeout=60, what="the start-up scan's run")
        assert became_active() == 1
        # Redis goes away for 10 s (the outage: every beat used to exit within 4 s).
        restartable_redis.stop()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            assert all(beat.poll() is None for beat in beats), "a beat exited while Redis was away"
            time.sleep(0.5)
        assert became_active() == 1, "a standby became active while no lock request could succeed"
        restartable_redis.ensure()  # back without its data: the lock is free
        second = eventually(owner, timeout=60, what="an active beat after the outage", interval=0.2)
        assert int(second.decode().rsplit(":", 1)[1]) in {beat.pid for beat in beats}
        eventually(lambda: became_active() == 2, timeout=30, what="one beat active again", interval=0.2)
        # Both still run; one is active, the other stands by (it never runs the scan).
        time.sleep(3)
        assert all(beat.poll() is None for beat in beats)
        assert became_active() == 2
        assert int(first.decode().rsplit(":", 1)[1]) in {beat.pid for beat in beats}
        text = "".join(path.read_text() for path in logs)
        assert "Traceback" not in text
        assert "Sending due task lane-check" not in text
    finally:
        for beat in beats:
            if beat.poll() is None:
                os.killpg(beat.pid, signal.SIGTERM)
        for beat in beats:
            try:
                beat.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(beat.pid, signal.SIGKILL)
        engine.dispose()

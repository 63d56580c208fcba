"""The beat: its UTC schedule driven by injected time, and one active beat
among two racing ones (real celery-redbeat lock, real Redis, real database)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import timedelta

import pytest
import redis
import sqlalchemy as sa

from lanes.catalog import make_engine
from lanes.clock import ManualClock
from lanes.memory import enqueue_runs, ensure_memory_schema, list_runs
from lanes.memory.tables import enqueue_state_t
from lanes.namespace import Namespace
from scheduler.beat import LANE_CHECK, MEMORY_TICK, beat_schedule
from tests.memory.conftest import say, utc
from tests.polling import eventually


def run_beat_clock(engine, start: str, hours: int) -> list[tuple[str, str]]:
    """Walk the schedule minute by minute, running each due entry as the beat would."""
    clock = ManualClock(utc(start))
    entries = {name: e for name, e in beat_schedule(nowfun=clock.now).items() if e["task"] == MEMORY_TICK}
    last_run = {name: clock.now() for name in entries}
    fired = []
    for _ in range(hours * 60):
        clock.advance(60)
        for name, entry in entries.items():
            due, _next = entry["schedule"].is_due(last_run[name])
            if due:
                last_run[name] = clock.now()
                fired.append((name, clock.now().strftime("%Y-%m-%d %H:%M")))
                enqueue_runs(engine, now=clock.now(), full=entry["kwargs"]["full"], retention_days=2, daily_cap=1000)
    return fired


def test_the_schedule_fires_at_hh02_and_the_full_scan_at_0302_across_a_year_end(memory_engine):
    # A message in every hour from the evening of 31 December to the morning of 1 January.
    first = utc("2026-12-31T20:30")
    say(memory_engine, "a", *[(first + timedelta(hours=h)).isoformat()[:16] for h in range(10)])
    fired = run_beat_clock(memory_engine, "2026-12-31T20:00", hours=9)  # up to 2027-01-01 05:00
    hourly = [at for name, at in fired if name == "memory-hourly"]
    assert hourly == [f"2026-12-31 {h}:02" for h in (20, 21, 22, 23)] + [f"2027-01-01 0{h}:02" for h in range(5)]
    assert [at for name, at in fired if name == "memory-full"] == ["2027-01-01 03:02"]
    # Every hour completed by the last tick (04:02) once; 04:00, in progress then, not yet.
    hours = sorted(r.hour.strftime("%Y-%m-%d %H") for r in list_runs(memory_engine, limit=100))
    assert hours == [f"2026-12-31 {h}" for h in (20, 21, 22, 23)] + [f"2027-01-01 0{h}" for h in range(4)]


def test_the_lane_check_polls_the_catalog_every_ten_seconds():
    entry = beat_schedule()["lane-check"]
    assert entry["task"] == LANE_CHECK and entry["schedule"] == 10.0


def start_beat(env: dict) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "scheduler.main", "--loglevel", "WARNING"], env=env,
                            start_new_session=True)


@pytest.mark.slow
def test_two_beats_racing_one_runs_the_other_takes_over_only_when_it_dies(postgres_url, one_redis_url, tmp_path):
    engine = make_engine(postgres_url)
    ensure_memory_schema(engine)
    say(engine, "a", "2020-01-01T00:00")  # far outside the retention window: never enqueued
    from lanes.clock import SystemClock

    now = SystemClock().now()
    for chat in range(20):
        say(engine, f"chat-{chat}", *[(now - timedelta(hours=h + 1)).isoformat() for h in range(3)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANES_") or k.startswith("LANES_TEST_")}
    env.update(LANES_REDIS_URL=one_redis_url, LANES_DATABASE_URL=postgres_url,
               LANES_STATE_DIR=str(tmp_path / "state"), LANES_BEAT_LOCK_SECONDS="5")
    client = redis.Redis.from_url(one_redis_url)
    names = Namespace("lanes:v2")
    beats = {}
    try:
        for _ in range(2):
            proc = start_beat(env)
            beats[proc.pid] = proc
        owner = eventually(lambda: client.hget(names.beat_active, "owner"), timeout=60, what="an active beat")
        first = int(owner.decode().rsplit(":", 1)[1])
        assert first in beats
        eventually(lambda: len(list_runs(engine, limit=1000)) == 60, timeout=60, what="the start-up scan's runs")
        assert client.exists(names.beat_lock)
        # Both keep running; the lock holder stays the only active beat.
        seen = client.hget(names.beat_active, "seen")
        eventually(lambda: client.hget(names.beat_active, "seen") != seen, timeout=30, what="a later tick")
        assert client.hget(names.beat_active, "owner") == owner
        assert all(proc.poll() is None for proc in beats.values())
        with engine.connect() as conn:
            first_tick = conn.execute(sa.select(enqueue_state_t.c.last_tick_at)).scalar_one()

        # New history in a completed hour, then the active beat dies without releasing its lock.
        say(engine, "late", (now - timedelta(hours=5)).isoformat())
        os.killpg(beats[first].pid, signal.SIGKILL)
        beats.pop(first).wait(10)
        second = next(iter(beats))
        eventually(lambda: client.hget(names.beat_active, "owner") not in (None, owner), timeout=60,
                   what="the second beat taking over")
        assert int(client.hget(names.beat_active, "owner").decode().rsplit(":", 1)[1]) == second
        # Its own start-up scan finds only the new hour: nothing twice.
        eventually(lambda: len(list_runs(engine, limit=1000)) == 61, timeout=60, what="the takeover's scan")
        with engine.connect() as conn:
            assert conn.execute(sa.select(enqueue_state_t.c.last_tick_at)).scalar_one() > first_tick
        runs = list_runs(engine, limit=1000)
        assert len({(r.chat_id, r.hour) for r in runs}) == len(runs) == 61
    finally:
        for proc in beats.values():
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in beats.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        client.close()
        engine.dispose()


@pytest.mark.slow
def test_the_lane_check_poll_runs_every_ten_seconds_without_a_log_line_each_time(sqlite_url, one_redis_url, tmp_path):
    # It used to log "Sending due task lane-check" every 10 s: 8,640 lines a day.
    import json

    engine = make_engine(sqlite_url)
    ensure_memory_schema(engine)
    engine.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANES_") or k.startswith("LANES_TEST_")}
    env.update(LANES_REDIS_URL=one_redis_url, LANES_DATABASE_URL=sqlite_url,
               LANES_STATE_DIR=str(tmp_path / "state"), LANES_BEAT_LOCK_SECONDS="5")
    log_path = tmp_path / "beat.log"
    client = redis.Redis.from_url(one_redis_url)
    entry_key = f"{Namespace('lanes:v2').beat_prefix}lane-check"

    def lane_check_runs() -> set:
        meta = client.hget(entry_key, "meta")
        # Each run writes the entry's meta anew (its last run time).
        return {json.loads(meta)["last_run_at"] and meta} - {None} if meta else set()

    seen: set = set()
    proc = subprocess.Popen([sys.executable, "-m", "scheduler.main", "--loglevel", "INFO"], env=env,
                            stderr=open(log_path, "w"), start_new_session=True)
    try:
        def two_runs() -> bool:
            seen.update(lane_check_runs())
            return len(seen) >= 3  # the entry stored, then two runs

        eventually(two_runs, timeout=90, interval=0.5, what="two runs of the lane-check entry")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
        client.close()
    text = log_path.read_text()
    assert "active: start-up scan" in text
    assert "Sending due task lane-check" not in text and "Traceback" not in text

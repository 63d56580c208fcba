"""Invariants of the enqueuer over arbitrary history and tick sequences (SQLite)."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
import sqlalchemy as sa
from hypothesis import given
from hypothesis import strategies as st

from lanes.catalog import make_engine
from lanes.memory import add_messages, enqueue_runs, ensure_memory_schema, list_runs
from lanes.memory.hours import hour_start
from lanes.memory.tables import enqueue_state_t, messages_t, rollups_t, runs_t
from tests.memory.conftest import utc

BASE = utc("2026-12-30T00:00")  # the sequences cross a month and a year end
HOUR = timedelta(hours=1)


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    engine = make_engine(f"sqlite:///{tmp_path_factory.mktemp('prop') / 'catalog.db'}")
    ensure_memory_schema(engine)
    yield engine
    engine.dispose()


def reset(engine) -> None:
    with engine.begin() as conn:
        for table in (runs_t, messages_t, rollups_t):
            conn.execute(table.delete())
        conn.execute(enqueue_state_t.update().values(backlog_from=None, last_tick_at=None))


messages = st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 72 * 60 - 1)), min_size=1, max_size=25)
# Each tick: hours after BASE, minute of the hour, full scan or not.
ticks = st.lists(st.tuples(st.integers(0, 72), st.integers(0, 59), st.booleans()), min_size=1, max_size=12)


@given(history=messages, plan=ticks, cap=st.sampled_from([0, 1, 3, 1000]))
def test_runs_are_unique_completed_capped_and_complete(engine, history, plan, cap):
    reset(engine)
    add_messages(engine, [{"chat_id": chat, "at": BASE + timedelta(minutes=m), "role": "user", "text": "x"}
                          for chat, m in history], now=BASE + 73 * HOUR)
    times = sorted(BASE + hours * HOUR + timedelta(minutes=minute) for hours, minute, _ in plan)
    fulls = [full for _, _, full in sorted(plan)]
    for now, full in zip(times, fulls):
        for run in enqueue_runs(engine, now=now, full=full, retention_days=7, daily_cap=cap).created:
            assert run.hour + HOUR <= now, "an hour in progress was enqueued"
    runs = list_runs(engine, limit=10_000)
    assert len({(r.chat_id, r.hour) for r in runs}) == len(runs)
    per_day = Counter(r.created_at.date() for r in runs)
    assert all(count <= cap for count in per_day.values())
    if cap == 1000 and any(fulls):
        # A full scan leaves no completed chat hour behind.
        last_full = max(t for t, f in zip(times, fulls) if f)
        wanted = {(chat, hour_start(BASE + timedelta(minutes=m))) for chat, m in history
                  if hour_start(BASE + timedelta(minutes=m)) + HOUR <= last_full}
        assert wanted <= {(r.chat_id, r.hour) for r in runs}
    with engine.connect() as conn:
        # The rollups count every run created, once.
        assert (conn.execute(sa.select(sa.func.sum(rollups_t.c.runs_created))).scalar() or 0) == len(runs)

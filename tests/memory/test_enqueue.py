"""Which chat hours a tick enqueues, at every boundary, with injected time."""

from __future__ import annotations

import threading

import sqlalchemy as sa

from lanes.clock import ManualClock
from lanes.memory import enqueue_runs, list_runs, rollups
from lanes.memory.tables import runs_t
from tests.memory.conftest import say, utc


def hours_of(engine) -> list[tuple[str, str]]:
    return sorted((r.chat_id, r.hour.strftime("%Y-%m-%d %H:%M")) for r in list_runs(engine, limit=10_000))


def tick(engine, now: str, *, full=False, retention_days=7, daily_cap=1000):
    return enqueue_runs(engine, now=utc(now), full=full, retention_days=retention_days, daily_cap=daily_cap)


def test_the_hourly_tick_takes_the_last_two_completed_hours_and_never_the_hour_in_progress(memory_engine):
    say(memory_engine, "a", "2026-05-10T07:30", "2026-05-10T08:10", "2026-05-10T09:59:59", "2026-05-10T10:01")
    result = tick(memory_engine, "2026-05-10T10:02")
    assert result.scan == "recent"
    assert hours_of(memory_engine) == [("a", "2026-05-10 08:00"), ("a", "2026-05-10 09:00")]


def test_each_hour_boundary_completes_the_hour_exactly_at_its_end(memory_engine):
    say(memory_engine, "a", "2026-05-10T09:15")
    assert tick(memory_engine, "2026-05-10T09:59:59.999999").created == []
    created = tick(memory_engine, "2026-05-10T10:00:00").created
    assert [(r.chat_id, r.hour) for r in created] == [("a", utc("2026-05-10T09:00"))]


def test_the_ticks_across_a_day_enqueue_every_hour_once(memory_engine):
    # A message in every hour of a day, ticks at every HH:02 of it and of the next.
    day = [f"2026-05-10T{h:02d}:30" for h in range(24)]
    say(memory_engine, "a", *day)
    clock = ManualClock(utc("2026-05-10T00:02"))
    for _ in range(48):
        enqueue_runs(memory_engine, now=clock.now(), full=False, retention_days=7, daily_cap=1000)
        clock.advance(3600)
    assert hours_of(memory_engine) == [("a", f"2026-05-10 {h:02d}:00") for h in range(24)]


def test_midnight_at_a_month_end_takes_the_previous_days_last_hours(memory_engine):
    say(memory_engine, "a", "2026-02-28T21:59", "2026-02-28T22:30", "2026-02-28T23:59:59", "2026-03-01T00:00:01")
    tick(memory_engine, "2026-03-01T00:02")
    assert hours_of(memory_engine) == [("a", "2026-02-28 22:00"), ("a", "2026-02-28 23:00")]


def test_midnight_at_a_year_end_takes_the_old_years_last_hours(memory_engine):
    say(memory_engine, "a", "2026-12-31T22:00", "2026-12-31T23:30", "2027-01-01T00:00")
    tick(memory_engine, "2027-01-01T00:02")
    assert hours_of(memory_engine) == [("a", "2026-12-31 22:00"), ("a", "2026-12-31 23:00")]
    tick(memory_engine, "2027-01-01T01:02")
    assert ("a", "2027-01-01 00:00") in hours_of(memory_engine)


def test_the_0302_full_scan_covers_the_retention_window_up_to_the_last_completed_hour(memory_engine):
    say(memory_engine, "old", "2026-05-07T02:59")  # just before a 3-day window starting 05-07 03:00
    say(memory_engine, "a", "2026-05-07T03:00", "2026-05-09T23:40", "2026-05-10T00:10", "2026-05-10T02:58")
    say(memory_engine, "now", "2026-05-10T03:01")  # the hour in progress
    result = tick(memory_engine, "2026-05-10T03:02", full=True, retention_days=3)
    assert result.scan == "full"
    assert hours_of(memory_engine) == [
        ("a", "2026-05-07 03:00"), ("a", "2026-05-09 23:00"), ("a", "2026-05-10 00:00"), ("a", "2026-05-10 02:00"),
    ]


def test_the_start_up_scan_at_any_minute_is_the_same_full_scan(memory_engine):
    say(memory_engine, "a", "2026-05-09T23:59", "2026-05-10T14:10")
    say(memory_engine, "b", "2026-05-10T14:36")
    tick(memory_engine, "2026-05-10T14:37", full=True)
    assert hours_of(memory_engine) == [("a", "2026-05-09 23:00")]


def test_a_second_tick_or_a_full_scan_after_the_hourly_one_creates_nothing_twice(memory_engine):
    say(memory_engine, "a", "2026-05-10T08:10", "2026-05-10T09:10", "2026-05-09T12:00")
    say(memory_engine, "b", "2026-05-10T09:20")
    assert len(tick(memory_engine, "2026-05-10T10:02").created) == 3
    assert tick(memory_engine, "2026-05-10T10:02").created == []
    full = tick(memory_engine, "2026-05-10T10:30", full=True)
    assert [(r.chat_id, r.hour) for r in full.created] == [("a", utc("2026-05-09T12:00"))]
    assert len(hours_of(memory_engine)) == 4


def test_the_daily_cap_holds_hours_back_and_a_later_tick_picks_them_up(memory_engine):
    for chat in ("a", "b", "c", "d", "e"):
        say(memory_engine, chat, "2026-05-10T22:30")
    first = tick(memory_engine, "2026-05-10T23:02", daily_cap=3)
    assert (len(first.created), first.deferred) == (3, 2)
    # The same day: the cap is spent, nothing more, the two still waiting.
    again = tick(memory_engine, "2026-05-10T23:30", daily_cap=3)
    assert (len(again.created), again.deferred) == (0, 2)
    # After midnight UTC the count starts again; the held hours are outside
    # the recent window by 01:02 but the backlog brings them back.
    say(memory_engine, "f", "2026-05-11T00:10")
    later = tick(memory_engine, "2026-05-11T01:02", daily_cap=3)
    assert sorted(r.chat_id for r in later.created) == ["d", "e", "f"]
    assert later.deferred == 0
    assert [(r.day.isoformat(), r.runs_created, r.skipped_by_cap) for r in rollups(memory_engine)] == [
        ("2026-05-11", 3, 0),
        ("2026-05-10", 3, 2),
    ]
    # The backlog is cleared: the next tick scans only the recent hours.
    assert tick(memory_engine, "2026-05-11T02:02", daily_cap=3).window.start == utc("2026-05-11T00:00")


def test_two_enqueuers_racing_create_each_run_once(memory_engine):
    for chat in range(30):
        say(memory_engine, f"chat-{chat}", "2026-05-10T08:10", "2026-05-10T09:10")
    barrier = threading.Barrier(4)
    results = []

    def race(full: bool) -> None:
        barrier.wait()
        results.append(tick(memory_engine, "2026-05-10T10:02", full=full))

    threads = [threading.Thread(target=race, args=(i % 2 == 0,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(len(r.created) for r in results) == 60
    with memory_engine.connect() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(runs_t)).scalar_one() == 60


def test_insert_or_skip_leaves_an_existing_run_alone(memory_engine):
    from lanes.memory.sql import insert_many_or_skip

    row = dict(chat_id="a", hour=utc("2026-05-10T08:00"), status="queued", attempts=0,
               created_at=utc("2026-05-10T10:02"), updated_at=utc("2026-05-10T10:02"))
    other = {**row, "chat_id": "b"}
    with memory_engine.begin() as conn:
        first = insert_many_or_skip(conn, runs_t, [row], unique=["chat_id", "hour"], returning=[runs_t.c.chat_id])
        second = insert_many_or_skip(conn, runs_t, [{**row, "status": "done"}, other], unique=["chat_id", "hour"],
                                     returning=[runs_t.c.chat_id])
    assert [r.chat_id for r in first] == ["a"] and [r.chat_id for r in second] == ["b"]
    assert sorted((r.chat_id, r.status) for r in list_runs(memory_engine)) == [("a", "queued"), ("b", "queued")]


def test_a_cap_backlog_older_than_the_retention_window_is_counted_not_dropped_silently(memory_engine):
    for chat in ("a", "b", "c"):
        say(memory_engine, chat, "2026-05-10T09:30")
    first = tick(memory_engine, "2026-05-10T10:02", daily_cap=1, retention_days=2)
    assert (len(first.created), first.deferred) == (1, 2)
    # No tick for three days: the two held hours have left the 2-day window.
    later = tick(memory_engine, "2026-05-13T10:02", daily_cap=1, retention_days=2)
    assert later.expired == 2 and later.as_dict()["expired_by_retention"] == 2
    assert [(r.day.isoformat(), r.expired_by_retention) for r in rollups(memory_engine)][0] == ("2026-05-13", 2)
    # Reported once: the backlog now starts inside the window.
    assert tick(memory_engine, "2026-05-13T11:02", daily_cap=1, retention_days=2).expired == 0


def test_a_late_first_message_of_an_older_hour_is_enqueued_by_the_next_hourly_tick(memory_engine):
    from lanes.memory import add_messages

    tick(memory_engine, "2026-05-10T12:02")
    # At 12:30 the history of 09:00 arrives: outside the next tick's two recent hours.
    add_messages(memory_engine, [{"chat_id": "late", "at": "2026-05-10T09:40:00Z", "role": "user",
                                  "text": "I start my new job on Monday"}], now=utc("2026-05-10T12:30"))
    result = tick(memory_engine, "2026-05-10T13:02")
    assert [(r.chat_id, r.hour) for r in result.created] == [("late", utc("2026-05-10T09:00"))]
    # The mark is spent: the tick after scans only its recent hours again.
    assert tick(memory_engine, "2026-05-10T14:02").window.start == utc("2026-05-10T12:00")

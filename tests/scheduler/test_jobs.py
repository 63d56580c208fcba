"""The beat's jobs: when the lane check runs, and the memory tick at an injected time."""

from __future__ import annotations

from lanes.catalog import apply_document, recent_events
from lanes.clock import ManualClock
from lanes.lanecheck import EVENT_KIND
from lanes.memory import list_runs
from lanes.settings import Settings
from scheduler.jobs import SchedulerJobs
from tests.memory.conftest import say, utc
from tests.scheduler.test_lane_check import document


def test_the_lane_check_runs_at_start_up_on_a_catalog_change_and_not_in_between(sqlite_url, one_redis_url, tmp_path):
    settings = Settings(state_dir=tmp_path / "state", redis_url=one_redis_url, database_url=sqlite_url,
                        lane_check_seconds=3600)
    jobs = SchedulerJobs(settings, one_redis_url)
    try:
        apply_document(jobs.engine, document())
        assert jobs.lane_check(force=True).ok
        assert jobs.lane_check() is None  # same catalog version, period not over
        apply_document(jobs.engine, document(widths={"gpu1": 3}))
        report = jobs.lane_check()
        assert [m.key for m in report.mismatches] == ["pool_over_services:gpu1"]
        assert jobs.lane_check() is None
        assert [e.detail["state"] for e in recent_events(jobs.engine, kind=EVENT_KIND)] == ["appeared"]
    finally:
        jobs.close()


def test_the_memory_tick_enqueues_and_sends_the_runs_due_at_the_injected_time(sqlite_url, one_redis_url, tmp_path):
    settings = Settings(state_dir=tmp_path / "state", redis_url=one_redis_url, database_url=sqlite_url)
    clock = ManualClock(utc("2026-05-10T10:02"))
    jobs = SchedulerJobs(settings, one_redis_url, clock=clock)
    try:
        say(jobs.engine, "a", "2026-05-10T09:10", "2026-05-08T09:10")
        assert jobs.memory_tick(full=False)["sent"] == 1
        assert jobs.memory_tick(full=True)["sent"] == 1  # the older hour; the first is not sent twice
        assert jobs.memory_tick(full=False)["sent"] == 0
        assert len(list_runs(jobs.engine)) == 2
        # An hour later both still sit queued (their messages were lost): the tick sends them again.
        clock.advance(3600)
        assert jobs.memory_tick(full=False)["sent"] == 2
    finally:
        jobs.close()

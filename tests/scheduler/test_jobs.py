"""The beat's jobs: when the lane check runs, and the memory tick at an injected time."""

from __future__ import annotations

from lanes.catalog import apply_document, recent_events
from lanes.clock import ManualClock
from lanes.memory import list_runs
from lanes.memory.dispatch import MEMORY_QUEUE
from lanes.memory.lifecycle import claim_run
from lanes.ops.lanecheck import EVENT_KIND
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


def memory_messages(client) -> int:
    """Messages waiting in the memory queue (kombu keeps one list per priority step)."""
    return sum(client.llen(key) for key in client.scan_iter(match=f"{MEMORY_QUEUE}*") if client.type(key) == b"list")


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
        assert memory_messages(jobs.client) == 2
    finally:
        jobs.close()


def test_queued_runs_without_a_worker_for_hours_keep_one_message_each(sqlite_url, one_redis_url, tmp_path):
    # The case: 2 runs, no memory worker for three hours, every tick
    # and a start-up scan in between; once 6 messages, now 2.
    settings = Settings(state_dir=tmp_path / "state", redis_url=one_redis_url, database_url=sqlite_url)
    clock = ManualClock(utc("2026-05-10T10:02"))
    jobs = SchedulerJobs(settings, one_redis_url, clock=clock)
    try:
        say(jobs.engine, "a", "2026-05-10T09:10")
        say(jobs.engine, "b", "2026-05-10T09:20")
        sent = [jobs.memory_tick(full=False)["sent"]]
        for _ in range(3):
            clock.advance(3600)
            sent.append(jobs.memory_tick(full=False)["sent"])
            sent.append(jobs.memory_tick(full=True)["sent"])  # a start-up scan, a 03:02 tick
        assert sent == [2, 0, 0, 0, 0, 0, 0]
        assert memory_messages(jobs.client) == 2
    finally:
        jobs.close()


def test_a_run_whose_message_redis_lost_is_sent_again_at_the_next_tick_once(sqlite_url, one_redis_url, tmp_path):
    # Created at 09:02:00.5; Redis loses its data (a restart without persistence) before 10:02.
    settings = Settings(state_dir=tmp_path / "state", redis_url=one_redis_url, database_url=sqlite_url)
    clock = ManualClock(utc("2026-05-10T09:02:00.500000"))
    jobs = SchedulerJobs(settings, one_redis_url, clock=clock)
    try:
        say(jobs.engine, "a", "2026-05-10T08:10")
        assert jobs.memory_tick(full=False)["sent"] == 1
        jobs.client.flushdb()
        clock.advance(3599.5)  # 10:02:00
        assert jobs.memory_tick(full=False)["sent"] == 1
        assert memory_messages(jobs.client) == 1
        clock.advance(3600)
        assert jobs.memory_tick(full=False)["sent"] == 0
    finally:
        jobs.close()


def test_a_run_orphaned_with_its_redis_state_is_reclaimed_and_sent_after_its_lease(sqlite_url, one_redis_url,
                                                                                   tmp_path):
    # A memory worker killed mid-call, and Redis lost its message: the run sat `running` for good.
    settings = Settings(state_dir=tmp_path / "state", redis_url=one_redis_url, database_url=sqlite_url,
                        memory_lease_seconds=120)
    clock = ManualClock(utc("2026-05-10T10:02"))
    jobs = SchedulerJobs(settings, one_redis_url, clock=clock)
    try:
        say(jobs.engine, "a", "2026-05-10T09:10")
        jobs.memory_tick(full=False)
        run = list_runs(jobs.engine)[0]
        assert claim_run(jobs.engine, run.id, now=clock.now(), lease_seconds=120) is not None
        jobs.client.flushdb()
        clock.advance(60)
        assert jobs.memory_tick(full=True)["reclaimed"] == 0  # its lease still runs
        clock.advance(3600)
        tick = jobs.memory_tick(full=True)
        assert (tick["reclaimed"], tick["sent"]) == (1, 1)
        assert [(r.status, r.attempts) for r in list_runs(jobs.engine)] == [("queued", 1)]
        assert memory_messages(jobs.client) == 1
    finally:
        jobs.close()

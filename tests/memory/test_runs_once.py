"""A memory run executes at most once at a time and writes its notes once,
on SQLite and PostgreSQL; late messages re-open their hour's run; failed
runs can be queued again."""

from __future__ import annotations

import threading
from datetime import timedelta

import sqlalchemy as sa

from lanes.memory import add_messages, enqueue_runs, get_run, list_runs, notes_of
from lanes.memory.lifecycle import (
    claim_run,
    complete_run,
    fail_run,
    mark_sent,
    reclaim_orphans,
    renew_lease,
    retry_failed,
    unsent_runs,
)
from lanes.memory.tables import notes_t
from tests.memory.conftest import say, utc

NOW = utc("2026-05-10T10:02")


def one_run(engine, chat: str = "a", at: str = "2026-05-10T09:10") -> int:
    say(engine, chat, at)
    return enqueue_runs(engine, now=NOW, full=False, retention_days=7, daily_cap=1000).created[0].id


def race(count: int, work) -> list:
    """Run ``work(i)`` in ``count`` threads started together; their results in thread order."""
    barrier = threading.Barrier(count)
    results: list = [None] * count

    def go(i: int) -> None:
        barrier.wait()
        results[i] = work(i)

    threads = [threading.Thread(target=go, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def test_two_deliveries_claiming_one_run_together_only_one_runs_it(memory_engine):
    for round_ in range(30):
        run_id = one_run(memory_engine, f"chat-{round_}")
        claims = race(2, lambda _: claim_run(memory_engine, run_id, now=NOW, lease_seconds=60))
        assert sum(claim is not None for claim in claims) == 1, claims
        assert get_run(memory_engine, run_id).attempts == 1


def test_a_duplicate_delivery_leaves_a_run_with_a_live_claim_alone_and_takes_it_once_the_lease_passed(memory_engine):
    run_id = one_run(memory_engine)
    first = claim_run(memory_engine, run_id, now=NOW, lease_seconds=60)
    assert claim_run(memory_engine, run_id, now=NOW + timedelta(seconds=30), lease_seconds=60) is None
    # Renewed: still held after the first lease would have passed.
    assert renew_lease(memory_engine, run_id, first.claim, now=NOW + timedelta(seconds=40), lease_seconds=60)
    assert claim_run(memory_engine, run_id, now=NOW + timedelta(seconds=90), lease_seconds=60) is None
    # Its worker died: the lease passes, the next delivery takes it, counting one attempt more.
    second = claim_run(memory_engine, run_id, now=NOW + timedelta(seconds=101), lease_seconds=60)
    assert second is not None and second.attempts == 2
    # The first attempt, come back to life, may not store, fail or renew anything.
    assert complete_run(memory_engine, run_id, ["stale"], claim=first.claim, now=NOW) is None
    assert not fail_run(memory_engine, run_id, "stale", claim=first.claim, now=NOW)
    assert not renew_lease(memory_engine, run_id, first.claim, now=NOW, lease_seconds=60)
    assert complete_run(memory_engine, run_id, ["fresh"], claim=second.claim, now=NOW) == 1
    assert [n["text"] for n in notes_of(memory_engine, "a")] == ["fresh"]


def test_two_completions_of_one_run_racing_write_its_notes_once(memory_engine):
    # The count: 100 pairs (on PostgreSQL 96 of them used to leave 4 notes instead of 2).
    doubled = 0
    for round_ in range(100):
        run_id = one_run(memory_engine, f"chat-{round_}")
        run = claim_run(memory_engine, run_id, now=NOW, lease_seconds=60)
        stored = race(2, lambda _: complete_run(memory_engine, run_id, ["one", "two"], claim=run.claim, now=NOW))
        assert sorted(stored, key=str) == [2, None]
        with memory_engine.connect() as conn:
            count = conn.execute(sa.select(sa.func.count()).select_from(notes_t)
                                 .where(notes_t.c.run_id == run_id)).scalar_one()
        doubled += count != 2
    assert doubled == 0


def test_a_late_message_reopens_its_hours_finished_run_and_a_running_one_runs_again(memory_engine):
    done_id = one_run(memory_engine, "done")
    running_id = one_run(memory_engine, "running")
    failed_id = one_run(memory_engine, "failed")
    mark_sent(memory_engine, [done_id, running_id, failed_id], epoch="e1")
    done = claim_run(memory_engine, done_id, now=NOW, lease_seconds=60)
    complete_run(memory_engine, done_id, ["first note"], claim=done.claim, now=NOW)
    failed = claim_run(memory_engine, failed_id, now=NOW, lease_seconds=60)
    fail_run(memory_engine, failed_id, "backend down", claim=failed.claim, now=NOW)
    running = claim_run(memory_engine, running_id, now=NOW, lease_seconds=600)
    assert unsent_runs(memory_engine, epoch="e1") == []

    # Messages for the same hour arrive hours later (a file import, POST /v1/history).
    late = utc("2026-05-10T13:40")
    add_messages(memory_engine, [{"chat_id": chat, "at": "2026-05-10T09:50:00Z", "role": "user",
                                  "text": "and I adopted a cat"} for chat in ("done", "running", "failed")], now=late)
    assert [(r.id, r.status, r.attempts) for r in unsent_runs(memory_engine, epoch="e1")] == [
        (done_id, "queued", 0), (failed_id, "queued", 0)
    ]
    # The running attempt read its messages before the new one: it ends queued, to run again.
    complete_run(memory_engine, running_id, ["early note"], claim=running.claim, now=late)
    assert get_run(memory_engine, running_id).status == "queued"
    assert {r.id for r in unsent_runs(memory_engine, epoch="e1")} == {done_id, running_id, failed_id}
    # The same message imported again changes nothing.
    mark_sent(memory_engine, [done_id, running_id, failed_id], epoch="e1")
    added = add_messages(memory_engine, [{"chat_id": "done", "at": "2026-05-10T09:50:00Z", "role": "user",
                                          "text": "and I adopted a cat"}], now=late)
    assert (added.added, added.already) == (0, 1)
    assert unsent_runs(memory_engine, epoch="e1") == []


def test_orphaned_running_runs_are_reclaimed_only_after_their_lease(memory_engine):
    run_id = one_run(memory_engine)
    mark_sent(memory_engine, [run_id], epoch="e1")
    claim_run(memory_engine, run_id, now=NOW, lease_seconds=60)
    assert reclaim_orphans(memory_engine, now=NOW + timedelta(seconds=59)) == []
    reclaimed = reclaim_orphans(memory_engine, now=NOW + timedelta(hours=1))
    assert [(r.id, r.status, r.attempts) for r in reclaimed] == [(run_id, "queued", 1)]
    assert [r.id for r in unsent_runs(memory_engine, epoch="e1")] == [run_id]


def test_failed_runs_are_queued_again_with_fresh_attempts_and_others_left_alone(memory_engine):
    failed_ids = [one_run(memory_engine, chat) for chat in ("a", "b")]
    done_id = one_run(memory_engine, "c")
    for run_id in failed_ids:
        run = claim_run(memory_engine, run_id, now=NOW, lease_seconds=60)
        fail_run(memory_engine, run_id, "503 from utility-14b", claim=run.claim, now=NOW)
    run = claim_run(memory_engine, done_id, now=NOW, lease_seconds=60)
    complete_run(memory_engine, done_id, [], claim=run.claim, now=NOW)
    assert [r.id for r in retry_failed(memory_engine, now=NOW, chat_id="b")] == [failed_ids[1]]
    assert [r.id for r in retry_failed(memory_engine, now=NOW)] == [failed_ids[0]]
    assert {r.chat_id: (r.status, r.attempts) for r in list_runs(memory_engine)} == {
        "a": ("queued", 0), "b": ("queued", 0), "c": ("done", 1)
    }

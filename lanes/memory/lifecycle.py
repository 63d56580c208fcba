"""A memory run's life after it is created: sent, claimed, completed, retried, reclaimed.

A run executes at most once at a time: a delivery claims it with a token
and a lease (:func:`claim_run`), renews the lease while it works, and only
the holder of the claim may complete, retry or fail it. On PostgreSQL the
claim's UPDATE and the completion's ``SELECT ... FOR UPDATE`` lock the row,
so a second one waits and then finds the claim gone; on SQLite every writer
takes the database lock first (``BEGIN IMMEDIATE``). A claim whose lease has
passed belongs to a dead worker: :func:`reclaim_orphans` gives the run back.

A queued run's message is sent once per broker epoch (``sent_epoch``, see
:mod:`lanes.memory.dispatch`): never again because it waited, only when it
was never sent or Redis lost it.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from lanes.catalog.engine import database_errors
from lanes.memory.hours import as_utc
from lanes.memory.runs import RunRecord
from lanes.memory.sql import write_transaction
from lanes.memory.tables import notes_t, runs_t
from lanes.instruments import memory_runs


def unsent_runs(engine: Engine, *, epoch: str, limit: int | None = None) -> list[RunRecord]:
    """Queued runs without a message in the broker's current epoch: never sent, or sent to a Redis that lost it."""
    query = (
        sa.select(runs_t)
        .where(runs_t.c.status == "queued",
               sa.or_(runs_t.c.sent_epoch.is_(None), runs_t.c.sent_epoch != epoch))
        .order_by(runs_t.c.hour, runs_t.c.id)
    )
    if limit is not None:
        query = query.limit(limit)
    with database_errors(engine), engine.connect() as conn:
        return [RunRecord.from_row(row) for row in conn.execute(query)]


def mark_sent(engine: Engine, run_ids: list[int], *, epoch: str) -> None:
    """Record that these runs' messages are in the broker of ``epoch`` (queued runs only)."""
    if not run_ids:
        return
    with database_errors(engine), engine.begin() as conn:
        for start in range(0, len(run_ids), 500):
            conn.execute(
                runs_t.update()
                .where(runs_t.c.id.in_(run_ids[start:start + 500]), runs_t.c.status == "queued")
                .values(sent_epoch=epoch)
            )


def mark_unsent(engine: Engine, run_id: int) -> None:
    """The run's next message could not be sent: the next tick sends it."""
    with database_errors(engine), engine.begin() as conn:
        conn.execute(runs_t.update().where(runs_t.c.id == run_id, runs_t.c.status == "queued").values(sent_epoch=None))


def reclaim_orphans(engine: Engine, *, now: datetime) -> list[RunRecord]:
    """Running runs whose lease has passed (their worker died, its message and
    Redis state perhaps gone): back to queued and unsent, so the tick sends them."""
    now = as_utc(now)
    orphaned = sa.and_(runs_t.c.status == "running",
                       sa.or_(runs_t.c.lease_until.is_(None), runs_t.c.lease_until < now))
    with write_transaction(engine) as conn:
        ids = [row.id for row in conn.execute(sa.select(runs_t.c.id).where(orphaned).with_for_update())]
        if not ids:
            return []
        conn.execute(
            runs_t.update().where(runs_t.c.id.in_(ids), orphaned).values(
                status="queued", claim=None, lease_until=None, sent_epoch=None, updated_at=now,
                error=sa.func.coalesce(runs_t.c.error, "its worker stopped renewing its lease; reclaimed"),
            )
        )
        found = [RunRecord.from_row(row) for row in conn.execute(sa.select(runs_t).where(runs_t.c.id.in_(ids)))]
    memory_runs("queued", len(found))
    return found


def retry_failed(engine: Engine, *, now: datetime, run_ids: tuple[int, ...] = (), chat_id: str | None = None,
                 limit: int = 1000) -> list[RunRecord]:
    """Failed runs (all, these ids, or this chat's) back to queued with a fresh
    count of attempts and no message yet; ``lanes memory retry`` sends them."""
    condition = runs_t.c.status == "failed"
    if run_ids:
        condition = sa.and_(condition, runs_t.c.id.in_(run_ids))
    if chat_id is not None:
        condition = sa.and_(condition, runs_t.c.chat_id == chat_id)
    with write_transaction(engine) as conn:
        ids = [row.id for row in conn.execute(
            sa.select(runs_t.c.id).where(condition).order_by(runs_t.c.hour, runs_t.c.id).limit(limit).with_for_update()
        )]
        if not ids:
            return []
        conn.execute(
            runs_t.update().where(runs_t.c.id.in_(ids), runs_t.c.status == "failed").values(
                status="queued", attempts=0, sent_epoch=None, claim=None, lease_until=None, updated_at=as_utc(now),
            )
        )
        found = [RunRecord.from_row(row) for row in
                 conn.execute(sa.select(runs_t).where(runs_t.c.id.in_(ids)).order_by(runs_t.c.hour, runs_t.c.id))]
    memory_runs("queued", len(found))
    return found


# --- the run's lifecycle (the memory worker) ----------------------------------------------


def claim_run(engine: Engine, run_id: int, *, now: datetime, lease_seconds: float) -> RunRecord | None:
    """Take a queued run (or one whose claim's lease has passed) for one attempt.

    Returns the run with its claim token, or None when it is finished, gone,
    or another delivery holds a live claim (a duplicate message: it is left
    alone). The attempt is counted here, once per claim.
    """
    now = as_utc(now)
    token = uuid.uuid4().hex
    claimable = sa.or_(runs_t.c.status == "queued",
                       sa.and_(runs_t.c.status == "running",
                               sa.or_(runs_t.c.lease_until.is_(None), runs_t.c.lease_until < now)))
    with write_transaction(engine) as conn:
        # On PostgreSQL a second claim of the row waits for the first's commit
        # and then re-checks the condition against the claimed row: no match.
        updated = conn.execute(
            runs_t.update().where(runs_t.c.id == run_id, claimable).values(
                status="running", attempts=runs_t.c.attempts + 1, updated_at=now, claim=token,
                lease_until=now + timedelta(seconds=lease_seconds), rerun=False,
            )
        ).rowcount
        if not updated:
            return None
        run = RunRecord.from_row(conn.execute(sa.select(runs_t).where(runs_t.c.id == run_id)).one())
    memory_runs("running")
    return run


def renew_lease(engine: Engine, run_id: int, claim: str, *, now: datetime, lease_seconds: float) -> bool:
    """Extend the claim's lease; False when the claim is no longer this attempt's."""
    with database_errors(engine), engine.begin() as conn:
        return conn.execute(
            runs_t.update().where(runs_t.c.id == run_id, runs_t.c.claim == claim, runs_t.c.status == "running")
            .values(lease_until=as_utc(now) + timedelta(seconds=lease_seconds))
        ).rowcount == 1


def _held(conn: Connection, run_id: int, claim: str):
    """The run's row, locked, when ``claim`` still holds it; else None."""
    return conn.execute(
        sa.select(runs_t)
        .where(runs_t.c.id == run_id, runs_t.c.claim == claim, runs_t.c.status == "running")
        .with_for_update()
    ).one_or_none()


def complete_run(engine: Engine, run_id: int, notes: list[str], *, claim: str, now: datetime) -> int | None:
    """Store the run's notes in place of any earlier ones for its chat hour; mark it done.

    Only the claim's holder completes, once: a second completion (or one
    whose claim was reclaimed) writes nothing and returns None. A run whose
    hour gained messages while it ran goes back to queued (unsent) instead
    of done, so the next tick runs it again with them.
    """
    with write_transaction(engine) as conn:
        run = _held(conn, run_id, claim)
        if run is None:
            return None
        # Replacing, not adding: a rerun of the same hour never duplicates memories.
        conn.execute(notes_t.delete().where(notes_t.c.chat_id == run.chat_id, notes_t.c.hour == run.hour))
        if notes:
            conn.execute(
                notes_t.insert(),
                [{"chat_id": run.chat_id, "hour": run.hour, "text": text, "run_id": run_id} for text in notes],
            )
        status = "queued" if run.rerun else "done"
        conn.execute(
            runs_t.update().where(runs_t.c.id == run_id).values(
                status=status, error=None, updated_at=as_utc(now), claim=None, lease_until=None, rerun=False,
                attempts=0 if run.rerun else runs_t.c.attempts,
                sent_epoch=None if run.rerun else runs_t.c.sent_epoch,
            )
        )
    memory_runs(status)
    return len(notes)


def retry_run(engine: Engine, run_id: int, error: str, *, claim: str, now: datetime) -> bool:
    """Back to queued with the error of the attempt that failed (its retry message is on its way)."""
    return _release(engine, run_id, claim, now, status="queued", error=error)


def fail_run(engine: Engine, run_id: int, error: str, *, claim: str, now: datetime) -> bool:
    return _release(engine, run_id, claim, now, status="failed", error=error)


def requeue_unstarted(engine: Engine, run_id: int, *, claim: str, now: datetime) -> bool:
    """The attempt never reached a backend (a shutdown, a requeued lane wait): give it back uncounted."""
    return _release(engine, run_id, claim, now, status="queued", uncount=True)


def _release(engine: Engine, run_id: int, claim: str, now: datetime, *, status: str, error: str | None = None,
             uncount: bool = False) -> bool:
    values = dict(status=status, updated_at=as_utc(now), claim=None, lease_until=None)
    if error is not None:
        values["error"] = error[:2000]
    if uncount:
        values["attempts"] = sa.case((runs_t.c.attempts > 0, runs_t.c.attempts - 1), else_=0)
    with write_transaction(engine) as conn:
        run = _held(conn, run_id, claim)
        if run is None:
            return False
        if run.rerun and status == "failed":
            # New messages arrived while it ran: they deserve a fresh start.
            values.update(status="queued", attempts=0, sent_epoch=None, rerun=False)
        conn.execute(runs_t.update().where(runs_t.c.id == run_id).values(**values))
    memory_runs(values["status"])
    return True

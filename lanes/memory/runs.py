"""Memory runs: enqueuing chat hours idempotently under a daily cap, and the run lifecycle.

One run covers one chat hour. Enqueuing inserts a run for every chat hour of
the window that has messages and no run yet; the unique (chat, hour)
constraint with insert-or-skip makes a second tick, a racing beat or a full
scan after an hourly one create nothing twice.

The daily cap counts runs created since midnight UTC. Hours it holds back are
not lost: the oldest of them is remembered (``backlog_from``) and every later
scan starts there, so a tick picks them up once the cap allows (at the
latest after midnight UTC, when the count starts again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from lanes.catalog.engine import database_errors
from lanes.errors import InvalidInput
from lanes.memory.hours import Window, as_utc, day_start, recent_window, retention_window, utc_day
from lanes.memory.sql import insert_many_or_skip, upsert, write_transaction
from lanes.memory.tables import RUN_STATUSES, enqueue_state_t, messages_t, notes_t, rollups_t, runs_t
from lanes.metrics import memory_runs


@dataclass(frozen=True)
class RunRecord:
    id: int
    chat_id: str
    hour: datetime
    status: str
    attempts: int
    created_at: datetime
    updated_at: datetime
    error: str | None

    @classmethod
    def from_row(cls, row) -> "RunRecord":
        return cls(
            id=row.id, chat_id=row.chat_id, hour=as_utc(row.hour), status=row.status, attempts=row.attempts,
            created_at=as_utc(row.created_at), updated_at=as_utc(row.updated_at), error=row.error,
        )

    def as_dict(self) -> dict:
        return {
            "id": self.id, "chat_id": self.chat_id, "hour": self.hour.isoformat(), "status": self.status,
            "attempts": self.attempts, "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(), "error": self.error,
        }


@dataclass(frozen=True)
class EnqueueResult:
    scan: str  # "recent" or "full"
    window: Window  # the hours scanned, widened back to the backlog when there is one
    created: list[RunRecord] = field(default_factory=list)
    deferred: int = 0  # chat hours the daily cap held back
    cap_left: int = 0

    def as_dict(self) -> dict:
        return {
            "scan": self.scan,
            "from": self.window.start.isoformat(),
            "to": self.window.end.isoformat(),
            "created": len(self.created),
            "deferred_by_cap": self.deferred,
            "cap_left": self.cap_left,
            "runs": [run.id for run in self.created],
        }


@dataclass(frozen=True)
class Rollup:
    day: date
    runs_created: int
    skipped_by_cap: int

    def as_dict(self) -> dict:
        return {"day": self.day.isoformat(), "runs_created": self.runs_created, "skipped_by_cap": self.skipped_by_cap}


def enqueue_runs(engine: Engine, *, now: datetime, full: bool, retention_days: int, daily_cap: int) -> EnqueueResult:
    """Create the runs due at ``now``: the last two completed hours, or (``full``)
    the whole retention window; either way from the cap's backlog on."""
    if daily_cap < 0:
        raise InvalidInput(f"daily cap {daily_cap!r} must be 0 or more")
    now = as_utc(now)
    retention = retention_window(now, retention_days)
    window = retention if full else recent_window(now)
    with write_transaction(engine) as conn:
        state = conn.execute(
            sa.select(enqueue_state_t).where(enqueue_state_t.c.id == 1).with_for_update()
        ).one()
        start = window.start
        if state.backlog_from is not None:
            start = max(retention.start, min(start, as_utc(state.backlog_from)))
        window = Window(start, window.end)
        waiting = _hours_without_run(conn, window)
        created_today = conn.execute(
            sa.select(sa.func.count()).select_from(runs_t).where(runs_t.c.created_at >= day_start(now))
        ).scalar_one()
        room = max(0, daily_cap - created_today)
        rows = [
            dict(chat_id=chat_id, hour=hour, status="queued", attempts=0, created_at=now, updated_at=now)
            for chat_id, hour in waiting[:room]
        ]
        inserted = insert_many_or_skip(
            conn, runs_t, rows, unique=["chat_id", "hour"], returning=[runs_t.c.id, runs_t.c.chat_id, runs_t.c.hour]
        )
        created = sorted(
            (RunRecord(row.id, row.chat_id, as_utc(row.hour), "queued", 0, now, now, None) for row in inserted),
            key=lambda run: (run.hour, run.chat_id),
        )
        held = waiting[room:]
        conn.execute(
            enqueue_state_t.update().where(enqueue_state_t.c.id == 1)
            .values(backlog_from=held[0][1] if held else None, last_tick_at=now)
        )
        upsert(
            conn, rollups_t, dict(day=utc_day(now), runs_created=len(created), skipped_by_cap=len(held)),
            key=["day"],
            updates={
                "runs_created": lambda new: rollups_t.c.runs_created + new.runs_created,
                "skipped_by_cap": lambda new: sa.case(
                    (new.skipped_by_cap > rollups_t.c.skipped_by_cap, new.skipped_by_cap),
                    else_=rollups_t.c.skipped_by_cap,
                ),
            },
        )
    memory_runs("queued", len(created))  # after the commit: counted once they exist
    return EnqueueResult(
        scan="full" if full else "recent", window=window, created=created, deferred=len(held),
        cap_left=max(0, room - len(created)),
    )


def _hours_without_run(conn: Connection, window: Window) -> list[tuple[str, datetime]]:
    """(chat, hour) pairs with messages in the window and no run, oldest hour first."""
    has_run = sa.exists().where(runs_t.c.chat_id == messages_t.c.chat_id, runs_t.c.hour == messages_t.c.hour)
    query = (
        sa.select(messages_t.c.chat_id, messages_t.c.hour)
        .where(messages_t.c.hour >= window.start, messages_t.c.hour < window.end, ~has_run)
        .distinct()
        .order_by(messages_t.c.hour, messages_t.c.chat_id)
    )
    return [(row.chat_id, as_utc(row.hour)) for row in conn.execute(query)]


# --- reading --------------------------------------------------------------------------


def list_runs(engine: Engine, *, statuses: tuple[str, ...] = (), chat_id: str | None = None,
              limit: int = 100) -> list[RunRecord]:
    """Runs, newest hour first."""
    unknown = [s for s in statuses if s not in RUN_STATUSES]
    if unknown:
        raise InvalidInput(f"unknown run status {unknown[0]!r} (known: {', '.join(RUN_STATUSES)})")
    query = sa.select(runs_t).order_by(runs_t.c.hour.desc(), runs_t.c.chat_id).limit(limit)
    if statuses:
        query = query.where(runs_t.c.status.in_(statuses))
    if chat_id is not None:
        query = query.where(runs_t.c.chat_id == chat_id)
    with database_errors(engine), engine.connect() as conn:
        return [RunRecord.from_row(row) for row in conn.execute(query)]


def get_run(engine: Engine, run_id: int) -> RunRecord | None:
    with database_errors(engine), engine.connect() as conn:
        row = conn.execute(sa.select(runs_t).where(runs_t.c.id == run_id)).one_or_none()
    return RunRecord.from_row(row) if row is not None else None


def status_counts(engine: Engine) -> dict[str, int]:
    query = sa.select(runs_t.c.status, sa.func.count()).group_by(runs_t.c.status)
    with database_errors(engine), engine.connect() as conn:
        found = dict(conn.execute(query).all())
    return {status: int(found.get(status, 0)) for status in RUN_STATUSES}


def rollups(engine: Engine, *, days: int = 14) -> list[Rollup]:
    query = sa.select(rollups_t).order_by(rollups_t.c.day.desc()).limit(days)
    with database_errors(engine), engine.connect() as conn:
        return [Rollup(row.day, row.runs_created, row.skipped_by_cap) for row in conn.execute(query)]


def stale_queued(engine: Engine, *, now: datetime, older_than: timedelta) -> list[RunRecord]:
    """Queued runs created long ago: their message was lost (e.g. a broker restart)."""
    query = sa.select(runs_t).where(runs_t.c.status == "queued", runs_t.c.updated_at <= as_utc(now) - older_than)
    with database_errors(engine), engine.connect() as conn:
        return [RunRecord.from_row(row) for row in conn.execute(query)]


# --- the run's lifecycle (the memory worker) ----------------------------------------------


def claim_run(engine: Engine, run_id: int, *, now: datetime) -> RunRecord | None:
    """Mark a run running and count the attempt; None when it is finished or gone.

    A run found ``running`` is taken too: its message came back because the
    worker that had it died (acks late), and its notes are replaced whole.
    """
    with write_transaction(engine) as conn:
        updated = conn.execute(
            runs_t.update()
            .where(runs_t.c.id == run_id, runs_t.c.status.in_(("queued", "running")))
            .values(status="running", attempts=runs_t.c.attempts + 1, updated_at=as_utc(now))
        ).rowcount
        if not updated:
            return None
        run = RunRecord.from_row(conn.execute(sa.select(runs_t).where(runs_t.c.id == run_id)).one())
    memory_runs("running")
    return run


def complete_run(engine: Engine, run_id: int, notes: list[str], *, now: datetime) -> int:
    """Store the run's notes in place of any earlier ones for its chat hour; mark it done."""
    with write_transaction(engine) as conn:
        run = conn.execute(sa.select(runs_t).where(runs_t.c.id == run_id)).one()
        # Replacing, not adding: a rerun of the same hour never duplicates memories.
        conn.execute(notes_t.delete().where(notes_t.c.chat_id == run.chat_id, notes_t.c.hour == run.hour))
        if notes:
            conn.execute(
                notes_t.insert(),
                [{"chat_id": run.chat_id, "hour": run.hour, "text": text, "run_id": run_id} for text in notes],
            )
        conn.execute(
            runs_t.update().where(runs_t.c.id == run_id).values(status="done", error=None, updated_at=as_utc(now))
        )
    memory_runs("done")
    return len(notes)


def retry_run(engine: Engine, run_id: int, error: str, *, now: datetime) -> None:
    """Back to queued, with the error of the attempt that failed."""
    _set_status(engine, run_id, "queued", error, now)


def fail_run(engine: Engine, run_id: int, error: str, *, now: datetime) -> None:
    _set_status(engine, run_id, "failed", error, now)


def requeue_unstarted(engine: Engine, run_id: int, *, now: datetime) -> None:
    """The attempt never reached a backend (a shutdown, a requeued lane wait): give it back."""
    with database_errors(engine), engine.begin() as conn:
        given_back = conn.execute(
            runs_t.update().where(runs_t.c.id == run_id, runs_t.c.status == "running")
            .values(status="queued", attempts=sa.case((runs_t.c.attempts > 0, runs_t.c.attempts - 1), else_=0),
                    updated_at=as_utc(now))
        ).rowcount
    memory_runs("queued", given_back)


def _set_status(engine: Engine, run_id: int, status: str, error: str, now: datetime) -> None:
    with database_errors(engine), engine.begin() as conn:
        conn.execute(
            runs_t.update().where(runs_t.c.id == run_id)
            .values(status=status, error=error[:2000], updated_at=as_utc(now))
        )
    memory_runs(status)


def notes_of(engine: Engine, chat_id: str, hour: datetime | None = None) -> list[dict]:
    query = sa.select(notes_t).where(notes_t.c.chat_id == chat_id).order_by(notes_t.c.hour, notes_t.c.id)
    if hour is not None:
        query = query.where(notes_t.c.hour == hour)
    with database_errors(engine), engine.connect() as conn:
        return [
            {"chat_id": r.chat_id, "hour": as_utc(r.hour).isoformat(), "text": r.text, "run_id": r.run_id}
            for r in conn.execute(query)
        ]

"""Memory runs: enqueuing chat hours idempotently under a daily cap, and the run lifecycle.

One run covers one chat hour. Enqueuing inserts a run for every chat hour of
the window that has messages and no run yet; the unique (chat, hour)
constraint with insert-or-skip makes a second tick, a racing beat or a full
scan after an hourly one create nothing twice.

The daily cap counts runs created since midnight UTC. Hours it holds back are
not lost: the oldest of them is remembered (``backlog_from``) and every later
scan starts there, so a tick picks them up once the cap allows (at the
latest after midnight UTC, when the count starts again). Hours the cap held
until they left the retention window are counted (``expired_by_retention``
in the result and the day's rollup) rather than dropped silently.

Late history: every tick also takes the hours, back to the retention
window's start, that got messages stored since the previous tick
(``chat_messages.added_at``) and have no run yet, so a chat hour whose
history arrives hours late gets its run at the next tick, not at the next
full scan. (An hour that already has a run is re-opened when the message
is stored: :mod:`lanes.memory.history`.)

How a run executes (claims, leases, sending) is :mod:`lanes.memory.lifecycle`.
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
from lanes.instruments import memory_runs

# A message stored just before a tick may commit just after its scan: each
# tick looks this far back before the previous one (a rescan costs nothing,
# runs are insert-or-skip).
LATE_OVERLAP = timedelta(minutes=10)


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
    lease_until: datetime | None = None
    claim: str | None = None  # the token of the attempt running it

    @classmethod
    def from_row(cls, row) -> "RunRecord":
        return cls(
            id=row.id, chat_id=row.chat_id, hour=as_utc(row.hour), status=row.status, attempts=row.attempts,
            created_at=as_utc(row.created_at), updated_at=as_utc(row.updated_at), error=row.error,
            lease_until=as_utc(row.lease_until) if row.lease_until is not None else None, claim=row.claim,
        )

    def as_dict(self) -> dict:
        return {
            "id": self.id, "chat_id": self.chat_id, "hour": self.hour.isoformat(), "status": self.status,
            "attempts": self.attempts, "created_at": self.created_at.isoformat(),
            "updated_at": self.updated_at.isoformat(), "error": self.error,
            "lease_until": self.lease_until.isoformat() if self.lease_until else None,
        }


@dataclass(frozen=True)
class EnqueueResult:
    scan: str  # "recent" or "full"
    window: Window  # the hours scanned, widened back to the backlog when there is one
    created: list[RunRecord] = field(default_factory=list)
    deferred: int = 0  # chat hours the daily cap held back
    cap_left: int = 0
    expired: int = 0  # chat hours the cap held back until they left the retention window

    def as_dict(self) -> dict:
        return {
            "scan": self.scan,
            "from": self.window.start.isoformat(),
            "to": self.window.end.isoformat(),
            "created": len(self.created),
            "deferred_by_cap": self.deferred,
            "cap_left": self.cap_left,
            "expired_by_retention": self.expired,
            "runs": [run.id for run in self.created],
        }


@dataclass(frozen=True)
class Rollup:
    day: date
    runs_created: int
    skipped_by_cap: int
    expired_by_retention: int = 0

    def as_dict(self) -> dict:
        return {"day": self.day.isoformat(), "runs_created": self.runs_created, "skipped_by_cap": self.skipped_by_cap,
                "expired_by_retention": self.expired_by_retention}


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
        start, expired = window.start, 0
        if state.backlog_from is not None:
            backlog_from = as_utc(state.backlog_from)
            if backlog_from < retention.start:
                # Held so long by the cap that they left the window: counted, not silently lost.
                expired = len(_hours_without_run(conn, Window(backlog_from, retention.start)))
            start = max(retention.start, min(start, backlog_from))
        window = Window(start, window.end)
        waiting = _hours_without_run(conn, window)
        if state.last_tick_at is not None:
            # History stored since the last tick for hours before this scan's window.
            since = as_utc(state.last_tick_at) - LATE_OVERLAP
            late = _hours_without_run(conn, Window(retention.start, window.start), added_since=since)
            waiting = sorted(set(waiting) | set(late), key=lambda pair: (pair[1], pair[0]))
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
            conn, rollups_t,
            dict(day=utc_day(now), runs_created=len(created), skipped_by_cap=len(held), expired_by_retention=expired),
            key=["day"],
            updates={
                "runs_created": lambda new: rollups_t.c.runs_created + new.runs_created,
                "expired_by_retention": lambda new: rollups_t.c.expired_by_retention + new.expired_by_retention,
                "skipped_by_cap": lambda new: sa.case(
                    (new.skipped_by_cap > rollups_t.c.skipped_by_cap, new.skipped_by_cap),
                    else_=rollups_t.c.skipped_by_cap,
                ),
            },
        )
    memory_runs("queued", len(created))  # after the commit: counted once they exist
    return EnqueueResult(
        scan="full" if full else "recent", window=window, created=created, deferred=len(held),
        cap_left=max(0, room - len(created)), expired=expired,
    )


def _hours_without_run(conn: Connection, window: Window, *,
                       added_since: datetime | None = None) -> list[tuple[str, datetime]]:
    """(chat, hour) pairs with messages in the window and no run, oldest hour first;
    with ``added_since``, only hours that got messages stored since then."""
    has_run = sa.exists().where(runs_t.c.chat_id == messages_t.c.chat_id, runs_t.c.hour == messages_t.c.hour)
    query = (
        sa.select(messages_t.c.chat_id, messages_t.c.hour)
        .where(messages_t.c.hour >= window.start, messages_t.c.hour < window.end, ~has_run)
        .distinct()
        .order_by(messages_t.c.hour, messages_t.c.chat_id)
    )
    if added_since is not None:
        query = query.where(messages_t.c.added_at >= added_since)
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
        return [Rollup(row.day, row.runs_created, row.skipped_by_cap, row.expired_by_retention)
                for row in conn.execute(query)]


def notes_of(engine: Engine, chat_id: str, hour: datetime | None = None) -> list[dict]:
    query = sa.select(notes_t).where(notes_t.c.chat_id == chat_id).order_by(notes_t.c.hour, notes_t.c.id)
    if hour is not None:
        query = query.where(notes_t.c.hour == hour)
    with database_errors(engine), engine.connect() as conn:
        return [
            {"chat_id": r.chat_id, "hour": as_utc(r.hour).isoformat(), "text": r.text, "run_id": r.run_id}
            for r in conn.execute(query)
        ]

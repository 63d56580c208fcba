"""Notable routing events (lane_bypass, lane_config_mismatch, ...), append-only.

The table keeps the newest ``keep`` rows: each insert trims older ones by id in
the same transaction, one indexed range delete, so the table never needs a
cleanup job. High-rate per-request events belong to the walker's own storage,
not here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanes.catalog.engine import database_errors, writing
from lanes.catalog.tables import NAME_LENGTH, Event, utcnow
from lanes.errors import InvalidInput

DEFAULT_KEEP = 100_000  # Settings.events_max's default
events_t = Event.__table__


@dataclass(frozen=True)
class EventRecord:
    id: int
    at: datetime
    kind: str
    pool: str | None
    workflow: str | None
    detail: dict


def record_event(
    engine: Engine,
    kind: str,
    *,
    pool: str | None = None,
    workflow: str | None = None,
    detail: dict | None = None,
    keep: int = DEFAULT_KEEP,
) -> int:
    """Append one event and trim the table to the newest ``keep``; return its id."""
    if not kind or len(kind) > 60:
        raise InvalidInput(f"event kind {kind!r} must be 1-60 characters")
    if keep < 1:
        raise InvalidInput(f"keep {keep!r} must be at least 1")
    row = {
        "at": utcnow(),
        "kind": kind,
        "pool": pool[:NAME_LENGTH] if pool else pool,
        "workflow": workflow[:NAME_LENGTH] if workflow else workflow,
        "detail": dict(detail or {}),
    }
    with database_errors(engine), writing(engine) as conn:
        event_id = conn.execute(events_t.insert().values(**row).returning(events_t.c.id)).scalar_one()
        conn.execute(events_t.delete().where(events_t.c.id <= event_id - keep))
    return int(event_id)


def recent_events(engine: Engine, *, limit: int = 100, kind: str | None = None) -> list[EventRecord]:
    """The newest events first."""
    query = sa.select(events_t).order_by(events_t.c.id.desc()).limit(limit)
    if kind is not None:
        query = query.where(events_t.c.kind == kind)
    with database_errors(engine), engine.connect() as conn:
        return [EventRecord(**dict(row)) for row in conn.execute(query).mappings()]

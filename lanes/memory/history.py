"""Chat history: validating and storing messages.

A message is ``{"chat_id": str, "at": ISO 8601 time with a zone, "role":
user|assistant|system|tool, "text": str}``. A batch is checked whole before
anything is written, and written in one transaction: a refused file leaves
no message behind. A message dated in the future (beyond a few minutes of
clock skew) is refused: its hour cannot have happened yet.

A message is known by its digest (chat, time, role, text): importing the
same file twice stores each message once. A message for an hour whose run
already exists re-opens that run (done or failed: queued again, sent by the
next tick; running: run again once it ends), and one for an older hour
without a run is found by the next tick through its ``added_at`` (see
:func:`lanes.memory.runs.enqueue_runs`), so late history is extracted too.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Iterable, Mapping

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanes.catalog.engine import database_errors
from lanes.errors import InvalidInput
from lanes.memory.hours import as_utc, hour_start, parse_time
from lanes.memory.sql import insert_many_or_skip, write_transaction
from lanes.memory.tables import CHAT_ID_LENGTH, ROLES, messages_t, runs_t

FIELDS = ("chat_id", "at", "role", "text")
MAX_TEXT = 100_000
MAX_PROBLEMS_SHOWN = 10
# Clocks of the machines that write history disagree a little; beyond this a
# message is from the future.
FUTURE_SKEW = timedelta(minutes=5)


@dataclass(frozen=True)
class ChatMessage:
    chat_id: str
    at: datetime  # aware UTC
    role: str
    text: str

    @property
    def hour(self) -> datetime:
        return hour_start(self.at)

    def as_dict(self) -> dict:
        return {"chat_id": self.chat_id, "at": self.at.isoformat(), "role": self.role, "text": self.text}

    @property
    def digest(self) -> str:
        return message_digest(self.chat_id, self.at, self.role, self.text)


def message_digest(chat_id: str, at: datetime, role: str, text: str) -> str:
    """What makes a message the same message (migrations/versions/memory_0002 keeps a frozen copy)."""
    raw = "\x1f".join((chat_id, as_utc(at).isoformat(timespec="microseconds"), role, text))
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def check_message(value: object, *, now: datetime | None = None) -> ChatMessage:
    """A ChatMessage from a mapping, or InvalidInput naming the bad field.

    ``now`` (default: the system clock) bounds the time: a message more than
    :data:`FUTURE_SKEW` ahead of it is refused.
    """
    if isinstance(value, ChatMessage):
        value = value.as_dict() | {"at": value.at}
    if not isinstance(value, Mapping):
        raise InvalidInput(f"a message must be a JSON object with {', '.join(FIELDS)}, got {type(value).__name__}")
    unknown = sorted(set(value) - set(FIELDS))
    if unknown:
        raise InvalidInput(f"unknown field {unknown[0]!r} (fields: {', '.join(FIELDS)})")
    missing = [name for name in FIELDS if name not in value]
    if missing:
        raise InvalidInput(f"missing field {missing[0]!r} (fields: {', '.join(FIELDS)})")
    chat_id, at, role, text = (value[name] for name in FIELDS)
    if not isinstance(chat_id, str) or not chat_id.strip() or len(chat_id) > CHAT_ID_LENGTH:
        raise InvalidInput(f"chat_id {chat_id!r} must be a non-empty string of <= {CHAT_ID_LENGTH} characters")
    if isinstance(at, datetime):
        if at.tzinfo is None:
            raise InvalidInput(f"time {at.isoformat()} has no time zone; pass an aware UTC datetime")
        at = as_utc(at)
    elif isinstance(at, str):
        at = parse_time(at)
    else:
        raise InvalidInput(f"at {at!r} must be an ISO 8601 time with a zone, e.g. 2026-03-01T10:15:00Z")
    latest = as_utc(now or datetime.now(timezone.utc)) + FUTURE_SKEW
    if at > latest:
        raise InvalidInput(
            f"time {at.isoformat()} is in the future (now {latest - FUTURE_SKEW:%Y-%m-%dT%H:%M:%SZ}); "
            "history holds messages already sent: check the date and its time zone"
        )
    if role not in ROLES:
        raise InvalidInput(f"role {role!r} is not one of {', '.join(ROLES)}")
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput(f"text {text!r} must be a non-empty string")
    if len(text) > MAX_TEXT:
        raise InvalidInput(f"text of {len(text)} characters is longer than {MAX_TEXT}; split the message")
    return ChatMessage(chat_id, at, role, text)


def parse_json_lines(lines: Iterable[str], *, source: str = "input", now: datetime | None = None) -> list[ChatMessage]:
    """Every message of a JSON Lines text; blank lines are skipped.

    All problems are collected first, so one run of the command names every
    bad line (up to ten), each with its line number.
    """
    messages: list[ChatMessage] = []
    problems: list[str] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            try:
                value = json.loads(line)
            except ValueError as exc:
                raise InvalidInput(f"not JSON ({exc.msg})") from None
            messages.append(check_message(value, now=now))
        except InvalidInput as exc:
            problems.append(f"{source} line {number}: {exc}")
    refuse_problems(problems, noun="line", source=source)
    if not messages:
        raise InvalidInput(f"{source} holds no messages; write one JSON object per line")
    return messages


def refuse_problems(problems: list[str], *, noun: str, source: str) -> None:
    """Refuse a batch naming every problem found (the first ten, and how many more)."""
    if not problems:
        return
    shown = problems[:MAX_PROBLEMS_SHOWN]
    more = len(problems) - len(shown)
    tail = f"\n  ... and {more} more" if more else ""
    raise InvalidInput(
        f"{len(problems)} bad {noun}{'s' if len(problems) != 1 else ''} in {source}; nothing was written\n  "
        + "\n  ".join(shown) + tail
    )


@dataclass(frozen=True)
class Added:
    added: int  # new messages stored
    already: int  # messages stored before (same chat, time, role and text)


def add_messages(engine: Engine, messages: Iterable[object], *, now: datetime | None = None) -> Added:
    """Validate every message, then store the new ones in one transaction.

    A message already stored is skipped; the runs of the hours that gained
    messages are re-opened (see the module docstring).
    """
    now = as_utc(now or datetime.now(timezone.utc))
    checked = [check_message(m, now=now) for m in messages]
    if not checked:
        return Added(0, 0)
    rows, seen = [], set()
    for m in checked:
        if m.digest not in seen:  # the same message twice in one batch is one message
            seen.add(m.digest)
            rows.append({"chat_id": m.chat_id, "at": m.at, "hour": m.hour, "role": m.role, "text": m.text,
                         "digest": m.digest, "added_at": now})
    with write_transaction(engine) as conn:
        inserted = insert_many_or_skip(conn, messages_t, rows, unique=["digest"],
                                       returning=[messages_t.c.chat_id, messages_t.c.hour])
        for chat_id, hour in sorted({(r.chat_id, as_utc(r.hour)) for r in inserted}):
            _reopen(conn, chat_id, hour)
    return Added(len(inserted), len(checked) - len(inserted))


def _reopen(conn, chat_id: str, hour: datetime) -> None:
    """The run of a chat hour that gained messages: finished -> queued and unsent; running -> rerun.

    One UPDATE of the run's row whatever its status, so on PostgreSQL it
    waits for a claim or a completion of that run in flight and then sees
    its result (no late message slips between a claim and its reading).
    """
    finished = runs_t.c.status.in_(("done", "failed"))
    conn.execute(
        runs_t.update().where(runs_t.c.chat_id == chat_id, runs_t.c.hour == hour).values(
            rerun=sa.case((runs_t.c.status == "running", sa.true()), else_=runs_t.c.rerun),
            attempts=sa.case((finished, 0), else_=runs_t.c.attempts),
            sent_epoch=sa.case((finished, sa.null()), else_=runs_t.c.sent_epoch),
            status=sa.case((finished, "queued"), else_=runs_t.c.status),
        )
    )


def hour_messages(engine: Engine, chat_id: str, hour: datetime) -> list[ChatMessage]:
    """The messages of one chat hour, oldest first."""
    query = (
        sa.select(messages_t.c.chat_id, messages_t.c.at, messages_t.c.role, messages_t.c.text)
        .where(messages_t.c.chat_id == chat_id, messages_t.c.hour == hour_start(hour))
        .order_by(messages_t.c.at, messages_t.c.id)
    )
    with database_errors(engine), engine.connect() as conn:
        return [ChatMessage(r.chat_id, as_utc(r.at), r.role, r.text) for r in conn.execute(query)]

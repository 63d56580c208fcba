"""Chat history: validating and storing messages.

A message is ``{"chat_id": str, "at": ISO 8601 time with a zone, "role":
user|assistant|system|tool, "text": str}``. A batch is checked whole before
anything is written, and written in one transaction: a refused file leaves
no message behind.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Iterable, Mapping

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanes.catalog.engine import database_errors
from lanes.errors import InvalidInput
from lanes.memory.hours import as_utc, hour_start, parse_time
from lanes.memory.tables import CHAT_ID_LENGTH, ROLES, messages_t

FIELDS = ("chat_id", "at", "role", "text")
MAX_TEXT = 100_000
MAX_PROBLEMS_SHOWN = 10


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


def check_message(value: object) -> ChatMessage:
    """A ChatMessage from a mapping, or InvalidInput naming the bad field."""
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
    if role not in ROLES:
        raise InvalidInput(f"role {role!r} is not one of {', '.join(ROLES)}")
    if not isinstance(text, str) or not text.strip():
        raise InvalidInput(f"text {text!r} must be a non-empty string")
    if len(text) > MAX_TEXT:
        raise InvalidInput(f"text of {len(text)} characters is longer than {MAX_TEXT}; split the message")
    return ChatMessage(chat_id, at, role, text)


def parse_json_lines(lines: Iterable[str], *, source: str = "input") -> list[ChatMessage]:
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
            messages.append(check_message(value))
        except InvalidInput as exc:
            problems.append(f"{source} line {number}: {exc}")
    if problems:
        shown = problems[:MAX_PROBLEMS_SHOWN]
        more = len(problems) - len(shown)
        tail = f"\n  ... and {more} more" if more else ""
        raise InvalidInput(
            f"{len(problems)} bad line{'s' if len(problems) != 1 else ''} in {source}; nothing was written\n  "
            + "\n  ".join(shown) + tail
        )
    if not messages:
        raise InvalidInput(f"{source} holds no messages; write one JSON object per line")
    return messages


def add_messages(engine: Engine, messages: Iterable[object]) -> int:
    """Validate every message, then store them all in one transaction; return the count."""
    checked = [check_message(m) for m in messages]
    if not checked:
        return 0
    rows = [
        {"chat_id": m.chat_id, "at": m.at, "hour": m.hour, "role": m.role, "text": m.text} for m in checked
    ]
    with database_errors(engine), engine.begin() as conn:
        conn.execute(messages_t.insert(), rows)
    return len(rows)


def hour_messages(engine: Engine, chat_id: str, hour: datetime) -> list[ChatMessage]:
    """The messages of one chat hour, oldest first."""
    query = (
        sa.select(messages_t.c.chat_id, messages_t.c.at, messages_t.c.role, messages_t.c.text)
        .where(messages_t.c.chat_id == chat_id, messages_t.c.hour == hour_start(hour))
        .order_by(messages_t.c.at, messages_t.c.id)
    )
    with database_errors(engine), engine.connect() as conn:
        return [ChatMessage(r.chat_id, as_utc(r.at), r.role, r.text) for r in conn.execute(query)]

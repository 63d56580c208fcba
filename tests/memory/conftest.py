"""A catalog database (SQLite and PostgreSQL) with the memory tables at head."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from lanes.catalog import make_engine
from lanes.memory import add_messages, ensure_memory_schema


@pytest.fixture
def memory_engine(db_url):
    engine = make_engine(db_url)
    ensure_memory_schema(engine)
    yield engine
    engine.dispose()


def utc(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=timezone.utc)


def say(engine, chat_id: str, *times: str, text: str = "I moved to Lisbon last week") -> None:
    """One user message in ``chat_id`` at each of ``times`` (ISO, UTC), said as the last of them
    happens (tests walk clocks past the machine's date)."""
    at = [t if isinstance(t, datetime) else utc(t) for t in times]
    add_messages(engine, [{"chat_id": chat_id, "at": t, "role": "user", "text": text} for t in at], now=max(at))

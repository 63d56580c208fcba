"""Adding chat history for the memory runs (``lanes history add``, ``POST /v1/history``)."""

from __future__ import annotations

from datetime import datetime
from typing import Iterable

from lanes.errors import InvalidInput
from lanes.memory import add_messages, check_message, open_memory
from lanes.memory.history import refuse_problems


def add_history(settings, messages: Iterable[object], *, now: datetime | None = None) -> dict:
    """Check every message, then store the new ones in one transaction.

    Any bad message refuses the whole batch (nothing is written), and the
    refusal names every bad message by its index, as the CLI names every
    bad line of a file. A message stored before is skipped. Returns
    ``{"added": new messages, "already": skipped, "chats": distinct chat ids}``.
    """
    messages = list(messages)
    if not messages:
        raise InvalidInput("no messages given; send at least one {chat_id, at, role, text} object")
    checked, problems = [], []
    for index, message in enumerate(messages):
        try:
            checked.append(check_message(message, now=now))
        except InvalidInput as exc:
            problems.append(f"messages[{index}]: {exc}")
    refuse_problems(problems, noun="message", source="the request")
    engine = open_memory(settings)
    try:
        added = add_messages(engine, checked, now=now)
    finally:
        engine.dispose()
    return {"added": added.added, "already": added.already, "chats": len({m.chat_id for m in checked})}

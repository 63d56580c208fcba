"""Adding chat history for the memory runs (``lanes history add``, ``POST /v1/history``)."""

from __future__ import annotations

from typing import Iterable

from lanes.errors import InvalidInput
from lanes.memory import add_messages, check_message, open_memory


def add_history(settings, messages: Iterable[object]) -> dict:
    """Check every message, then store them all in one transaction.

    Any bad message refuses the whole batch (nothing is written). Returns
    ``{"added": count, "chats": distinct chat ids}``.
    """
    messages = list(messages)
    if not messages:
        raise InvalidInput("no messages given; send at least one {chat_id, at, role, text} object")
    checked = []
    for index, message in enumerate(messages):
        try:
            checked.append(check_message(message))
        except InvalidInput as exc:
            where = f"messages[{index}]: " if len(messages) > 1 else ""
            raise InvalidInput(f"{where}{exc}; nothing was written") from None
    engine = open_memory(settings)
    try:
        count = add_messages(engine, checked)
    finally:
        engine.dispose()
    return {"added": count, "chats": len({m.chat_id for m in checked})}

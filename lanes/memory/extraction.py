"""The extraction prompt for one chat hour, and reading notes out of the answer.

The model is asked for a JSON object ``{"notes": ["...", ...]}``. The
simulator recognises the marker in the system prompt and answers in that
shape, so tests and the demo exercise the whole path.
"""

from __future__ import annotations

import json
import re
from datetime import datetime

from lanes.errors import LanesError
from lanes.memory.history import ChatMessage

MARKER = "[lanes:memory-extraction]"
MAX_NOTES = 20
MAX_NOTE_CHARS = 2_000

SYSTEM_PROMPT = (
    f"{MARKER} You extract long-term memories from a chat transcript. "
    "Write down facts about the user worth remembering later: preferences, plans, "
    "people, places, decisions. Skip small talk. Answer with JSON only: "
    '{"notes": ["one fact per string", ...]}; use {"notes": []} when there is nothing to keep.'
)


class NotesUnreadable(LanesError):
    """The model's answer held no readable notes; the run is retried."""


def extraction_payload(chat_id: str, hour: datetime, messages: list[ChatMessage]) -> dict:
    """The chat-completion payload for the ``memory_extraction`` workflow."""
    lines = [f"{m.role}: {' '.join(m.text.split())}" for m in messages]
    transcript = f"Chat {chat_id}, hour starting {hour.isoformat()} (UTC):\n" + "\n".join(lines)
    return {
        "messages": [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": transcript},
        ],
        "temperature": 0,
    }


def answer_text(answer: dict) -> str:
    try:
        return str(answer["choices"][0]["message"]["content"] or "")
    except (KeyError, IndexError, TypeError):
        raise NotesUnreadable(f"the answer has no message content: {json.dumps(answer)[:200]}") from None


def parse_notes(text: str) -> list[str]:
    """The notes of an answer: the first JSON object holding a ``notes`` list of strings.

    Models wrap JSON in prose or code fences; the outermost braces are tried.
    """
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise NotesUnreadable(f"no JSON object in the answer: {_show(text)}")
    try:
        value = json.loads(text[start:end + 1])
    except ValueError as exc:
        raise NotesUnreadable(f"the answer's JSON does not parse ({exc.msg}): {_show(text)}") from None
    notes = value.get("notes") if isinstance(value, dict) else None
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise NotesUnreadable(f"the answer has no 'notes' list of strings: {_show(text)}")
    cleaned, seen = [], set()
    for note in notes:
        note = re.sub(r"\s+", " ", note).strip()[:MAX_NOTE_CHARS]
        if note and note not in seen:
            seen.add(note)
            cleaned.append(note)
    return cleaned[:MAX_NOTES]


def _show(text: str) -> str:
    flat = " ".join(text.split())
    return repr(flat[:160] + ("..." if len(flat) > 160 else ""))

"""The demo's memory step: a few chats' history, the beat creating their memory runs, the runs completed.

Before the fleet starts, the demo ingests three short chats in the last
completed hour (:func:`ingest_demo_chats`), then starts ``lanes beat`` and a
memory worker beside the fleet workers (:mod:`lanes.demo.services`). The beat, once it holds its lock,
runs its start-up scan: it finds those chat hours without a run, creates the
runs and sends them to the memory worker, whose extraction goes through the
lanes at background priority while the rest of the demo runs.
:func:`show_memory_runs` follows them to ``done`` and prints them.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from rich.console import Console
from rich.table import Table

from lanes.clock import SystemClock
from lanes.memory.history import add_messages
from lanes.memory.hours import hour_start
from lanes.memory.runs import list_runs, notes_of
from lanes.memory.schema import open_memory
from lanes.settings import Settings

CHATS = {
    "ana": ["I just moved to Porto for a new job", "My sister Rita is visiting in June"],
    "ben": ["I am allergic to peanuts", "Remind me that my passport expires in March"],
    "chen": ["I am training for the Lisbon half marathon", "I prefer tea to coffee"],
}


@dataclass(frozen=True)
class DemoChats:
    chat_ids: list[str]
    hour: datetime
    messages: int


def ingest_demo_chats(settings: Settings) -> DemoChats:
    """Add the demo's chats to the history, in the last completed hour, under ids new to this run."""
    engine = open_memory(settings)
    try:
        now = SystemClock().now()
        hour = hour_start(now) - timedelta(hours=1)
        stamp = now.strftime("%H%M%S")
        messages = []
        for name, lines in CHATS.items():
            for i, text in enumerate(lines):
                messages.append({"chat_id": f"{name}-{stamp}", "at": hour + timedelta(minutes=10 + 5 * i),
                                 "role": "user", "text": text})
                messages.append({"chat_id": f"{name}-{stamp}", "at": hour + timedelta(minutes=12 + 5 * i),
                                 "role": "assistant", "text": "Noted."})
        add_messages(engine, messages)
        return DemoChats([f"{name}-{stamp}" for name in CHATS], hour, len(messages))
    finally:
        engine.dispose()


def show_memory_runs(settings: Settings, chats: DemoChats, console: Console, timeout: float = 90.0) -> dict:
    """Follow the runs the beat created for ``chats`` until each is done or failed; print them.

    Returns ``{"runs": n, "done": n}``.
    """
    engine = open_memory(settings)
    try:
        deadline = time.monotonic() + timeout
        while True:
            runs = [run for chat in chats.chat_ids for run in list_runs(engine, chat_id=chat)]
            finished = len(runs) == len(chats.chat_ids) and all(r.status in ("done", "failed") for r in runs)
            if finished or time.monotonic() > deadline:
                break
            time.sleep(0.3)
        table = Table(title="memory runs the beat created (background priority, memory_extraction)")
        for column in ("chat", "hour (UTC)", "status", "attempts", "notes", "first note"):
            table.add_column(column)
        for run in runs:
            notes = notes_of(engine, run.chat_id, run.hour)
            table.add_row(run.chat_id, f"{run.hour:%Y-%m-%d %H:00}", run.status, str(run.attempts),
                          str(len(notes)), notes[0]["text"] if notes else "")
        console.print(table)
        return {"runs": len(runs), "done": sum(1 for r in runs if r.status == "done")}
    finally:
        engine.dispose()

"""The demo's memory step: a few chats' history, the beat creating their memory runs, the runs completed.

Before the fleet starts, the demo ingests three short chats in the last
completed hour (:func:`ingest_demo_chats`), then starts ``lanes beat`` and a
memory worker beside the fleet workers. The beat, once it holds its lock,
runs its start-up scan: it finds those chat hours without a run, creates the
runs and sends them to the memory worker, whose extraction goes through the
lanes at background priority while the rest of the demo runs.
:func:`show_memory_runs` follows them to ``done`` and prints them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

import redis
from rich.console import Console
from rich.table import Table

from lanes.clock import SystemClock
from lanes.memory.history import add_messages
from lanes.memory.hours import hour_start
from lanes.memory.runs import list_runs, notes_of
from lanes.memory.schema import open_memory
from lanes.namespace import Namespace
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


def start_beat(settings: Settings, redis_url: str) -> subprocess.Popen:
    """``lanes beat`` as a process of its own (the scheduler is started, never imported, from here)."""
    return _start(settings, redis_url, "beat", [sys.executable, "-m", "scheduler.main", "--loglevel", "INFO"])


def start_memory_worker(settings: Settings, redis_url: str) -> subprocess.Popen:
    return _start(settings, redis_url, "worker-memory", [sys.executable, "-m", "workers.memory", "--concurrency", "2"])


def beat_status(settings: Settings, redis_url: str) -> dict | None:
    """Who holds the beat lock and since when (the hash the active beat refreshes), or None."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        active = client.hgetall(Namespace(settings.key_prefix).beat_active)
    finally:
        client.close()
    return active or None


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


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(40)
    except subprocess.TimeoutExpired:
        proc.kill()


def _start(settings: Settings, redis_url: str, name: str, args: list[str]) -> subprocess.Popen:
    env = os.environ.copy()
    env["LANES_STATE_DIR"] = str(settings.state_dir)
    env["LANES_REDIS_URL"] = redis_url
    logs = settings.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as log:
        return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)

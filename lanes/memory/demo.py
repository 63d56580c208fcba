"""The demo's memory step: a few chats' history, their memory runs created and completed.

Run after the demo's workload, on the same Redis, catalog and simulator: it
ingests three short chats in the last completed hour, starts the memory
workers, runs the hourly enqueue and follows the runs to ``done``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import timedelta

from rich.console import Console
from rich.table import Table

from lanes.clock import SystemClock
from lanes.memory.dispatch import enqueue_and_dispatch
from lanes.memory.history import add_messages
from lanes.memory.hours import hour_start
from lanes.memory.runs import get_run, notes_of
from lanes.memory.schema import open_memory
from lanes.routing.client import LanesClient
from lanes.settings import Settings

CHATS = {
    "ana": ["I just moved to Porto for a new job", "My sister Rita is visiting in June"],
    "ben": ["I am allergic to peanuts", "Remind me that my passport expires in March"],
    "chen": ["I am training for the Lisbon half marathon", "I prefer tea to coffee"],
}


def show_memory_runs(settings: Settings, redis_url: str, client: LanesClient, console: Console,
                     timeout: float = 90.0) -> bool:
    """Ingest, enqueue, run; print the runs and a note per chat. True when every run is done."""
    engine = open_memory(settings)
    now = SystemClock().now()
    hour = hour_start(now) - timedelta(hours=1)  # the last completed hour
    stamp = now.strftime("%H%M%S")
    messages = []
    for name, lines in CHATS.items():
        for i, text in enumerate(lines):
            messages.append({"chat_id": f"{name}-{stamp}", "at": hour + timedelta(minutes=10 + 5 * i),
                             "role": "user", "text": text})
            messages.append({"chat_id": f"{name}-{stamp}", "at": hour + timedelta(minutes=12 + 5 * i),
                             "role": "assistant", "text": "Noted."})
    add_messages(engine, messages)
    console.print(f"[bold]memory runs[/]: {len(messages)} messages in {len(CHATS)} chats, hour {hour:%H:00} UTC")
    worker = _start_memory_worker(settings, redis_url)
    try:
        result, _ = enqueue_and_dispatch(engine, client.celery, settings, now=now, full=False)
        runs = [run for run in result.created if run.chat_id.endswith(stamp)]
        console.print(f"hourly enqueue created {len(result.created)} runs; following them through the lanes")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            states = [get_run(engine, run.id) for run in runs]
            if all(s.status in ("done", "failed") for s in states):
                break
            time.sleep(0.3)
        table = Table(title="memory runs (background priority, memory_extraction)")
        for column in ("chat", "hour (UTC)", "status", "attempts", "notes", "first note"):
            table.add_column(column)
        all_done = True
        for run in runs:
            state = get_run(engine, run.id)
            notes = notes_of(engine, run.chat_id, run.hour)
            all_done &= state.status == "done"
            table.add_row(run.chat_id, f"{run.hour:%Y-%m-%d %H:00}", state.status, str(state.attempts),
                          str(len(notes)), notes[0]["text"] if notes else "")
        console.print(table)
        return all_done
    finally:
        _stop(worker)
        engine.dispose()


def _start_memory_worker(settings: Settings, redis_url: str) -> subprocess.Popen:
    env = os.environ.copy()
    env["LANES_STATE_DIR"] = str(settings.state_dir)
    env["LANES_REDIS_URL"] = redis_url
    logs = settings.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / "worker-memory.log", "ab") as log:
        return subprocess.Popen([sys.executable, "-m", "workers.memory", "--concurrency", "2"],
                                env=env, stdout=log, stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(40)
    except subprocess.TimeoutExpired:
        proc.kill()

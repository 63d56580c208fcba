"""Chat history and hourly memory runs.

- :func:`open_memory` gives a catalog engine with the memory tables at head;
- :func:`add_messages` / :func:`parse_json_lines` ingest chat history;
- :func:`enqueue_runs` creates the runs due at a given time (idempotent, capped);
- :func:`list_runs`, :func:`rollups`, :func:`notes_of` read them back;
- :mod:`lanes.memory.lifecycle` claims, completes, retries and reclaims runs
  (at most one execution at a time), :mod:`lanes.memory.dispatch` sends them.

The worker that runs a memory run, and its fleet, live in ``workers/memory/``;
the beat that enqueues runs every hour lives in ``scheduler/``.
"""

from lanes.memory.history import ChatMessage, add_messages, check_message, hour_messages, parse_json_lines
from lanes.memory.hours import Window, hour_start, parse_time, recent_window, retention_window
from lanes.memory.runs import (
    EnqueueResult,
    Rollup,
    RunRecord,
    enqueue_runs,
    get_run,
    list_runs,
    notes_of,
    rollups,
    status_counts,
)
from lanes.memory.schema import ensure_memory_schema, open_memory

MEMORY_WORKFLOW = "memory_extraction"

__all__ = [
    "MEMORY_WORKFLOW",
    "ChatMessage",
    "EnqueueResult",
    "Rollup",
    "RunRecord",
    "Window",
    "add_messages",
    "check_message",
    "ensure_memory_schema",
    "enqueue_runs",
    "get_run",
    "hour_messages",
    "hour_start",
    "list_runs",
    "notes_of",
    "open_memory",
    "parse_json_lines",
    "parse_time",
    "recent_window",
    "retention_window",
    "rollups",
    "status_counts",
]

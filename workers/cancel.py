"""Cancelling lane waits when a task is revoked or the worker shuts down.

Each running task registers an event that its lane wait watches. A revoke
only marks the id in the worker's in-memory ``revoked`` set (the threads
pool cannot terminate a thread), so one watcher thread per worker checks the
registered ids against that set; a warm shutdown cancels every wait at once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from celery import signals
from celery.worker import state as worker_state


@dataclass
class Cancellation:
    event: threading.Event = field(default_factory=threading.Event)
    reason: str | None = None

    def cancel(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.event.set()


class CancelRegistry:
    def __init__(self, *, watch_interval: float = 0.2) -> None:
        self._items: dict[str, Cancellation] = {}
        self._lock = threading.Lock()
        self._interval = watch_interval
        self._shutting_down = False
        self._watcher: threading.Thread | None = None

    def register(self, task_id: str) -> Cancellation:
        item = Cancellation()
        with self._lock:
            if self._shutting_down:
                item.cancel("shutdown")
            self._items[task_id] = item
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="lanes-revoke-watch", daemon=True)
                self._watcher.start()
        return item

    def __len__(self) -> int:
        """How many tasks are registered now (the worker's in-flight count)."""
        return len(self._items)

    def unregister(self, task_id: str) -> None:
        with self._lock:
            self._items.pop(task_id, None)

    def cancel_all(self, reason: str) -> None:
        with self._lock:
            self._shutting_down = self._shutting_down or reason == "shutdown"
            for item in self._items.values():
                item.cancel(reason)

    def _watch(self) -> None:
        # Reads an in-memory set only: no Redis traffic while tasks wait.
        while True:
            with self._lock:
                items = list(self._items.items())
            for task_id, item in items:
                if task_id in worker_state.revoked:
                    item.cancel("revoked")
            threading.Event().wait(self._interval)


def stop_with_the_worker(context) -> None:
    """A warm shutdown cancels every lane wait of ``context.cancels`` at
    once; the worker's end closes ``context``. worker_shutdown, not
    worker_process_shutdown: the threads pool has no child processes, and the
    event buffer must be flushed on the way out."""

    @signals.worker_shutting_down.connect(weak=False)
    def _cancel_waits(**_) -> None:
        context.cancels.cancel_all("shutdown")

    @signals.worker_shutdown.connect(weak=False)
    def _close(**_) -> None:
        context.close()

"""Keeps at least one worker thread free of background work.

When background tasks occupy all but one thread, the worker stops consuming
the fleet's background queue; when one ends, it consumes it again. The
switch runs on the consumer's own loop (``call_soon``), which is the only
thread allowed to touch it. A background message that slipped in before the
switch took effect is handed back to the queue.
"""

from __future__ import annotations

import threading


class BackgroundGate:
    def __init__(self, limit: int, queue: str) -> None:
        if limit < 1:
            raise ValueError(f"background limit {limit} must be >= 1")
        self.limit = limit
        self.queue = queue
        self.consumer = None  # set by the ConsumerHandle bootstep
        self._active = 0
        self._paused = False
        self._lock = threading.Lock()

    @property
    def active(self) -> int:
        return self._active

    def enter(self) -> bool:
        with self._lock:
            if self._active >= self.limit:
                return False
            self._active += 1
            if self._active >= self.limit and not self._paused:
                self._paused = True
                self._switch(consume=False)
            return True

    def leave(self) -> None:
        with self._lock:
            self._active -= 1
            if self._paused and self._active < self.limit:
                self._paused = False
                self._switch(consume=True)

    def _switch(self, *, consume: bool) -> None:
        consumer = self.consumer
        if consumer is None:
            return
        if consume:
            consumer.call_soon(consumer.add_task_queue, self.queue)
        else:
            consumer.call_soon(consumer.cancel_task_queue, self.queue)

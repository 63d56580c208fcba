"""A cancellation flag that wakes lane waiters the moment it is set.

A plain ``threading.Event`` cannot be waited on together with another event,
so a waiter given one checks it every ``PLAIN_EVENT_CHECK_SECONDS`` (a local
flag read, no Redis traffic). A :class:`CancelEvent` (a ``threading.Event``)
calls its waiters back instead, so cancellation is immediate and free.
"""

from __future__ import annotations

import threading
from typing import Callable

PLAIN_EVENT_CHECK_SECONDS = 0.05


class CancelEvent(threading.Event):
    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], None]] = []
        self._callbacks_lock = threading.Lock()

    def set(self) -> None:
        super().set()
        with self._callbacks_lock:
            callbacks = list(self._callbacks)
        for callback in callbacks:
            callback()

    def add_callback(self, callback: Callable[[], None]) -> None:
        with self._callbacks_lock:
            self._callbacks.append(callback)
        if self.is_set():
            callback()

    def remove_callback(self, callback: Callable[[], None]) -> None:
        with self._callbacks_lock:
            try:
                self._callbacks.remove(callback)
            except ValueError:
                pass

"""Injected time, so controllers, budgets and schedules can be driven in tests."""

from __future__ import annotations

import time
from datetime import datetime, timezone
from typing import Protocol


class Clock(Protocol):
    def monotonic(self) -> float: ...
    def now(self) -> datetime: ...


class SystemClock:
    def monotonic(self) -> float:
        return time.monotonic()

    def now(self) -> datetime:
        return datetime.now(timezone.utc)


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, start: datetime | None = None) -> None:
        self._mono = 0.0
        self._start = start or datetime(2026, 1, 1, tzinfo=timezone.utc)

    def monotonic(self) -> float:
        return self._mono

    def now(self) -> datetime:
        from datetime import timedelta

        return self._start + timedelta(seconds=self._mono)

    def advance(self, seconds: float) -> None:
        self._mono += seconds

"""Waiting on real state in tests: poll the thing itself, never a fixed sleep."""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable


def eventually(probe: Callable[[], Any], *, timeout: float = 5.0, what: str = "condition",
               interval: float = 0.005, shown: Callable[[], Any] | None = None) -> Any:
    """Poll ``probe`` until it returns something truthy; return that value.

    ``shown``: what a timeout reports besides the probe's last value (the
    state a comparison was made on, say)."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            seen = f"; {shown()!r}" if shown is not None else ""
            raise AssertionError(f"timed out waiting for {what}; last value {value!r}{seen}")
        time.sleep(interval)


async def aeventually(probe: Callable[[], Any], *, timeout: float = 5.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}; last value {value!r}")
        await asyncio.sleep(0.005)

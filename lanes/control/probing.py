"""When a law may probe above a capacity it measured, and how far.

A probe is a width above the last measured capacity, tried to learn whether
the backend grew. Laws that read gauges count their back-off in readings (a
probe is judged on one); the ``overload`` law counts decisions. Probing forever costs: each failed probe queues work in
vLLM (or earns 529s) until the next fresh reading shows it. So, kept in the
law's ``memo`` (plain JSON, no clock: decisions are counted):

- **back-off**: after a probe fails (the width above the measurement was cut
  again), the next probe waits ``probe_backoff`` decisions, doubling with
  every probe that fails in a row up to ``max_probe_backoff``; a probe that
  holds resets it;
- **proportion**: at small widths the smallest step (+1) is a large share of
  the width (+100 % at 1, +50 % at 2). The wait is stretched by how much the
  step exceeds ``probe_fraction`` of the width, so the share of time spent
  over capacity stays what ``probe_fraction`` promises at any width;
- **demand** and **fresh evidence** are the law's to check (work waiting in
  the lane; a reading taken after the width last changed, past the gauges'
  lag): :func:`evidence_after_change`.
"""

from __future__ import annotations

import math


def tick(memo: dict) -> int:
    """Count one decision; the decision's number."""
    memo["n"] = memo.get("n", 0) + 1
    return memo["n"]


def step(width: int, fraction: float, minimum: int = 1) -> int:
    return max(minimum, math.ceil(width * fraction))


def allowed(memo: dict) -> bool:
    return memo.get("n", 0) >= memo.get("quiet_until", 0)


def waiting_for(memo: dict) -> int:
    return max(0, memo.get("quiet_until", 0) - memo.get("n", 0))


def failed(memo: dict, width: int, measured: int, params: dict, *, probed: bool) -> None:
    """A cut from ``width`` to a new ``measured`` capacity: no probe for a while. When ``width``
    was a probe above the previous measurement, the probe failed: the wait doubles. Otherwise
    the backend itself changed (or its capacity was just found): the wait starts over."""
    if measured >= width:
        return
    if probed:
        backoff = memo.get("backoff")
        backoff = params["probe_backoff"] if backoff is None else min(params["max_probe_backoff"], backoff * 2)
        memo["backoff"] = backoff
    else:
        # A capacity just found (or a backend that changed): a short pause, since the first
        # measurement can be a little low; the back-off proper starts with a failed probe.
        memo.pop("backoff", None)
        backoff = max(1, params["probe_backoff"] // 8)
    # The next probe's step from the measurement, as a share of it, against the promised share.
    share = step(measured, params["probe_fraction"]) / max(1, measured)
    stretch = max(1.0, share / params["probe_fraction"])
    memo["quiet_until"] = memo.get("n", 0) + math.ceil(backoff * stretch)


def held(memo: dict) -> None:
    """A probe held: the back-off starts over."""
    memo.pop("backoff", None)
    memo.pop("quiet_until", None)


def evidence_after_change(width_age: float | None, reading_age: float, lag: float) -> bool:
    """Whether a reading ``reading_age`` seconds old was taken at least ``lag`` seconds
    after the width last changed ``width_age`` seconds ago (None: long ago)."""
    return width_age is None or width_age - reading_age >= lag

"""The adaptive-controller kinds a pool may name, and their parameters.

This is the catalog's contract with the controllers: a kind listed here with
its parameters is what a pool row may hold. Parameters left out of a file are
filled with their defaults when the file is applied, so the catalog shows the
settings in effect and an export re-applies unchanged. Adding a controller is
one more entry in ``KINDS``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lanes.catalog.shown import show


@dataclass(frozen=True)
class Param:
    kind: type  # int or float
    default: int | float
    low: float
    high: float
    low_open: bool = False  # True: the value must be strictly above ``low``
    doc: str = ""

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is unacceptable, or None."""
        accepted = (int,) if self.kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, accepted):
            return f"{show(value)} is not {'an integer' if self.kind is int else 'a number'}"
        # nan compares false with everything, so it would pass the bounds below;
        # inf is refused by them, but say the same thing for both.
        if isinstance(value, float) and not math.isfinite(value):
            return f"{show(value)} is not a finite number"
        below = value <= self.low if self.low_open else value < self.low
        if below or value > self.high:
            opener = "(" if self.low_open else "["
            return f"{show(value)} is outside {opener}{self.low:g}, {self.high:g}]"
        return None


KINDS: dict[str, dict[str, Param]] = {
    # Adaptive off means off: the lane's width is exactly the configured width.
    "off": {},
    # Additive increase, multiplicative decrease on 429/503/529 answers.
    "overload": {
        "step": Param(int, 1, 1, 64, doc="slots added after a quiet interval"),
        "backoff": Param(float, 0.5, 0.0, 1.0, low_open=True, doc="width multiplier on an overload"),
        "interval_seconds": Param(float, 30.0, 0.0, 3600.0, low_open=True),
    },
    # vLLM's Prometheus gauges: grow while requests wait in vLLM less than this.
    "vllm_gauges": {
        "target_waiting": Param(int, 0, 0, 10_000),
        "interval_seconds": Param(float, 15.0, 0.0, 3600.0, low_open=True),
    },
    # First-token latency against a budget.
    "latency": {
        "ttft_budget_ms": Param(int, 2_000, 1, 600_000),
        "interval_seconds": Param(float, 15.0, 0.0, 3600.0, low_open=True),
    },
    # Keep the backend's utilisation near a target fraction.
    "utilisation": {
        "target": Param(float, 0.85, 0.0, 1.0, low_open=True),
        "interval_seconds": Param(float, 15.0, 0.0, 3600.0, low_open=True),
    },
}


def normalise(params: dict[str, Any], kind: str) -> dict[str, Any]:
    """``params`` with defaults filled in, numbers in their declared type. Assumes valid input."""
    spec = KINDS[kind]
    return {name: spec[name].kind(params.get(name, spec[name].default)) for name in sorted(spec)}


def problems(params: dict[str, Any], kind: str) -> list[tuple[str, str]]:
    """(parameter, message) for each bad parameter of a controller of ``kind``."""
    spec = KINDS[kind]
    found = []
    for name, value in params.items():
        if name not in spec:
            known = ", ".join(sorted(spec)) or "none"
            found.append((name, f"{value!r} is not a parameter of controller {kind!r} (known: {known})"))
            continue
        message = spec[name].problem(value)
        if message:
            found.append((name, message))
    return found

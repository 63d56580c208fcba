"""The adaptive-controller kinds a pool may name, and their parameters.

This is the catalog's contract with the controllers (:mod:`lanes.control`):
a kind listed here with its parameters is what a pool row may hold. A pool
names one controller (``controller = {kind = "vllm"}``) or several
(``controller = [{kind = "vllm"}, {kind = "overload"}]``); several are
composed by veto (the lowest proposal wins). Parameters left out of a file
are filled with their defaults when the file is applied, so the catalog shows
the settings in effect and an export re-applies unchanged.

In the database a pool keeps ``controller_kind`` (``off`` or the kinds in
effect joined by commas, sorted) and ``controller_params`` (kind ->
parameters). Adding a controller is one more entry in ``KINDS``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from lanes.catalog.shown import show

OFF = "off"


@dataclass(frozen=True)
class Param:
    kind: type  # int, float, or list (a list of integers within low..high)
    default: Any
    low: float
    high: float
    low_open: bool = False  # True: the value must be strictly above ``low``
    doc: str = ""
    high_open: bool = False  # True: the value must be strictly below ``high``

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is unacceptable, or None."""
        if self.kind is list:
            if not isinstance(value, list) or not value:
                return f"{show(value)} is not a non-empty list of integers"
            for item in value:
                if isinstance(item, bool) or not isinstance(item, int) or not self.low <= item <= self.high:
                    return f"{show(item)} in {show(value)} is not an integer within [{self.low:g}, {self.high:g}]"
            return None
        accepted = (int,) if self.kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, accepted):
            return f"{show(value)} is not {'an integer' if self.kind is int else 'a number'}"
        # nan compares false with everything, so it would pass the bounds below;
        # inf is refused by them, but say the same thing for both.
        if isinstance(value, float) and not math.isfinite(value):
            return f"{show(value)} is not a finite number"
        below = value <= self.low if self.low_open else value < self.low
        above = value >= self.high if self.high_open else value > self.high
        if below or above:
            opener, closer = "(" if self.low_open else "[", ")" if self.high_open else "]"
            return f"{show(value)} is outside {opener}{self.low:g}, {self.high:g}{closer}"
        return None


def _interval(default: float) -> Param:
    return Param(float, default, 0.0, 3600.0, low_open=True, doc="seconds between two decisions")


KINDS: dict[str, dict[str, Param]] = {
    # Adaptive off means off: the lane's width is exactly the configured width.
    OFF: {},
    # Overload answers (529 by default) from requests admitted under the
    # current generation: cut to the in-flight count measured at the first
    # one (x cut_factor when none was measured); grow when every slot was used.
    "overload": {
        "statuses": Param(list, [529], 100, 599, doc="HTTP statuses that mean the backend is overloaded"),
        "cut_factor": Param(float, 0.8, 0.0, 1.0, low_open=True, doc="width multiplier when no capacity was measured"),
        "growth_factor": Param(float, 1.5, 1.0, 4.0, low_open=True, doc="width multiplier while no capacity is known"),
        "probe_fraction": Param(float, 0.05, 0.0, 1.0, low_open=True, doc="step above a measured capacity"),
        "interval_seconds": _interval(5.0),
    },
    # vLLM's Prometheus gauges, scraped from each backend of the pool.
    "vllm": {
        "scrape_seconds": Param(float, 12.0, 0.0, 3600.0, low_open=True, doc="least time between two scrapes"),
        "timeout_seconds": Param(float, 2.0, 0.0, 60.0, low_open=True, doc="one scrape's timeout"),
        "stale_seconds": Param(float, 60.0, 0.0, 86400.0, low_open=True, doc="a last good scrape older than this is a failure"),
        "waiting_threshold": Param(int, 0, 0, 1_000_000, doc="without the capacity gauge: waiting above this is saturated"),
        "kv_threshold": Param(float, 0.98, 0.0, 1.0, low_open=True, doc="KV-cache usage at or above this is saturated"),
        "near_full": Param(float, 0.8, 0.0, 1.0, low_open=True, doc="running at or above this fraction of the width grows it"),
        "growth_fraction": Param(float, 0.5, 0.0, 4.0, low_open=True, doc="step while no capacity is known (at least 1)"),
        "probe_fraction": Param(float, 0.05, 0.0, 1.0, low_open=True, doc="step above a measured capacity"),
        "max_cut": Param(float, 0.5, 0.0, 1.0, low_open=True, doc="a cut keeps at least (1 - max_cut) of the width"),
        "interval_seconds": _interval(5.0),
    },
    # Utilisation (the KV-cache gauge) kept near a target, as an autoscaler would.
    "utilisation": {
        "target": Param(float, 0.85, 0.0, 1.0, low_open=True),
        "tolerance": Param(float, 0.05, 0.0, 1.0, doc="no change while target / utilisation is this close to 1"),
        "min_completions": Param(int, 20, 1, 1_000_000, doc="evidence a decision needs"),
        "min_intervals": Param(int, 6, 1, 10_000, doc="busy intervals a decision needs (gauges are instants)"),
        "max_window_intervals": Param(int, 30, 1, 10_000, doc="a window is judged after this many busy intervals at the latest"),
        "max_rise": Param(float, 2.0, 1.0, 16.0, low_open=True),
        "scrape_seconds": Param(float, 12.0, 0.0, 3600.0, low_open=True),
        "timeout_seconds": Param(float, 2.0, 0.0, 60.0, low_open=True),
        "interval_seconds": _interval(5.0),
    },
}


def _typed(param: Param, value: Any) -> Any:
    return [int(v) for v in value] if param.kind is list else param.kind(value)


def normalise(params: dict[str, Any], kind: str) -> dict[str, Any]:
    """``params`` with defaults filled in, numbers in their declared type. Assumes valid input."""
    spec = KINDS[kind]
    return {name: _typed(spec[name], params.get(name, spec[name].default)) for name in sorted(spec)}


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


# --- the file form and the stored form -----------------------------------------------


def entries(value: Any) -> list[Any]:
    """A pool's ``controller`` value as a list of entries (one table or a list of tables)."""
    return value if isinstance(value, list) else [value]


def kinds_of(kind_text: str) -> tuple[str, ...]:
    """The kinds in effect from a stored ``controller_kind`` (``()`` when off)."""
    return tuple(k for k in kind_text.split(",") if k and k != OFF)


def stored(value: Any) -> tuple[str, dict[str, dict[str, Any]]]:
    """(controller_kind, controller_params) of a valid file ``controller`` value."""
    by_kind: dict[str, dict[str, Any]] = {}
    for entry in entries(value):
        kind = entry["kind"]
        if kind != OFF:
            by_kind[kind] = normalise({k: v for k, v in entry.items() if k != "kind"}, kind)
    kinds = sorted(by_kind)
    return (",".join(kinds) or OFF), {kind: by_kind[kind] for kind in kinds}


def file_form(kind_text: str, params: dict[str, Any]) -> dict[str, Any] | list[dict[str, Any]]:
    """The file's ``controller`` value for a stored pair: a table for one kind, a list for several."""
    kinds = kinds_of(kind_text)
    if not kinds:
        return {"kind": OFF}
    tables = [{"kind": kind, **params.get(kind, {})} for kind in kinds]
    return tables[0] if len(tables) == 1 else tables

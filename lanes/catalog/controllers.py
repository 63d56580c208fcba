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
    kind: type  # int, float, str (one of ``choices``) or list (a list of integers within low..high)
    default: Any
    low: float = 0
    high: float = 0
    low_open: bool = False  # True: the value must be strictly above ``low``
    doc: str = ""
    high_open: bool = False  # True: the value must be strictly below ``high``
    choices: tuple[str, ...] = ()

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is unacceptable, or None."""
        if self.kind is str:
            if value not in self.choices:
                return f"{show(value)} is not one of {', '.join(self.choices)}"
            return None
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


def _probing() -> dict[str, Param]:
    """How probes above a measured capacity back off (lanes/control/probing.py)."""
    return {
        "probe_backoff": Param(int, 8, 1, 100_000, doc="decisions before the next probe after one failed"),
        "max_probe_backoff": Param(int, 128, 1, 1_000_000, doc="the back-off doubles per failed probe up to this"),
    }


def _scraping(scrape_seconds: float = 12.0) -> dict[str, Param]:
    return {
        "scrape_seconds": Param(float, scrape_seconds, 0.0, 3600.0, low_open=True, doc="least time between two scrapes"),
        "timeout_seconds": Param(float, 2.0, 0.0, 60.0, low_open=True, doc="one scrape's timeout"),
        "outage_seconds": Param(float, 300.0, 0.0, 86400.0,
                                doc="after this long with no endpoint answering, back to the configured width (0: hold)"),
    }


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
        **_probing(),
    },
    # vLLM's Prometheus gauges, scraped from each endpoint of the pool.
    "vllm": {
        **_scraping(),
        "gauge_lag_seconds": Param(float, 6.0, 0.0, 600.0,
                                   doc="a growth needs a reading taken this long after the width changed"),
        "stale_seconds": Param(float, 60.0, 0.0, 86400.0, low_open=True, doc="a last good scrape older than this is a failure"),
        "waiting_threshold": Param(int, 0, 0, 1_000_000, doc="without the capacity gauge: waiting above this is saturated"),
        "kv_threshold": Param(float, 0.98, 0.0, 1.0, low_open=True, doc="KV-cache usage at or above this is saturated"),
        "near_full": Param(float, 0.8, 0.0, 1.0, low_open=True, doc="running at or above this fraction of the width grows it"),
        "growth_fraction": Param(float, 0.5, 0.0, 4.0, low_open=True,
                                 doc="step while no capacity is known and no KV gauge measures the room (at least 1)"),
        "headroom_factor": Param(float, 4.0, 1.0, 64.0, low_open=True,
                                 doc="the largest growth per reading into the room the KV cache measures"),
        "probe_fraction": Param(float, 0.05, 0.0, 1.0, low_open=True, doc="step above a measured capacity"),
        "max_cut": Param(float, 0.5, 0.0, 1.0, low_open=True, doc="a cut keeps at least (1 - max_cut) of the width"),
        "interval_seconds": _interval(5.0),
        **_probing(),
        "cap_backoff": Param(int, 24, 1, 1_000_000,
                             doc="readings before a probe above a measured running cap (max_num_seqs)"),
        # Off by default: on an engine whose decode steps slow with the batch, a probe
        # that holds also shows longer calls and fewer answers, and failing it keeps a
        # grown backend at its old cap (the live growth test, 6 -> 12, never got there).
        "lane_probe": Param(float, 0.0, 0.0, 1.0,
                            doc="a probe above the running cap fails when, the lane full, its calls take this much "
                                "longer than the yardstick and this share of the width did not run (0, the "
                                "default: readings alone judge it; 0.03 for backends whose call time does not "
                                "grow with the batch)"),
        "lane_rejudge": Param(float, 0.10, 0.0, 1.0,
                              doc="after a cut to below what a reading showed running, the lane's answers "
                                  "judge once more when the lane is full, calls take this much longer than the "
                                  "yardstick and this share of the width did not run (0: no second look)"),
    },
    # Utilisation (the KV-cache gauge) kept near a target, as an autoscaler would.
    "utilisation": {
        "target": Param(float, 0.85, 0.0, 1.0, low_open=True),
        "tolerance": Param(float, 0.05, 0.0, 1.0, doc="no change while target / utilisation is this close to 1"),
        "min_completions": Param(int, 20, 1, 1_000_000, doc="evidence a decision needs"),
        "min_intervals": Param(int, 6, 1, 10_000, doc="busy intervals a decision needs (gauges are instants)"),
        "max_window_intervals": Param(int, 30, 1, 10_000, doc="a window is judged after this many busy intervals at the latest"),
        "max_rise": Param(float, 2.0, 1.0, 16.0, low_open=True),
        **_scraping(),
        "interval_seconds": _interval(5.0),
    },
    # A quantile of vLLM's inter-token latency or time to first token (its
    # histograms, per endpoint, the worst one counting) kept under a target.
    "latency": {
        "signal": Param(str, "inter_token", choices=("inter_token", "ttft"), doc="which histogram"),
        "quantile": Param(float, 0.95, 0.5, 0.999, doc="which quantile of it"),
        "target_ms": Param(float, 50.0, 0.0, 600_000.0, low_open=True, doc="the quantile to stay under"),
        "tolerance": Param(float, 0.5, 0.0, 0.99,
                           doc="grow only while the share over the target is below (1 - quantile) x (1 - tolerance)"),
        "min_samples": Param(int, 50, 1, 10_000_000, doc="observations an endpoint needs to be judged"),
        "growth_fraction": Param(float, 0.25, 0.0, 4.0, low_open=True, doc="the largest step up"),
        "probe_fraction": Param(float, 0.05, 0.0, 1.0, low_open=True, doc="the step that counts as a small probe"),
        "max_cut": Param(float, 0.5, 0.0, 1.0, low_open=True, doc="a cut keeps at least (1 - max_cut) of the width"),
        **_scraping(5.0),
        "interval_seconds": _interval(5.0),
        **_probing(),
    },
}


def _typed(param: Param, value: Any) -> Any:
    return [int(v) for v in value] if param.kind is list else param.kind(value)


def filled(params: dict[str, Any], kind: str) -> dict[str, Any]:
    """Stored ``params`` with any parameter added since they were stored at its default."""
    spec = KINDS.get(kind, {})
    return {**{name: param.default for name, param in spec.items()}, **params}


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


def running_kinds(pool) -> dict[str, dict]:
    """The controllers of ``pool`` (a :class:`~lanes.catalog.routing.PoolInfo`) that run
    (kind -> parameters); {} when off."""
    return {kind: params for kind, params in pool.controllers.items() if kind in KINDS and kind != OFF}


def kinds_text(pool) -> str:
    """The running controllers' kinds as stored beside a learned width (``vllm,overload``)."""
    return ",".join(sorted(running_kinds(pool)))

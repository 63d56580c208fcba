"""A workflow's failover share settings: defaults, bounds and overrides.

The failover share (seed 003, :mod:`lanes.routing.share`) runs for every
workflow with two or more candidates unless the catalog turns it off. A
workflow's ``failover`` value in the catalog is its override:

- absent / ``null``: the defaults below (a change of the defaults reaches
  such workflows with the next catalog reload);
- ``{enabled = false}``: no share; routing is the plain candidate order;
- a table of parameters: they replace the defaults they name; members left
  out keep the defaults. An override is stored as written and replaced whole
  by the next one (it is never merged with the previous override).

The admin API's ``PATCH /v1/workflows/{name}`` and ``lanes shares set`` go
through :func:`lanes.ops.patch.patch_item`, which gives seed 003's PATCH
semantics: an omitted ``failover`` leaves the override unchanged, ``null``
restores the defaults, ``{"enabled": false}`` disables, an object replaces
the old override whole; it is validated as a catalog file's would be.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from lanes.catalog.controllers import Param
from lanes.catalog.shown import show

MAX_STATUSES = 32

PARAMS: dict[str, Param] = {
    "latency_budget_ms": Param(int, 10_000, 1, 3_600_000, doc="a first token later than this is a breach"),
    "breach_rate_target": Param(float, 0.10, 0.0, 1.0, high_open=True, doc="a window above this rate cuts the share"),
    "recovery_breach_rate": Param(float, 0.03, 0.0, 1.0, doc="a window at or below this rate for a dwell raises it"),
    "window_samples": Param(int, 100, 2, 100_000, doc="healthy/breach outcomes kept"),
    "min_samples": Param(int, 20, 2, 100_000, doc="outcomes a decision needs"),
    "share_step": Param(float, 0.05, 0.0, 1.0, low_open=True, doc="added to the share by a recovery"),
    "share_decay": Param(float, 0.8, 0.0, 1.0, low_open=True, high_open=True, doc="share multiplier on a breach"),
    "share_floor": Param(float, 0.05, 0.0, 1.0, low_open=True, doc="the share never goes below this"),
    "dwell_ms": Param(int, 30_000, 1, 86_400_000, doc="least time between two changes"),
    "idle_recovery_ms": Param(int, 300_000, 0, 86_400_000, doc="one step per interval without enough samples (0: off)"),
}
DEFAULT_STATUSES = (429, 503, 529)
KEYS = ("enabled", *PARAMS, "overload_statuses")


@dataclass(frozen=True)
class FailoverParams:
    """The parameters in effect for one workflow (an enabled controller)."""

    latency_budget_ms: int = 10_000
    breach_rate_target: float = 0.10
    recovery_breach_rate: float = 0.03
    window_samples: int = 100
    min_samples: int = 20
    share_step: float = 0.05
    share_decay: float = 0.8
    share_floor: float = 0.05
    dwell_ms: int = 30_000
    idle_recovery_ms: int = 300_000
    overload_statuses: tuple[int, ...] = DEFAULT_STATUSES

    @property
    def budget_seconds(self) -> float:
        return self.latency_budget_ms / 1000

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "overload_statuses": list(self.overload_statuses)}


DEFAULTS = FailoverParams()
# The defaults are written twice (the validated table above, the typed record here): keep them one.
assert {f.name for f in fields(FailoverParams)} == {*PARAMS, "overload_statuses"}
assert all(getattr(DEFAULTS, name) == param.default for name, param in PARAMS.items())


def problems(value: Any) -> list[tuple[str, str]]:
    """(key, message) for each problem of a ``failover`` override (None: the defaults)."""
    if value is None:
        return []
    if not isinstance(value, dict):
        return [("", f"{show(value)} is not a table of failover settings (or null for the defaults)")]
    found: list[tuple[str, str]] = []
    for key, item in value.items():
        if key not in KEYS:
            found.append((key, f"{show(item)} is not a failover setting (known: {', '.join(KEYS)})"))
        elif key == "enabled":
            if not isinstance(item, bool):
                found.append((key, f"{show(item)} is not true or false"))
        elif key == "overload_statuses":
            found.extend((key, message) for message in _status_problems(item))
        else:
            message = PARAMS[key].problem(item)
            if message:
                found.append((key, message))
    if found:
        return found
    merged = {**DEFAULTS.as_dict(), **{k: v for k, v in value.items() if k != "enabled"}}
    if merged["min_samples"] > merged["window_samples"]:
        found.append(("min_samples", f"{merged['min_samples']} is above window_samples {merged['window_samples']}; "
                                     "a decision could never have enough samples"))
    if merged["recovery_breach_rate"] > merged["breach_rate_target"]:
        found.append(("recovery_breach_rate", f"{show(merged['recovery_breach_rate'])} is above breach_rate_target "
                                              f"{show(merged['breach_rate_target'])}; it must be at most the target"))
    return found


def _status_problems(value: Any) -> list[str]:
    if not isinstance(value, list):
        return [f"{show(value)} is not a list of HTTP statuses"]
    if len(value) > MAX_STATUSES:
        return [f"{len(value)} statuses are more than the {MAX_STATUSES} allowed"]
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or not 400 <= item <= 599:
            return [f"{show(item)} in {show(value)} is not an HTTP status in 400..599"]
    return []


def normalise(value: dict | None) -> dict | None:
    """A valid override in its stored form: numbers in their declared types, keys sorted."""
    if value is None:
        return None
    out: dict[str, Any] = {}
    for key in sorted(value):
        item = value[key]
        if key == "enabled":
            out[key] = bool(item)
        elif key == "overload_statuses":
            out[key] = sorted({int(s) for s in item})
        else:
            out[key] = PARAMS[key].kind(item)
    return out


def effective(override: dict | None) -> FailoverParams | None:
    """The parameters in effect for a stored override; None when it disables the share."""
    if override is None:
        return DEFAULTS
    if override.get("enabled", True) is False:
        return None
    values = {k: v for k, v in override.items() if k != "enabled"}
    if "overload_statuses" in values:
        values["overload_statuses"] = tuple(values["overload_statuses"])
    return FailoverParams(**values)

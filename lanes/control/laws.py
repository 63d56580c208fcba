"""The control laws: pure functions from one interval's signals to a proposed width.

No I/O and no clock here: the live loop (:mod:`lanes.control.loop`) and the
deterministic harness (:mod:`lanes.control.simulate`) feed the same
functions, so what the benchmark measures is what runs.

Each law keeps a small JSON-able ``memo`` of its own between intervals (kept
in Redis by the live loop). :func:`compose` asks every law that is on and
takes the **lowest** proposal, within [floor, ceiling]: any one law can veto
a growth or pull the width down.

Why the laws measure instead of only probing. Seed 000's x0.8 / x1.5 and
seed 002's "+25 % while near full" never settle on a capacity they were not
told: they swing around it forever. Both signals carry the capacity itself
at the moment of saturation, so a cut goes *to* it (the backend's running
count when vLLM says requests wait for capacity; the lane's in-flight count
at the first overload answer of a generation). Near a measured capacity the
laws probe by a small step (+5 %); once a probe above it has held a whole
interval the measurement is stale (the backend grew), so it is forgotten and
growth is fast again (x1.5).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Bounds:
    floor: int
    ceiling: int

    def clamp(self, width: int) -> int:
        return max(self.floor, min(self.ceiling, width))


@dataclass(frozen=True)
class Gauges:
    """vLLM's gauges summed over a pool's backends (the selected models, every replica)."""

    ok: bool
    running: float = 0.0
    waiting: float = 0.0
    waiting_capacity: float | None = None  # None: the by-reason gauge is absent (vLLM < 0.9.2)
    kv_usage: float | None = None  # the mean of the replicas
    error: str | None = None


@dataclass(frozen=True)
class Signals:
    """What one interval saw. ``gauges`` is None when no new scrape was made."""

    width: int
    in_flight: int
    waiting: int  # requests waiting in the lane
    admitted: int = 0  # admissions under the current generation
    overloads: int = 0  # overload answers to foreground work admitted under the current generation
    overload_in_flight: int | None = None  # lane in-flight at the first of them
    completions: int = 0  # served answers since the last decision
    # Served call-seconds since the last decision / its elapsed seconds: by
    # Little's law, how many requests the backend actually served at once.
    served_concurrency: float | None = None
    window_seconds: float | None = None  # time since the last decision
    gauges: Gauges | None = None


@dataclass(frozen=True)
class Proposal:
    width: int
    decision: str  # grow, cut, hold, floor
    reason: str


def _hold(width: int, reason: str) -> Proposal:
    return Proposal(width, "hold", reason)


def _grow(width: int, memo: dict, factor: float, probe: float, minimum_step: int = 1) -> tuple[int, str]:
    """The next width up: a small probe near a measured capacity, fast growth otherwise.

    A probe that held a whole interval raises the measurement to it. Once a
    width at or above the last one that failed (``memo["failed"]``) has held,
    the measurement is stale (the backend grew): it is forgotten and growth
    is fast again. A held probe below that width proves nothing new (the
    measurement was a little low), so probing goes on in small steps there.
    """
    measured = memo.get("measured")
    if measured is not None and width < measured:
        return measured, f"back to the measured capacity {measured}"
    if measured is not None and width > measured:
        if width >= memo.get("failed", math.inf):
            memo["measured"] = measured = None
        else:
            memo["measured"] = measured = width
    if measured is not None:
        return width + max(minimum_step, math.ceil(width * probe)), f"probe above measured capacity {measured}"
    return max(width + minimum_step, math.ceil(width * factor)), "no capacity known; grow"


def overload_law(s: Signals, bounds: Bounds, params: dict, memo: dict) -> Proposal:
    """Overload answers (529s) under the current generation: one cut per generation."""
    width = s.width
    if s.overloads > 0:
        # What the backend served at once while it rejected the rest is its
        # capacity; without that, the lane's in-flight count at the first
        # overload answer of this generation; without either, a fixed factor.
        served = s.served_concurrency
        if served is not None and s.completions and s.window_seconds:
            mean_call = served * s.window_seconds / s.completions
            if mean_call > s.window_seconds:
                served = None  # calls longer than the window: too few ended in it to measure by
        if served is not None:
            measured, source = (math.floor(served) if served >= 1 else None), "served at once"
        else:
            measured, source = s.overload_in_flight, "in flight at the first overload"
        if measured is not None and measured < 1:
            measured = None  # nothing served, or nothing else in flight: nothing measured
        if measured is not None and measured < width:
            target, how = measured, f"to the {measured} {source}"
            memo["measured"] = max(bounds.floor, measured)
        elif measured is not None:
            # Measured at or above the width (a noisy interval): the width is
            # still too much, so step back below it by one probe.
            # The backend did serve the whole width, so this interval showed no
            # lower capacity: the width stays the measurement to return to.
            target = width - max(1, math.ceil(width * params["probe_fraction"]))
            how = f"one probe below {width} ({measured} {source})"
            memo["measured"] = width
        else:
            target, how = math.floor(width * params["cut_factor"]), f"x{params['cut_factor']}"
            memo["measured"] = None
        target = max(bounds.floor, 1, min(target, width - 1))
        memo["failed"] = width
        return Proposal(target, "cut", f"{s.overloads} overload answer(s) this generation; cut {how}")
    if not (s.in_flight >= width and s.waiting > 0):
        return _hold(width, "not every slot was used")
    target, why = _grow(width, memo, params["growth_factor"], params["probe_fraction"])
    target = bounds.clamp(target)
    if target <= width:
        return _hold(width, "at the ceiling")
    # A raise must be earned: as many admissions under this width as it adds,
    # or growth (every interval) outruns cuts (once per generation).
    if s.admitted < target - width:
        return _hold(width, f"raise not earned: {s.admitted} of {target - width} admissions")
    return Proposal(target, "grow", f"every slot used; {why}")


def vllm_law(s: Signals, bounds: Bounds, params: dict, memo: dict) -> Proposal:
    """vLLM's gauges: cut to the running count at saturation, grow while near full."""
    width, g = s.width, s.gauges
    if g is None:
        return _hold(width, "no new scrape")
    if not g.ok:
        # Fail-safe: nothing is known about the backend, so the width the
        # operator promised is safe (seed 002), and nothing can grow.
        memo["measured"] = None
        return Proposal(bounds.floor, "floor", f"scrape failed: {g.error}")
    if g.waiting_capacity is not None:
        saturated, why = g.waiting_capacity > 0, f"{g.waiting_capacity:g} waiting for capacity"
    else:
        saturated, why = g.waiting > params["waiting_threshold"], f"{g.waiting:g} waiting"
    if not saturated and g.kv_usage is not None and g.kv_usage >= params["kv_threshold"]:
        saturated, why = True, f"KV cache {g.kv_usage:.0%} used"
    if saturated:
        running = int(g.running)
        target = max(bounds.floor, running, math.ceil(width * (1 - params["max_cut"])))
        if target >= width:
            return _hold(width, f"saturated ({why}) with {running} running, at or above the width")
        memo["measured"], memo["failed"] = target, width
        return Proposal(target, "cut", f"saturated ({why}); cut to the {running} running")
    # Near full by the gauges *and* by the lane's own count: the gauges lag dispatch by
    # seconds, so a scrape can still show the lane's last burst after it has emptied.
    near_full = params["near_full"] * width
    if g.running >= near_full and s.in_flight >= near_full and g.waiting <= params["waiting_threshold"]:
        target, grow_why = _grow(width, memo, 1 + params["growth_fraction"], params["probe_fraction"])
        target = bounds.clamp(target)
        if target <= width:
            return _hold(width, "at the ceiling")
        return Proposal(target, "grow", f"{g.running:g} running of {width}; {grow_why}")
    return _hold(width, f"{g.running:g} running of {width} ({s.in_flight} in flight): not near full")


def utilisation_law(s: Signals, bounds: Bounds, params: dict, memo: dict) -> Proposal:
    """Width <- in-flight x target / utilisation, on a window of enough evidence."""
    width = s.width
    window = memo.setdefault("window", {"width": width, "intervals": 0, "in_flight": 0.0, "utilisation": 0.0,
                                        "completions": 0, "full": 0})
    g = s.gauges
    if s.in_flight == 0 and s.completions == 0:
        return _hold(width, "idle interval (not counted)")
    if window["width"] != width:
        memo["window"] = {"width": width, "intervals": 0, "in_flight": 0.0, "utilisation": 0.0,
                          "completions": 0, "full": 0}
        return _hold(width, "the width changed during the window; a new window starts")
    if g is None or not g.ok or g.kv_usage is None:
        return _hold(width, "no utilisation gauge this interval")
    window["intervals"] += 1
    # The running count comes from the same scrape as the utilisation, so the
    # two describe one instant (the lane's count is newer than lagging gauges).
    window["in_flight"] += g.running if g.running else s.in_flight
    window["utilisation"] += g.kv_usage
    window["completions"] += s.completions
    window["full"] += 1 if s.in_flight >= width else 0
    enough = window["completions"] >= params["min_completions"] and window["intervals"] >= params["min_intervals"]
    if not enough and window["intervals"] < params["max_window_intervals"]:
        return _hold(width, f"gathering evidence: {window['completions']} completions, {window['intervals']} intervals")
    n = window["intervals"]
    in_flight, used = window["in_flight"] / n, window["utilisation"] / n
    slots_used = window["full"] * 2 >= n
    memo["window"] = {"width": width, "intervals": 0, "in_flight": 0.0, "utilisation": 0.0, "completions": 0, "full": 0}
    if used <= 0:
        return _hold(width, "utilisation 0")
    ratio = params["target"] / used
    if abs(ratio - 1) <= params["tolerance"]:
        return _hold(width, f"utilisation {used:.0%} within tolerance of {params['target']:.0%}")
    target = math.ceil(in_flight * ratio)
    if target > width:
        if not slots_used:
            return _hold(width, "would rise but the slots were not used")
        target = min(target, math.floor(width * params["max_rise"]))
    target = bounds.clamp(target)
    if target == width:
        return _hold(width, "at a bound")
    return Proposal(target, "grow" if target > width else "cut", f"utilisation {used:.0%} against {params['target']:.0%}")


LAWS = {"overload": overload_law, "vllm": vllm_law, "utilisation": utilisation_law}


@dataclass
class Composed:
    width: int
    decision: str
    controller: str | None
    reason: str
    proposals: dict = field(default_factory=dict)


def compose(kinds: dict[str, dict], s: Signals, bounds: Bounds, memos: dict[str, dict]) -> Composed:
    """Ask every law that is on; the lowest proposal wins, within [floor, ceiling]."""
    proposals = {}
    for kind in sorted(kinds):
        law = LAWS.get(kind)
        if law is not None:
            proposals[kind] = law(s, bounds, kinds[kind], memos.setdefault(kind, {}))
    if not proposals:
        return Composed(bounds.clamp(s.width), "hold", None, "no controller runs")
    kind, lowest = min(proposals.items(), key=lambda item: (item[1].width, item[0]))
    width = bounds.clamp(lowest.width)
    decision = lowest.decision if width != s.width else "hold"
    return Composed(width, decision, kind, lowest.reason,
                    {k: {"width": p.width, "decision": p.decision, "reason": p.reason} for k, p in proposals.items()})

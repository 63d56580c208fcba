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
growth is fast again (x1.5). Probes back off while they keep failing, need
work waiting in the lane and a reading taken after the width changed
(:mod:`lanes.control.probing`). The ``vllm`` law measures more than that:
work waiting while the KV cache has room is ``max_num_seqs`` binding (the
running count is the pool's running cap: cut to it at once, probe above it
rarely), and the cache's usage per running request says how many more fit
(growth goes into that room instead of blind steps).

Between readings the ``vllm`` law judges the width by the lane's own answers (fresh every
decision, while a scrape comes every 12 s): at the backend's mean call time, answers per
second say how many ran at once, and in flight well above that waits in vLLM.

A failed scrape holds the last good width (:func:`failed_scrape`); an
endpoint missing from a reading is left out of its sums and its share held,
and nothing grows on a partial reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from lanes.control import histograms, probing


@dataclass(frozen=True)
class Bounds:
    floor: int
    ceiling: int

    def clamp(self, width: int) -> int:
        return max(self.floor, min(self.ceiling, width))


@dataclass(frozen=True)
class Gauges:
    """vLLM's gauges summed over the fresh endpoints of a pool (the selected models).

    Each endpoint is judged apart: one that failed this scrape is left out of
    the sums (``fresh`` < ``endpoints``), and ``held`` is the share of the
    width that stays with it (what the lane has in flight there). ``ok`` is
    False only when no endpoint answered.
    """

    ok: bool
    running: float = 0.0
    waiting: float = 0.0
    waiting_capacity: float | None = None  # None: the by-reason gauge is absent (vLLM < 0.20)
    kv_usage: float | None = None  # the mean of the replicas
    error: str | None = None
    endpoints: int = 1
    fresh: int = 1
    held: float = 0.0  # width kept for endpoints missing from this reading
    age_seconds: float = 0.0  # how long ago the reading was taken
    # signal ("inter_token", "ttft") -> [(endpoint, [(upper bound, cumulative count)...])]: the
    # histogram's growth between the endpoint's last two good scrapes.
    latency: dict = field(default_factory=dict)
    latency_window_seconds: float = 0.0  # the longest span those deltas cover

    @property
    def complete(self) -> bool:
        return self.ok and self.fresh >= self.endpoints


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
    configured: int | None = None  # the catalog's width for the pool
    width_age_seconds: float | None = None  # since the width last changed (None: long ago)
    outage_seconds: float | None = None  # since the last scrape any endpoint answered (None: no outage)


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
        probing.held(memo)
        if width >= memo.get("failed", math.inf):
            memo["measured"] = measured = None
        else:
            memo["measured"] = measured = width
    if measured is not None:
        return width + probing.step(width, probe, minimum_step), f"probe above measured capacity {measured}"
    return max(width + minimum_step, math.ceil(width * factor)), "no capacity known; grow"


def _probing_above(width: int, memo: dict) -> bool:
    """Whether ``width`` is a probe above the measured capacity (a cut from it is a failed probe)."""
    measured = memo.get("measured")
    return measured is not None and width > measured


def _probe_gate(width: int, memo: dict) -> str | None:
    """Why a growth from ``width`` must wait (the probe back-off), or None."""
    measured = memo.get("measured")
    if measured is not None and width >= measured and not probing.allowed(memo):
        return f"probe backing off for {probing.waiting_for(memo)} more decision(s) after a failed probe"
    return None


def overload_law(s: Signals, bounds: Bounds, params: dict, memo: dict) -> Proposal:
    """Overload answers (529s) under the current generation: one cut per generation."""
    probing.tick(memo)
    width = s.width
    was_probing = _probing_above(width, memo)
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
        probing.failed(memo, width, target, params, probed=was_probing)
        return Proposal(target, "cut", f"{s.overloads} overload answer(s) this generation; cut {how}")
    if not (s.in_flight >= width and s.waiting > 0):
        return _hold(width, "not every slot was used")
    gate = _probe_gate(width, memo)
    if gate:
        return _hold(width, gate)
    target, why = _grow(width, memo, params["growth_factor"], params["probe_fraction"])
    target = bounds.clamp(target)
    if target <= width:
        return _hold(width, "at the ceiling")
    # A raise must be earned: as many admissions under this width as it adds,
    # or growth (every interval) outruns cuts (once per generation).
    if s.admitted < target - width:
        return _hold(width, f"raise not earned: {s.admitted} of {target - width} admissions")
    return Proposal(target, "grow", f"every slot used; {why}")


def failed_scrape(s: Signals, bounds: Bounds, params: dict, measured: int | None = None) -> Proposal:
    """No endpoint answered: hold the last good width; never grow.

    Only the backend's own evidence cuts (its gauges, or overload answers to
    the ``overload`` law): a scrape that timed out says nothing about the
    backend. After ``outage_seconds`` without a good reading the width goes
    back to the configured one if it was above it (0: hold for ever).
    """
    width, g = s.width, s.gauges
    if measured is not None and width > measured:
        # A probe above the measured capacity is only worth its cost with readings to judge
        # it by: without one it is given up (the last confirmed width, not a cut below it).
        return Proposal(bounds.clamp(measured), "cut",
                        f"scrape failed ({g.error}) during a probe: back to the measured capacity {measured}")
    limit = params.get("outage_seconds", 0.0)
    outage = s.outage_seconds
    if limit and outage is not None and outage >= limit and s.configured is not None and width > s.configured:
        return Proposal(bounds.clamp(s.configured), "cut",
                        f"no good scrape for {outage:.0f}s ({g.error}): back to the configured width")
    return _hold(width, f"scrape failed ({g.error}): holding the last good width")


def saturation(g: Gauges, params: dict) -> tuple[bool, str]:
    if g.waiting_capacity is not None:
        saturated, why = g.waiting_capacity > 0, f"{g.waiting_capacity:g} waiting for capacity"
    else:
        saturated, why = g.waiting > params["waiting_threshold"], f"{g.waiting:g} waiting"
    if not saturated and g.kv_usage is not None and g.kv_usage >= params["kv_threshold"]:
        saturated, why = True, f"KV cache {g.kv_usage:.0%} used"
    return saturated, why


def binds_on_running(g: Gauges, params: dict) -> bool:
    """Whether a saturated reading shows vLLM's running limit (``max_num_seqs``) binding: work
    waits for capacity while the KV cache still has room for one more request on a replica.
    The running count then *is* the pool's running cap, exactly."""
    if not g.complete or g.kv_usage is None or g.running < 1:
        return False
    per_replica = g.running / max(1, g.fresh)
    return g.kv_usage * (1 + 1 / per_replica) < params["kv_threshold"]


def kv_room(g: Gauges, params: dict) -> int | None:
    """How many requests the KV cache holds below its saturation threshold, by token accounting:
    the running requests fill ``kv_usage`` of it, each about as much as the others (None: no
    usable KV gauge)."""
    if g.kv_usage is None or g.kv_usage <= 0 or g.running < 1:
        return None
    return math.floor(g.running * params["kv_threshold"] / g.kv_usage)


# A cache at its saturation threshold holds its running requests at its edge: each decode step
# asks for more blocks, and the newest requests are preempted or kept waiting while the others
# grow. A width at that count keeps the cache there, and one this share below it does not
# (engines, capacity 100 -> 50 by the cache, F6 seed 3: at a width of 53 with 52-53 running at
# 96-98 %, about a third of each interval's admissions waited; at 50, none. Over twelve seeds
# F6 21.5 -> 17.8 %, F5 29.8 -> 27.6 %, F12 6.6 -> 5.9 % of requests waited).
KV_EDGE_SHARE = 0.02


def _kv_edge(running: int) -> int:
    """The width a cut leaves when the KV cache, not ``max_num_seqs``, binds with ``running``
    requests: a share below them (``KV_EDGE_SHARE``; one request at a count of 50 or fewer),
    never below one."""
    return max(1, math.floor(running * (1 - KV_EDGE_SHARE)))


def _cap_back_off(memo: dict, params: dict, *, probed: bool) -> None:
    """The running cap was measured: no probe above it for ``cap_backoff`` readings, doubling
    (up to ``max_probe_backoff``) with each probe above it that fails. Kept apart from the
    probe back-off, which a cut for another reason (the KV cache binding) starts over."""
    backoff = memo.get("cap_backoff")
    if backoff is None:
        backoff = params["cap_backoff"]
    elif probed:
        backoff = min(max(params["max_probe_backoff"], params["cap_backoff"]), backoff * 2)
    memo["cap_backoff"] = backoff
    # At small caps the smallest step is a large share (+1 at 2 is +50 %): a step over a quarter
    # of the cap waits longer in proportion (the wait is long already; other probes stretch more).
    memo["cap_quiet_until"] = memo.get("n", 0) + math.ceil(backoff * max(1.0, _step_share(memo["cap"], params) * 4))


def _cap_agrees(memo: dict, cap: int, endpoints, params: dict) -> bool:
    """Whether a running cap a reading just measured stands: it agrees with the one before it
    (within ``CAP_AGREES``), or it is small. One reading can show work waiting while the batch
    has room (a burst of admissions waiting for the step's token budget, not max_num_seqs): a
    cap is kept for its back-off once a second measurement agrees. (A cap from the lane's
    answers, measured at one width, keeps its back-off at once: made a first measurement too,
    it cost F3 2.8 -> 7.7 % and F6 7.5 -> 19.5 % of requests on the engines, in probes during
    the swings; see :func:`_lane_evidence` for one measured in a growth's interval.)

    A small cap needs no second look: a backlog of a few prompts is no token budget's, and the
    probe that would confirm it is a large share of it (+1 at a cap of 1 is +100 % for a
    reading), which settled capacity 1 in 16 decisions where the first measurement was right."""
    if _small_step(cap, params):
        return True
    previous = memo.get("cap") if memo.get("cap_endpoints") == endpoints else None
    return previous is not None and abs(cap - previous) <= CAP_AGREES * previous


def _just_over(queued: float, running: float, width: int, memo: dict, params: dict) -> bool:
    """Whether no more wait than a width just over the cap leaves waiting: the requests in
    transit's allowance (2, or 2 % of what runs) or, after a step of at most a quarter, a probe's
    step above the running count. A growth's prefill backlog holds what the step's token budget
    has not taken of all it added (265 of 711 on the physical engines); a width a few over
    max_num_seqs leaves those few, and a cap read so stands at once: its confirmation probe is the
    same test run again, and while it runs every request admitted waits behind the ones over the
    cap (C = 100 from 10, 7.9 -> 5.4 % of requests; 100 -> 20, 15.3 -> 11.2 %; a probe of +26 at
    512 on the physical engines: about 190 requests, an interval's admissions; over twelve seeds
    P0 5.6 -> 5.1 %, P3 7.9 -> 7.1 %). The probe's step is allowed only after a small step: the
    tail of a x4 growth's backlog (68 running, 4 waiting, after 18 -> 72) stood as a cap and held
    the pool at 68 of 512 for the whole run."""
    if queued <= _in_transit(running):
        return True
    return _came_by_a_small_step(width, memo) and queued <= probing.step(int(running), params["probe_fraction"])


def _came_by_a_small_step(width: int, memo: dict) -> bool:
    """Whether the width came of a step up of at most ``SMALL_STEP`` (a probe's, not a growth's)
    or of a cut (which admits nothing at once). Not the width the law began at: the lane admitted
    all of it at once (F9 seed 7 read 81 running and 4 waiting at its configured 85 under a load
    below capacity 100, and a cap of 81 stood for 72 decisions, idle 18 %)."""
    before = memo.get("width_before")
    return before is not None and width <= before * SMALL_STEP


# A step up of at most this factor admits at most a quarter of the width before it at once.
SMALL_STEP = 1.25


def _growth_ran_none(memo: dict, running: int, width: int) -> bool:
    """Whether the newest reading of another width saw the lane's whole narrower width running
    with nothing waiting, and this one, after a growth, sees no more running: the growth ran none
    of what it added, so the running count is the cap, not a backlog the next steps clear."""
    before = memo.get("reading_before")
    if before is None:
        return False
    ran, queued, at, endpoints = before
    return (queued <= 0 and at < width and endpoints == memo.get("endpoints") and ran >= at - _in_transit(at)
            and abs(running - ran) <= _in_transit(ran))


def _step_share(cap: int, params: dict) -> float:
    """The smallest probe above ``cap`` as a share of it (+1 at 2 is 0.5)."""
    return probing.step(cap, params["probe_fraction"]) / max(1, cap)


def _small_step(cap: int, params: dict) -> bool:
    """A cap whose smallest probe is over a quarter of it (1, 2 and 3 at the default 5 %)."""
    return _step_share(cap, params) * 4 > 1


def _cap_measured(memo: dict, params: dict, *, confirmed: bool, probed: bool) -> None:
    """The back-off after a cut to the running cap: the cap's own when it is confirmed; a
    single reading when it is a first measurement, so the probe above it then confirms it or,
    running more, forgets it."""
    if confirmed:
        _cap_back_off(memo, params, probed=probed)
    else:
        memo["cap_quiet_until"] = memo.get("n", 0) + 1


def _queued(g: Gauges) -> float:
    """What waits in vLLM for capacity: the by-reason gauge where the backend has it (vLLM >= 0.20),
    else every waiting request."""
    return g.waiting_capacity if g.waiting_capacity is not None else g.waiting


# What a measured running cap keeps in a law's memo, with its back-off and the probe it judged.
CAP_KEYS = ("cap", "cap_endpoints", "cap_backoff", "cap_quiet_until", "cap_lane", "measured", "failed")


def _forget_cap(memo: dict, *also: str) -> None:
    for key in (*CAP_KEYS, *also):
        memo.pop(key, None)


def _end_raise_streak(memo: dict) -> None:
    """A new cap was measured: the probes that raised the last one (and doubled the step) start over."""
    memo.pop("cap_raised", None)
    memo.pop("cap_raised_at", None)


def _cap(memo: dict, g: Gauges) -> int | None:
    """The running cap measured on this pool's endpoints (another set of endpoints has another)."""
    cap = memo.get("cap")
    return cap if cap is not None and memo.get("cap_endpoints") == g.endpoints else None


# The lane's own accounting judges a growth between readings. Enough answers in an interval to
# take their mean call time, and how far the lane's in-flight count must exceed what the backend
# ran (by that mean) before the difference is taken for work waiting in vLLM (noise in call
# times, a batch that slows its steps as it grows).
LANE_MIN_COMPLETIONS = 20
# A reading that saw this much more running (a share of it) than the lane's answers say ran
# has outlived the yardstick those answers are read by.
YARDSTICK_OUTGROWN = 0.5
# Requests in transit between vLLM and the lane's count at a reading: at most this many, or this
# share of what runs.
LANE_TRANSIT = 2
LANE_TRANSIT_SHARE = 0.02
# Two measurements of the running cap this close (a share of the first) are the same cap.
CAP_AGREES = 0.10
LANE_MARGIN = 0.10
# Answers short of what the lane keeps in flight by this share of the margin that cuts: not
# proof of waiting in vLLM, but enough to read the gauges at the next decision (_answers_fall_short).
READ_SOON = 0.3
# How often a probe that follows probes that held doubles its step (5 % -> 40 % at the default).
# An 80 % step admits its prompts at once and most wait for the engines' token budget (physical
# P2 seed 7: 251 -> 452, 198 of the next interval's 241 admissions waited); over twelve seeds a
# cap of 40 % took P0 4.67 -> 4.00 %, P12 11.03 -> 9.80 %, the engines' mean 8.16 -> 8.05 %, but
# P3 6.12 -> 6.59 % (journal, 2026-12-07).
PROBE_DOUBLINGS = 3
ANSWERS_KEPT = 8  # intervals of the lane's answers kept: 40 s at the default 5-s decision
# A yardstick taken after a cut by the lane's evidence that is this much longer than the one the
# cut was judged by: the calls slow with the batch (decode steps), which the lane's answers cannot
# tell from waiting; from then on only the readings judge a growth.
LANE_SLOWS = 0.10
# Yardsticks kept by the width they were taken at (a pool whose capacity swings is judged at each
# of its widths by calls of that batch).
YARDSTICKS_KEPT = 6


def _in_transit(running: float) -> float:
    """How many requests may be in transit between vLLM and the lane's count at a reading."""
    return max(LANE_TRANSIT, running * LANE_TRANSIT_SHARE)


def _below_transit(lane: float) -> int:
    """The lane's count of what runs less the requests that may be in transit: the count is high
    by them (answers it has not counted yet, calls vLLM has not queued yet)."""
    return max(1, int(lane - _in_transit(lane)))


def _lane_count(lane: float, running: int) -> int:
    """The lane's count of what ran (in flight less what waits in vLLM) where it says more than
    the running gauge by more than the requests in transit (an answer the lane has not counted
    yet, a call not yet in vLLM's queue), else the gauge. One in transit read a cap of 101 for
    100, and every request admitted for the 15 s to the next reading waited behind it (F2, 10 %
    of scrapes failing: 6.7 % of requests waited, 5.6 % without it)."""
    lane = int(lane)
    return lane if lane - running > _in_transit(running) else running


def _answers_over(memo: dict, s: Signals, call: float) -> tuple[int, float]:
    """The lane's answers and their seconds over the trailing intervals at this width, back
    until they span one call (or the width changed, or the kept intervals end).

    Requests admitted together end together, about one call later: on the physical engines
    (calls of 12.8 s, a decision every 5 s) the 186 admitted by a growth from 266 to 452
    answered in one interval and left the next with 104 answers, which "showed" 267 run of 452
    and sent the pool back to 266 (twice in a run, and once from 452 to 92). Over a call's span
    every request in flight answers about once, whenever it was admitted."""
    return _trailing_answers(memo.get("answers") or [[s.width, s.completions, s.window_seconds]], s.width, call)


def _trailing_answers(answers: list, width: int, call: float) -> tuple[int, float]:
    """The answers and their seconds of the last ``answers`` intervals kept at ``width``, back
    until they span ``call`` seconds or the width differs."""
    done, seconds = 0, 0.0
    for kept_width, completions, window in reversed(answers):
        if kept_width != width:
            break
        done, seconds = done + completions, seconds + window
        if seconds >= call:
            break
    return done, seconds


def _mean_call(s: Signals) -> float | None:
    """The mean call time of the interval's answers (admission to answer, as the lane saw them)."""
    if s.served_concurrency is None or not s.window_seconds or s.completions < LANE_MIN_COMPLETIONS:
        return None
    return s.served_concurrency * s.window_seconds / s.completions


def _yardstick_outgrown(s: Signals, ran: float, memo: dict) -> bool:
    """Whether the decision's reading saw far more running than the yardstick says ran (Little's
    law on the interval's answers): the calls now take far longer than when the yardstick was
    taken (decode steps slow as the batch grows: 1.49 s at 8 running on the physical engines,
    several times that at 500), which no waiting in vLLM explains, since a backend runs no more
    than it can. The yardstick is dropped (the next interval settled at one width takes a new
    one), and the lane judges nothing on it (read against it, 512 running "showed" 71 run at
    once, and cut after cut took the pool from 512 to 459)."""
    g = s.gauges
    if g is None or not g.ok or not g.complete or g.age_seconds > (s.window_seconds or 0):
        return False
    if g.running + g.held <= ran * (1 + YARDSTICK_OUTGROWN):
        return False
    memo.pop("call_s", None)
    memo.pop("yardsticks", None)
    return True


def _learn_from_reading(s: Signals, g: Gauges, params: dict, memo: dict) -> None:
    """What a complete reading proves: the backend ran ``proven`` requests; and, when nothing
    waited in vLLM over a whole interval at one width, the lane's mean call time is the
    backend's own (``call_s``), the yardstick for the lane's evidence between readings."""
    memo["proven"], memo["endpoints"] = int(g.running + g.held), g.endpoints
    memo.pop("lane_cut", None)
    queued = _queued(g)
    # What a growth is judged against (_growth_ran_none): the newest reading of another width. The
    # reading just before can be of the same width within its gauge lag, still showing the width
    # before (100 running, none waiting at a probe to 105; then 100 and 4), and a cap of 100 then
    # waited for a confirmation probe that made an interval's admissions wait (over twelve seeds:
    # F12 7.3 -> 7.0 %, physical P2 8.8 -> 8.3 %).
    last = memo.get("reading")
    if last is not None and last[2] != s.width:
        memo["reading_before"] = last
    memo["reading"] = [memo["proven"], queued, s.width, g.endpoints]
    call = _mean_call(s)
    # The interval and the one before it at this width: calls that began before the lane was
    # busy at it (its first interval) are a biased sample (the short ones end first).
    settled = s.width_age_seconds is None or (
        memo.get("last_width") == s.width and s.width_age_seconds >= (s.window_seconds or 0) + params["gauge_lag_seconds"])
    looked_again = memo.pop("looked_again", False)
    if call is not None and queued <= 0 and settled and not looked_again and _yardstick_contradicted(s, memo):
        memo["read_soon"] = memo["looked_again"] = True
    elif call is not None and queued <= 0 and settled:
        memo["call_s"], memo["call_at"], memo["call_width"] = call, memo.get("decisions", 0), s.width
        _keep_yardstick(memo, s.width, call)
        judged_by = memo.pop("lane_call", None)
        if judged_by is not None and call > judged_by * (1 + LANE_SLOWS) and memo.get("cap_lane"):
            memo["slows"] = True
            _forget_cap(memo)


def _answers_fall_short(s: Signals, memo: dict, call: float, done: int, seconds: float) -> bool:
    """Whether a lane kept full answered fewer than it keeps in flight, at ``call`` seconds a call,
    by more than ``LANE_MARGIN`` of it and ``READ_SOON`` of the count's noise (below that floor, a
    steady lane's noise read the gauges early, and the readings brought the cap's next probe
    sooner): too little to cut on (a cut needs the whole margin), enough to read the gauges at
    the next decision (:func:`wants_reading`) instead of at the scrape's cadence, since a drop in
    capacity makes every request admitted wait until a reading shows it (F12, the KV cache
    binding at 60 of 100: the answers fell from about 148 to 128 and 118 an interval while the
    next scrape was 12 s away, and every one of the 490 requests admitted in those four
    intervals waited)."""
    if not memo.get("was_full") or s.in_flight < s.width or seconds <= 0 or _began_at_change(s):
        return False
    ran = done / seconds * call
    return s.in_flight - ran > max(LANE_MARGIN * s.in_flight, READ_SOON * _count_noise(s.in_flight, done))


def _yardstick_contradicted(s: Signals, memo: dict) -> bool:
    """Whether this interval's answers fall short against the yardstick taken at this width
    (:func:`_answers_fall_short`) while the decision's reading saw nothing waiting. A reading is
    3-6 s old and can predate a drop the answers already show (F12: 100 running, none waiting,
    KV 47 %, five seconds after the KV cache began to bind at 60); taken as the yardstick, the
    interval's calls, longer by the waiting, would hide the drop from the lane's evidence. The
    yardstick is kept, and the gauges are read again at the next decision; a second reading
    that sees nothing waiting stands (calls can lengthen for other reasons: longer prompts)."""
    call = memo.get("call_s") if memo.get("call_width") == s.width else None
    if call is None or not s.window_seconds:
        return False
    return _answers_fall_short(s, memo, call, s.completions, s.window_seconds)


def _keep_yardstick(memo: dict, width: int, call: float) -> None:
    """Keep the yardstick by the width it was taken at (the newest of each width, within
    ``LANE_MARGIN``; a few widths): calls slow as the batch grows, so a width is judged by one
    taken at about it when the lane has been there before."""
    kept = [y for y in memo.get("yardsticks", []) if abs(y[0] - width) > LANE_MARGIN * width]
    memo["yardsticks"] = (kept + [[width, call]])[-YARDSTICKS_KEPT:]


def _yardstick_at(memo: dict, width: int) -> float | None:
    """The mean call time at about ``width`` by the yardsticks taken at other widths, or None:
    the newest taken within ``LANE_MARGIN`` of it; else a straight line through the two taken
    nearest on either side (between them, or a little above the widest: a decode step costs
    about a fixed part plus a part per running request, so calls lengthen about linearly with
    the batch)."""
    sticks = memo.get("yardsticks", [])
    for taken_at, call in reversed(sticks):
        if abs(taken_at - width) <= LANE_MARGIN * width:
            return call
    below = sorted(y for y in sticks if y[0] < width)
    above = sorted(y for y in sticks if y[0] > width)
    if below and above:
        (w0, c0), (w1, c1) = below[-1], above[0]
    elif len(below) >= 2 and width <= below[-1][0] * (1 + 2 * LANE_MARGIN):
        (w0, c0), (w1, c1) = below[-2], below[-1]
    else:
        return None
    if c1 < c0:
        return None  # shorter calls at a larger batch: another backend since, not a slope
    return c0 + (c1 - c0) * (width - w0) / (w1 - w0)


def _call_margin(s: Signals, share: float) -> float:
    """How much longer than the yardstick the interval's mean call must be to show waiting: ``share``,
    or, when few answered, two standard deviations of their mean for calls that vary by a third
    (0.67 / sqrt(answers): 12 % for a small lane's 30 answers an interval, 3 % at 500). Calls
    that vary more fail a probe above the cap that would have held now and then: it costs the
    wait before the next probe, never a width below the cap."""
    return max(share, 0.67 / math.sqrt(max(1, s.completions)))


def _rejudged(s: Signals, mean: float, call: float, params: dict) -> float | None:
    """The margin of a second look by the lane's answers, the decision after a cut to below what
    the last reading showed running (the backend shrank), or None: no second look.

    The first look judged an interval that began before the drop, while the batch above the new
    capacity was still finishing: what ran reads high (57 for 50), and what waits in vLLM over
    it waits until the next reading (5-15 s). The next interval is at the cut width throughout.
    Its answers need not clear the count's Poisson noise (3 / sqrt(answers)): with the lane full,
    they vary far less (a closed loop: one answer lets one call in), and the interval's calls
    took longer than the yardstick by more than the same margin, which is work that waited (a
    call that ran alone takes the yardstick's time). The two together, each above
    ``lane_rejudge`` of the width, cut again to what ran."""
    if s.in_flight < s.width or mean <= call * (1 + _call_margin(s, params["lane_rejudge"])):
        return None
    return max(1.0, s.in_flight * params["lane_rejudge"])


def _probe_judged(s: Signals, bounds: Bounds, params: dict, memo: dict) -> Proposal | None:
    """A probe above the running cap judged by the lane's answers, every decision it lasts.

    The probe (+5 %) is otherwise judged by the next reading, 15 s later at the default cadence
    (30 s when that scrape fails), and while any request waits in vLLM every request admitted
    waits too: one probe was 3.75 % of a 400-s run's requests. Its 5 % is inside the count's
    Poisson noise (3 / sqrt(answers)), but with the lane full the answers are a closed loop and
    vary far less (1.6 % sd at 100): calls longer than the yardstick and fewer run than in
    flight, each by more than ``lane_probe``, is the probe queueing in vLLM. It fails as a
    probe failed by a reading does: back to the cap, the cap's back-off doubled."""
    cap, call, mean = memo.get("cap"), memo.get("call_s"), _mean_call(s)
    share = params["lane_probe"]
    if (not share or cap is None or call is None or mean is None or s.width <= cap or s.in_flight < s.width
            or memo.get("cap_endpoints") != memo.get("endpoints") or memo.get("slows") or memo.get("call_at") == memo.get("decisions", 0)
            or (s.width_age_seconds is not None and s.width_age_seconds < (s.window_seconds or 0))):
        return None
    ran = s.completions / s.window_seconds * call
    if mean <= call * (1 + _call_margin(s, share)) or s.in_flight - ran <= max(1.0, s.in_flight * share):
        return None
    if _yardstick_outgrown(s, ran, memo):
        return None
    target = bounds.clamp(cap)
    if target >= s.width:
        return None
    memo["measured"], memo["failed"] = target, s.width
    probing.failed(memo, s.width, target, params, probed=True)
    _cap_back_off(memo, params, probed=True)
    return Proposal(target, "cut", f"probe at {s.width}: the lane's answers show about {ran:.0f} run at once, calls "
                                   f"{mean / call - 1:.0%} longer than the yardstick ({call:.2f}s): it queues in "
                                   f"vLLM; back to the running cap {cap}")


def _began_at_change(s: Signals) -> bool:
    """Whether the interval began with the width's last change (its answers are of calls begun
    at the width before)."""
    return s.width_age_seconds is not None and s.width_age_seconds <= (s.window_seconds or 0)


def _count_noise(count: float, done: int) -> float:
    """How far ``count`` may be off when read from ``done`` answers: the interval's count of
    answers varies by about its square root (fewer answers, a wider margin), and never less than
    ``LANE_MARGIN`` of it."""
    return max(1.0, count * max(LANE_MARGIN, 3 / math.sqrt(max(1, done))))


def _before_ran_in_full(s: Signals, memo: dict, call: float, ran: float, done: int) -> bool:
    """Whether a growth's own interval answered at least as the width before it ran (within the
    count's noise): the growth then waits for a reading (every decision reads the gauges until
    one judges it), not for these answers.

    Most of them are of calls begun before the growth, and the growth's own calls answer late or
    not at all within it: a call at a full batch lasts an interval or more, and a growth's
    prompts wait for the step's token budget (216 take about 4 s to prefill on two engines).
    Read as the growth's, the answers "showed" it queueing whenever calls ran longer than the
    yardstick or ended in waves: 131 answers at 512 (from 454) "showed" 360 run at once, and the
    pool went back to 452 and probed its way up again, a probe an interval of waiting; 74 at 128
    (from 32) "showed" 22, and the start's growth was made twice. Answers clearly fewer than the
    width before ran are the backend shrinking during the growth: judged as before.

    What the width before ran is what its own last answers showed by the same yardstick, where
    that is less than the width: a yardstick taken at a smaller batch reads every interval short
    (143 answers at 179 showed 139 run), and against the width itself the growth's 115 answers
    "showed" the backend shrinking, and the growth to 251 went back to 177 and the way up again
    made its admissions wait (over twelve seeds: F4 3.49 -> 2.72 %, physical P3 6.07 -> 5.20 %
    of requests waited)."""
    before = memo.get("width_before")
    if before is None or before >= s.width or not _began_at_change(s):
        return False
    return min(before, _ran_at(memo, before, call)) - ran <= _count_noise(before, done)


def _ran_at(memo: dict, width: int, call: float) -> float:
    """How many the lane's answers showed run at once at ``width`` over its last intervals there
    (up to a call's span) before this one, at ``call`` seconds a call; ``width`` itself when none
    are kept."""
    done, seconds = _trailing_answers(memo.get("answers", [])[:-1], width, call)
    return done / seconds * call if seconds else width


def _within_gauge_cap(width: int, memo: dict) -> bool:
    """Whether ``width`` is at or below a running cap the gauges measured (max_num_seqs binding,
    exact) on the endpoints the lane reads now. A growth back there is left to the readings: the
    lane's yardstick was taken at a smaller batch, and calls slow as the batch grows (2.44 s at
    63 running, 3 s at 100), so answers read against it "showed" 73 run of 100 after a
    long-context burst, and the lane cut to 72 and climbed back a probe at a time (F12: idle
    17 % of the run). A growth is read at every decision until a reading judges it."""
    cap = memo.get("cap")
    return (cap is not None and not memo.get("cap_lane") and width <= cap
            and memo.get("cap_endpoints") == memo.get("endpoints"))


def _lane_evidence(s: Signals, bounds: Bounds, params: dict, memo: dict) -> Proposal | None:
    """The width judged by the lane's own answers between readings (a reading comes every
    third decision by default): at the backend's mean call time, the interval's answers show
    how many it ran at once (Little's law); in flight well above that is work waiting in vLLM.
    Above what the last reading showed running (a growth it did not judge), the width goes
    back to what ran, never below that count, and that is a running cap measured by the lane
    (a probe above it that runs more raises it, and the next probe follows at the next
    reading; measured in the interval of the growth, the first probe waits only one reading).
    At or below it (the backend shrank
    since), the width goes to what ran, as a measurement (the next reading says why)."""
    proven, call, mean = memo.get("proven"), memo.get("call_s"), _mean_call(s)
    again = memo.get("lane_cut") == "shrink" and params["lane_rejudge"] and mean is not None
    if (proven is None or call is None or mean is None or (memo.get("lane_cut") and not again)
            or memo.get("slows") or memo.get("call_at") == memo.get("decisions", 0)):
        # Once per reading (the yardstick was taken at the proven width, not at this one), and
        # not on the interval the yardstick came from (it would judge itself); see _rejudged.
        return None
    if s.in_flight > s.width:
        # The lane drains a cut: what waits in vLLM above the width was cut for already (a
        # count of 488 in flight at width 178 read as 7 run at once once sent a pool to 7).
        return None
    above = s.width > proven
    if above and _within_gauge_cap(s.width, memo):
        return None
    if above and memo.get("cap_lane") and memo.get("cap") is not None and s.width <= memo["cap"] and _began_at_change(s):
        # A growth back to a cap the lane measured, in its own interval: the calls that ended in it
        # began at the width before (113 answers "showed" 51 run of 96, and a pool whose capacity
        # had come back to 100 went back to 52). The next interval's answers judge it.
        return None
    near = _yardstick_at(memo, s.width)
    if near is not None:
        # Calls of about this batch (at 96, 3.25 s by the line through 86 and 52, where the last
        # yardstick, taken at 52, said 2.27 s and "showed" 68 run of 96).
        call = near
    elif not above and memo.get("call_width", s.width) < s.width * (1 - LANE_MARGIN):
        # A shrink is judged by a yardstick taken at about this batch: one taken at a smaller one
        # is shorter than the calls are now (1.28 s at 40, about 3 s at 88), and answers read
        # against it "showed" 39 run of 88 (F4, one address: the pool went to 39 and back).
        return None
    if not again and _answers_fall_short(s, memo, call, *_answers_over(memo, s, call)):
        memo["read_soon"] = True  # before any reading of this decision is heard: it may be stale
    g = s.gauges
    judged_after = g is not None and probing.evidence_after_change(s.width_age_seconds, g.age_seconds,
                                                                    params["gauge_lag_seconds"])
    if g is not None and g.ok and g.complete and _queued(g) <= 0 and (not above or judged_after):
        # A reading of this decision, inside the interval, saw nothing waiting: at or below
        # ``proven`` the backend did not shrink; above it, taken after the growth, the growth
        # held. Calls that took longer than the yardstick were slower, not waiting (a decode
        # step slows as the batch grows, and prefills of the newly admitted share its steps).
        return None
    done, seconds = _answers_over(memo, s, call)
    ran = done / seconds * call
    if _yardstick_outgrown(s, ran, memo):
        return None
    if again:
        memo["lane_cut"] = True  # one second look, no more
        margin = _rejudged(s, mean, call, params)
    else:
        margin = _count_noise(s.in_flight, done)
    if margin is None or s.in_flight - ran <= margin:
        return None
    if above and not again and _before_ran_in_full(s, memo, call, ran, done):
        return None
    if not again and not memo.get("was_full"):
        # In flight is a count at one instant, the answers a mean over the interval: under a
        # load below the width, a burst of arrivals just before the decision looks like work
        # waiting in vLLM (F9: 100 in flight after a burst, 83 answered, 69 in flight at the
        # decision before). Work waits in vLLM only behind a lane kept full: the lane must
        # have been full at the decision before too.
        return None
    target = bounds.clamp(max(proven, math.floor(ran)) if above else math.floor(ran))
    before = memo.get("width_before")
    if above and before is not None and proven <= before < target and \
            target - before <= ran * 3 / math.sqrt(s.completions):
        # A growth whose answers show no more run than the width before it, within their count's
        # noise, bought nothing: back to that width (a reading saw it near full, nothing waiting:
        # the growth came from there), not to a noisy count above it (105 for 100, where every
        # request admitted for the 15 s to the next reading waited: 1.6 % of F2's requests).
        target = before
    if target >= s.width:
        return None
    probed = _probing_above(s.width, memo)
    memo["measured"], memo["failed"] = target, s.width
    memo["lane_cut"] = True if above or again else "shrink"
    probing.failed(memo, s.width, target, params, probed=probed)
    if above:
        memo["cap"], memo["cap_endpoints"], memo["cap_lane"] = target, memo.get("endpoints"), True
        _end_raise_streak(memo)
        memo["lane_call"] = call
        if _began_at_change(s):
            # The interval began at the growth: calls begun at the old width and the new ones'
            # prefills make its answers read low (86 of 100 after a growth to 211), so the cap
            # waits one reading, as a first measurement by the gauges does, not its back-off.
            memo["cap_quiet_until"] = memo.get("n", 0) + 1
        else:
            _cap_back_off(memo, params, probed=False)
    return Proposal(target, "cut", f"{s.in_flight} in flight but the lane's answers show about {ran:.0f} run at "
                                   f"once (mean call {call:.2f}s): work waits in vLLM; back to {target}")


def vllm_law(s: Signals, bounds: Bounds, params: dict, memo: dict) -> Proposal:
    """:func:`_vllm_proposal`, and whether its growth still waits for a reading to judge it.

    A growth (a probe above the running cap, a step into the KV room) is judged by the first
    reading taken ``gauge_lag_seconds`` after it; until then every decision reads the gauges
    (:func:`wants_reading`) instead of waiting for the next scrape at its own cadence: while
    a growth the backend cannot run is out, every request admitted waits in vLLM, so the
    wait for its judgment is what it costs (a +5 % probe judged 15 s later was 3.75 % of a
    400-s run's requests). A single address read as one of n replicas
    (:func:`_behind_one_address`) is judged on its gauges x n, and the reason says so."""
    g = s.gauges
    if g is not None and g.ok and g.complete and probing.evidence_after_change(
            s.width_age_seconds, g.age_seconds, params["gauge_lag_seconds"]):
        memo.pop("unjudged_growth", None)
    replicas = 1
    if g is not None:
        g, replicas = _behind_one_address(s, g, params, memo)
        s = replace(s, gauges=g)
    proposal = _vllm_proposal(s, bounds, params, memo)
    if proposal.decision == "cut":
        # Nothing to read early for: the next reading shows the width before the cut (a stale
        # 91 running and 2 waiting after a cut to 27 stood as a cap of 91 for the rest of a run).
        memo.pop("unjudged_growth", None)
        memo.pop("read_soon", None)
    if replicas > 1:
        proposal = replace(proposal, reason=f"{proposal.reason} (one address, read as one of {replicas} replicas: "
                                            f"its gauges x{replicas})")
    return proposal  # a growth that takes effect is marked by compose()


def wants_reading(memos: dict[str, dict]) -> bool:
    """Whether a law waits for a reading to judge a growth, or to see why the lane's answers fell
    short (:func:`_answers_fall_short`): read the gauges at this decision, whatever the scrape
    cadence."""
    wanted = ("unjudged_growth", "cap_check", "read_soon")
    return any(isinstance(memo, dict) and any(memo.get(key) for key in wanted) for memo in memos.values())


# One address in front of several replicas (a Service, a balancer): each scrape reaches one of
# them and sees its share of the lane's calls. A fresh reading of a full lane that sees less than
# this share of what the lane has in flight (running and waiting) is one replica of several.
ONE_OF_SEVERAL = 0.67
MOST_REPLICAS_GUESSED = 64


def _behind_one_address(s: Signals, g: Gauges, params: dict, memo: dict) -> tuple[Gauges, int]:
    """The reading as the pool's, and how many replicas it stands for. A single endpoint whose
    fresh readings of a full lane see about 1/n of the lane's calls, twice in a row, is taken for
    one of n replicas behind one address: its gauges are multiplied by n (its KV usage is the
    mean's estimate as it is), until a reading sees the lane's calls again. Listing the
    replicas apart (``endpoints``) is exact; this keeps a pool behind a balancer from sitting at
    its start width, "never near full" with half its calls out of sight."""
    if not (g.ok and g.complete and g.endpoints == 1):
        return g, 1
    fresh = probing.evidence_after_change(s.width_age_seconds, g.age_seconds, params["gauge_lag_seconds"])
    seen = g.running + g.waiting
    if fresh and s.in_flight >= max(4, params["near_full"] * s.width) and seen >= 1:
        guess = min(MOST_REPLICAS_GUESSED, round(s.in_flight / seen)) if seen < ONE_OF_SEVERAL * s.in_flight else 1
        if guess == 1 or guess == memo.get("replicas_guess"):
            memo["replicas"] = guess
        memo["replicas_guess"] = guess
    replicas = memo.get("replicas", 1)
    if replicas <= 1:
        return g, 1
    capacity_waiting = None if g.waiting_capacity is None else g.waiting_capacity * replicas
    return replace(g, running=g.running * replicas, waiting=g.waiting * replicas,
                   waiting_capacity=capacity_waiting), replicas


def _vllm_proposal(s: Signals, bounds: Bounds, params: dict, memo: dict) -> Proposal:
    """vLLM's gauges: cut to the running count at saturation, grow into the measured room.

    Two measurements bound the growth. The **running cap**: work waiting for capacity while
    the KV cache has room means ``max_num_seqs`` binds, and the running count is the pool's cap;
    a width above it only queues work in vLLM, so probes above it wait ``cap_backoff``
    readings (only a reconfigured backend takes more). The **KV room**: the cache's usage
    over the running count says how many requests fit (token accounting). Growth goes into
    the room, up to ``headroom_factor`` x per reading, never past the cap or the work that
    waits; without a KV gauge it steps by ``growth_fraction`` (blind). Its probe back-off
    counts readings, not decisions: a probe is judged on a reading, and scrapes (every 12 s
    by default) are rarer than decisions."""
    width, g = s.width, s.gauges
    memo["decisions"] = memo.get("decisions", 0) + 1  # every decision (``n`` counts readings)
    if s.window_seconds:  # the lane's answers of the last intervals, this one last: _answers_over
        answers = memo.setdefault("answers", [])
        answers.append([width, s.completions, s.window_seconds])
        del answers[:-ANSWERS_KEPT]
    memo["was_full"], memo["full"] = memo.get("full", False), s.in_flight >= width
    in_flight_before, memo["in_flight"] = memo.get("in_flight"), s.in_flight
    if g is not None:
        probing.tick(memo)
    memo.pop("read_soon", None)
    saturated, why = saturation(g, params) if g is not None and g.ok else (False, "")
    if g is not None and g.ok and g.complete:
        _learn_from_reading(s, g, params, memo)
    if memo.get("last_width") not in (None, width):
        memo["width_before"] = memo["last_width"]  # what the lane's answers judge a growth against
    memo["last_width"] = width
    backlog = _first_cap_outrun(s, g, bounds, params, memo)
    if backlog is not None:
        return backlog
    if not saturated:
        lane = _probe_judged(s, bounds, params, memo) or _lane_evidence(s, bounds, params, memo)
        if lane is not None:
            return lane
    if g is None:
        return _hold(width, "no new scrape")
    if not g.ok:
        given_up = failed_scrape(s, bounds, params, memo.get("measured"))
        if given_up.decision == "cut" and memo.get("cap") is not None and width > memo["cap"]:
            # A probe above the running cap that no reading could judge cost what a failed one
            # costs: the next waits the cap's back-off again, not for the next reading. A first
            # cap's probe was its confirmation: it is tried again after one reading (a start
            # burst's backlog read as a cap of 18 for 100 held the pool there for 380 s once that
            # probe met a failed scrape; F2 / F3 over twelve seeds: idle 19 / 22 -> 7 / 13 %).
            _cap_measured(memo, params, confirmed=not memo.get("cap_first"), probed=False)
        return given_up
    partial = "" if g.complete else f" ({g.fresh} of {g.endpoints} endpoints fresh; {g.held:g} held for the rest)"
    if saturated:
        # What runs on the endpoints that answered, plus what the lane keeps on
        # those that did not (they are neither judged nor cut for it).
        running = int(g.running + g.held)
        capped = binds_on_running(g, params)
        if capped:
            # The lane's own count less what waits in vLLM is the same cap by another road
            # (exact in flight, one noisy gauge instead of two): the larger of the two, so a
            # running gauge read low is not taken for a lower cap.
            queued = _queued(g)
            # Not where the gauge reads the cap already known: a probe that failed there has
            # answers in transit that the lane's count would take for a higher cap (538 in
            # flight less 10 waiting read 528 for 512, and 16 waited at every reading after).
            known = _cap(memo, g)
            at_known = known is not None and abs(running - known) <= _in_transit(known)
            if probing.evidence_after_change(s.width_age_seconds, g.age_seconds, params["gauge_lag_seconds"]):
                # Only at the width the reading saw: right after a change the count is of
                # another width (698 in flight less 171 waiting 6 s before read 527 for 512).
                if not at_known:
                    running = max(running, _lane_count(s.in_flight - queued, running))
                lane = s.in_flight - queued
                if running - lane > _in_transit(running) and s.in_flight == width == in_flight_before:
                    # Nor one read high: what runs is at most what the lane keeps in flight less
                    # what waits, when the lane held exactly its width since the decision before
                    # (not while it drains a cut: 512 ran 6 s before, 290 are in flight now; nor
                    # under a load below the width: a burst of 100 was read, 83 are in flight now).
                    # A noisy gauge's 106 to 112 at a width of 106 held the pool over a cap of 100,
                    # and every request waited (F11, 10 % noise, over six seeds: 26.4 -> 10.3 %).
                    # The lane's count is high by the requests in transit (answers it has not
                    # counted yet): the cap is taken below it by them. At the count itself a cap
                    # of 101 or 102 for 100 stood after a noisy reading, and the lane came down a
                    # request a reading while everything it admitted waited (F11 over twelve
                    # seeds: 10.4 -> 8.8 % of requests waited).
                    running = _below_transit(lane)
                elif memo.get("capped_at") == width and s.in_flight == width == in_flight_before:
                    # The cut before came to this width as the running cap, and work waits again:
                    # that count was high (a noisy gauge read the queue low: 109 less 6 read 103
                    # for 100, and the readings after took 103 -> 102 -> 101 while every request
                    # admitted waited). Below the lane's count by the requests in transit, at
                    # most (F11 over twelve seeds: 8.8 -> 6.8 % of requests waited).
                    running = min(running, _below_transit(lane))
                elif (running > lane and s.in_flight == width == in_flight_before
                      and _came_by_a_small_step(width, memo)
                      and probing.step(int(lane), params["probe_fraction"]) >= LANE_TRANSIT):
                    # A probe's step that queued work, read with more running than the lane keeps
                    # in flight less what waits: a gauge read high (a noisy one read 103 running
                    # and 3 waiting at 105 for a capacity of 100: a cap of 103, and every request
                    # admitted waited for three decisions). The lane's count less the two requests
                    # in transit a reading may miss, where two are within a probe's step of it (at
                    # 8, two of 8 took a pool of two replicas of 4 to 5). F11 over twelve seeds:
                    # 5.0 -> 4.8 % of requests waited.
                    running = max(1, int(lane - LANE_TRANSIT))
            # The cap stands at once, with no probe to confirm it, when it agrees with the last,
            # leaves no more waiting than a width just over it, or comes of a growth that ran none
            # of what it added (100 running before and after a growth to 208, 107 waiting): that
            # probe made every request admitted for two decisions wait (over twelve seeds: F12
            # 8.5 -> 8.3 %, F3 5.1 -> 4.7 %, P0 11.9 -> 11.2 % of requests).
            confirmed = (_cap_agrees(memo, running, g.endpoints, params)
                         or _just_over(queued, running, width, memo, params)
                         or _growth_ran_none(memo, running, width))
            memo["cap"], memo["cap_endpoints"], memo["cap_first"] = running, g.endpoints, not confirmed
            # Where a first cap was read: if a probe then runs past it, the reading was of a
            # prefill backlog at this width (see _past_a_backlog).
            memo.pop("backlog_ceiling", None)
            if confirmed:
                memo.pop("cap_read_at", None)
            else:
                memo["cap_read_at"] = width
                memo["cap_check"] = True  # read again at the next decision: _first_cap_outrun
            memo["capped_at"] = running  # the width a cut to it leaves: see above
            _end_raise_streak(memo)
            memo.pop("cap_lane", None)
        # Work waiting while the cache has room: the running count is the cap, however old the
        # reading (the backend was full then), so the cut goes all the way to it at once.
        kept = 0 if capped else math.ceil(width * (1 - params["max_cut"]))
        # Where the cache binds (it has no room for one more), what runs is at its edge.
        at_edge = not capped and g.complete and g.kv_usage is not None
        edge = _kv_edge(running) if at_edge else running
        target = max(bounds.floor, edge, kept)
        if target >= width:
            return _hold(width, f"saturated ({why}) with {running} running, at or above the width{partial}")
        probed = _probing_above(width, memo)
        cap = _cap(memo, g)
        memo["measured"], memo["failed"] = target, width
        probing.failed(memo, width, target, params, probed=probed)
        if capped:
            _cap_measured(memo, params, confirmed=confirmed, probed=cap is not None and width > cap)
        cap_why = (f"; the running cap {running} (KV cache {g.kv_usage:.0%})"
                   + ("" if confirmed else ", to be confirmed by a probe") if capped else "")
        cut_to = (f"{target}, below the {running} running at the cache's edge" if target == edge < running
                  else f"the {running} running")
        return Proposal(target, "cut", f"saturated ({why}); cut to {cut_to}{cap_why}{partial}")
    # Near full by the gauges *and* by the lane's own count: the gauges lag dispatch by
    # seconds, so a scrape can still show the lane's last burst after it has emptied.
    near_full = params["near_full"] * width
    if not (g.running + g.held >= near_full and s.in_flight >= near_full and g.waiting <= params["waiting_threshold"]):
        return _hold(width, f"{g.running:g} running of {width} ({s.in_flight} in flight): not near full{partial}")
    if not g.complete:
        return _hold(width, f"near full, but no growth on missing data{partial}")
    if s.waiting <= 0:
        return _hold(width, "near full, but no work waits in the lane: nothing to grow for")
    measured = memo.get("measured")
    if measured is not None and width < measured:
        return _growth(width, measured, bounds, g, f"back to the measured capacity {measured}")
    # A growth (a probe above the measurement, or into the room) is judged on a reading of the
    # present width, not on gauges of before it.
    fresh = probing.evidence_after_change(s.width_age_seconds, g.age_seconds, params["gauge_lag_seconds"])
    stale = (f"near full by a reading from before the width changed "
             f"(+{params['gauge_lag_seconds']:g}s of gauge lag): waiting for a fresh one")
    cap = _cap(memo, g)
    if cap is not None and width >= cap:
        if width > cap and g.running + g.held > cap and (memo.get("cap_lane") or memo.get("replicas", 1) > 1):
            # The lane's cap is an estimate, low if anything (taken while the excursion's calls
            # were starting): a probe above it that ran more raises it to what ran, and the next
            # probe follows at the next reading until one fails (the gauges then measure the
            # cap exactly). No jump into the KV room, which only the next reading could judge.
            # So is a cap read behind one address (one replica's gauges x n, coarse by n): a
            # probe at 93 that "ran 94" held, no more; forgotten, the cap sent the width into the
            # KV room (210 for 100) until the lane's answers cut it (F4: 5.2 -> 3.1 % of requests
            # waited, settled in 10 decisions, not 12).
            memo["cap"] = memo["measured"] = int(g.running + g.held)
            memo["cap_quiet_until"] = memo.get("n", 0)
            if memo.get("cap_raised_at") != width:
                # One probe, one step of the streak: readings at the same probe that each see a
                # request or two more running (473, 474, 475 at 475) are one raise, not three; as
                # three, the next probe's step doubled three times (475 -> 665, +40 %), and its
                # prompts waited for the engines' token budget (physical P2 seed 1: 290 requests).
                memo["cap_raised"], memo["cap_raised_at"] = memo.get("cap_raised", 0) + 1, width
            probing.held(memo)
            whose = "the lane's" if memo.get("cap_lane") else "the"
            return _hold(width, f"probe at {width} ran {g.running + g.held:g}: {whose} running cap is raised")
        if width > cap and g.running + g.held > cap:
            # More ran than the cap with nothing waiting (no reading of before the probe can
            # show that): the backend was reconfigured, or a first cap was a burst's prefill
            # backlog. Growth goes back to the width that first cap was read at, then by the KV
            # room through probes (_past_a_backlog). (Raising a first cap to what ran, a probe
            # at a time, kept a backend grown from 6 to 12 below 11 for 40 s live.)
            read_at = memo.pop("cap_read_at", None)
            _forget_cap(memo)
            if read_at is not None and read_at > width:
                memo["backlog_ceiling"], memo["backlog_steps"] = read_at, 0
            probing.held(memo)
            cap = measured = None
            fresh = True
        else:
            wait = memo.get("cap_quiet_until", 0) - memo.get("n", 0)
            if wait > 0:
                return _hold(width, f"at the running cap {cap}: no probe above it for {wait} more reading(s)")
            if width > cap:
                return _hold(width, f"probe at {width}: {g.running + g.held:g} running, not yet above the "
                                    f"running cap {cap}")
            if not fresh:
                return _hold(width, stale)
            # Each probe that raised the cap doubles the next one's step (up to x8): a low
            # estimate is left in a few readings, not at 5 % a probe (a lane's cap of 37 read in
            # a growth's first interval took 250 s to reach 57 of 100; F2-F4 over twelve seeds:
            # idle 7 / 13 / 13 -> 5 / 8 / 10 %, requests that waited 4.7 / 4.3 / 4.9 -> 5.0 / 5.1 /
            # 5.4 %; physical P2 / P3 5,699 / 5,881 -> 6,421 / 6,507 tokens/s).
            streak = memo.get("cap_raised", 0)
            target = bounds.clamp(_doubled_probe(width, streak, params))
            return _growth(width, target, bounds, g, f"probe above the running cap {cap}")
    if not fresh:
        return _hold(width, stale)
    room = kv_room(g, params)
    if room is None:
        if measured is not None and width >= measured:
            gate = _probe_gate(width, memo)
            if gate:
                return _hold(width, gate)
            if width > measured and g.running + g.held <= measured:
                # A probe holds when the backend ran more than the measurement with nothing
                # waiting; "near full" at the old capacity proves nothing about the new width.
                return _hold(width, f"probe at {width}: {g.running + g.held:g} running, not yet above the "
                                    f"measured {measured}")
        target, grow_why = _grow(width, memo, 1 + params["growth_fraction"], params["probe_fraction"])
        return _growth(width, target, bounds, g, grow_why)
    if room <= width:
        return _hold(width, f"KV cache {g.kv_usage:.0%} used by {g.running:g} running: room for {room}, "
                            "no more than the width")
    failed = memo.get("failed")
    if measured is not None and width >= measured and failed is not None and room <= failed:
        # Room for no more than the width that just failed: the same probe again, so it waits
        # the probe back-off (doubling while such probes fail), or the pool probes the cache's
        # edge at every reading (at KV 92 %, "room for 21" at 20, failing each time).
        gate = _probe_gate(width, memo)
        if gate:
            return _hold(width, f"KV cache {g.kv_usage:.0%} used: room for {room}, no more than the {failed} "
                                f"that failed; {gate}")
    elif measured is not None and width >= measured:
        # The cache has room above the last measurement and the width that failed (shorter
        # requests, or a grown backend): the measurement is stale.
        memo.pop("measured", None)
        probing.held(memo)
    target = min(room, math.ceil(width * params["headroom_factor"]), s.in_flight + s.waiting)
    bound = "the KV room" if target == room else "the work waiting" if target == s.in_flight + s.waiting \
        else f"x{params['headroom_factor']:g}"
    past = _past_a_backlog(width, target, memo, params)
    if past is not None:
        target, bound = past
    if cap is not None and target > cap:
        target, bound = cap, f"the running cap {cap}"
    return _growth(width, target, bounds, g, f"KV cache {g.kv_usage:.0%} used: room for {room}; grow to {bound}")


def _first_cap_outrun(s: Signals, g: Gauges | None, bounds: Bounds, params: dict, memo: dict) -> Proposal | None:
    """A first running cap outrun while the lane drains the cut to it: back where it was read.

    A first cap read within the gauges' lag of a growth can be the growth's prompts waiting for
    the step's token budget (128 -> 512 read at 144 running, 367 waiting). The backend never runs
    more than max_num_seqs, so a reading that sees more running than that cap (by more than the
    requests in transit or ``CAP_AGREES`` of it, whichever is more) while the width is still at
    it proves it a backlog. The lane reads at the decision after such a cut (:func:`wants_reading`),
    while most of the growth is still in flight: the width goes back towards where the cap was
    read at once, no higher than what is in flight, so only what ended since is admitted again;
    a probe after the drain admitted the whole growth a second time, and its prompts waited
    again (over twelve seeds: physical P0 8.3 -> 6.0 %, P12 15.2 -> 11.9 %, F11 6.5 -> 5.5 % of
    requests waited; going back to the width itself, 7.1 / 14.7 / 5.9 %). A reading that sees the
    same count with work still waiting confirms the cap instead (:func:`_first_cap_read_again`)."""
    if g is None or not g.ok:
        return None
    check = memo.pop("cap_check", False)
    if not (check and g.complete and memo.get("cap_first")):
        return None
    cap, read_at = _cap(memo, g), memo.get("cap_read_at")
    ran = int(g.running + g.held)
    if cap is None or read_at is None or s.width > cap:
        return None
    queued = _queued(g)
    if ran <= cap + max(_in_transit(cap), CAP_AGREES * cap):
        return _first_cap_read_again(s.width, cap, ran, queued, params, memo)
    target = bounds.clamp(min(read_at, max(ran, s.in_flight)))
    if queued > _in_transit(ran):
        # Work still waits at the higher count: a first cap again, of what ran (one address in front
        # of two replicas read 88, then 100 with 44 waiting, and the width went back to the 160 the
        # first was read at: 60 waited). It is checked as the first was, and a probe confirms or
        # forgets it (over twelve seeds: physical P0 6.0 -> 5.6 %, P12 11.9 -> 11.6 %; F4 seed 7
        # settles in 8 decisions, where the way back to 160 took 11). The backend ran them: a
        # width it was seen running is measured, and a failed scrape holds it, where it took the
        # width back to the cap cut to before, as a probe above it (P2 seed 12: 399 -> 177 -> 399).
        memo["cap"], memo["capped_at"], memo["cap_check"] = ran, ran, True
        memo["measured"] = ran
        memo["cap_quiet_until"] = memo.get("n", 0) + 1
        target = min(target, ran)
        why = f"{ran} running, more than the first running cap {cap}, and {queued:g} waiting: a first cap of {ran}"
        return Proposal(target, "grow", why) if target > s.width else _hold(s.width, why)
    _forget_cap(memo, "cap_read_at", "cap_first")
    memo["backlog_ceiling"], memo["backlog_steps"] = read_at, 0
    probing.held(memo)
    if target <= s.width:
        return _hold(s.width, f"{ran} running, more than the first running cap {cap}: it was a prefill backlog")
    toward = f"back to the width {read_at} it was read at" if target == read_at else \
        f"back towards the width {read_at} it was read at, as far as the {s.in_flight} in flight"
    return Proposal(target, "grow", f"{ran} running, more than the first running cap {cap}: it was a prefill "
                                    f"backlog; {toward}")


def _first_cap_read_again(width: int, cap: int, ran: int, queued: float, params: dict,
                          memo: dict) -> Proposal | None:
    """A first running cap read again a decision after the cut to it, at the same count and with
    work still waiting: it is max_num_seqs, and it stands with no probe to confirm it.

    A prefill backlog drains between two readings (the step's token budget takes its prompts, and
    the cut admits nothing new), so the running count grows or the queue empties. The same count
    with a queue still there is the batch's limit. Its confirmation probe made every request
    admitted while it lasted wait (physical P3 seed 7: 512 running, 175 then 125 waiting; the
    probe to 538 made 375 requests wait over two intervals)."""
    if abs(ran - cap) > _in_transit(cap) or queued <= _in_transit(ran):
        return None
    memo["cap_first"] = False
    memo.pop("cap_read_at", None)
    _cap_back_off(memo, params, probed=False)
    return _hold(width, f"{ran} running again at the first running cap {cap}, {queued:g} still waiting: "
                        f"the cap stands")


def _past_a_backlog(width: int, target: int, memo: dict, params: dict) -> tuple[int, str] | None:
    """A growth into the KV room bounded by the width a forgotten first cap was read at.

    A first cap that a probe ran past was a prefill backlog (a start's burst read as 82 running
    and 18 waiting at 100), but the width it was read at is the best guess of the cap there is:
    the growth goes back to it, not into the KV room, which is twice the cap where max_num_seqs
    binds at half the cache (87 -> 208 for 100, and 107 requests waited). Above it, probes step
    as a raised cap's do, the step doubling with each that holds (5, 10, 20, then 40 % a
    reading, within the KV room), so a backend that is much wider is reached in a few readings.
    The ceiling stands until a reading measures a running cap. Over twelve seeds: F12 8.3 -> 7.1
    %, F2 4.8 -> 3.8 %, physical P0 9.5 -> 6.5 %, P12 18.6 -> 13.0 % of requests waited (the
    physical rows' answers then of equal length); letting
    the KV room lead again after five such probes gave back most of the physical rows' gain (P2
    9.6 %, P3 8.3 %)."""
    ceiling = memo.get("backlog_ceiling")
    if ceiling is None:
        return None
    if width < ceiling:
        return (ceiling, f"the width {ceiling} a prefill backlog was read at") if target > ceiling else None
    steps = memo.get("backlog_steps", 0)
    memo["backlog_steps"] = steps + 1
    probe = _doubled_probe(width, steps, params)
    return (probe, f"a probe above the width {ceiling} a prefill backlog was read at") if probe < target else None


def _doubled_probe(width: int, held: int, params: dict) -> int:
    """The width of a probe after ``held`` probes in a row held: the step doubles with each."""
    return width + probing.step(width, params["probe_fraction"] * 2 ** min(held, PROBE_DOUBLINGS))


def _growth(width: int, target: int, bounds: Bounds, g: Gauges, why: str) -> Proposal:
    target = bounds.clamp(target)
    if target <= width:
        return _hold(width, "at the ceiling")
    return Proposal(target, "grow", f"{g.running:g} running of {width}; {why}")


def _new_window(width: int) -> dict:
    return {"width": width, "intervals": 0, "in_flight": 0.0, "utilisation": 0.0, "completions": 0, "full": 0}


def utilisation_law(s: Signals, bounds: Bounds, params: dict, memo: dict) -> Proposal:
    """Width <- in-flight x target / utilisation, on a window of enough evidence.

    Bounded by the running cap it observes: when requests wait in vLLM while
    the KV cache is below the target, what binds is the running limit
    (``max_num_seqs``), not the cache, and the running count then is the
    backend's capacity. A width above it only queues work in vLLM, however
    low the utilisation reads (the normal case for short prompts).
    """
    width = s.width
    window = memo.setdefault("window", _new_window(width))
    g = s.gauges
    if g is not None and g.ok and g.complete and g.kv_usage is not None:
        waiting = _queued(g)
        if waiting > 0 and g.kv_usage < params["target"] and g.running >= 1:
            memo["running_cap"] = int(g.running)
    cap = memo.get("running_cap")
    if cap is not None and width > cap:
        memo["window"] = _new_window(cap)
        return Proposal(bounds.clamp(cap), "cut", f"work waited in vLLM with the KV cache below "
                                                  f"{params['target']:.0%}: bounded by the {cap} running (the running cap)")
    if s.in_flight == 0 and s.completions == 0:
        return _hold(width, "idle interval (not counted)")
    if window["width"] != width:
        memo["window"] = _new_window(width)
        return _hold(width, "the width changed during the window; a new window starts")
    if g is None or not g.ok or not g.complete or g.kv_usage is None:
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
    memo["window"] = _new_window(width)
    if used <= 0:
        return _hold(width, "utilisation 0")
    ratio = params["target"] / used
    if abs(ratio - 1) <= params["tolerance"]:
        return _hold(width, f"utilisation {used:.0%} within tolerance of {params['target']:.0%}")
    target = math.ceil(in_flight * ratio)
    bound = ""
    if cap is not None and target > cap:
        target, bound = cap, f"; bounded by the running cap {cap}"
    if target > width:
        if not slots_used:
            return _hold(width, "would rise but the slots were not used")
        target = min(target, math.floor(width * params["max_rise"]))
    target = bounds.clamp(target)
    if target == width:
        return _hold(width, f"at a bound{bound}")
    return Proposal(target, "grow" if target > width else "cut",
                    f"utilisation {used:.0%} against {params['target']:.0%}{bound}")


def worst_endpoint(g: Gauges, signal: str, target: float, min_samples: int) -> tuple[float, str] | None:
    """The highest share of ``signal`` observations above ``target`` over the endpoints with
    enough observations, and that endpoint."""
    found = []
    for endpoint, buckets in g.latency.get(signal, []):
        if histograms.count(buckets) >= min_samples:
            share = histograms.share_above(buckets, target)
            if share is not None:
                found.append((share, endpoint))
    return max(found) if found else None


def latency_law(s: Signals, bounds: Bounds, params: dict, memo: dict) -> Proposal:
    """Keep a quantile of vLLM's inter-token latency (or TTFT) under a target.

    Judged per endpoint (the worst replica counts: its users wait the
    longest), from the histograms' growth between two scrapes, as the share
    of observations above the target: the p95 is under the target exactly
    when at most 5 % are above it. vLLM's buckets are coarse (10, 25, 50, 75,
    100 ms...), and a quantile interpolated inside one is a guess, while the
    share above a bucket bound is exact; so a target at a bound is judged
    exactly. More than ``1 - quantile`` above: cut in proportion (target /
    the interpolated quantile, keeping at least ``1 - max_cut``). Less than
    ``(1 - quantile) x (1 - tolerance)`` above, with work waiting in the lane:
    grow, by half the headroom at most ``growth_fraction``, under the same
    probe back-off as the other laws. Decode steps slow as the batch grows,
    so the width this finds is usually far below ``max_num_seqs``.
    """
    width, g = s.width, s.gauges
    if g is None:
        return _hold(width, "no new scrape")
    probing.tick(memo)  # the back-off counts readings, as the vllm law's does
    if not g.ok:
        return failed_scrape(s, bounds, params, memo.get("measured"))
    signal, q, target = params["signal"], params["quantile"], params["target_ms"] / 1000
    allowed = 1 - q
    worst = worst_endpoint(g, signal, target, params["min_samples"])
    if worst is None:
        return _hold(width, f"fewer than {params['min_samples']} {signal} observations on every endpoint")
    if not probing.evidence_after_change(s.width_age_seconds, g.age_seconds + g.latency_window_seconds, 0.0):
        return _hold(width, f"the {signal} window began before the width changed")
    share, where = worst
    buckets = dict(g.latency[signal])[where]
    value = histograms.quantile(buckets, q) or target
    seen = (f"{share:.1%} of {signal} over {target * 1000:g} ms on {where} "
            f"(p{q * 100:g} ~{value * 1000:.0f} ms; at most {allowed:.0%} may be)")
    if share > allowed:
        new = max(math.floor(width * target / max(value, target)), math.ceil(width * (1 - params["max_cut"])))
        new = max(bounds.floor, 1, min(new, width - 1))
        if new >= width:
            return _hold(width, f"{seen}: at the floor")
        probed = _probing_above(width, memo)
        memo["measured"], memo["failed"] = new, width
        probing.failed(memo, width, new, params, probed=probed)
        return Proposal(new, "cut", f"{seen}: cut in proportion")
    room = allowed * (1 - params["tolerance"])
    if share > room:
        return _hold(width, f"{seen}: within tolerance")
    if not (s.waiting > 0 and s.in_flight >= width):
        return _hold(width, f"{seen}: no work waits for a wider lane")
    gate = _probe_gate(width, memo)
    if gate:
        return _hold(width, gate)
    if memo.get("measured") is not None and width > memo["measured"]:
        probing.held(memo)
        memo["measured"] = width
    step = params["growth_fraction"] if share <= 0 else min(params["growth_fraction"], (room / share - 1) / 2)
    new = bounds.clamp(width + probing.step(width, step))
    if new <= width:
        return _hold(width, "at the ceiling")
    return Proposal(new, "grow", f"{seen}: grow")


LAWS = {"overload": overload_law, "vllm": vllm_law, "utilisation": utilisation_law, "latency": latency_law}


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
    vllm = memos.get("vllm")
    if vllm is not None and width > s.width and width > max(vllm.get("cap") or 0, vllm.get("measured") or 0):
        vllm["unjudged_growth"] = True  # past what was measured: see vllm_law
    return Composed(width, decision, kind, lowest.reason,
                    {k: {"width": p.width, "decision": p.decision, "reason": p.reason} for k, p in proposals.items()})

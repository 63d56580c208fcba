"""The peer benchmark's fleet, scenarios and figures, shared by every arm.

The fleet: two pools of width ``WIDTH`` (a primary and a fallback), each a
model on the simulator with capacity ``WIDTH`` and a fixed ``SERVICE_MS``, in
queue mode as vLLM is (it queues what is over its running limit and never
answers 429), so a router that sends more than the width shows up as the
simulator's ``max_in_flight`` above it, not as errors.

A scenario is a list of requests, each with its class (interactive or
background), its moment (seconds after the start) and its deadline; every arm
is given the same list and reports one :class:`Outcome` per request.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

WIDTH = 4
SERVICE_MS = 200
MODELS = ("primary", "fallback")
SIM_SPECS = [f"{name}:{WIDTH}:{SERVICE_MS}" for name in MODELS]
CHAT = {"messages": [{"role": "user", "content": "bench"}], "max_tokens": 1}


@dataclass(frozen=True)
class Request:
    index: int
    kind: str  # "interactive" or "background"
    at: float  # seconds after the scenario's start
    deadline: float  # seconds after it was sent


@dataclass(frozen=True)
class Scenario:
    name: str
    requests: tuple[Request, ...]
    # (from, to) seconds after the start during which the primary is down
    # (a dead engine kept alive: 500 per request), or None.
    outage: tuple[float, float] | None = None


@dataclass
class Outcome:
    index: int
    kind: str
    sent: float  # epoch seconds
    done: float  # epoch seconds, when the caller saw the answer or the error
    ok: bool
    reason: str = ""  # why it failed: a short, bounded label

    def as_dict(self) -> dict:
        return asdict(self)


def scenarios(smoke: bool) -> list[Scenario]:
    """Mixed burst, burst bigger than the primary (deadline-bound), primary outage."""
    # 1. A background backlog (10 s of the primary's work in a full run) lands at
    # once; interactive requests arrive every 150-250 ms while it drains.
    background, interactive = (16, 3) if smoke else (200, 20)
    mixed = [Request(i, "background", 0.0, 120.0) for i in range(background)]
    mixed += [Request(background + i, "interactive", 0.3 + 0.2 * i + 0.05 * (i % 3 - 1), 30.0)
              for i in range(interactive)]
    # 2. A burst of interactive requests at once, 1.5x what the primary alone can
    # answer within their deadline; the fallback is idle.
    deadline = 1.0 if smoke else 1.5
    burst = [Request(i, "interactive", 0.0, deadline)
             for i in range(round(1.5 * WIDTH * deadline / (SERVICE_MS / 1000)))]
    # 3. Interactive requests at 15/s (three quarters of the primary's 20/s);
    # the primary is down for the middle 40 % of the run.
    count = 8 if smoke else 48
    seconds = count / 15
    outage = [Request(i, "interactive", i / 15, 10.0) for i in range(count)]
    # The outage comes last: a router's memory of it (Lanes' breaker, LiteLLM's
    # cooldown) must not reach into another scenario; each arm starts afresh.
    return [
        Scenario("mixed_burst", tuple(mixed)),
        Scenario("burst_over_primary", tuple(burst)),
        Scenario("primary_outage", tuple(outage), outage=(0.3 * seconds, 0.7 * seconds)),
    ]


def percentile(values: list[float], q: int) -> float | None:
    if not values:
        return None
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1]


def figures(outcomes: list[Outcome], requests: int, sim_stats: dict, cpu_seconds: float,
            scenario: Scenario) -> dict:
    """One arm's row for one scenario (over every round it ran)."""
    deadlines = {r.index: r.deadline for r in scenario.requests}
    failed: dict[str, int] = {}
    for outcome in outcomes:
        if not outcome.ok:
            failed[outcome.reason] = failed.get(outcome.reason, 0) + 1
    in_time = sum(1 for o in outcomes if o.ok and o.done - o.sent <= deadlines[o.index])
    interactive = [o.done - o.sent for o in outcomes if o.ok and o.kind == "interactive"]
    calls = sum(sim_stats[m][k] for m in MODELS for k in ("served", "rejected", "failed", "cancelled"))
    return {
        "requests": requests,
        "max_in_flight": {m: sim_stats[m]["max_in_flight"] for m in MODELS},
        "width": WIDTH,
        "failed": dict(sorted(failed.items())),
        "answered_within_deadline": in_time,
        "interactive_p50_ms": _ms(percentile(interactive, 50)),
        "interactive_p99_ms": _ms(percentile(interactive, 99)),
        "backend_calls_per_request": round(calls / requests, 3),
        "served_by": {m: sim_stats[m]["served"] for m in MODELS},
        "cpu_ms_per_request": round(cpu_seconds / requests * 1000, 2),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)

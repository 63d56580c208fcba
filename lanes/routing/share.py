"""The load-aware failover share (seed 003): how often a workflow tries its primary first.

A workflow with two or more candidates has a share f in [floor, 1]: that
fraction of its requests tries the primary first, the rest start at the next
candidate (and may still reach the primary after it). There are no synthetic
probes: the floor keeps real traffic measuring the primary.

Only attempts on the primary feed the controller, each ending as:

- **breach**: its first token came later than ``latency_budget_ms``, or no
  first token came before a limit at or after the budget, or the answer
  carried an overload status (429, 503, 529 by default; on the response or
  inside a streamed 2xx);
- **healthy**: its first token came within the budget;
- **unknown**: anything else (other errors, a limit shorter than the budget,
  a lost lease, an answer without a measured first token). Unknown outcomes
  are counted but never enter the rate, and never hold a decision back.

An attempt whose first token was measured is judged by it, whatever came
after (a stream that failed or went silent after its first token still
answered within or after the budget), and an overload status counts wherever
it came from: the response line, or a code embedded in a streamed 2xx
(``Attempt.stream_status``), for every status the workflow lists, not only
the three the backend client itself calls overloads.

While the primary's breaker is open the walker passes the primary over
without trying it. Such a request teaches the share nothing, and it is not
the quiet that idle recovery is for (a primary tried too rarely to judge):
the share holds (``held``, one event when it starts) and idle recovery counts
its intervals from the last time the breaker held the primary back. The
breaker's half-open trials are real attempts and count as usual.

Over a window of the last ``window_samples`` outcomes (``min_samples`` at
least): a rate above ``breach_rate_target`` multiplies f by ``share_decay``,
clears the window and starts a new generation (attempts begun under the old
share are then ignored); a rate at or below ``recovery_breach_rate`` for one
dwell adds ``share_step`` (the window is kept), again after each dwell;
between the two, f holds. Every change is followed by a dwell. A window that
cannot fill credits one step per ``idle_recovery_ms``. Attempts in flight are
never waited for.

State lives in Redis (``Namespace.share``) and is changed by one script
(``scripts/share.lua``), so every worker of the deployment shares one f per
workflow. Time comes from the injected clock. A configuration change (the
parameters, the workflow's deadline, the primary's identity) retires the
controller: its successor starts at 1.0. While a workflow has one candidate
its controller is parked (the share kept) and resumes when a second returns.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING

import redis

from lanes.catalog import RoutingTable, WorkflowRoute
from lanes.catalog.failover import FailoverParams
from lanes.clock import Clock
from lanes.namespace import Namespace
from lanes.routing.observers import Attempt, BaseObserver, Bypass
from lanes.routing.scripts import script_source

if TYPE_CHECKING:
    from lanes.routing.events import EventLog

log = logging.getLogger("lanes.routing")

HEALTHY, BREACH, UNKNOWN = "healthy", "breach", "unknown"
# Changes worth a ``share_change`` event (``started`` is the first use, at 1.0).
REPORTED = frozenset({"decrease", "increase", "idle_recovery", "retired", "resumed", "held"})


def eligible(route: WorkflowRoute) -> bool:
    return route.failover is not None and len(route.candidates) >= 2


def signature(route: WorkflowRoute, params: FailoverParams) -> str:
    """What a controller was learned under: its parameters, the deadline, the primary's identity
    (seed 003: its URL, its key, its upstream model; the key by the variable that holds it)."""
    primary = route.candidates[0]
    text = json.dumps([params.as_dict(), route.default_deadline_seconds, primary.name, primary.base_url,
                       primary.timeout_seconds, primary.api_key_env], sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def classify(attempt: Attempt, params: FailoverParams) -> str:
    """``healthy``, ``breach`` or ``unknown`` for one attempt on the primary."""
    if any(status is not None and status in params.overload_statuses
           for status in (attempt.status, attempt.stream_status)):
        return BREACH
    if attempt.ttft_seconds is not None:
        # The first token is the observation, whatever happened to the stream after it.
        return BREACH if attempt.ttft_seconds > params.budget_seconds else HEALTHY
    if attempt.outcome == "served":
        return UNKNOWN
    # A first-token limit that fired: a breach only when it was at least the
    # budget; a shorter limit says nothing about the budget (censored).
    if attempt.no_first_token_by is not None and attempt.no_first_token_by >= params.budget_seconds - 1e-6:
        return BREACH
    return UNKNOWN


@dataclass(frozen=True)
class Update:
    """The share after one script call, and what changed."""

    share: float
    generation: int
    change: str  # '' or started, retired, resumed, decrease, increase, idle_recovery, floor, stale
    previous: float
    samples: int  # the window now
    breaches: int
    decided_samples: int = 0  # the window the change was decided on (a decrease then empties it)
    decided_breaches: int = 0

    @property
    def breach_rate(self) -> float | None:
        return self.breaches / self.samples if self.samples else None

    @property
    def decided_breach_rate(self) -> float | None:
        return self.decided_breaches / self.decided_samples if self.decided_samples else None


@dataclass(frozen=True)
class Choice:
    """One request's draw: whether it tries the primary first, under which share and generation."""

    primary_first: bool
    share: float
    generation: int


@dataclass(frozen=True)
class ShareState:
    workflow: str
    share: float
    generation: int
    samples: int
    breaches: int
    unknown: int
    parked: bool
    decision: str | None
    changed_at: float | None
    held_at: float | None = None  # the last time the breaker kept a request from the primary

    def as_dict(self) -> dict:
        return {
            "workflow": self.workflow, "share": round(self.share, 4), "generation": self.generation,
            "samples": self.samples, "breaches": self.breaches, "unknown": self.unknown, "parked": self.parked,
            "decision": self.decision, "changed_at": self.changed_at, "held_at": self.held_at,
        }


class ShareStore:
    """The Redis side: one script call per draw and per primary outcome."""

    def __init__(self, client: redis.Redis, namespace: Namespace) -> None:
        self.client = client
        self.ns = namespace
        self._script = client.register_script(script_source("share"))

    def _run(self, op: str, route: WorkflowRoute, params: FailoverParams, now: float, *extra) -> Update:
        args = [op, signature(route, params), int(now * 1000), repr(params.share_step), repr(params.share_decay),
                repr(params.share_floor), repr(params.breach_rate_target), repr(params.recovery_breach_rate),
                params.window_samples, params.min_samples, params.dwell_ms, params.idle_recovery_ms, *extra]
        share, generation, change, previous, samples, breaches, decided, decided_breaches = self._script(
            keys=list(self.ns.share(route.name)), args=args)
        return Update(float(share), int(generation), _text(change), float(previous), int(samples), int(breaches),
                      int(decided), int(decided_breaches))

    def tick(self, route: WorkflowRoute, params: FailoverParams, now: float) -> Update:
        return self._run("tick", route, params, now)

    def record(self, route: WorkflowRoute, params: FailoverParams, now: float, *, breach: bool,
               generation: int) -> Update:
        return self._run("record", route, params, now, "1" if breach else "0", generation)

    def unknown(self, route: WorkflowRoute, params: FailoverParams, now: float) -> Update:
        return self._run("unknown", route, params, now)

    def blocked(self, route: WorkflowRoute, params: FailoverParams, now: float) -> Update:
        return self._run("blocked", route, params, now)

    def park(self, workflow: str) -> bool:
        """Mark a workflow's controller parked (its share kept); False when it has none."""
        state, _ = self.ns.share(workflow)
        parked = self.client.hget(state, "parked")
        if parked is None or _text(parked) == "1":
            return False  # no controller, or parked already
        self.client.hset(state, mapping={"parked": 1, "decision": "parked"})
        return True

    def forget(self, workflow: str) -> bool:
        """Retire a workflow's controller for good (its share turned off)."""
        return bool(self.client.delete(*self.ns.share(workflow)))

    def share(self, workflow: str) -> float:
        """The workflow's share now (1.0 before its controller's first draw)."""
        value = self.client.hget(self.ns.share(workflow)[0], "share")
        return 1.0 if value is None else float(value)

    def read(self, workflow: str) -> ShareState | None:
        state, window = self.ns.share(workflow)
        with self.client.pipeline(transaction=True) as pipe:
            pipe.hgetall(state)
            pipe.llen(window)
            raw, samples = pipe.execute()
        if not raw:
            return None
        fields = {_text(k): _text(v) for k, v in raw.items()}
        return ShareState(
            workflow=workflow, share=float(fields.get("share", 1.0)), generation=int(fields.get("generation", 0)),
            samples=int(samples), breaches=int(fields.get("breaches", 0)), unknown=int(fields.get("unknown", 0)),
            parked=fields.get("parked") == "1", decision=fields.get("decision"),
            changed_at=float(fields["changed_at"]) / 1000 if fields.get("changed_at") else None,
            held_at=float(fields["blocked_at"]) / 1000 if fields.get("blocked_at") else None,
        )


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class ShareController:
    """A process's use of the shares: draws for the walker, outcomes from the observer seam."""

    def __init__(self, store: ShareStore, *, clock: Clock, events: "EventLog | None" = None,
                 rng: random.Random | None = None, metrics=None) -> None:
        self.store = store
        self.clock = clock
        self.events = events
        self.rng = rng or random.Random()
        self.metrics = metrics

    def _now(self) -> float:
        return self.clock.now().timestamp()

    def choose(self, route: WorkflowRoute) -> Choice | None:
        """The draw for one request of ``route`` (None: the workflow has no share)."""
        if not eligible(route):
            return None
        params = route.failover
        update = self.store.tick(route, params, self._now())
        self._reported(route, update)
        return Choice(primary_first=self.rng.random() < update.share, share=update.share,
                      generation=update.generation)

    def observe(self, route: WorkflowRoute, attempt: Attempt) -> str | None:
        """Feed one primary attempt of a request that drew under ``attempt.share_generation``."""
        params = route.failover
        if params is None or attempt.share_generation is None or attempt.model != route.candidates[0].name:
            return None
        outcome = classify(attempt, params)
        if self.metrics is not None and attempt.outcome == "served" and attempt.ttft_seconds is not None:
            self.metrics.first_token(route.name, attempt.ttft_seconds)  # uncensored samples only
        if outcome == UNKNOWN:
            update = self.store.unknown(route, params, self._now())
            if self.metrics is not None:
                self.metrics.unknown(route.name)
        else:
            update = self.store.record(route, params, self._now(), breach=outcome == BREACH,
                                       generation=attempt.share_generation)
        self._reported(route, update)
        return outcome

    def held(self, route: WorkflowRoute) -> None:
        """The primary's breaker kept a request of ``route`` from trying it (see the module doc)."""
        if not eligible(route):
            return
        self._reported(route, self.store.blocked(route, route.failover, self._now()))

    def follow(self, table: RoutingTable) -> None:
        """After a catalog change: park the controllers of workflows left with one candidate,
        retire those turned off. (A changed configuration retires on its next draw.)"""
        for route in table.workflows.values():
            if route.failover is None:
                if self.store.forget(route.name):
                    self._event(route, "retired", share=1.0, previous=None, reason="turned off")
                self._set_active(route.name, False)
            elif len(route.candidates) < 2:
                if self.store.park(route.name):
                    state = self.store.read(route.name)
                    self._event(route, "parked", share=state.share if state else None, previous=None)
                self._set_active(route.name, False)

    def _reported(self, route: WorkflowRoute, update: Update) -> None:
        if self.metrics is not None:
            self.metrics.update(route.name, update)
        if update.change == "held":
            self._event(route, "held", share=update.share, previous=update.previous,
                        generation=update.generation, reason="breaker_open")
        elif update.change in REPORTED:
            rate = update.decided_breach_rate
            self._event(route, update.change, share=update.share, previous=update.previous,
                        generation=update.generation, samples=update.decided_samples,
                        breach_rate=None if rate is None else round(rate, 4))

    def _event(self, route: WorkflowRoute, change: str, **detail) -> None:
        if change in ("decrease", "increase", "idle_recovery"):
            log.info("failover share of %s: %s -> %s (%s)", route.name, detail.get("previous"), detail.get("share"), change)
        if self.events is not None:
            primary = route.candidates[0] if route.candidates else None
            self.events.record("share_change", pool=primary.pool.name if primary and primary.pool else None,
                               workflow=route.name, change=change, **detail)

    def _set_active(self, workflow: str, active: bool) -> None:
        if self.metrics is not None:
            self.metrics.active(workflow, active)


class ShareObserver(BaseObserver):
    """The walker's reports on primary attempts, fed to the workflow's share."""

    def __init__(self, runtime) -> None:
        self.rt = runtime

    def on_attempt(self, attempt: Attempt) -> None:
        if attempt.share_generation is None:
            return
        route = self.rt.table().workflows.get(attempt.workflow)
        if route is not None and eligible(route):
            self.rt.shares.observe(route, attempt)

    def on_bypass(self, bypass: Bypass) -> None:
        if bypass.reason != "breaker_open":
            return
        route = self.rt.table().workflows.get(bypass.workflow)
        if route is not None and eligible(route) and bypass.model == route.candidates[0].name:
            self.rt.shares.held(route)

"""What the walker tells the rest of the system about each try and each bypass.

The walker does not call breakers, event logs, traces, controllers or metrics
one by one: it builds one :class:`Attempt` per backend call (or one
:class:`Bypass` per candidate passed over) and hands it to every observer in
its list. Adding a listener is one more entry in that list, never another
argument or another call in the walker.

Observers run on the walker's thread, after the slot was released: they must
be quick and must not raise (an observer's failure is logged and the others
still run; the answer the backend gave is never thrown away because a report
about it failed).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Protocol, Sequence

from lanes.priority import Priority

log = logging.getLogger("lanes.routing")


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """One backend call of one routed request, as it ended.

    ``outcome`` is one of ``served``, ``failed`` (the backend answered with an
    error, or did not answer), ``timeout`` (no first token or answer within the
    model's first-token timeout), ``abandoned`` (no first token before the
    request's own time for this candidate ran out: the deadline minus the
    reserve kept for the candidates after it; our time, not the backend's
    fault), ``lease_lost`` (our slot was lost mid-call), ``yielded`` (a
    background call cut short because urgent work asked for its slot; the
    request waits and calls again), ``rejected`` (the
    backend refused the request itself, e.g. a 400: not the backend's fault).
    ``status`` is the HTTP status when one arrived.
    ``generation`` is the pool controller generation the request was admitted
    under (None for a model without a pool or before controllers run).
    ``trial`` is the breaker's half-open trial token when this call was the
    trial; ``reason`` the error text of an attempt that did not serve;
    ``admitted_at`` the wall-clock time the call started.
    ``share_generation`` is set on an attempt on the workflow's primary when
    the request drew under the failover share (:mod:`lanes.routing.share`):
    the share's generation at the draw. ``no_first_token_by`` is the
    first-token limit (seconds) that fired, when the call ended for want of one.
    ``stream_status`` is the error code a streamed 2xx carried inside the
    stream, when it carried one (``status`` keeps only what the walker acts on).
    ``ttft_seconds`` is set whenever a first token came, also on a call that
    failed after it.
    ``asked_yield``: the lane was full and the admission asked background
    holders for a slot (preemption, docs/SCHEDULING.md, "Urgent work takes a background slot").
    """

    workflow: str
    model: str
    pool: str | None
    pool_id: int | None
    priority: Priority
    outcome: str
    status: int | None = None
    ttft_seconds: float | None = None
    call_seconds: float | None = None
    wait_seconds: float | None = None
    generation: int | None = None
    task_id: str | None = None
    trial: str | None = None
    reason: str | None = None
    admitted_at: float | None = None
    share_generation: int | None = None
    no_first_token_by: float | None = None
    asked_yield: bool = False
    stream_status: int | None = None
    # Submit to this call, for the request's first call (None for later ones):
    # the whole wait, broker and lane, that the lane wait is a part of.
    queue_wait_seconds: float | None = None

    @property
    def backend_fault(self) -> bool:
        """Whether this outcome says something about the backend's health."""
        return self.outcome in ("failed", "timeout")


@dataclass(frozen=True, kw_only=True)
class Bypass:
    """A candidate passed over without a call, and why (``breaker_open``, ``budget_spent``...)."""

    workflow: str
    model: str
    pool: str | None
    priority: Priority
    reason: str
    detail: dict
    task_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class WaitEnd:
    """A lane wait that ended without a slot: ``outcome`` ``timeout`` (its time
    limit) or ``cancelled`` (the task was revoked, or its worker is stopping)."""

    workflow: str
    model: str
    pool: str
    priority: Priority
    outcome: str
    wait_seconds: float
    task_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class Calling:
    """A request admitted (to its lane's slot, or to a model without a lane), about
    to call the backend: from here it is calling, no longer waiting."""

    workflow: str
    model: str
    pool: str | None
    priority: Priority
    at: float
    task_id: str | None = None


class Observer(Protocol):
    def on_attempt(self, attempt: Attempt) -> None: ...

    def on_bypass(self, bypass: Bypass) -> None: ...

    def on_wait_end(self, wait: WaitEnd) -> None: ...


class BaseObserver:
    """An observer that ignores what it does not care about."""

    def on_attempt(self, attempt: Attempt) -> None:
        return None

    def on_bypass(self, bypass: Bypass) -> None:
        return None

    def on_wait_end(self, wait: WaitEnd) -> None:
        return None

    def on_calling(self, calling: Calling) -> None:
        return None


def _notify(observers: Sequence[Observer], hook: str, report, what: str) -> None:
    for observer in observers:
        try:
            getattr(observer, hook)(report)
        except Exception:  # a report must never lose the answer it reports on
            log.warning("observer %r failed on %s of %s", observer, what, report.model, exc_info=True)


def notify_attempt(observers: Sequence[Observer], attempt: Attempt) -> None:
    _notify(observers, "on_attempt", attempt, "an attempt")


def notify_wait_end(observers: Sequence[Observer], wait: WaitEnd) -> None:
    _notify(observers, "on_wait_end", wait, "a lane wait")


def notify_calling(observers: Sequence[Observer], calling: Calling) -> None:
    # Optional hook: an observer written before it existed simply has none.
    _notify([o for o in observers if hasattr(o, "on_calling")], "on_calling", calling, "a call's start")


def notify_bypass(observers: Sequence[Observer], bypass: Bypass) -> None:
    _notify(observers, "on_bypass", bypass, "a bypass")

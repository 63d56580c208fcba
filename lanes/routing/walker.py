"""The fallback walker: one routed request through its workflow's candidates.

A request whose deadline passed before its walk began (it sat in a queue)
fails at once with :class:`DeadlineExpired`: no lane is touched, no breaker
learns anything. Then, for each candidate, in the workflow's order:

- its breaker is open -> pass it over (``lane_bypass``), unless it is the last;
- a free slot in its lane is taken at once, whatever the budget (a free slot
  costs no waiting);
- otherwise, when the forecast wait exceeds what the request can spend there,
  pass it over; else wait in its lane until the admission deadline minus the
  workflow's fallback reserve (the last candidate keeps no reserve);
- holding the slot, claim the breaker (the half-open trial is taken only here,
  and given back on every path that does not call), then call the backend:
  its first token must come before the deadline minus the reserve, so a hung
  backend leaves the next candidates their time;
- a background call whose slot urgent work asked for (``Permit.yield_asked``,
  :mod:`lanes.lane`) is cut short (or, asked before it began, never sent: the
  asker takes the slot at once, ``Permit.before_use``), its slot released to
  the urgent waiter, and the request waits again on the same lane, ahead of
  the background work that came after it (attempt outcome ``yielded``).

Every wait and every call also fits in the walk's budget from delivery (below
Celery's visibility timeout, :mod:`lanes.routing.budget`): a walk that cannot
fit its next step asks to be requeued (:class:`RequeueRequested`), carrying
the candidates already called so no backend is called again for the task.

The walker does not feed breakers or events itself: it reports one
:class:`Attempt` per call, one :class:`Bypass` per candidate passed over and
one :class:`WaitEnd` per lane wait that ended without a slot to
the runtime's observers and to the walk's trace (:mod:`lanes.routing.observers`).
After a successful call, releasing the slot and every report are best effort:
the answer is returned whatever Redis says (an unreleased slot's lease expires).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable

from lanes.errors import (
    AcquireCancelled,
    AcquireTimeout,
    BackendError,
    BackendTimeout,
    BackendUnreachable,
    CandidatesExhausted,
    CapacityWaitTimeout,
    DeadlineExpired,
    LaneSignal,
    LeaseLost,
)
from lanes.control.replicas import ReplicaCall
from lanes.priority import Priority
from lanes.routing.budget import WalkBudget, start_budget
from lanes.routing.observers import (
    Attempt,
    Bypass,
    Calling,
    WaitEnd,
    notify_attempt,
    notify_bypass,
    notify_calling,
    notify_wait_end,
)
from lanes.routing.request import RouteRequest
from lanes.routing.trace import Trace

if TYPE_CHECKING:
    from lanes.routing.runtime import Runtime

log = logging.getLogger("lanes.routing")


class RequeueRequested(LaneSignal):
    """The walk cannot fit its next wait or call in its budget from delivery: requeue the task.

    ``called`` names the candidates already called in this walk (and earlier
    deliveries); the requeued task skips them.
    """

    def __init__(self, message: str, called: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.called = called


SKIP = object()  # a candidate passed over or given up on: try the next one
YIELDED = object()  # a background call gave its slot to urgent work: wait and call again

# How a trace ends when the walk ends in an exception.
OUTCOMES = {
    CapacityWaitTimeout: "capacity_timeout",
    RequeueRequested: "requeued",
    AcquireCancelled: "cancelled",
    DeadlineExpired: "expired",
}


@dataclass
class RouteResult:
    body: dict
    trace: Trace

    def as_dict(self) -> dict:
        return {
            "workflow": self.trace.workflow,
            "model": self.trace.served_by,
            "answer": self.body,
            "trace": self.trace.as_dict(),
        }


@dataclass
class _Admission:
    """A held slot (``permit`` None for a model without a pool) and what came with it."""

    permit: object | None
    generation: int | None
    # Called right before the call: False when the slot was asked back (or
    # lost) before it (Permit.before_use); the backend is then not called.
    begin: Callable[[], bool] = lambda: True


def lane_name(model) -> str:
    """What a lane wait on ``model`` is reported under: its pool, or the hosted model's own lane."""
    return model.pool.name if model.pool is not None else f"hosted:{model.name}"


class Walker:
    def __init__(self, runtime: "Runtime") -> None:
        self.rt = runtime
        self.trace: Trace | None = None  # the last walk's, kept for failures too
        self.called: list[str] = []  # candidates called for this task, earlier deliveries included
        self._share = None  # this walk's failover-share draw (lanes.routing.share.Choice), if any

    def walk(
        self,
        request: RouteRequest,
        *,
        attempt: int = 0,
        cancel: threading.Event | None = None,
        trace: Trace | None = None,
        delivered_at: float | None = None,
    ) -> RouteResult:
        rt = self.rt
        route = rt.workflow(request.workflow)
        started = rt.clock.now().timestamp()
        trace = self.trace = trace or Trace(
            task_id=request.task_id,
            workflow=route.name,
            priority=request.priority.label,
            attempt=attempt,
            deadline=request.deadline,
            started_at=started,
            queued_seconds=max(0.0, started - request.submitted_at),
        )
        self.called = list(request.called)
        if request.deadline is not None and request.deadline <= started:
            trace.outcome = "expired"
            raise DeadlineExpired(
                f"task {request.task_id} reached its deadline {started - request.deadline:.1f}s before "
                f"routing began (it waited {trace.queued_seconds:.1f}s in the queue); no backend was called"
            )
        budget = start_budget(
            deadline=request.deadline,
            admission_cap=None if request.priority is Priority.BACKGROUND else rt.settings.admission_cap_seconds,
            walk_seconds=rt.settings.background_wait_cap,
            started=started,
            delivered_at=delivered_at,
        )
        candidates = self._share_order(route, [model for model in route.candidates if model.name not in request.called],
                                       trace)
        for index, model in enumerate(candidates):
            last = index == len(candidates) - 1
            try:
                outcome = self._try(route, model, request, last, budget, cancel, trace)
            except BaseException as exc:
                trace.outcome = OUTCOMES.get(type(exc), "failed")
                raise
            if outcome is not None:
                trace.outcome = "served"
                trace.served_by = model.name
                return RouteResult(outcome, trace)
        trace.outcome = "exhausted"
        tried = "; ".join(
            f"{s['model']}: {s['action']}" + (f" ({s['reason']})" if s.get("reason") else "") for s in trace.steps
        )
        raise CandidatesExhausted(
            f"every candidate of workflow {route.name!r} failed or was passed over: "
            + (tried or f"all were called in earlier attempts ({', '.join(request.called)})")
        )

    def _share_order(self, route, candidates: list, trace: Trace) -> list:
        """The candidates in the order this request tries them, after its failover-share draw.

        A request that draws "not the primary" starts at the next candidate;
        the primary stays reachable right after it. Only the first try moves.
        """
        self._share = None
        if len(candidates) < 2 or candidates[0] is not route.candidates[0]:
            return candidates  # the primary was called already (a requeue), or there is no fallback
        try:
            choice = self.rt.shares.choose(route)
        except Exception:  # the share is a preference; its fault must not cost the request
            log.warning("failover share of %s could not be read; trying the primary first", route.name, exc_info=True)
            return candidates
        if choice is None:
            return candidates
        self._share = choice
        if choice.primary_first:
            return candidates
        primary = candidates[0]
        trace.step(primary.name, primary.pool.name if primary.pool else None, "share_skip",
                   share=round(choice.share, 4))
        return [candidates[1], primary, *candidates[2:]]

    # --- one candidate ------------------------------------------------------

    def _try(self, route, model, request, last, budget: WalkBudget, cancel, trace) -> dict | None:
        """Serve the request on ``model``, or return None to move on to the next candidate."""
        if not last and self.rt.breakers.state(model.name) == "open":
            self._bypass(trace, route, model, request, "breaker_open")
            return None
        resume = False
        while True:
            admitted = self._admit(route, model, request, last, budget, cancel, trace, resume)
            if admitted is SKIP:
                return None
            notify_calling(self.rt.observers, Calling(
                workflow=route.name, model=model.name, pool=model.pool.name if model.pool else None,
                priority=request.priority, at=self.rt.clock.now().timestamp(), task_id=request.task_id))
            try:
                answer = self._call(route, model, request, last, budget, admitted, trace)
            finally:
                self._release(admitted.permit, model)  # a no-op when _call released it already
            if answer is not YIELDED:
                return answer
            # Our background call gave its slot to urgent work: wait again,
            # ahead of the background work that came after us.
            resume = True

    def _admit(self, route, model, request, last, budget: WalkBudget, cancel, trace, resume: bool = False):
        """An :class:`_Admission` on the model's lane, or SKIP."""
        rt = self.rt
        pool = model.pool
        now = rt.clock.now().timestamp()
        wait_room = budget.wait_room(now, model.timeout_seconds)
        if wait_room <= 0 and (budget.deadline is None or budget.deadline > budget.walk_deadline):
            raise RequeueRequested(
                f"{model.name}'s call ({model.timeout_seconds:.0f}s) no longer fits in this delivery's budget; "
                "requeued", tuple(self.called),
            )
        if pool is None and model.concurrency is None:
            return _Admission(None, None)
        # A hosted model with a concurrency limit waits in a lane of its own.
        lane = rt.lane(pool) if pool is not None else rt.hosted_lane(model)
        admission = budget.admission_budget(now, 0.0 if last else route.reserve_seconds)
        # The wait ends by the admission budget, and early enough that the
        # call after it still ends inside the walk's budget from delivery.
        wait_limit = wait_room if admission is None else min(admission, wait_room)
        weighs_wait = not last and admission is not None  # it may bypass this candidate instead
        permit = None
        if weighs_wait or wait_limit <= 0:
            # A free slot costs no waiting: take it whatever the budget. (A
            # candidate it will wait for anyway is asked in one call: acquire
            # takes a free slot in the same round trip as it queues.)
            # The workflow's name: its guaranteed share within the priority (lanes/lane/lib_share.lua).
            permit = lane.try_acquire(request.priority, workflow=request.workflow, resume=resume)
        if permit is None:
            permit = self._wait(route, model, request, last, lane, admission, wait_room, wait_limit, cancel, trace,
                                resume)
            if permit is SKIP:
                return SKIP
        if cancel is not None and cancel.is_set():
            # Cancelled (a revoke, a stopping worker) as the slot was granted:
            # it goes back unused, as a cancelled wait leaves nothing held.
            self._release(permit, model)
            self._wait_ended(route, model, request, "cancelled", permit.waited_seconds)
            raise AcquireCancelled(f"the wait on lane {lane_name(model)!r} was cancelled as its slot was granted; "
                                   "the slot went back unused")
        # Until the call begins, an urgent waiter that asks for this slot takes
        # it at once: there is nothing to cut, and no need to wait for this
        # thread to come back from the steps below to give it back.
        begin = permit.before_use()
        generation = self._generation(pool, permit, model) if pool is not None else None
        return _Admission(permit, generation, begin)

    def _wait(self, route, model, request, last, lane, admission, wait_room, wait_limit, cancel, trace,
              resume=False):
        if not last and admission is not None:
            if admission <= 0:
                self._bypass(trace, route, model, request, "budget_spent", budget_ms=_ms(admission))
                return SKIP
            forecast = lane.forecast(request.priority)
            if forecast is not None and forecast > admission:
                self._bypass(trace, route, model, request, "forecast",
                             forecast_ms=_ms(forecast), budget_ms=_ms(admission))
                return SKIP
        started = time.monotonic()
        try:
            if wait_limit <= 0:
                raise AcquireTimeout("no time left to wait")
            return lane.acquire(request.priority, timeout=wait_limit, cancel=cancel, workflow=request.workflow,
                                resume=resume)
        except AcquireCancelled:
            self._wait_ended(route, model, request, "cancelled", time.monotonic() - started)
            raise
        except AcquireTimeout:
            waited = time.monotonic() - started
            self._wait_ended(route, model, request, "timeout", waited)
            trace.step(model.name, lane_name(model), "wait_timeout", wait_ms=_ms(waited))
            if admission is None or admission > wait_room:
                raise RequeueRequested(
                    f"lane wait on {lane_name(model)} reached {max(0.0, wait_limit):.0f}s, the most this delivery "
                    "can spend there; requeued", tuple(self.called),
                ) from None
            if last:
                raise CapacityWaitTimeout(
                    f"capacity_wait_timeout: no slot on {lane_name(model)} for workflow {route.name!r} "
                    f"within {waited:.1f}s; retry later"
                ) from None
            return SKIP

    def _generation(self, pool, permit, model) -> int | None:
        """The controller generation this admission falls under (right after the grant)."""
        try:
            return self.rt.control_generation(pool)
        except Exception:  # a controller's fault must not lose the slot or the task
            log.warning("control generation of pool %s could not be read", pool.name, exc_info=True)
            return None

    def _call(self, route, model, request, last, budget: WalkBudget, admitted: _Admission, trace) -> dict | None:
        """Call the backend holding the admission's slot; report the attempt after releasing it."""
        rt = self.rt
        permit = admitted.permit
        now = rt.clock.now().timestamp()
        limits = budget.call_limits(now, model.timeout_seconds, 0.0 if last else route.reserve_seconds)
        if limits is None:
            if budget.deadline is not None and budget.deadline <= now:
                raise DeadlineExpired(
                    f"task {request.task_id} reached its deadline while waiting for {model.name}; "
                    "no backend was called for it"
                )
            raise RequeueRequested(f"{model.name}'s call no longer fits in this delivery's budget; requeued",
                                   tuple(self.called))
        claim = rt.breakers.claim(model.name, call_seconds=limits.total)
        if not claim.may_call and not last:
            self._release(permit, model)
            self._bypass(trace, route, model, request, "breaker_open")
            return None
        pool = model.pool
        first_call = not self.called and not request.called
        self.called.append(model.name)
        report = dict(
            workflow=route.name, model=model.name, pool=pool.name if pool else None,
            pool_id=pool.id if pool else None, priority=request.priority, generation=admitted.generation,
            task_id=request.task_id, trial=claim.trial, admitted_at=now,
            wait_seconds=permit.waited_seconds if permit is not None else None,
            asked_yield=permit is not None and permit.asked_yield,
            queue_wait_seconds=max(0.0, now - request.submitted_at) if first_call else None,
            share_generation=self._share.generation if self._share and model is route.candidates[0] else None,
        )
        started = time.monotonic()
        error: BackendError | None = None
        try:
            if not admitted.begin():
                raise LeaseLost(f"the slot on {model.name}'s lane was asked back or lost before the call began; "
                                "nothing was sent")
            answer = self._send(model, request, limits, permit)
        except LeaseLost as exc:
            if permit is not None and permit.yield_asked:
                # Asked back by urgent work: not an outcome of the backend
                # (nor of the failover share); the walk waits and calls again.
                report["share_generation"] = None
                attempt = Attempt(outcome="yielded", reason="the slot was asked back by urgent work",
                                  call_seconds=time.monotonic() - started, **report)
            else:
                attempt = Attempt(outcome="lease_lost", reason=str(exc), call_seconds=time.monotonic() - started,
                                  **report)
        except BackendTimeout as exc:
            # The model's own limit fired: the backend's fault. Our cap fired
            # (the time kept for the next candidates): the call is abandoned,
            # which says nothing about the backend.
            ours = exc.limit_seconds < model.timeout_seconds - 1e-3
            attempt = Attempt(outcome="abandoned" if ours else "timeout", reason=str(exc),
                              call_seconds=time.monotonic() - started, ttft_seconds=exc.ttft_seconds,
                              no_first_token_by=exc.limit_seconds if exc.phase == "first_token" else None, **report)
        except BackendError as exc:
            error = exc
            attempt = Attempt(outcome="rejected" if exc.request_rejected else "failed", reason=str(exc),
                              status=exc.status, call_seconds=time.monotonic() - started,
                              ttft_seconds=exc.ttft_seconds, stream_status=exc.stream_status, **report)
        except BaseException:
            self._release(permit, model)
            if claim.trial is not None:
                self._give_back(model, claim.trial)
            raise
        else:
            attempt = Attempt(outcome="served", status=answer.status, call_seconds=answer.seconds,
                              ttft_seconds=answer.ttft_seconds, **report)
        self._release(permit, model)
        notify_attempt([*rt.observers, trace], attempt)
        if attempt.outcome == "served":
            return answer.body
        if attempt.outcome == "yielded":
            self.called.remove(model.name)  # it answered nothing: a requeue may call it again
            return YIELDED
        if attempt.outcome == "rejected":
            raise error
        return None

    def _send(self, model, request, limits, permit):
        """The backend call; to the least busy replica when the pool lists its replicas.

        A replica that cannot be reached got nothing, so the next one is
        tried at once (while the call's time lasts) and the dead one is
        marked down for every worker (:mod:`lanes.control.replicas`).
        """
        rt = self.rt
        pool = model.pool
        if pool is None or not pool.endpoints:
            return rt.backend.call(model, request.payload, timeout=limits.total,
                                   first_token_timeout=limits.first_token, abort=permit, task_id=request.task_id)
        started = time.monotonic()
        tried: tuple[str, ...] = ()
        while True:
            spent = time.monotonic() - started
            call = self._pick_replica(pool, limits.total, tried)
            try:
                return rt.backend.call(
                    replace(model, base_url=call.endpoint), request.payload, timeout=limits.total - spent,
                    first_token_timeout=None if limits.first_token is None else limits.first_token - spent,
                    abort=permit, task_id=request.task_id)
            except BackendUnreachable:
                self._best_effort(lambda: rt.replicas.mark_down(pool.id, call.endpoint), "mark a replica down")
                tried += (call.endpoint,)
                left = min(limits.total, limits.first_token or limits.total) - (time.monotonic() - started)
                if len(tried) >= len(pool.endpoints) or left < 1.0:
                    raise
            finally:
                if call.call_id:
                    self._best_effort(lambda: rt.replicas.release(call), "release a replica's call count")

    def _pick_replica(self, pool, call_seconds: float, tried: tuple[str, ...]) -> ReplicaCall:
        try:
            return self.rt.replicas.pick(pool.id, pool.endpoints, call_seconds=call_seconds, avoid=tried)
        except Exception:  # Redis away: any replica not tried yet still serves the call
            log.warning("could not pick a replica of pool %s; taking one at random", pool.name, exc_info=True)
            left = [e for e in pool.endpoints if e not in tried] or list(pool.endpoints)
            return ReplicaCall(pool.id, random.choice(left), "")

    def _best_effort(self, action, what: str) -> None:
        try:
            action()
        except Exception:
            log.warning("could not %s", what, exc_info=True)

    # --- best-effort parts --------------------------------------------------

    def _release(self, permit, model) -> None:
        if permit is None:
            return
        try:
            permit.release()
        except Exception:  # the lease expires on its own; the answer must not be lost for it
            log.warning("could not release the slot of %s; its lease will expire", model.name, exc_info=True)

    def _give_back(self, model, trial: str) -> None:
        try:
            self.rt.breakers.give_back(model.name, trial)
        except Exception:  # the trial period ends on its own
            log.warning("could not give back the breaker trial of %s", model.name, exc_info=True)

    def _wait_ended(self, route, model, request, outcome: str, waited: float) -> None:
        wait = WaitEnd(workflow=route.name, model=model.name, pool=lane_name(model), priority=request.priority,
                       outcome=outcome, wait_seconds=waited, task_id=request.task_id)
        notify_wait_end(self.rt.observers, wait)

    def _bypass(self, trace, route, model, request, reason: str, **detail) -> None:
        bypass = Bypass(
            workflow=route.name, model=model.name, pool=model.pool.name if model.pool else None,
            priority=request.priority, reason=reason, detail=detail, task_id=request.task_id,
        )
        notify_bypass([*self.rt.observers, trace], bypass)


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)

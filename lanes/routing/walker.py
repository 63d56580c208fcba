"""The fallback walker: one routed request through its workflow's candidates.

For each candidate, in the workflow's order:

- its breaker is open, or its lane's forecast wait exceeds what the request
  can spend there -> pass it over (``lane_bypass``), unless it is the last;
- otherwise wait in its lane until the admission deadline minus the
  workflow's fallback reserve (the last candidate keeps no reserve);
- call the backend, capped by the time left to the deadline; a failure feeds
  the breaker and moves on, and the slot is always released.

Background work with no deadline waits without limit, up to a cap below
Celery's visibility timeout, where it asks to be requeued instead (so does
any wait whose budget is longer than that cap).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lanes.errors import (
    AcquireCancelled,
    AcquireTimeout,
    BackendError,
    CandidatesExhausted,
    CapacityWaitTimeout,
    LaneSignal,
    LeaseLost,
)
from lanes.priority import Priority
from lanes.routing.observers import Attempt, notify_attempt
from lanes.routing.request import RouteRequest
from lanes.routing.trace import Trace

if TYPE_CHECKING:
    from lanes.routing.runtime import Runtime


class RequeueRequested(LaneSignal):
    """A background wait reached the cap below the visibility timeout: requeue the task."""


SKIP = object()  # a candidate passed over or given up on: try the next one

# How a trace ends when the walk ends in an exception.
OUTCOMES = {
    CapacityWaitTimeout: "capacity_timeout",
    RequeueRequested: "requeued",
    AcquireCancelled: "cancelled",
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


class Walker:
    def __init__(self, runtime: "Runtime") -> None:
        self.rt = runtime
        self.trace: Trace | None = None  # the last walk's, kept for failures too

    def walk(
        self,
        request: RouteRequest,
        *,
        attempt: int = 0,
        cancel: threading.Event | None = None,
        trace: Trace | None = None,
    ) -> RouteResult:
        route = self.rt.workflow(request.workflow)
        started = self.rt.clock.now().timestamp()
        trace = self.trace = trace or Trace(
            task_id=request.task_id,
            workflow=route.name,
            priority=request.priority.label,
            attempt=attempt,
            deadline=request.deadline,
            started_at=started,
            queued_seconds=max(0.0, started - request.submitted_at),
        )
        admission_deadline = request.deadline
        if admission_deadline is None and request.priority is not Priority.BACKGROUND:
            admission_deadline = started + self.rt.settings.admission_cap_seconds

        last_index = len(route.candidates) - 1
        for index, model in enumerate(route.candidates):
            try:
                outcome = self._try(route, model, request, index == last_index, admission_deadline, cancel, trace)
            except BaseException as exc:
                trace.outcome = OUTCOMES.get(type(exc), "failed")
                raise
            if outcome is not None:
                trace.outcome = "served"
                trace.served_by = model.name
                return RouteResult(outcome, trace)
        trace.outcome = "exhausted"
        raise CandidatesExhausted(
            f"every candidate of workflow {route.name!r} failed or was passed over: "
            + "; ".join(f"{s['model']}: {s['action']}" + (f" ({s['reason']})" if s.get("reason") else "") for s in trace.steps)
        )

    def _try(self, route, model, request, last, admission_deadline, cancel, trace) -> dict | None:
        """Serve the request on ``model``, or return None to move on to the next candidate."""
        if self.rt.breakers.state(model.name) == "open" and not last:
            self._bypass(trace, route, model, request, "breaker_open")
            return None
        admitted = self._admit(route, model, request, last, admission_deadline, cancel, trace)
        if admitted is SKIP:
            return None
        return self._call(model, request, admitted, trace)

    def _admit(self, route, model, request, last, admission_deadline, cancel, trace):
        """A permit on the model's lane, None for a model without a pool, or SKIP."""
        rt = self.rt
        pool = model.pool
        if pool is None:
            return None
        lane = rt.lane(pool)
        budget = None
        if admission_deadline is not None:
            reserve = 0.0 if last else route.reserve_seconds
            budget = admission_deadline - rt.clock.now().timestamp() - reserve
            if not last:
                if budget <= 0:
                    self._bypass(trace, route, model, request, "budget_spent", budget_ms=_ms(budget))
                    return SKIP
                forecast = lane.forecast(request.priority)
                if forecast is not None and forecast > budget:
                    self._bypass(trace, route, model, request, "forecast",
                                 forecast_ms=_ms(forecast), budget_ms=_ms(budget))
                    return SKIP
        # No wait may outlive Celery's visibility timeout, or the task would be
        # delivered twice while it still waits: past the cap it is requeued.
        cap = rt.settings.background_wait_cap
        wait_limit = cap if budget is None else min(max(0.0, budget), cap)
        started = time.monotonic()
        try:
            permit = lane.acquire(request.priority, timeout=wait_limit, cancel=cancel)
        except AcquireTimeout:
            waited = time.monotonic() - started
            trace.step(model.name, pool.name, "wait_timeout", wait_ms=_ms(waited))
            if budget is None or budget > cap:
                raise RequeueRequested(f"lane wait on {pool.name} reached {wait_limit:.0f}s; requeued") from None
            if last:
                raise CapacityWaitTimeout(
                    f"capacity_wait_timeout: no slot on {pool.name} for workflow {route.name!r} "
                    f"within {waited:.1f}s; retry later"
                ) from None
            return SKIP
        rt.events.record(
            "lane_wait", pool=pool.name, workflow=route.name,
            priority=request.priority.label, wait_ms=_ms(permit.waited_seconds),
        )
        return permit

    def _call(self, model, request, permit, trace) -> dict | None:
        """Call the backend holding ``permit``; always release it, then tell the observers."""
        rt = self.rt
        pool_name = model.pool.name if model.pool else None
        admitted_at = rt.clock.now().timestamp()
        waited = {"wait_ms": _ms(permit.waited_seconds)} if permit is not None else {}
        timeout = model.timeout_seconds
        if request.deadline is not None:
            timeout = min(timeout, request.deadline - admitted_at)
        started = time.monotonic()
        ended = {"outcome": "failed", "status": None, "ttft_seconds": None}
        generation = None
        try:
            if permit is not None:
                generation = rt.control_generation(model.pool)
            answer = rt.backend.call(model, request.payload, timeout=timeout,
                                     abort=permit.lost if permit is not None else None)
            ended.update(outcome="served", ttft_seconds=answer.ttft_seconds)
        except LeaseLost as exc:
            ended["outcome"] = "lease_lost"
            trace.step(model.name, pool_name, "lease_lost", reason=str(exc), **waited)
            return None
        except BackendError as exc:
            ended.update(outcome="rejected" if exc.request_rejected else "failed", status=exc.status)
            if not exc.request_rejected:
                rt.breakers.record(model.name, ok=False)
            trace.step(model.name, pool_name, "failed", reason=str(exc), status=exc.status,
                       call_ms=_ms(time.monotonic() - started), **waited)
            if exc.request_rejected:
                raise
            return None
        finally:
            if permit is not None:
                permit.release()
            notify_attempt(rt.observers, Attempt(
                workflow=request.workflow, model=model.name, pool=pool_name,
                pool_id=model.pool.id if model.pool else None, priority=request.priority,
                call_seconds=time.monotonic() - started, generation=generation, task_id=request.task_id,
                wait_seconds=permit.waited_seconds if permit is not None else None, **ended,
            ))
        rt.breakers.record(model.name, ok=True)
        trace.step(
            model.name, pool_name, "served", admitted_at=admitted_at, call_ms=_ms(answer.seconds),
            ttft_ms=_ms(answer.ttft_seconds) if answer.ttft_seconds is not None else None, **waited,
        )
        return answer.body

    def _bypass(self, trace, route, model, request, reason: str, **detail) -> None:
        pool_name = model.pool.name if model.pool else None
        trace.step(model.name, pool_name, "bypass", reason=reason, **detail)
        self.rt.events.record(
            "lane_bypass", pool=pool_name, workflow=route.name, model=model.name,
            priority=request.priority.label, reason=reason, **detail,
        )


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)

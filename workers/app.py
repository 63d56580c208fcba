"""The Celery worker app: the routed-request task and the worker's own state.

Build it with :func:`create_app`; nothing is read or connected at import.
``celery -A workers.app ...`` works too (Flower, inspect), but run workers
with ``lanes worker --fleet NAME``, which sizes and supervises them.
"""

from __future__ import annotations

import logging
import threading
import time

from celery import Celery, bootsteps, signals, states
from celery.exceptions import Ignore, Reject

from lanes.celery_client import ROUTE_TASK, make_celery
from lanes.errors import (
    AcquireCancelled,
    CandidatesExhausted,
    CapacityWaitTimeout,
    DeadlineExpired,
    RedisUnavailable,
)
from lanes.redis_conn import resolve_redis_url
from lanes.routing.request import RouteRequest
from lanes.routing.runtime import Runtime
from lanes.routing.walker import RequeueRequested, Walker
from lanes.settings import Settings, load_settings
from workers.background import BackgroundConsumer, BackgroundQueue
from workers.cancel import CancelRegistry
from workers.handback import StopTaking, hand_back_at_front
from workers.memgate import MemoryGate, MemoryGateWatcher
from workers.outcome import RESULT_STORE_RETRY, patient_backend_url, publish_retry
from workers.prefetch import ForegroundPrefetch
from workers.presence import PresenceHeartbeat
from workers.runs import RunLeases

log = logging.getLogger("lanes.worker")

RETRY_BACKOFF_CAP = 30.0
RETRIES_WITHOUT_DEADLINE = 5
# A second delivery of a task another delivery is running looks again after this.
DUPLICATE_RECHECK_SECONDS = 5.0


class WorkerContext:
    """Per-process state shared by the worker's threads."""

    def __init__(self, settings: Settings, redis_url: str) -> None:
        self.settings = settings
        self.redis_url = redis_url
        self.cancels = CancelRegistry()
        # The memory gate: with it, controllers may raise widths (fleets are sized from the ceiling).
        self.memory = None
        if settings.memory_gate_high is not None:
            gate = MemoryGate(settings.memory_gate_high, settings.memory_gate_low)
            if gate.enabled:
                self.memory = MemoryGateWatcher(gate, [], in_flight=lambda: len(self.cancels)).start()
        self._runtime: Runtime | None = None
        self._runs: RunLeases | None = None
        self._lock = threading.Lock()

    def runtime(self) -> Runtime:
        with self._lock:
            if self._runtime is None:
                self._runtime = Runtime(self.settings, redis_url=self.redis_url)
                self._runtime.start_steward()
            return self._runtime

    def runs(self) -> RunLeases:
        runtime = self.runtime()
        with self._lock:
            if self._runs is None:
                self._runs = RunLeases(runtime.client, prefix=self.settings.key_prefix,
                                       ttl_seconds=self.settings.background_wait_cap)
            return self._runs

    def close(self) -> None:
        with self._lock:
            if self._runtime is not None:
                self._runtime.close()
                self._runtime = None


class MemoryGateHandle(bootsteps.StartStopStep):
    """Hands the worker's consumers (Celery's and the background one) to the memory gate."""

    requires = {BackgroundConsumer}

    def start(self, c) -> None:
        memory = c.app.lanes_context.memory
        if memory is not None:
            memory.attach(c, background=c.blueprint.steps.get(BackgroundConsumer.name))


def create_app(
    settings: Settings | None = None,
    *,
    background: BackgroundQueue | None = None,
    foreground_threads: int | None = None,
) -> Celery:
    """The worker app; with ``background``, its worker also consumes that
    queue on a channel of its own (workers/background.py); with
    ``foreground_threads``, Celery's own consumer holds at most that many
    foreground messages (workers/prefetch.py)."""
    settings = settings or load_settings()
    # The recorded address, never a newly started embedded server: a worker
    # that lost its Redis reconnects to the same address when it comes back.
    redis_url = resolve_redis_url(settings, start_embedded=False)
    app = make_celery(settings, redis_url, main="lanes-worker")
    context = WorkerContext(settings, redis_url)
    app.lanes_context = context
    app.lanes_background = background
    app.lanes_foreground_threads = foreground_threads
    # A task's end is recorded before its message is acknowledged, also
    # through seconds of refused writes (workers/outcome.py).
    app.conf.update(result_backend=patient_backend_url(redis_url), **RESULT_STORE_RETRY)
    # After a reconnect Celery would reset the prefetch to the whole pool
    # (foreground and background threads); ForegroundPrefetch's limit holds.
    app.conf.worker_enable_prefetch_count_reduction = False
    app.steps["consumer"].add(ForegroundPrefetch)
    app.steps["consumer"].add(BackgroundConsumer)
    app.lanes_not_taking = threading.Event()  # set once the worker stops taking work (workers/handback.py)
    app.steps["consumer"].add(StopTaking)
    app.steps["consumer"].add(MemoryGateHandle)
    app.steps["worker"].add(PresenceHeartbeat)

    # The width follower and control loop start with the worker, not with its
    # first task: a freshly (re)started worker must bring lanes to the width
    # authority's width even while no work arrives.
    @signals.worker_ready.connect(weak=False)
    def _start_steward(**_) -> None:
        # On a thread of its own: building the runtime reads the catalog, and
        # the worker must not wait for that before it answers.
        threading.Thread(target=_build_runtime, name="lanes-runtime-start", daemon=True).start()

    def _build_runtime() -> None:
        try:
            context.runtime()
        except Exception:  # Redis or the catalog away: the first task retries the runtime
            log.warning("could not start the width follower", exc_info=True)

    @signals.worker_shutting_down.connect(weak=False)
    def _cancel_waits(**_) -> None:
        context.cancels.cancel_all("shutdown")

    # worker_shutdown, not worker_process_shutdown: the threads pool has no
    # child processes, and the event buffer must be flushed on the way out.
    @signals.worker_shutdown.connect(weak=False)
    def _close(**_) -> None:
        context.close()

    # ``throws``: outcomes a routed task ends with by design, logged in one
    # line instead of as an unexpected error with a traceback.
    @app.task(name=ROUTE_TASK, bind=True, acks_late=True, max_retries=None, reject_on_worker_lost=True,
              throws=(DeadlineExpired, CandidatesExhausted, CapacityWaitTimeout))
    def route(self, message: dict) -> dict:
        return run_routed(self, context, RouteRequest.from_message(message))

    return app


def run_routed(task, context: WorkerContext, request: RouteRequest) -> dict:
    """Walk the request; hand it back, retry it or fail it with a clear outcome.

    Every way back to the queue (a requeue, a retry) carries the candidates
    already called, so a task calls each backend at most once unless its
    worker dies mid-call. A task past its deadline fails with
    DeadlineExpired, never retried (a retry could only be later).
    """
    delivered_at = time.time()
    task_id = task.request.id
    cancellation = context.cancels.register(task_id)
    walker = None
    lease = None
    try:
        runtime = context.runtime()
        walker = Walker(runtime)
        try:
            lease = context.runs().claim(task_id)
            if _finished(task, task_id):
                raise Ignore()  # a late copy of a task that already ended
            if lease is None:
                # Another delivery runs this task now (the broker handed it out
                # again): look again later, in case that one dies.
                raise publish_retry(task, countdown=DUPLICATE_RECHECK_SECONDS, max_retries=None)
            result = walker.walk(request, attempt=task.request.retries, cancel=cancellation.event,
                                 delivered_at=delivered_at)
            return result.as_dict()
        except AcquireCancelled:
            if cancellation.reason == "revoked":
                task.backend.mark_as_revoked(task_id, "revoked while waiting in a lane", request=task.request)
                raise Ignore() from None
            if hand_back_at_front(task_id, task.app.lanes_not_taking):
                raise Ignore() from None
            raise Reject("worker shutting down during a lane wait", requeue=True) from None
        except RequeueRequested as exc:
            if not walker.called:
                raise Reject(str(exc), requeue=True) from None
            raise publish_retry(task, args=[_carrying(request, walker.called)], countdown=0, max_retries=None) from None
        except (CandidatesExhausted, RedisUnavailable) as exc:
            untried = [m.name for m in runtime.workflow(request.workflow).candidates if m.name not in walker.called]
            countdown = min(RETRY_BACKOFF_CAP, 2.0 ** task.request.retries)
            if untried and _may_retry(request, task.request.retries, countdown):
                raise publish_retry(task, args=[_carrying(request, walker.called)], exc=exc, countdown=countdown)
            raise
    finally:
        if lease is not None:
            context.runs().release(task_id, lease)
        context.cancels.unregister(task_id)
        if walker is not None and walker.trace is not None:
            try:
                runtime.traces.save(walker.trace)
            except Exception:  # the trace is a report; losing it must not lose the task
                log.warning("could not save the routing trace of %s", task_id, exc_info=True)


def _finished(task, task_id: str) -> bool:
    """Whether the task already ended (a copy delivered after its end must not run)."""
    try:
        return task.backend.get_state(task_id) in states.READY_STATES
    except Exception:  # unknown: the run lease still keeps two deliveries apart
        log.warning("could not read the state of %s", task_id, exc_info=True)
        return False


def _carrying(request: RouteRequest, called: list[str]) -> dict:
    """The task's message for its next delivery, naming the candidates already called."""
    return {**request.to_message(), "called": list(dict.fromkeys([*request.called, *called]))}


def _may_retry(request: RouteRequest, retries: int, countdown: float) -> bool:
    if request.deadline is None:
        return retries < RETRIES_WITHOUT_DEADLINE
    return request.deadline - time.time() > countdown + 1.0


_cli_app: Celery | None = None


def __getattr__(name: str):
    """``celery -A workers.app ...`` (Flower, inspect, purge) finds ``app`` here.

    Built on first access, from the environment, so importing this module
    still reads nothing and connects nowhere.
    """
    global _cli_app
    if name in ("app", "celery"):
        if _cli_app is None:
            _cli_app = create_app()
        return _cli_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

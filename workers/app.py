"""The Celery worker app: the routed-request task and the worker's own state.

Build it with :func:`create_app`; nothing is read or connected at import.
``celery -A workers.app ...`` works too (Flower, inspect), but run workers
with ``lanes worker --fleet NAME``, which sizes and supervises them.
"""

from __future__ import annotations

import gc
import logging
import os
import threading
import time

from celery import Celery, bootsteps, signals, states
from celery.exceptions import Ignore, Reject, Retry

from lanes import metrics
from lanes.celery_client import HOSTED_FLEET, ROUTE_TASK, make_celery, shown_arguments
from lanes.errors import (
    AcquireCancelled,
    CandidatesExhausted,
    CapacityWaitTimeout,
    DeadlineExpired,
    RedisUnavailable,
)
from lanes.namespace import Namespace
from lanes.redis_conn import resolve_redis_url, shared_pool_size
from lanes.routing.request import RouteRequest
from lanes.routing.runtime import Runtime
from lanes.routing.walker import RequeueRequested, Walker
from lanes.settings import Settings, load_settings, result_url_of
from workers.background import BackgroundConsumer, BackgroundQueue
from workers.cancel import CancelRegistry, RevokeFeed, stop_with_the_worker
from workers.green_events import GreenEventBatches
from workers.handback import StopTaking, hand_back_at_front
from workers.in_flower import LaneEventSender, LanesInfo
from workers.memgate import CGROUP, MemoryGate, MemoryGateWatcher, cgroup_memory
from workers.metrics import MetricsEndpoint
from workers.outage import background_retry_countdown, redis_patience, wait_for_redis
from workers.outcome import RESULT_STORE_RETRY, patient_backend_url, publish_retry
from workers.prefetch import ConsumerPrefetch
from workers.presence import PresenceHeartbeat
from workers.runs import RunLeases, Started

log = logging.getLogger("lanes.worker")

RETRY_BACKOFF_CAP = 30.0
CAPACITY_BACKOFF_CAP = 120.0  # the longest wait before a capacity requeue runs again
RETRIES_WITHOUT_DEADLINE = 5
# A second delivery of a task another delivery is running looks again after this.
DUPLICATE_RECHECK_SECONDS = 5.0


class WorkerContext:
    """Per-process state shared by the worker's threads."""

    def __init__(self, settings: Settings, redis_url: str, *, calls_at_once: int | None = None) -> None:
        self.settings = settings
        self.redis_url = redis_url
        # The most tasks this process runs at once (its held messages), to size its connection pools.
        self.calls_at_once = calls_at_once
        self.cancels = CancelRegistry()
        # The memory gate: with it, controllers may raise widths (fleets are sized from the ceiling).
        self.memory = None
        if settings.memory_gate_high is not None:
            root = settings.memory_gate_cgroup or CGROUP
            gate = MemoryGate(settings.memory_gate_high, settings.memory_gate_low, read=lambda: cgroup_memory(root))
            if gate.enabled:
                self.memory = MemoryGateWatcher(gate, [], in_flight=lambda: len(self.cancels)).start()
        # More listeners of the walker for this worker (Flower's lane events).
        self.observers: list = []
        self._runtime: Runtime | None = None
        self._runs: RunLeases | None = None
        self._runs_renewing: threading.Event | None = None
        self._lock = threading.Lock()

    def runtime(self) -> Runtime:
        with self._lock:
            if self._runtime is None:
                self._runtime = Runtime(self.settings, redis_url=self.redis_url, calls_at_once=self.calls_at_once)
                self._runtime.observers.extend(self.observers)
                self._runtime.start_steward()
            return self._runtime

    def runs(self) -> RunLeases:
        runtime = self.runtime()
        with self._lock:
            if self._runs is None:
                self._runs = RunLeases(runtime.client, prefix=self.settings.key_prefix,
                                       ttl_seconds=self.settings.message_lease_seconds)
                # Before the first claim: a revoke after any claim is in the feed.
                self.cancels.follow(RevokeFeed(runtime.client, Namespace(self.settings.key_prefix).revokes))
                self._runs_renewing = self._runs.start_renewing(self.settings.message_lease_seconds / 3)
            return self._runs

    def close(self) -> None:
        with self._lock:
            if self._runs_renewing is not None:
                self._runs_renewing.set()
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

    def info(self, c) -> dict:
        # Shown by `celery inspect stats` and on Flower's worker page.
        memory = c.app.lanes_context.memory
        heap = {"frozen_objects": gc.get_freeze_count(),
                "collections_by_generation": [gen["collections"] for gen in gc.get_stats()]}
        return {"heap": heap} if memory is None else {"heap": heap, "memory_gate": memory.info()}


def freeze_start_up_heap() -> None:
    """Take what the worker's start-up left alive out of the collector's sight.

    Celery, kombu, httpx, SQLAlchemy and the catalog leave a large heap that
    lives as long as the worker, and every full collection walked all of it
    with every thread of the worker stopped: 92-95 ms each, about one every
    four minutes under the priority benchmark's load (docs/BENCHMARKS_JOURNAL.md), so
    an urgent request arriving then waited that long to start. Frozen, it is
    never scanned again (nor freed, which it never would be anyway); the
    collector still sees everything made afterwards. ``gc.collect`` first, so
    no garbage is frozen with it."""
    gc.collect()
    gc.freeze()


def create_app(
    settings: Settings | None = None,
    *,
    background: BackgroundQueue | None = None,
    consumer_threads: int | None = None,
) -> Celery:
    """The worker app; with ``background``, its worker also consumes that
    queue on a channel of its own (workers/background.py); with
    ``consumer_threads``, Celery's own consumer holds at most that many
    messages of its queue (workers/prefetch.py)."""
    settings = settings or load_settings()
    # The recorded address, never a newly started embedded server: a worker
    # that lost its Redis reconnects to the same address when it comes back.
    redis_url = resolve_redis_url(settings, start_embedded=False)
    app = make_celery(settings, redis_url, main="lanes-worker")
    held = (consumer_threads or 0) + (background.threads if background is not None else 0)
    context = WorkerContext(settings, redis_url, calls_at_once=held or None)
    app.lanes_context = context
    app.lanes_background = background
    app.lanes_consumer_threads = consumer_threads
    # A task's end is recorded before its message is acknowledged, also
    # through seconds of refused writes (workers/outcome.py).
    app.conf.update(result_backend=patient_backend_url(result_url_of(settings, redis_url)), **RESULT_STORE_RETRY)
    # One result backend (and its Redis connection pool) for the whole
    # process. Celery's default keeps one per thread, and under gevent's
    # patching a thread-local is a green thread's own: every task built a
    # backend and opened a Redis connection for its STARTED claim and its
    # result, about a fifth of the fleet worker's CPU per request
    # (docs/BENCHMARKS_JOURNAL.md, "where a request's CPU goes"). redis-py's
    # pool is safe to share between threads.
    app.conf.result_backend_thread_safe = True
    if held:
        # Shared by every task storing its state at once: redis-py's default
        # pool of 100 refused the rest, which Celery took for a lost
        # connection and retried a second later. Bounded, a store past the
        # bound waits for a connection (PatientRedisBackend).
        app.conf.redis_max_connections = shared_pool_size(held)
    # After a reconnect Celery would reset the prefetch to the whole pool
    # (foreground and background threads); ConsumerPrefetch's limit holds.
    app.conf.worker_enable_prefetch_count_reduction = False
    app.steps["consumer"].add(ConsumerPrefetch)
    app.steps["consumer"].add(BackgroundConsumer)
    app.lanes_not_taking = threading.Event()  # set once the worker stops taking work (workers/handback.py)
    app.steps["consumer"].add(StopTaking)
    app.steps["consumer"].add(MemoryGateHandle)
    app.steps["consumer"].add(GreenEventBatches)
    app.steps["worker"].add(PresenceHeartbeat)
    app.steps["worker"].add(MetricsEndpoint)
    # Lanes in Flower: each task's lane events, each worker's lanes in its stats.
    context.observers.append(LaneEventSender(app))
    app.steps["worker"].add(LanesInfo)

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
        freeze_start_up_heap()

    stop_with_the_worker(context)

    # ``throws``: outcomes a routed task ends with by design, logged in one
    # line instead of as an unexpected error with a traceback.
    # ``track_started=False``: the run claim stores STARTED (workers/runs.py).
    @app.task(name=ROUTE_TASK, bind=True, acks_late=True, max_retries=None, reject_on_worker_lost=True,
              track_started=False, throws=(DeadlineExpired, CandidatesExhausted, CapacityWaitTimeout))
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
    runtime = walker = None
    lease = None
    going_back = False
    try:
        runtime = context.runtime()
        walker = Walker(runtime)
        try:
            claim = context.runs().claim(task_id, _started(task))
            if claim.finished is not None:
                raise Ignore()  # a late copy of a task that already ended
            if claim.revoked:
                # Revoked before this delivery, perhaps while no running worker
                # held it (a worker started after the revoke never heard it).
                task.backend.mark_as_revoked(task_id, "revoked before it ran", request=task.request)
                raise Ignore()
            lease = claim.token
            if lease is None:
                # Another delivery runs this task now (the broker handed it out
                # again): look again later, in case that one dies.
                count_retry(walker, request, "duplicate_delivery")
                raise publish_retry(task, countdown=DUPLICATE_RECHECK_SECONDS, max_retries=None)
            try:
                result = walker.walk(request, attempt=task.request.retries, cancel=cancellation.event,
                                     delivered_at=delivered_at)
            except RedisUnavailable:
                # Redis went away mid-walk: wait for it here (handing the task back needs
                # that same Redis), then walk once more in this delivery (workers/outage.py).
                patience = redis_patience(context.settings, request, time.time())
                if not wait_for_redis(runtime.client.ping, patience, cancellation.event):
                    raise
                log.info("task %s: Redis answers again; walking once more", task_id)
                _save_trace(runtime, walker, task_id)
                walker = Walker(runtime)
                result = walker.walk(request, attempt=task.request.retries, cancel=cancellation.event,
                                     delivered_at=delivered_at)
            return result.as_dict()
        except AcquireCancelled:
            if cancellation.reason == "revoked":
                task.backend.mark_as_revoked(task_id, "revoked while waiting in a lane", request=task.request)
                raise Ignore() from None
            count_retry(walker, request, "shutdown")
            if hand_back_at_front(task_id, task.app.lanes_not_taking):
                raise Ignore() from None
            raise Reject("worker shutting down during a lane wait", requeue=True) from None
        except RequeueRequested as exc:
            count_retry(walker, request, "requeued")
            if not walker.called:
                raise Reject(str(exc), requeue=True) from None
            raise publish_retry(task, args=[_carrying(request, walker.called)], countdown=0, max_retries=None,
                                **_shown(runtime, request)) from None
        except CapacityWaitTimeout as exc:
            raise _requeue_after_capacity_timeout(task, context.settings, runtime, request, walker, exc) from None
        except (CandidatesExhausted, RedisUnavailable) as exc:
            untried = [m.name for m in runtime.workflow(request.workflow).candidates if m.name not in walker.called]
            countdown = min(RETRY_BACKOFF_CAP, 2.0 ** task.request.retries)
            if untried and _may_retry(request, task.request.retries, countdown):
                count_retry(walker, request, "redis_unavailable" if isinstance(exc, RedisUnavailable)
                            else "candidates_exhausted")
                raise publish_retry(task, args=[_carrying(request, walker.called)], exc=exc, countdown=countdown,
                                    **_shown(runtime, request))
            steps = walker.trace.steps if walker.trace is not None else []
            backoff = background_retry_countdown(context.settings, request, steps,
                                                 isinstance(exc, RedisUnavailable), time.time())
            if backoff is not None:
                # Background work outlasts an outage: every candidate again, after a backoff.
                log.info("task %s: %s; retried in %.1fs (outage retry %d)", task_id, exc, backoff,
                         request.outage_retries + 1)
                count_retry(walker, request, "outage")
                runtime.events.record("outage_retry", workflow=request.workflow, task_id=task_id,
                                      retry=request.outage_retries + 1, countdown=round(backoff, 3),
                                      error=str(exc)[:300])
                message = {**_carrying(request, []), "called": [], "outage_retries": request.outage_retries + 1}
                raise publish_retry(task, args=[message], exc=exc, countdown=backoff, max_retries=None,
                                    **_shown(runtime, request))
            raise
    except (Retry, Reject, Ignore):
        going_back = True
        raise
    finally:
        if lease is not None:
            # A task going back to its queue frees its lease for the next delivery at once.
            context.runs().release(task_id, lease, ended=not going_back)
        context.cancels.unregister(cancellation)
        _save_trace(runtime, walker, task_id)


def _save_trace(runtime, walker: Walker | None, task_id: str) -> None:
    if walker is not None and walker.trace is not None:
        try:
            runtime.traces.save(walker.trace)
        except Exception:  # the trace is a report; losing it must not lose the task
            log.warning("could not save the routing trace of %s", task_id, exc_info=True)


def count_retry(walker: Walker | None, request: RouteRequest, reason: str) -> None:
    """Seed 000's retry metric: a task going back to its queue, by reason and by
    the last HTTP status its walk got (a 529 from upstream is told from a 429 of
    a quota this way), under the pool of its last candidate (else its primary's)."""
    try:
        steps = walker.trace.steps if walker is not None and walker.trace is not None else []
        primary = walker.rt.workflow(request.workflow).candidates[0].pool if walker is not None else None
        metrics.retried_walk(steps, reason, primary.name if primary is not None else "")
    except Exception:  # a count must never change how the task ends
        log.warning("could not count the retry of %s", request.task_id, exc_info=True)


def _started(task) -> Started:
    """The STARTED result Celery's tracer stores for a task that tracks it
    (``trace.py``: the process id and the worker's name), built and encoded
    by the task's own result backend."""
    backend = task.backend
    request = task.request
    meta = backend._get_result_meta(result={"pid": os.getpid(), "hostname": request.hostname},
                                    state=states.STARTED, traceback=None, request=request)
    meta["task_id"] = request.id
    return Started(key=backend.get_key_for_task(request.id), value=backend.encode(meta),
                   ttl_seconds=int(backend.expires or 0))


def _carrying(request: RouteRequest, called: list[str], **changes) -> dict:
    """The task's message for its next delivery, naming the candidates already called."""
    return {**request.to_message(), "called": list(dict.fromkeys([*request.called, *called])), **changes}


def _requeue_after_capacity_timeout(task, settings: Settings, runtime: Runtime, request: RouteRequest,
                                    walker: Walker, exc: CapacityWaitTimeout) -> BaseException:
    """What to raise when the last candidate's wait timed out: a requeue with backoff, or the failure.

    The wait timed out at the admission cap (no deadline) or at the deadline:
    the backends were busy, not broken. Up to ``capacity_requeues`` times the
    task goes back to its queue, ``capacity_requeue_seconds`` doubling each
    time, and starts a fresh admission cap when it runs again. A deadline that
    leaves no room for the backoff ends it now.
    """
    done = request.capacity_requeues
    countdown = min(CAPACITY_BACKOFF_CAP, settings.capacity_requeue_seconds * 2.0 ** done)
    room = request.deadline is None or request.deadline - time.time() > countdown + 1.0
    if done < settings.capacity_requeues and room:
        log.info("task %s: %s; requeued in %.1fs (%d of %d)", task.request.id, exc, countdown, done + 1,
                 settings.capacity_requeues)
        count_retry(walker, request, "capacity_timeout")
        return publish_retry(task, args=[_carrying(request, walker.called, capacity_requeues=done + 1)],
                             countdown=countdown, max_retries=None, throw=False, **_shown(runtime, request))
    if done >= settings.capacity_requeues:
        reason = (f"gave up after {done} capacity requeue{'s' if done != 1 else ''} "
                  f"(LANES_CAPACITY_REQUEUES={settings.capacity_requeues}; raise it, or widen the lanes)")
    else:
        reason = "its deadline leaves no time to requeue it"
    return CapacityWaitTimeout(f"{exc}; {reason}")


def _shown(runtime: Runtime, request: RouteRequest) -> dict:
    """The retried message shows Flower the routing, never the request (as submit does)."""
    return shown_arguments(workflow=request.workflow, priority=request.priority,
                           fleet=runtime.workflow(request.workflow).fleet or HOSTED_FLEET, deadline=request.deadline)


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

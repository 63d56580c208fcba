"""The memory worker: runs one chat hour's memory extraction through the lanes.

A memory run is routed like any other work of the ``memory_extraction``
workflow (the walker, the workflow's candidates, breakers, events, traces)
at background priority, so in its lane it waits behind interactive and
user-tool requests. The answer is parsed into notes and stored in place of
any earlier notes of that chat hour.

A delivery first claims the run (:func:`lanes.memory.lifecycle.claim_run`):
a run already running under a live claim is left alone, so a duplicate
message never calls the backend twice. The claim's lease is renewed in the
background while the attempt runs (lane waits at background priority can be
long); an attempt whose claim was taken from it stores nothing.

A failed attempt is retried with exponential backoff
(``memory_retry_seconds`` x 2^(attempt-1)) up to ``memory_max_attempts``,
then the run is marked failed with its error (``lanes memory retry`` queues
it again). A lane wait given up at shutdown or at the visibility cap hands
the message back without counting an attempt.

Its size is planned and kept by :mod:`workers.memory.fleet`.

    python -m workers.memory.worker --concurrency N
"""

from __future__ import annotations

import argparse
import logging
import socket
import threading
import time
import uuid

from celery import Celery
from celery.exceptions import Reject, Retry

from lanes.celery_client import make_celery
from lanes.instruments import retried_walk
from lanes.errors import AcquireCancelled, InvalidInput, LanesError, RedisUnavailable, RoutingError
from lanes.memory import MEMORY_WORKFLOW, hour_messages, open_memory
from lanes.memory.dispatch import MEMORY_QUEUE, MEMORY_TASK
from lanes.memory.extraction import NotesUnreadable, answer_text, extraction_payload, parse_notes
from lanes.memory.lifecycle import (
    claim_run,
    complete_run,
    fail_run,
    mark_unsent,
    renew_lease,
    requeue_unstarted,
    retry_run,
)
from lanes.priority import Priority
from lanes.redis_conn import resolve_redis_url
from lanes.routing.request import RouteRequest
from lanes.routing.runtime import Runtime
from lanes.routing.walker import RequeueRequested, Walker
from lanes.settings import Settings, load_settings
from workers.cancel import CancelRegistry, stop_with_the_worker

log = logging.getLogger("lanes.memory")

RETRY_DELAY_CAP_SECONDS = 900.0


def retry_delay(settings: Settings, attempts: int) -> float:
    return min(RETRY_DELAY_CAP_SECONDS, settings.memory_retry_seconds * 2 ** max(0, attempts - 1))


class MemoryContext:
    """Per-process state shared by the memory worker's threads."""

    def __init__(self, settings: Settings, redis_url: str) -> None:
        self.settings = settings
        self.redis_url = redis_url
        self.cancels = CancelRegistry()
        self._runtime: Runtime | None = None
        self._lock = threading.Lock()

    def runtime(self) -> Runtime:
        with self._lock:
            if self._runtime is None:
                runtime = Runtime(self.settings, redis_url=self.redis_url, engine=open_memory(self.settings))
                self._runtime = runtime
            return self._runtime

    def close(self) -> None:
        with self._lock:
            if self._runtime is not None:
                self._runtime.close()
                self._runtime = None


def register_memory_task(app: Celery, context: MemoryContext) -> None:
    @app.task(name=MEMORY_TASK, bind=True, acks_late=True, max_retries=None, reject_on_worker_lost=True)
    def memory_run(self, run_id: int) -> dict:
        return run_memory(self, context, int(run_id))


class LeaseKeeper:
    """Renews a run's claim every third of its lease until stopped; notes when the claim was lost."""

    def __init__(self, engine, clock, run_id: int, claim: str, lease_seconds: float) -> None:
        self.engine, self.clock, self.run_id, self.claim = engine, clock, run_id, claim
        self.lease_seconds = lease_seconds
        self.lost = threading.Event()
        self.cancellation = None  # the attempt's lane wait, given up when the claim is lost
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"memory-lease-{run_id}", daemon=True)

    def __enter__(self) -> "LeaseKeeper":
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.wait(self.lease_seconds / 3):
            try:
                held = renew_lease(self.engine, self.run_id, self.claim, now=self.clock.now(),
                                   lease_seconds=self.lease_seconds)
            except LanesError as exc:  # the database blinked: try again at the next beat of the loop
                log.warning("memory run %s: could not renew its lease: %s", self.run_id, exc)
                continue
            if not held:
                log.warning("memory run %s: its claim was reclaimed; this attempt stores nothing", self.run_id)
                self.lost.set()
                if self.cancellation is not None:
                    self.cancellation.cancel("its claim was reclaimed")
                return


def run_memory(task, context: MemoryContext, run_id: int) -> dict:
    runtime = context.runtime()
    engine, clock, settings = runtime.engine, runtime.clock, context.settings
    lease = settings.memory_lease_seconds
    run = claim_run(engine, run_id, now=clock.now(), lease_seconds=lease)
    if run is None:
        return {"run": run_id, "status": "skipped", "reason": "finished, unknown, or running elsewhere"}
    with LeaseKeeper(engine, clock, run_id, run.claim, lease) as keeper:
        return _attempt(task, context, runtime, run, keeper)


def _attempt(task, context: MemoryContext, runtime: Runtime, run, keeper: LeaseKeeper) -> dict:
    engine, clock, settings, run_id, claim = runtime.engine, runtime.clock, context.settings, run.id, run.claim
    messages = hour_messages(engine, run.chat_id, run.hour)
    if not messages:
        complete_run(engine, run_id, [], claim=claim, now=clock.now())
        return {"run": run_id, "status": "done", "notes": 0}
    request = RouteRequest(
        task_id=f"{task.request.id or uuid.uuid4()}",
        workflow=MEMORY_WORKFLOW,
        payload=extraction_payload(run.chat_id, run.hour, messages),
        priority=Priority.BACKGROUND,
        deadline=None,
        submitted_at=time.time(),
    )
    cancellation = context.cancels.register(request.task_id)
    keeper.cancellation = cancellation
    walker = Walker(runtime)
    try:
        result = walker.walk(request, attempt=run.attempts - 1, cancel=cancellation.event)
        notes = parse_notes(answer_text(result.body))
    except (AcquireCancelled, RequeueRequested) as exc:
        if not requeue_unstarted(engine, run_id, claim=claim, now=clock.now()):
            return {"run": run_id, "status": "lost", "reason": "its claim was reclaimed"}
        raise Reject(f"memory run {run_id}: {exc}", requeue=True) from None
    except (RoutingError, NotesUnreadable, RedisUnavailable, InvalidInput) as exc:
        error = f"{type(exc).__name__}: {exc}"
        if run.attempts < settings.memory_max_attempts:
            delay = retry_delay(settings, run.attempts)
            if not retry_run(engine, run_id, error, claim=claim, now=clock.now()):
                return {"run": run_id, "status": "lost", "reason": "its claim was reclaimed"}
            retried_walk(walker.trace.steps if walker.trace is not None else [], "memory_attempt_failed")
            log.info("memory run %s attempt %s failed (%s); retry in %.1fs", run_id, run.attempts, error, delay)
            try:
                raise task.retry(countdown=delay, exc=exc)
            except Retry:
                raise
            except Exception:
                # The retry message was not sent: the next tick sends the run.
                mark_unsent(engine, run_id)
                raise
        if not fail_run(engine, run_id, error, claim=claim, now=clock.now()):
            return {"run": run_id, "status": "lost", "reason": "its claim was reclaimed"}
        log.warning("memory run %s failed after %s attempts: %s (lanes memory retry --run %s queues it again)",
                    run_id, run.attempts, error, run_id)
        return {"run": run_id, "status": "failed", "attempts": run.attempts, "error": error}
    finally:
        context.cancels.unregister(cancellation)
        if walker.trace is not None:
            try:
                runtime.traces.save(walker.trace)
            except Exception:  # the trace is a report; losing it must not lose the run
                log.warning("could not save the routing trace of memory run %s", run_id, exc_info=True)
    stored = complete_run(engine, run_id, notes, claim=claim, now=clock.now())
    if stored is None:
        return {"run": run_id, "status": "lost", "reason": "its claim was reclaimed"}
    return {"run": run_id, "status": "done", "notes": stored, "model": result.trace.served_by}


def create_memory_app(settings: Settings | None = None) -> Celery:
    settings = settings or load_settings()
    redis_url = resolve_redis_url(settings)
    app = make_celery(settings, redis_url, main="lanes-memory")
    context = MemoryContext(settings, redis_url)
    app.lanes_context = context
    register_memory_task(app, context)

    stop_with_the_worker(context)

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workers.memory.worker")
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--loglevel", default="WARNING")
    parser.add_argument("--hostname", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if logging.getLevelName(args.loglevel) >= logging.WARNING:
        logging.getLogger("celery.app.trace").setLevel(logging.ERROR)
    settings = load_settings()
    concurrency = args.concurrency
    app = create_memory_app(settings)
    app.worker_main(
        [
            "--quiet", "worker",
            "--pool", "threads",
            "--concurrency", str(concurrency),
            "--queues", MEMORY_QUEUE,
            "--hostname", args.hostname or f"memory@{socket.gethostname()}",
            "--loglevel", args.loglevel,
            "--task-events",
            "--without-gossip",
            "--without-mingle",
        ]
    )


if __name__ == "__main__":
    main()

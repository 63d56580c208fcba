"""What a worker tells Flower about its lanes.

- :class:`LaneEventSender`: an observer of the walker that sends each task's
  call starts, lane admissions and bypasses as custom task events
  (:mod:`lanes.flower.lane_events`), in the same batches as Celery's own
  task events.
- :class:`LanesInfo`: a worker bootstep whose ``info()`` lands in the
  worker's ``stats`` reply, which Flower shows on the worker's page (and in
  ``/api/workers``): width, in flight, queued per priority and controllers
  of every lane this worker's fleet waits in.
"""

from __future__ import annotations

import logging

from celery import bootsteps

from lanes.celery_client import HOSTED_FLEET, fleet_of_queue
from lanes.flower import lane_events
from lanes.routing.observers import Attempt, BaseObserver, Bypass, Calling

log = logging.getLogger("lanes.worker")


class LaneEventSender(BaseObserver):
    """Sends ``task-lane-*`` events through the worker app's event dispatcher."""

    def __init__(self, app) -> None:
        self.app = app
        self.hostname: str | None = None  # set by LanesInfo when the worker starts
        self.worker = None  # likewise: its consumer's dispatcher batches task events

    def on_attempt(self, attempt: Attempt) -> None:
        if attempt.pool is None or attempt.task_id is None:
            return  # a hosted model: no lane to tell about
        self._send(lane_events.ADMITTED, attempt.task_id, pool=attempt.pool, model=attempt.model,
                   priority=attempt.priority.label, outcome=attempt.outcome,
                   wait_ms=None if attempt.wait_seconds is None else round(attempt.wait_seconds * 1000, 1))

    def on_calling(self, calling: Calling) -> None:
        if calling.task_id is None:
            return
        self._send(lane_events.CALLING, calling.task_id, pool=calling.pool, model=calling.model,
                   priority=calling.priority.label, at=calling.at)

    def on_bypass(self, bypass: Bypass) -> None:
        if bypass.task_id is None:
            return
        self._send(lane_events.BYPASS, bypass.task_id, pool=bypass.pool, model=bypass.model,
                   priority=bypass.priority.label, reason=bypass.reason)

    def _send(self, kind: str, task_id: str, **fields) -> None:
        # A running worker's consumer keeps a dispatcher that buffers ``task-*``
        # events and publishes them as one ``task.multi`` message per turn of
        # its event loop (Celery's own task-started and task-succeeded go the
        # same way, from the pool's threads): one more entry in a batch rather
        # than a producer, a dispatcher and a publish of its own per call,
        # which cost the fleet worker about 9 % of its interpreter time in a
        # 50 ms background drain (docs/BENCHMARKS_JOURNAL.md). On the gevent pool
        # (no event loop) workers/green_events.py gives the dispatcher the same
        # batches, flushed a moment after their first event.
        consumer = getattr(self.worker, "consumer", None)
        dispatcher = getattr(consumer, "event_dispatcher", None)
        if dispatcher is not None and dispatcher.enabled:
            dispatcher.send(kind, uuid=task_id, **fields)
            return
        # Between connections (the consumer has no dispatcher), or outside a
        # worker: a dispatcher of its own, with a producer from the app's pool.
        # No retries: an event is a report, the walk goes on.
        with self.app.events.default_dispatcher(hostname=self.hostname) as dispatcher:
            dispatcher.send(kind, uuid=task_id, retry=False, **fields)


class LanesInfo(bootsteps.StartStopStep):
    """``stats()["lanes"]``: the lanes of this worker's fleet, read live from Redis."""

    def start(self, worker) -> None:
        for observer in worker.app.lanes_context.observers:
            if isinstance(observer, LaneEventSender):
                observer.hostname = worker.hostname
                observer.worker = worker

    def info(self, worker) -> dict:
        try:
            return {"lanes": self._lanes(worker)}
        except Exception as exc:  # a report: the stats reply must still go out
            log.warning("could not read this worker's lanes for its stats", exc_info=True)
            return {"lanes": {"error": f"{type(exc).__name__}: {exc}"}}

    @staticmethod
    def _lanes(worker) -> dict:
        from lanes.ops.lane_stats import pool_rows
        from lanes.priority import Priority

        runtime = worker.app.lanes_context.runtime()
        fleets = {fleet_of_queue(name) for name in worker.app.amqp.queues.consume_from or ()}
        table = runtime.table()
        # Every pool the fleet's workflows may wait in: the primary's and the fallbacks'.
        pools = {
            model.pool.name: model.pool
            for route in table.workflows.values() if (route.fleet or HOSTED_FLEET) in fleets
            for model in route.candidates if model.pool is not None
        }
        shown = {}
        for row in pool_rows(runtime.settings, runtime.client, pools.values()):
            shown[row["pool"]] = {
                "width": row["width"],
                "configured_width": row["configured_width"],
                "in_flight": row["in_flight"],
                "queued": " / ".join(f"{p.label} {row['queued'][p.label]}" for p in Priority),
                "controller": ",".join(sorted(row["controllers"])) or "off",
                "wait_p95_ms": row["wait_p95_ms"],
            }
        return shown

"""Task events in batches on the gevent pool, as the threads pool sends them.

On the threads pool Celery's consumer runs an event loop, and its event
dispatcher buffers ``task-*`` events and publishes each turn's as one
``task.multi`` message. On the gevent pool there is no such loop, so Celery
publishes every event at once: five a request (received, started, the lane's
admission and call, succeeded), each a publish of its own, about an eighth of
the fleet worker's CPU per request (docs/BENCHMARKS_JOURNAL.md, "where a
request's CPU goes"). This step gives the gevent pool the same batches: the
first event buffered schedules a flush a moment later on a green thread of
its own (blocking I/O may not run in the loop's callbacks), and a full batch
(Celery's limit, 24) goes at once. Receivers (Flower, ``lanes events``)
already read batches.
"""

from __future__ import annotations

from celery import bootsteps

# How long an event may wait in the batch: short against anything that shows
# it (Flower refreshes every second), long enough for a loaded worker to fill
# the batch.
FLUSH_AFTER_SECONDS = 0.02
TASK_GROUP = "task"


class GreenEventBatches(bootsteps.StartStopStep):
    """Buffers the consumer's task events and flushes them shortly after, on the gevent pool."""

    requires = {"celery.worker.consumer.events:Events"}

    def __init__(self, c, **kwargs) -> None:
        self._pending = None
        self._consumer = None
        super().__init__(c, **kwargs)

    def start(self, c) -> None:
        # Runs after Events.start on every (re)connect, which builds a new dispatcher.
        dispatcher = c.event_dispatcher
        if dispatcher is None or not getattr(c.pool, "is_green", False) or c.hub is not None:
            return
        self._consumer = c
        dispatcher.buffer_group = frozenset({TASK_GROUP})
        dispatcher.on_send_buffered = self._schedule

    def _schedule(self) -> None:
        if self._pending is None:
            import gevent

            self._pending = gevent.spawn_later(FLUSH_AFTER_SECONDS, self._flush)

    def _flush(self) -> None:
        self._pending = None
        dispatcher = getattr(self._consumer, "event_dispatcher", None)
        if dispatcher is not None:
            dispatcher.flush(errors=False)

    def stop(self, c) -> None:
        # Before Events closes the dispatcher (it is required, so it stops after
        # this step): what is buffered goes out rather than being dropped.
        if self._consumer is not None:
            self._flush()

    shutdown = stop

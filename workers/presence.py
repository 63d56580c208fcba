"""The worker's heartbeat: ``lanes worker --list``, ``lanes pools`` and
``lanes submit`` see which fleets have a live worker (lanes.presence)."""

from __future__ import annotations

import logging
import threading

import redis
from celery import bootsteps

from lanes.celery_client import fleet_of_queue
from lanes.presence import WorkerPresence
from lanes.redis_conn import connect

log = logging.getLogger("lanes.worker")


class PresenceHeartbeat(bootsteps.StartStopStep):
    """Keeps this worker listed under every fleet whose queues it consumes."""

    def __init__(self, worker, **kwargs) -> None:
        super().__init__(worker, **kwargs)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._presence: WorkerPresence | None = None
        self._fleets: list[str] = []
        self._name = ""

    def start(self, worker) -> None:
        context = worker.app.lanes_context
        queues = worker.app.amqp.queues.consume_from or {}
        self._fleets = sorted({f for f in (fleet_of_queue(q) for q in queues) if f})
        if not self._fleets:
            return
        self._name = worker.hostname
        client = connect(context.redis_url, timeout=context.settings.redis_timeout_seconds)
        self._presence = WorkerPresence(client, prefix=context.settings.key_prefix)
        self._beat()  # listed at once, not a heartbeat later
        self._thread = threading.Thread(target=self._run, name="lanes-presence", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        for fleet in self._fleets:
            try:
                self._presence.beat(fleet, self._name)
            except redis.RedisError as exc:
                # Redis away: the entry lapses, and comes back with Redis.
                log.debug("heartbeat of %s not written: %s", self._name, exc)

    def _run(self) -> None:
        while not self._stop.wait(self._presence.interval_seconds):
            self._beat()

    def stop(self, worker) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._presence is None:
            return
        for fleet in self._fleets:
            try:
                self._presence.leave(fleet, self._name)
            except redis.RedisError:
                pass  # the entry expires on its own

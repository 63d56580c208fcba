"""Cancelling lane waits when a task is revoked or the worker shuts down.

Each running task registers an event that its lane wait watches. A revoke's
broadcast only marks the id in the worker's in-memory ``revoked`` set (the
threads pool cannot terminate a thread), so the event looks in that set
whenever it is read: the lane reads it every 50 ms while it waits, and the
walker once more when a slot is granted, so a slot granted while the revoke
was on its way goes back unused instead of calling the backend. A watcher
thread per worker sets the events of revoked tasks too (for whatever blocks
on the event rather than reading it); a warm shutdown cancels every wait at
once.

A broadcast reaches only the workers subscribed when it is sent: one whose
broadcast connection is starting or reconnecting misses it, and a task it
holds in a lane wait would run when granted. So the watcher also reads the
revokes stream (:class:`RevokeFeed`, one command about once a second, only
while tasks are registered), where every revoke through Lanes is appended.
"""

from __future__ import annotations

import logging
import threading
import time

import redis
from celery import signals
from celery.worker import state as worker_state

from lanes.lane.base import text

log = logging.getLogger("lanes.worker")

# The stream is read on every this many turns of the watcher (0.2 s each).
FEED_EVERY_TURNS = 5
# The feed starts this long before it is made: a revoke appended just before
# is read again, which is harmless (the claim's mark check already caught it).
FEED_START_MARGIN_MS = 1_000
FEED_BATCH = 1_000


class Cancellation:
    """One delivery's cancel: the event its walk reads, and why it was set."""

    def __init__(self, task_id: str) -> None:
        self.task_id = task_id
        self.reason: str | None = None
        self.event = _CancelEvent(self)

    def cancel(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.event.set()

    def revoked_by_broadcast(self) -> bool:
        if self.task_id in worker_state.revoked:
            self.cancel("revoked")
            return True
        return False


class _CancelEvent(threading.Event):
    """Set, or its task is in the worker's revoked set (a broadcast heard
    since the watcher's last turn)."""

    def __init__(self, owner: Cancellation) -> None:
        super().__init__()
        self._owner = owner

    def is_set(self) -> bool:
        return super().is_set() or self._owner.revoked_by_broadcast()


class RevokeFeed:
    """The task ids appended to the revokes stream since the feed was made.

    Made before the first claim of the process (``WorkerContext.runs``), so
    a revoke that comes after a claim, and so after the claim's mark check,
    is always in what the feed reads. It starts at the Redis server's clock,
    which the stream's ids are made from, so no host's clock matters."""

    def __init__(self, client: redis.Redis, key: str) -> None:
        self._client = client
        self._key = key
        try:
            seconds, micros = client.time()
            now_ms = int(seconds) * 1000 + int(micros) // 1000
        except (redis.RedisError, TypeError, ValueError):  # Redis away: the worker's clock, with room for a skew
            now_ms = int(time.time() * 1000) - 60_000
        self._last = f"{now_ms - FEED_START_MARGIN_MS}-0"

    def read(self) -> set[str]:
        found: set[str] = set()
        while True:
            reply = self._client.xread({self._key: self._last}, count=FEED_BATCH)
            entries = reply[0][1] if reply else []
            for entry_id, fields in entries:
                self._last = text(entry_id)
                task_id = fields.get(b"task", fields.get("task"))
                if task_id is not None:
                    found.add(text(task_id))
            if len(entries) < FEED_BATCH:
                return found


class CancelRegistry:
    def __init__(self, *, watch_interval: float = 0.2) -> None:
        # A task id may have two deliveries in one process (a copy handed
        # back while the first still ends): each keeps its own cancel.
        self._items: dict[str, list[Cancellation]] = {}
        self._lock = threading.Lock()
        self._interval = watch_interval
        self._shutting_down = False
        self._watcher: threading.Thread | None = None
        self._feed: RevokeFeed | None = None

    def follow(self, feed: RevokeFeed) -> None:
        """Cancel the waits of the tasks ``feed`` reports revoked, too."""
        self._feed = feed

    def register(self, task_id: str) -> Cancellation:
        item = Cancellation(task_id)
        with self._lock:
            if self._shutting_down:
                item.cancel("shutdown")
            self._items.setdefault(task_id, []).append(item)
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch, name="lanes-revoke-watch", daemon=True)
                self._watcher.start()
        return item

    def __len__(self) -> int:
        """How many deliveries are registered now (the worker's in-flight count)."""
        with self._lock:
            return sum(len(held) for held in self._items.values())

    def unregister(self, item: Cancellation) -> None:
        """Forget one delivery's cancel (another delivery of its task keeps its own)."""
        with self._lock:
            held = self._items.get(item.task_id, [])
            if item in held:
                held.remove(item)
            if not held:
                self._items.pop(item.task_id, None)

    def cancel_all(self, reason: str) -> None:
        with self._lock:
            self._shutting_down = self._shutting_down or reason == "shutdown"
            for held in self._items.values():
                for item in held:
                    item.cancel(reason)

    def _watch(self) -> None:
        # The in-memory set every turn; the stream every FEED_EVERY_TURNS
        # turns, and only while tasks wait (an idle worker sends nothing).
        # The stream is read before the registered ids are listed, so no
        # revoke it reports is passed over for a task registered in between:
        # a task that registers after the read claims after the revoke's
        # mark was set, and its claim finds the mark.
        turn = 0
        while True:
            turn += 1
            try:
                self._turn(read_stream=turn % FEED_EVERY_TURNS == 0)
            except Exception:  # the watcher must outlive any one turn's fault
                log.warning("revoke watcher turn failed", exc_info=True)
            threading.Event().wait(self._interval)

    def _turn(self, *, read_stream: bool) -> None:
        streamed: set[str] = set()
        if read_stream and self._items and self._feed is not None:
            try:
                streamed = self._feed.read()
            except redis.RedisError as exc:  # Redis away: the next read catches up
                log.debug("revokes stream not read: %s", exc)
        with self._lock:
            items = [item for held in self._items.values() for item in held]
        for item in items:
            if item.task_id in streamed:
                item.cancel("revoked")
            else:
                item.revoked_by_broadcast()


def stop_with_the_worker(context) -> None:
    """A warm shutdown cancels every lane wait of ``context.cancels`` at
    once; the worker's end closes ``context``. worker_shutdown, not
    worker_process_shutdown: the threads pool has no child processes, and the
    event buffer must be flushed on the way out."""

    @signals.worker_shutting_down.connect(weak=False)
    def _cancel_waits(**_) -> None:
        context.cancels.cancel_all("shutdown")

    @signals.worker_shutdown.connect(weak=False)
    def _close(**_) -> None:
        context.close()

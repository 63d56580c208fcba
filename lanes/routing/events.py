"""Routing events at request rate: a capped Redis stream, written in batches.

``lane_wait`` (one per admission) and ``lane_bypass`` (one per candidate
passed over) come at request rate, so they are buffered in the process and
flushed by one background thread in a pipeline, instead of costing each
request a round trip. The stream is trimmed to ``max_len`` entries.

Events are a report, never a reason to lose work: the flusher survives any
Redis error (a full no-eviction Redis answers ``OutOfMemoryError``, not a
connection error), the buffer in the process is bounded in ``record()`` itself
(the oldest events are dropped while Redis cannot take them: counted in
``dropped`` and exported as ``lanes_events_dropped_total``), and ``close()``
never raises.

:class:`EventObserver` turns the walker's attempts and bypasses into events:
``lane_wait`` (one per admission), ``lane_bypass`` (one per candidate passed
over) and ``call_abandoned`` (a call given up for want of a first token).
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass

import redis

from lanes.errors import RedisUnavailable
from lanes.instruments import events_dropped
from lanes.namespace import Namespace
from lanes.routing.observers import Attempt, BaseObserver, Bypass

log = logging.getLogger("lanes.routing")


@dataclass(frozen=True)
class Event:
    id: str
    time: float
    kind: str
    pool: str | None
    workflow: str | None
    detail: dict

    def as_dict(self) -> dict:
        return {
            "id": self.id,
            "time": self.time,
            "kind": self.kind,
            "pool": self.pool,
            "workflow": self.workflow,
            **self.detail,
        }


def events_key(prefix: str) -> str:
    return Namespace(prefix).events


class EventLog:
    def __init__(
        self,
        client: redis.Redis,
        *,
        prefix: str,
        max_len: int = 100_000,
        enabled: bool = True,
        flush_interval: float = 0.1,
        max_buffer: int | None = None,
    ) -> None:
        self._client = client
        self._key = events_key(prefix)
        self._max_len = max_len
        # Never more in the process than the stream itself would keep.
        self._max_buffer = max_buffer if max_buffer is not None else max_len
        self.dropped = 0  # events dropped because Redis could not take them in time
        self.enabled = enabled
        self._interval = flush_interval
        self._buffer: list[dict] = []
        self._lock = threading.Lock()
        # One flush at a time: a flush that returns has written everything recorded
        # before it, even when the background flusher had taken it and was writing.
        self._flush_lock = threading.Lock()
        self._wake = threading.Event()
        self._closed = False
        self._thread: threading.Thread | None = None

    def record(self, kind: str, *, pool: str | None = None, workflow: str | None = None, **detail) -> None:
        if not self.enabled:
            return
        fields = {"kind": kind, "pool": pool or "", "workflow": workflow or "", "detail": json.dumps(detail)}
        with self._lock:
            self._buffer.append(fields)
            overflow = len(self._buffer) - self._max_buffer
            if overflow > 0:
                del self._buffer[:overflow]
                self._count_dropped(overflow)
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="lanes-events", daemon=True)
                self._thread.start()

    def _count_dropped(self, count: int) -> None:
        self.dropped += count
        events_dropped(count)

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self._interval)
            self._wake.clear()
            try:
                self.flush()
            except RedisUnavailable:
                pass  # kept in the buffer; the next flush tries again
            except Exception:  # the flusher must outlive any fault, or events pile up
                log.warning("routing events could not be flushed; retrying", exc_info=True)

    def flush(self) -> int:
        with self._flush_lock:
            return self._write_buffer()

    def _write_buffer(self) -> int:
        with self._lock:
            batch, self._buffer = self._buffer, []
        if not batch:
            return 0
        pipe = self._client.pipeline(transaction=False)
        for fields in batch:
            pipe.xadd(self._key, fields, maxlen=self._max_len, approximate=True)
        try:
            pipe.execute()
        except redis.RedisError as exc:
            with self._lock:
                # Keep what failed, but never grow without bound while Redis is away.
                kept = batch + self._buffer
                overflow = len(kept) - self._max_buffer
                if overflow > 0:
                    self._count_dropped(overflow)
                    kept = kept[overflow:]
                self._buffer = kept
            raise RedisUnavailable(f"could not write routing events: {exc}") from exc
        return len(batch)

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        try:
            self.flush()
        except Exception:  # closing must never fail a worker's shutdown
            log.warning("routing events left unwritten at close: %d", len(self._buffer), exc_info=True)

    def list(
        self,
        *,
        kind: str | None = None,
        pool: str | None = None,
        workflow: str | None = None,
        since: float | None = None,
        limit: int = 100,
        scan_limit: int = 20_000,
    ) -> list[Event]:
        """Newest first, filtered; reads at most ``scan_limit`` entries."""
        found: list[Event] = []
        end = "+"
        start = f"{int(since * 1000)}-0" if since is not None else "-"
        scanned = 0
        while len(found) < limit and scanned < scan_limit:
            page = self._client.xrevrange(self._key, max=end, min=start, count=500)
            if not page:
                break
            for entry_id, fields in page:
                scanned += 1
                event = _decode(entry_id, fields)
                if kind and event.kind != kind:
                    continue
                if pool and event.pool != pool:
                    continue
                if workflow and event.workflow != workflow:
                    continue
                found.append(event)
                if len(found) >= limit:
                    break
            last = page[-1][0].decode() if isinstance(page[-1][0], bytes) else page[-1][0]
            ms, seq = (int(x) for x in last.split("-"))
            end = f"{ms}-{seq - 1}" if seq > 0 else f"{ms - 1}"
        return found

    def newer(self, than: str | None, *, since: float, count: int = 10_000) -> list[Event]:
        """Oldest first: events after entry ``than`` (or, without one, from ``since``), at most ``count``.

        A reader that keeps the last id it saw reads each event once (``lanes top``).
        """
        start = f"({than}" if than else f"{int(since * 1000)}-0"
        return [_decode(entry_id, fields) for entry_id, fields in self._client.xrange(self._key, min=start, count=count)]

    def count(self) -> int:
        return int(self._client.xlen(self._key))


def _decode(entry_id, fields) -> Event:
    text = {k.decode() if isinstance(k, bytes) else k: v.decode() if isinstance(v, bytes) else v for k, v in fields.items()}
    ident = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return Event(
        id=ident,
        time=int(ident.split("-")[0]) / 1000,
        kind=text.get("kind", ""),
        pool=text.get("pool") or None,
        workflow=text.get("workflow") or None,
        detail=json.loads(text.get("detail") or "{}"),
    )


class EventObserver(BaseObserver):
    """Routing events from the walker's reports."""

    def __init__(self, events: EventLog) -> None:
        self.events = events

    def on_attempt(self, attempt: Attempt) -> None:
        if attempt.pool is not None and attempt.wait_seconds is not None:
            self.events.record(
                "lane_wait", pool=attempt.pool, workflow=attempt.workflow,
                priority=attempt.priority.label, wait_ms=_ms(attempt.wait_seconds),
            )
        if attempt.outcome in ("timeout", "abandoned"):
            self.events.record(
                "call_abandoned", pool=attempt.pool, workflow=attempt.workflow, model=attempt.model,
                priority=attempt.priority.label, outcome=attempt.outcome, reason=attempt.reason,
                call_ms=_ms(attempt.call_seconds) if attempt.call_seconds is not None else None,
            )

    def on_bypass(self, bypass: Bypass) -> None:
        self.events.record(
            "lane_bypass", pool=bypass.pool, workflow=bypass.workflow, model=bypass.model,
            priority=bypass.priority.label, reason=bypass.reason, **bypass.detail,
        )


def _ms(seconds: float) -> float:
    return round(seconds * 1000, 2)

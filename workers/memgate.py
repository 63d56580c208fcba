"""The worker memory gate: stop taking tasks when this worker's own memory runs high.

A controller may raise a pool's width above its configured value, and the
fleet is sized from the pool's ceiling; what bounds the work a worker holds
then is its memory, measured rather than predicted (one request's memory
varies by an order of magnitude with the answer's length). The gate reads the
worker's cgroup (v2 ``memory.current``/``memory.max``, else v1
``memory.usage_in_bytes``/``memory.limit_in_bytes``, reclaimable page cache
left out) and:

- engages at ``high`` (a fraction of the limit): the worker stops consuming
  its queues, so its in-flight work can only fall; it records the in-flight
  count at that moment (the worker's measured ceiling) and counts engagements;
- releases below ``low``, or once in-flight has drained to
  ``drain_fraction`` of its level at engagement (memory held by the runtime
  may not come back, but the work that needed it is gone);
- never blocks on a source it cannot read, or without a limit;
- is no gate at all for nonsensical thresholds (none, outside (0, 1], or a
  low mark not below the high one).

Without a gate, controllers that could raise a width fail closed (see
:mod:`lanes.control.loop`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lanes.instruments import memory_gate

log = logging.getLogger("lanes.worker")

CGROUP = Path("/sys/fs/cgroup")
UNLIMITED = 1 << 60  # cgroup v1 reports "no limit" as a huge number


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _stat(path: Path, name: str) -> int:
    try:
        for line in path.read_text().splitlines():
            key, _, value = line.partition(" ")
            if key == name:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0


def cgroup_memory(root: Path = CGROUP) -> float | None:
    """This process's memory working set over its limit, or None when unknown or unlimited."""
    v2_current, v2_max = root / "memory.current", root / "memory.max"
    if v2_current.exists():
        used, limit = _read_int(v2_current), _read_int(v2_max)
        cache = _stat(root / "memory.stat", "inactive_file")
    else:
        v1 = root / "memory"
        used, limit = _read_int(v1 / "memory.usage_in_bytes"), _read_int(v1 / "memory.limit_in_bytes")
        cache = _stat(v1 / "memory.stat", "total_inactive_file")
    if used is None or not limit or limit >= UNLIMITED:
        return None
    return max(0, used - cache) / limit


@dataclass
class GateState:
    engaged: bool = False
    engagements: int = 0
    in_flight_at_gate: int | None = None  # the in-flight count when it last engaged: the worker's ceiling
    last_ratio: float | None = None


class MemoryGate:
    def __init__(self, high: float | None, low: float | None, *, drain_fraction: float = 0.5,
                 read: Callable[[], float | None] = cgroup_memory) -> None:
        self.enabled = high is not None and 0 < high <= 1 and (low is None or 0 < low < high)
        if high is not None and not self.enabled:
            log.error("memory gate thresholds high=%r low=%r make no sense (want 0 < low < high <= 1): no gate",
                      high, low)
        self.high = high
        self.low = low if low is not None else (high * 0.9 if high else None)
        self.drain_fraction = drain_fraction
        self.read = read
        self.state = GateState()

    def update(self, in_flight: int) -> bool:
        """Read memory once and move the gate; whether the worker may take new tasks."""
        if not self.enabled:
            return True
        ratio = self.read()
        state = self.state
        state.last_ratio = ratio
        if ratio is None:
            state.engaged = False  # an unreadable source never blocks
            memory_gate(False, None)
            return True
        if not state.engaged:
            if ratio >= self.high:
                state.engaged = True
                state.engagements += 1
                state.in_flight_at_gate = in_flight
                log.warning("memory gate engaged at %.0f%% of the limit with %d in flight", ratio * 100, in_flight)
        elif ratio < self.low or self._drained(in_flight):
            state.engaged = False
            log.info("memory gate released at %.0f%% with %d in flight", ratio * 100, in_flight)
        memory_gate(state.engaged, ratio)
        return not state.engaged

    def _drained(self, in_flight: int) -> bool:
        """In-flight work fell to ``drain_fraction`` of its level at engagement.

        Only when there was work at engagement: an idle worker whose memory is
        high has nothing to drain, and releasing it at once would open and shut
        the gate on every poll.
        """
        at_gate = self.state.in_flight_at_gate or 0
        return at_gate > 0 and in_flight <= self.drain_fraction * at_gate


class MemoryGateWatcher:
    """Polls the gate on a thread and switches the worker's consumer off and on.

    The switch runs on the consumer's own loop (``call_soon``), the only
    thread allowed to touch it. That loop keeps such callbacks in a set, so
    two switches posted close together may run in either order: each posted
    call therefore applies the latest wish (:meth:`_apply`), never "pause" or
    "resume" as such, and whatever order they run in the last one wins.
    """

    def __init__(self, gate: MemoryGate, queues: list[str], in_flight: Callable[[], int], *,
                 period: float = 1.0) -> None:
        self.gate = gate
        self.queues = queues
        self.in_flight = in_flight
        self.period = period
        self.consumer = None
        self.background = None  # the worker's BackgroundConsumer step, switched with the rest
        self._paused = False
        self.applied = False  # whether the consumer was last switched off (what the worker really does)
        self._stop = threading.Event()

    def start(self) -> "MemoryGateWatcher":
        threading.Thread(target=self._run, name="lanes-memgate", daemon=True).start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period):
            try:
                self.poll()
            except Exception:
                log.warning("memory gate poll failed", exc_info=True)

    def attach(self, consumer, *, background=None) -> None:
        """Take the worker's consumer (its task queues) and its background consumer."""
        self.queues = [queue.name for queue in consumer.task_consumer.queues]
        self.background = background
        self.consumer = consumer

    def poll(self) -> None:
        open_ = self.gate.update(self.in_flight())
        consumer = self.consumer
        if consumer is None or open_ != self._paused:
            return
        self._paused = not open_
        consumer.call_soon(self._apply)

    def _apply(self) -> None:
        consumer, paused = self.consumer, self._paused
        if consumer is None:
            return
        self.applied = paused
        for queue in self.queues:
            if paused:
                consumer.cancel_task_queue(queue)
            else:
                consumer.add_task_queue(queue)
        if self.background is not None:
            self.background.pause() if paused else self.background.resume()

    def info(self) -> dict:
        """The gate as ``celery inspect stats`` and Flower's worker page show it."""
        state = self.gate.state
        return {"high": self.gate.high, "low": self.gate.low, "ratio": state.last_ratio,
                "engaged": state.engaged, "consuming": not self.applied, "engagements": state.engagements,
                "in_flight_at_gate": state.in_flight_at_gate}

    def stop(self) -> None:
        self._stop.set()

"""The live state of one simulated model: who runs, who waits, what was counted.

Everything here runs on the simulator's event loop, so plain integers are
exact without locks; other threads reach it through the loop (see
``server.Simulator``).

Accounting is the point of the simulator: tests take ``max_running`` and
``max_in_flight`` as the ground truth of how many requests a backend saw at
once. So:

- a request is *in flight* from its arrival until :meth:`ModelEngine.finish`,
  which the HTTP layer calls just *before* it sends the last byte of the
  answer; a client can never see its answer while the simulator still counts
  it, so a client that sends its next request after an answer cannot make the
  simulator over-count;
- a slot is handed straight to the oldest waiter when it frees (no barging),
  and ``running`` counts the new holder from that moment;
- :meth:`finish` is idempotent and runs in a ``finally``, so a cancelled
  request (client gone, server stopping) always frees what it held, including
  a slot handed to it in the instant it was cancelled.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any

from lanes.errors import InvalidInput
from lanes.sim.model import FIELD_NAMES, FIXED_FIELDS, SimModel, Timing, new_rng, sample_timing

# vLLM's buckets (vllm/v1/metrics/loggers.py) so dashboards built on it fit.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
QUEUE_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
                 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)

# Runtime-only knobs of configure(): counters of requests still to be hit.
INJECTIONS = frozenset({"fail_next", "hang_next"})
CONFIGURABLE = (FIELD_NAMES - FIXED_FIELDS) | INJECTIONS


class Rejected(Exception):
    """The request is answered at once with ``status`` (overflow or injection)."""

    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind  # the OpenAI error type


class Histogram:
    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.reset()

    def reset(self) -> None:
        self.counts = [0] * (len(self.bounds) + 1)  # last: +Inf
        self.sum = 0.0

    def observe(self, value: float) -> None:
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
                break
        else:
            self.counts[-1] += 1
        self.sum += value

    def cumulative(self) -> list[tuple[str, int]]:
        out, total = [], 0
        for bound, count in zip((*map(str, self.bounds), "+Inf"), self.counts):
            total += count
            out.append((bound, total))
        return out


@dataclass(eq=False)
class Ticket:
    """One request's passage through a model."""

    arrived: float = field(default_factory=time.monotonic)
    state: str = "new"  # new -> deferred -> waiting -> running -> done
    grant: asyncio.Future | None = None


class Device:
    """Requests in flight on one device, over every model it serves."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.in_flight = 0
        self.max_in_flight = 0

    def arrive(self) -> None:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def leave(self) -> None:
        self.in_flight -= 1

    def reset(self) -> None:
        self.max_in_flight = self.in_flight


class ModelEngine:
    def __init__(self, model: SimModel, device: Device | None = None) -> None:
        self.device = device
        self.initial = model
        self.model = model
        self.rng = new_rng(model)
        self.running = 0
        self.deferred = 0
        self.queue: deque[Ticket] = deque()
        self.in_flight = 0
        self.fail_next = 0
        self.hang_next = 0
        self.ttft = Histogram(TTFT_BUCKETS)
        self.queue_time = Histogram(QUEUE_BUCKETS)
        self.reset_counters()

    # --- configuration -------------------------------------------------------

    def configure(self, changes: dict[str, Any]) -> None:
        """Apply admin changes atomically: all are valid or none is applied."""
        unknown = sorted(set(changes) - CONFIGURABLE)
        if unknown:
            raise InvalidInput(
                f"unknown setting {', '.join(map(repr, unknown))} for model {self.model.name!r} "
                f"(known: {', '.join(sorted(CONFIGURABLE))})"
            )
        injections = {k: changes[k] for k in INJECTIONS & set(changes)}
        for key, value in injections.items():
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InvalidInput(f"{key} {value!r} must be an integer >= 0")
        settings = {k: v for k, v in changes.items() if k not in INJECTIONS}
        model = replace(self.model, **settings) if settings else self.model
        if "seed" in settings or "name" in settings:
            self.rng = new_rng(model)
        self.model = model
        self.fail_next = injections.get("fail_next", self.fail_next)
        self.hang_next = injections.get("hang_next", self.hang_next)
        self._grant_free_slots()  # a raised capacity admits waiters now

    def reset_counters(self) -> None:
        self.served = self.rejected = self.failed = self.cancelled = self.preemptions = 0
        # Peaks restart from what is true now, not from zero: a reset while
        # requests run must not hide them.
        self.max_running = self.running
        self.max_in_flight = self.in_flight
        self.ttft.reset()
        self.queue_time.reset()

    def restore(self) -> None:
        """Back to the model as it started, injections cleared."""
        self.model = self.initial
        self.rng = new_rng(self.initial)
        self.fail_next = self.hang_next = 0
        self._grant_free_slots()

    # --- one request -----------------------------------------------------------

    def arrive(self) -> Ticket:
        ticket = Ticket()
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.device is not None:
            self.device.arrive()
        return ticket

    def injected_failure(self) -> Rejected | None:
        """The failure this request must answer with, if one is injected."""
        m = self.model
        if m.down:
            return Rejected(503, f"model {m.name!r} is down (simulated)", "ServiceUnavailableError")
        if self.fail_next > 0:
            self.fail_next -= 1
            return Rejected(m.fail_status, f"injected failure ({m.fail_status})", "InternalServerError")
        if m.fail_rate > 0 and self.rng.random() < m.fail_rate:
            return Rejected(m.fail_status, f"injected failure ({m.fail_status})", "InternalServerError")
        return None

    async def defer(self, ticket: Ticket) -> None:
        if self.model.defer_ms <= 0:
            return
        ticket.state = "deferred"
        self.deferred += 1
        try:
            await asyncio.sleep(self.model.defer_ms / 1000)
        finally:
            self.deferred -= 1
            ticket.state = "new"

    def enter(self, ticket: Ticket) -> None:
        """Run now, join the queue, or raise :class:`Rejected`. Never waits."""
        m = self.model
        if self.running < m.capacity and not self.queue:
            self._start(ticket)
            return
        if m.overflow == "reject":
            raise Rejected(m.reject_status, f"model {m.name!r} is at capacity ({m.capacity})", "OverloadedError")
        if m.max_queue is not None and len(self.queue) >= m.max_queue:
            raise Rejected(m.reject_status, f"model {m.name!r} queue is full ({m.max_queue})", "OverloadedError")
        ticket.state = "waiting"
        ticket.grant = asyncio.get_running_loop().create_future()
        self.queue.append(ticket)

    async def wait_turn(self, ticket: Ticket) -> None:
        if ticket.state == "waiting":
            # finish() cleans up if this wait is cancelled, granted or not.
            await ticket.grant
        self.queue_time.observe(time.monotonic() - ticket.arrived)

    def sample(self, max_tokens: int | None) -> Timing:
        return sample_timing(self.model, self.rng, running=self.running, max_tokens=max_tokens)

    def take_hang(self) -> float | None:
        if self.hang_next > 0:
            self.hang_next -= 1
            return self.model.hang_s
        return None

    def first_token(self, ticket: Ticket) -> None:
        self.ttft.observe(time.monotonic() - ticket.arrived)

    def finish(self, ticket: Ticket, outcome: str) -> None:
        """Count the request out; free its slot. Safe to call more than once."""
        if ticket.state == "done":
            return
        if ticket.state == "waiting":
            self.queue.remove(ticket)
        elif ticket.state == "running":
            self.running -= 1
            self._grant_free_slots()
        ticket.state = "done"
        self.in_flight -= 1
        if self.device is not None:
            self.device.leave()
        if outcome == "served":
            self.served += 1
        elif outcome == "rejected":
            self.rejected += 1
        elif outcome == "failed":
            self.failed += 1
        else:
            self.cancelled += 1

    def _start(self, ticket: Ticket) -> None:
        ticket.state = "running"
        self.running += 1
        self.max_running = max(self.max_running, self.running)

    def _grant_free_slots(self) -> None:
        while self.queue and self.running < self.model.capacity:
            ticket = self.queue.popleft()
            self._start(ticket)
            if ticket.grant is not None and not ticket.grant.done():
                ticket.grant.set_result(None)

    # --- reporting -------------------------------------------------------------

    @property
    def waiting(self) -> int:
        return len(self.queue) + self.deferred

    @property
    def kv_cache_usage(self) -> float:
        # Sequences are the only thing the simulator stores: a full batch is a
        # full cache, which is what saturation scorers expect (kv / 0.8 >= 1).
        capacity = self.model.capacity
        if capacity == 0:
            return 1.0 if self.running else 0.0
        return min(1.0, self.running / capacity)

    def stats(self) -> dict[str, Any]:
        m = self.model
        return {
            "kind": m.kind,
            "capacity": m.capacity,
            "overflow": m.overflow,
            "reject_status": m.reject_status,
            "max_queue": m.max_queue,
            "running": self.running,
            "waiting": self.waiting,
            "in_flight": self.in_flight,
            "max_running": self.max_running,
            "max_in_flight": self.max_in_flight,
            "served": self.served,
            "rejected": self.rejected,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "down": m.down,
            "fail_next": self.fail_next,
            "fail_rate": m.fail_rate,
            "hang_next": self.hang_next,
            "port": m.port,
            "device": self.device.name if self.device else None,
            "device_in_flight": self.device.in_flight if self.device else self.in_flight,
            "device_max_in_flight": self.device.max_in_flight if self.device else self.max_in_flight,
        }

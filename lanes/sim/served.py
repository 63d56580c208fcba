"""A model as its clients see it: one address, its engines, its failures and counts.

The engines (``engine.EngineCore``) are the deterministic model; this module
is what runs them on the simulator's event loop and answers for them:

- which engine a request goes to (round robin over replicas behind a load
  balancer, the least loaded rank in data-parallel mode), and whether it is
  refused first: an injected failure, a dead engine (500), vLLM's queue limits
  (503 and a rejection counted by reason), or a gateway's 529;
- a timer per engine that calls ``advance`` when ``next_wakeup`` says, and
  wakes the requests that changed;
- accounting, the point of the simulator: tests take ``max_running`` and
  ``max_in_flight`` as the ground truth of how many requests a backend saw at
  once. A request is *in flight* from its arrival until :meth:`finish`, which
  the HTTP layer calls just *before* it sends the last byte of the answer, so
  a client that sends its next request after an answer is never over-counted.
  :meth:`finish` is idempotent and runs in a ``finally``.

Everything here runs on the simulator's event loop: plain integers are exact.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Any

from lanes.errors import InvalidInput
from lanes.sim.engine import EngineCore, SimRequest
from lanes.sim.model import FIELD_NAMES, FIXED_FIELDS, SimModel, new_rng, service_seconds

# Runtime-only knobs of configure(): counters of requests still to be hit.
INJECTIONS = frozenset({"fail_next", "hang_next", "error_next"})
CONFIGURABLE = (FIELD_NAMES - FIXED_FIELDS) | INJECTIONS
# vLLM's words for a dead engine (EngineDeadError) and a full queue.
DEAD_MESSAGE = "EngineCore encountered an issue. See stack trace (above) for the root cause."
BUSY_MESSAGE = "The engine is currently busy and cannot accept new requests: {detail}. Please retry later."


class Rejected(Exception):
    """The request is answered at once with ``status``."""

    def __init__(self, status: int, message: str, kind: str) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind  # the OpenAI error type


def loop_time() -> float:
    """The simulator's clock: its event loop's, or monotonic time off the loop."""
    try:
        return asyncio.get_running_loop().time()
    except RuntimeError:
        return time.monotonic()


@dataclass(eq=False)
class Ticket:
    """One request's passage through the server, from arrival to answer."""

    arrived: float
    done: bool = False
    outcome: str | None = None  # served, rejected, failed or cancelled, once done
    request: SimRequest | None = None
    core: EngineCore | None = None


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


class ServedModel:
    def __init__(self, model: SimModel, device: Device | None = None) -> None:
        self.device = device
        self.initial = model
        self.model = model
        self.cores = [EngineCore(model, new_rng(model, i)) for i in range(model.replicas)]
        self._seed(model)
        self._timers: dict[int, asyncio.TimerHandle | asyncio.Handle] = {}
        self._next_replica = 0
        self.in_flight = 0
        self.fail_next = self.hang_next = self.error_next = 0
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
        if "seed" in settings:
            self._seed(model)
        for key, value in injections.items():
            setattr(self, key, value)
        self._apply(model)

    def restore(self) -> None:
        """Back to the model as it started, injections cleared."""
        self._seed(self.initial)
        self.fail_next = self.hang_next = self.error_next = 0
        self._apply(self.initial)

    def _seed(self, model: SimModel) -> None:
        self.rng = new_rng(model, -1)  # failure draws
        self.scrape_rng = new_rng(model, -2)  # which replica answers a scrape: apart, so scrapes never shift failures
        for i, core in enumerate(self.cores):
            core.rng = new_rng(model, i)

    def _apply(self, model: SimModel) -> None:
        dying = model.down and not self.model.down
        self.model = model
        for core in self.cores:
            core.model = model
            if dying:  # what a dead engine held fails with it
                self._wake(core.fail_all(DEAD_MESSAGE))
            self.poke(core)  # a raised capacity admits waiters now

    def reset_counters(self) -> None:
        self.served = self.rejected = self.failed = self.cancelled = 0
        self.rejections: dict[str, int] = {}
        # Peaks restart from what is true now, not from zero: a reset while
        # requests run must not hide them.
        self.max_running = self.running
        self.max_in_flight = self.in_flight
        for core in self.cores:
            core.counters.reset()
            core.max_running = len(core.running)

    # --- one request -----------------------------------------------------------

    def arrive(self) -> Ticket:
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        if self.device is not None:
            self.device.arrive()
        return Ticket(arrived=loop_time())

    def injected_failure(self) -> Rejected | None:
        """The failure this request must answer with at once, if any."""
        m = self.model
        if m.down:
            return Rejected(500, DEAD_MESSAGE, "InternalServerError")
        if self.fail_next > 0:
            self.fail_next -= 1
            return Rejected(m.fail_status, f"injected failure ({m.fail_status})", "InternalServerError")
        if m.fail_rate > 0 and self.rng.random() < m.fail_rate:
            return Rejected(m.fail_status, f"injected failure ({m.fail_status})", "InternalServerError")
        return None

    def submit(self, ticket: Ticket, *, prompt_tokens: int, max_tokens: int | None) -> SimRequest:
        """Hand the request to an engine, or raise :class:`Rejected`. Never waits."""
        m = self.model
        fixed = m.service_ms is not None or m.kind == "embedding"
        answer = 0 if m.kind == "embedding" else min(m.tokens, max_tokens or m.tokens)
        context = m.kv_blocks * m.block_size
        if prompt_tokens + answer > context:
            raise Rejected(400, f"This model's maximum context length is {context} tokens. However, you requested "
                                f"{prompt_tokens + answer} tokens ({prompt_tokens} in the messages, {answer} in "
                                "the completion). Please reduce the length of the messages or completion.",
                           "BadRequestError")
        core = self._choose_core()
        self._check_limits(core, prompt_tokens)
        now = loop_time()
        request = SimRequest(
            prompt_tokens=prompt_tokens,
            max_tokens=answer,
            arrived=ticket.arrived,
            finish_reason="length" if m.kind == "chat" and answer < m.tokens else "stop",
            service_s=service_seconds(m, core.rng) if fixed else None,
            defer_until=now + m.defer_ms / 1000,
            listener=asyncio.Event(),
        )
        if self.hang_next > 0:
            self.hang_next -= 1
            request.hang_s = m.hang_s
        if self.error_next > 0:
            self.error_next -= 1
            request.fail_after = 1
        core.add(request)
        ticket.request, ticket.core = request, core
        self.poke(core)
        return request

    def _choose_core(self) -> EngineCore:
        if self.model.overflow == "gateway":
            # A request just handed over waits for the engine's next pass: count it.
            free = [c for c in self.cores if len(c.running) + len(c.waiting) < self.model.capacity]
            if not free:
                raise Rejected(self.model.reject_status,
                               f"model {self.model.name!r} is at capacity ({self.model.capacity}): every worker is busy",
                               "OverloadedError")
            return free[0]
        if self.model.data_parallel:  # vLLM's DP coordinator balances by queue length
            return min(self.cores, key=lambda c: len(c.running) + len(c.waiting))
        core = self.cores[self._next_replica % len(self.cores)]
        self._next_replica += 1
        return core

    def _check_limits(self, core: EngineCore, prompt_tokens: int) -> None:
        m = self.model
        # In data-parallel mode the limits count across ranks; replicas are separate servers.
        scope = self.cores if m.data_parallel else [core]
        queued = sum(len(c.running) + len(c.waiting) for c in scope)
        tokens = sum(c.queued_tokens() for c in scope)
        reason = detail = None
        if m.max_num_queued_reqs is not None and queued >= m.max_num_queued_reqs:
            reason, detail = "max_num_queued_reqs", f"{queued} requests running or waiting (max_num_queued_reqs={m.max_num_queued_reqs})"
        elif m.max_num_queued_tokens is not None and tokens + prompt_tokens > m.max_num_queued_tokens:
            reason, detail = "max_num_queued_tokens", f"{tokens} prompt tokens running or waiting (max_num_queued_tokens={m.max_num_queued_tokens})"
        if reason is not None:
            self.rejections[reason] = self.rejections.get(reason, 0) + 1
            raise Rejected(503, BUSY_MESSAGE.format(detail=detail), "Service Unavailable")

    def abort(self, ticket: Ticket) -> None:
        if ticket.request is not None and not ticket.request.done:
            ticket.core.abort(ticket.request)
            self.poke(ticket.core)

    def finish(self, ticket: Ticket, outcome: str) -> None:
        """Count the request out. Safe to call more than once."""
        if ticket.done:
            return
        self.abort(ticket)  # a no-op unless the client left mid-way
        ticket.done = True
        ticket.outcome = outcome
        self.in_flight -= 1
        if self.device is not None:
            self.device.leave()
        setattr(self, outcome, getattr(self, outcome) + 1)

    # --- driving the engines -------------------------------------------------------

    def poke(self, core: EngineCore) -> None:
        """Let ``core`` act on a change now (on the loop; a no-op off it)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        index = self.cores.index(core)
        timer = self._timers.pop(index, None)
        if timer is not None:
            timer.cancel()
        self._timers[index] = loop.call_soon(self._run, index)

    def _run(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        core = self.cores[index]
        now = loop.time()
        self._wake(core.advance(now))
        self.max_running = max(self.max_running, self.running)
        wakeup = core.next_wakeup(now)
        if wakeup is None:
            self._timers.pop(index, None)
        else:
            self._timers[index] = loop.call_at(wakeup, self._run, index)

    @staticmethod
    def _wake(requests: list[SimRequest]) -> None:
        for request in requests:
            if isinstance(request.listener, asyncio.Event):
                request.listener.set()

    # --- reporting -------------------------------------------------------------

    @property
    def running(self) -> int:
        return sum(len(c.running) for c in self.cores)

    def stats(self) -> dict[str, Any]:
        m = self.model
        now = loop_time()
        engines = [core.stats(now) for core in self.cores]

        def total(key: str) -> int:
            return sum(e[key] for e in engines)

        return {
            "kind": m.kind,
            "capacity": m.capacity,
            "overflow": m.overflow,
            "reject_status": m.reject_status,
            "max_num_queued_reqs": m.max_num_queued_reqs,
            "max_num_queued_tokens": m.max_num_queued_tokens,
            "kv_blocks": m.kv_blocks,
            "running": total("running"),
            "waiting": total("waiting"),
            "waiting_capacity": total("waiting_capacity"),
            "waiting_deferred": total("waiting_deferred"),
            "kv_blocks_used": total("kv_blocks_used"),
            "kv_cache_usage": max(e["kv_cache_usage"] for e in engines),
            "in_flight": self.in_flight,
            "max_running": self.max_running,
            "max_in_flight": self.max_in_flight,
            "served": self.served,
            "rejected": self.rejected,
            "failed": self.failed,
            "cancelled": self.cancelled,
            "preemptions": total("preemptions"),
            "admission_rejections": dict(self.rejections),
            "down": m.down,
            "fail_next": self.fail_next,
            "fail_rate": m.fail_rate,
            "hang_next": self.hang_next,
            "error_next": self.error_next,
            "metrics_lag_s": m.metrics_lag_s,
            "replicas": m.replicas,
            "data_parallel": m.data_parallel,
            "engines": engines,
            "port": m.port,
            "device": self.device.name if self.device else None,
            "device_in_flight": self.device.in_flight if self.device else self.in_flight,
            "device_max_in_flight": self.device.max_in_flight if self.device else self.max_in_flight,
        }


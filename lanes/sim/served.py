"""A model as its clients see it: one address, its engines, its failures and counts.

The engines (``engine.EngineCore``) are the deterministic model; this module
is what runs them on the simulator's event loop and answers for them:

- which engine a request goes to (round robin over replicas behind a load
  balancer, the least loaded rank in data-parallel mode), and whether it is
  refused first: an injected failure, a dead engine (500), a replica whose
  server has exited (the balancer's 502 or 503), vLLM's queue limits (503 and
  a rejection counted by reason), or a gateway's 529;
- a dead engine's server exiting (``death``);
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
from lanes.sim.death import BALANCER_ANSWERS, DEAD_MESSAGE, ServerDeath
from lanes.sim.engine import EngineCore, SimRequest
from lanes.sim.model import FIELD_NAMES, FIXED_FIELDS, SimModel, new_rng, service_seconds

# Runtime-only knobs of configure(): counters of requests still to be hit.
INJECTIONS = frozenset({"fail_next", "hang_next", "error_next"})
CONFIGURABLE = (FIELD_NAMES - FIXED_FIELDS) | INJECTIONS
# vLLM's words for its admission refusals (vllm/exceptions.py: QueueOverflowError,
# MaxQueuedTokensError; HTTP 503 with the status phrase as the error type).
QUEUE_OVERFLOW_MESSAGE = ("The engine is currently busy and cannot accept new requests. "
                          "Please try again later or on a different instance.")
QUEUED_TOKENS_MESSAGE = ("The engine has reached its prefill token backlog limit. "
                         "Please try again later or on a different instance.")


class Rejected(Exception):
    """The request is answered at once with ``status``."""

    def __init__(self, status: int, message: str, kind: str, *, raw: tuple[bytes, bytes] | None = None,
                 dead_engine: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind  # the OpenAI error type
        self.raw = raw  # (body, content type) of an answer that is not vLLM's JSON (a balancer's)
        self.dead_engine = dead_engine  # the dead engine that answered: its server exits after it


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
    requests: list[SimRequest] | None = None  # n sequences of one request
    core: EngineCore | None = None

    @property
    def request(self) -> SimRequest | None:
        return self.requests[0] if self.requests else None


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
        self.death = ServerDeath(self)
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
        before = self.model
        self.model = model
        for index, core in enumerate(self.cores):
            core.model = model
            if model.engine_down(index) and not before.engine_down(index):
                self._wake(core.fail_all(DEAD_MESSAGE))  # what a dead engine held fails with it
            self.poke(core)  # a raised capacity admits waiters now
        self.death.schedule_exits(revive=True)

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
        if self.fail_next > 0:
            self.fail_next -= 1
            return Rejected(m.fail_status, f"injected failure ({m.fail_status})", "InternalServerError")
        if m.fail_rate > 0 and self.rng.random() < m.fail_rate:
            return Rejected(m.fail_status, f"injected failure ({m.fail_status})", "InternalServerError")
        return None

    def submit(self, ticket: Ticket, *, prompt_tokens: int, max_tokens: int | None, n: int = 1) -> list[SimRequest]:
        """Hand the request's ``n`` sequences to an engine, or raise :class:`Rejected`. Never waits."""
        m = self.model
        fixed = m.service_ms is not None or m.kind == "embedding"
        answer = 0 if m.kind == "embedding" else min(m.tokens, max_tokens or m.tokens)
        context = m.context_limit
        if prompt_tokens + answer > context:
            raise Rejected(400, f"This model's maximum context length is {context} tokens. However, you requested "
                                f"{prompt_tokens + answer} tokens ({prompt_tokens} in the messages, {answer} in "
                                "the completion). Please reduce the length of the messages or completion.",
                           "BadRequestError")
        index = self._choose_core()
        core = self.cores[index]
        if m.engine_down(index) or index in self.death.exited:
            if index in self.death.exited:  # only a balancer is left to answer for it
                body, content_type = BALANCER_ANSWERS[m.balancer_status]
                raise Rejected(m.balancer_status, body.decode(), "BalancerError", raw=(body, content_type))
            raise Rejected(500, DEAD_MESSAGE, "InternalServerError", dead_engine=index)
        self._check_limits(core, n)
        now = loop_time()
        listener = asyncio.Event()  # one per request: its handler wakes on any sequence's change
        requests = []
        for _ in range(n):
            request = SimRequest(
                prompt_tokens=prompt_tokens,
                max_tokens=answer,
                arrived=ticket.arrived,
                queued_at=now,
                finish_reason="length" if m.kind == "chat" and answer < m.tokens else "stop",
                service_s=service_seconds(m, core.rng) if fixed else None,
                defer_until=now + m.defer_ms / 1000,
                listener=listener,
            )
            if self.hang_next > 0:
                self.hang_next -= 1
                request.hang_s = m.hang_s
            if self.error_next > 0:
                self.error_next -= 1
                request.fail_after = 1
            requests.append(request)
        for request in requests:
            core.add(request)
        ticket.requests, ticket.core = requests, core
        self.poke(core)
        return requests

    def _choose_core(self) -> int:
        m = self.model
        cores = range(len(self.cores))
        if m.overflow == "gateway":
            free = [i for i in cores if not self._gateway_busy(self.cores[i])]
            if not free:
                raise Rejected(m.reject_status,
                               f"model {m.name!r} is at capacity ({m.capacity}): every worker is busy",
                               "OverloadedError")
            return free[0]
        if m.data_parallel:  # vLLM's DP coordinator balances by queue length
            return min(cores, key=lambda i: self.cores[i].unfinished())
        index = self._next_replica % len(self.cores)
        self._next_replica += 1
        return index

    def _gateway_busy(self, core: EngineCore) -> bool:
        m = self.model
        if m.gateway_thresholds:  # NVIDIA Dynamo's busy rule: either threshold passed
            kv = m.gateway_kv_threshold is not None and core.used_blocks / m.kv_blocks > m.gateway_kv_threshold
            prefill = (m.gateway_prefill_tokens_threshold is not None
                       and core.prefill_tokens_left() > m.gateway_prefill_tokens_threshold)
            return kv or prefill
        # A request just handed over waits for the engine's next pass: count it.
        return core.unfinished() >= m.capacity

    def _check_limits(self, core: EngineCore, n: int) -> None:
        """vLLM's ``AsyncLLM.check_admission(n)``: refuse when the unfinished
        sequences plus this request's ``n`` would pass ``max_num_queued_reqs``,
        or when the prompt tokens still in prefill are already at
        ``max_num_queued_tokens`` (the new prompt is not added: an idle engine
        admits any prompt). The request limit is checked first."""
        m = self.model
        # In data-parallel mode the API server counts across ranks; replicas are separate servers.
        scope = self.cores if m.data_parallel else [core]
        reason = message = None
        if m.max_num_queued_reqs is not None and sum(c.unfinished() for c in scope) + n > m.max_num_queued_reqs:
            reason, message = "max_num_queued_reqs", QUEUE_OVERFLOW_MESSAGE
        elif m.max_num_queued_tokens is not None and sum(c.queued_tokens() for c in scope) >= m.max_num_queued_tokens:
            reason, message = "max_num_queued_tokens", QUEUED_TOKENS_MESSAGE
        if reason is not None:
            self.rejections[reason] = self.rejections.get(reason, 0) + 1
            raise Rejected(503, message, "Service Unavailable")

    def abort(self, ticket: Ticket) -> None:
        pending = [r for r in ticket.requests or () if not r.done]
        for request in pending:
            ticket.core.abort(request)
        if pending:
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
            "scheduler_waiting": total("scheduler_waiting"),
            "waiting_capacity": total("waiting_capacity"),
            "waiting_deferred": total("waiting_deferred"),
            "queued_prompt_tokens": sum(core.queued_tokens() for core in self.cores),
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
            "aborted": total("aborted"),
            "admission_rejections": dict(self.rejections),
            "down": m.down,
            "down_replicas": list(m.down_replicas),
            "exited_replicas": sorted(self.death.exited),
            "keep_alive_on_engine_death": m.keep_alive_on_engine_death,
            "max_model_len": m.context_limit,
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


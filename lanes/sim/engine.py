"""One simulated vLLM engine: a scheduler stepping over a KV cache, on an injected clock.

Nothing here sleeps, reads a clock or knows about HTTP: every call takes
``now``, :meth:`EngineCore.advance` does what is due at that time and
:meth:`EngineCore.next_wakeup` says when it must be called next. The HTTP
layer drives it from its event loop; a test or a discrete-event harness can
drive it with any clock and get the same answer for the same inputs.

What it imitates from vLLM's v1 scheduler:

- a request is admitted only if ``running < capacity`` (``max_num_seqs``),
  its prompt fits in the free KV blocks and the step's token budget
  (``max_num_batched_tokens``, shared with the decodes) has room; the queue
  is FIFO and stops at a head that does not fit;
- a running request holds a KV block per ``block_size`` tokens of prompt
  plus generated text; when the next token needs a block and none is free,
  the newest running request is preempted: its blocks are freed, it goes
  back to the front of the queue to redo its prefill (prompt and what it had
  generated), ``preemptions`` rises, and nothing new is admitted that step;
- a request whose ``defer_until`` has not come (a grammar compiling) is
  skipped when the scheduler reaches it, keeps its place, and from then
  counts as waiting with reason ``deferred``;
- each step costs what the step law says (``model.step_seconds``): the
  batch and its context slow every token from the first request on;
- gauges are snapshotted once per step and published with a lag (``stats``);
  the waiting gauge counts what a schedule left waiting, as vLLM's scheduler
  queue does: a request that arrives during a step joins that queue at the
  next schedule, which admits it if there is room, so it is never published
  as waiting for capacity the batch has;
  an abort changes the exact counts at once but no gauge until a step runs,
  and is not a success (``request_success_total`` counts finished requests).

Time is the engine's own: a step that follows another starts when the one
before ended, not when the event loop got round to it, so a busy machine
delays when tokens are *delivered* but not the times the engine records
(histograms, TTFT). A request is considered by a step only once it has
arrived (``queued_at``).
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from lanes.sim.model import SimModel, step_seconds
from lanes.sim.stats import EngineCounters, GaugeSnapshot, PublishedGauges

WAITING, RUNNING, FINISHED, ABORTED, FAILED = "waiting", "running", "finished", "aborted", "failed"


@dataclass(eq=False)
class SimRequest:
    """One request inside an engine. The engine changes the fields below the line."""

    prompt_tokens: int
    max_tokens: int  # tokens to generate
    arrived: float
    queued_at: float = 0.0  # when the engine got it (after tokenizing)
    finish_reason: str = "stop"  # "length" when max_tokens cut the model's answer
    service_s: float | None = None  # fixed mode: the whole answer this long after admission
    defer_until: float = 0.0
    hang_s: float = 0.0  # stalls this long after admission, holding its slot
    fail_after: int | None = None  # fails mid-generation after this many tokens
    listener: Any = None  # the HTTP layer's wake-up handle; never read here
    # ---- engine state
    state: str = "new"
    generated: int = 0
    computed: int = 0  # tokens of this admission's prefill already processed
    blocks: int = 0
    skipped: bool = False
    left_waiting: bool = False  # a schedule found it and left it waiting (the gauge's own count)
    # Left waiting at least once because the batch was full (max_num_seqs) or the KV cache had no
    # room (or preempted), not only for a step's token budget: what a narrower width would avoid.
    waited_for_room: bool = False
    room_mark: int = 0  # the engine's count of schedules stalled for room when it joined the queue
    first_scheduled: float | None = None
    stall_until: float = 0.0
    due: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    error: str | None = None

    @property
    def prefill_target(self) -> int:
        # After a preemption the prefill recomputes what was generated too.
        return self.prompt_tokens + self.generated

    @property
    def prefilled(self) -> bool:
        return self.computed >= self.prefill_target

    @property
    def done(self) -> bool:
        return self.state in (FINISHED, ABORTED, FAILED)


@dataclass
class Step:
    end: float
    decode: list[SimRequest] = field(default_factory=list)
    prefill: list[tuple[SimRequest, int]] = field(default_factory=list)


class EngineCore:
    """One engine (a replica, or a data-parallel rank) of a model."""

    def __init__(self, model: SimModel, rng: random.Random) -> None:
        self.model = model  # replaced by the served model on a runtime change
        self.rng = rng
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []  # in admission order: the newest is last
        self.used_blocks = 0
        self.step: Step | None = None
        self.counters = EngineCounters()
        self.published = PublishedGauges()
        self.max_running = 0
        self.room_stalls = 0  # schedules whose queue head found no room (see SimRequest.waited_for_room)

    # --- requests in and out ---------------------------------------------------

    def add(self, request: SimRequest) -> None:
        request.state = WAITING
        request.room_mark = self.room_stalls
        self.waiting.append(request)

    def abort(self, request: SimRequest) -> None:
        """The client went away: free what it holds. No gauge changes until a step."""
        if request.done:
            return
        self._leave(request)
        request.state = ABORTED
        self.counters.aborted += 1

    def fail_all(self, message: str) -> list[SimRequest]:
        """The engine died: every request it holds ends with ``message``."""
        failed = [*self.running, *self.waiting]
        for request in failed:
            self._leave(request)
            request.state, request.error = FAILED, message
        return failed

    def _leave(self, request: SimRequest) -> None:
        if request.state == WAITING:
            self.waiting.remove(request)
        elif request.state == RUNNING:
            self.running.remove(request)
            self._free(request)
            if self.step is not None:
                self.step.decode = [r for r in self.step.decode if r is not request]
                self.step.prefill = [(r, n) for r, n in self.step.prefill if r is not request]

    # --- time ------------------------------------------------------------------------

    def advance(self, now: float) -> list[SimRequest]:
        """Do everything due by ``now``; return the requests that changed."""
        changed: list[SimRequest] = []
        acted = False
        for request in [r for r in self.running if r.due is not None and r.due <= now]:
            self._finish_whole(request, request.due)  # at its own time, however late the wake-up
            changed.append(request)
            acted = True
        # Steps back to back keep their own times (bounded: a late wake-up catches up).
        for _ in range(100_000):
            if self.step is None or self.step.end > now:
                break
            end = self.step.end
            # A step left empty by aborts reports nothing, as in vLLM, where
            # aborts are applied after the step's stats are made: the gauges
            # stay stale until a step with work runs.
            worked = self._complete_step(end, changed)
            acted = worked or acted
            self.step = None
            if worked:
                self.published.record(self.snapshot(end), self.model.metrics_lag_s)
                acted = self._schedule(end) or acted
        if self.step is None:
            acted = self._schedule(now) or acted
        if acted:
            self.published.record(self.snapshot(now), self.model.metrics_lag_s)
        return changed

    def next_wakeup(self, now: float) -> float | None:
        """When :meth:`advance` next has something to do (None: only on a new event)."""
        times = [r.due for r in self.running if r.due is not None]
        times += [r.stall_until for r in self.running if r.stall_until > now]
        times += [r.defer_until for r in self.waiting if r.defer_until > now]
        if self.step is not None:
            times.append(self.step.end)
        return min(times) if times else None

    # --- the scheduler ------------------------------------------------------------

    def _schedule(self, now: float) -> bool:
        """Plan one step starting at ``now``; True when the engine held requests to consider."""
        m = self.model
        step = Step(end=now)
        budget = m.max_num_batched_tokens
        preemptions = self.counters.preemptions
        for request in list(self.running):
            if request.state != RUNNING or request.due is not None or request.stall_until > now:
                continue
            if request.prefilled and self._grow(request):
                step.decode.append(request)
                budget -= 1
        for request in self.running:
            if request.due is None and not request.prefilled and request.stall_until <= now and budget > 0:
                chunk = min(request.prefill_target - request.computed, budget)
                step.prefill.append((request, chunk))
                budget -= chunk
        # As vLLM: a step that had to preempt admits nobody new.
        preempted = self.counters.preemptions > preemptions
        admitted = False if preempted else self._admit(now, step, budget)
        if preempted or self._head_without_room(now):
            self.room_stalls += 1
        if step.decode or step.prefill:
            prefill_tokens = sum(n for _, n in step.prefill)
            context = sum(r.prompt_tokens + r.generated for r in step.decode)
            context += sum(r.computed + n for r, n in step.prefill)
            step.end = now + step_seconds(m, self.rng, sequences=len(step.decode) + len(step.prefill),
                                          prefill_tokens=prefill_tokens, context_tokens=context)
            self.step = step
            self.counters.steps += 1
        # What this schedule left waiting. Requests that arrived since the
        # last schedule are appended at the tail and nothing else is unmarked
        # (the requeued go to the front marked): mark from the tail back; one
        # not yet arrived (``queued_at`` ahead) is not in the queue yet.
        for request in reversed(self.waiting):
            if request.left_waiting:
                break
            if request.queued_at <= now:
                request.left_waiting = True
        # vLLM steps (and reports) whenever it holds requests, even when it can
        # schedule none of them; with none left it stays idle, gauges unchanged.
        return admitted or self.step is not None or bool(self.waiting) or bool(self.running)

    def _head_without_room(self, now: float) -> bool:
        """Whether the first request the queue holds now waits for a slot or KV blocks (everything
        behind it waits as long): not for the step's token budget, which the next step renews."""
        head = next((r for r in self.waiting if r.queued_at <= now and r.defer_until <= now), None)
        if head is None:
            return False
        if len(self.running) >= self.model.capacity:
            return True
        return self._blocks_to_admit(head) > self.free_blocks

    def _blocks_to_admit(self, request: SimRequest) -> int:
        """The KV blocks ``request`` takes when admitted (a fixed-time request holds its whole answer's)."""
        fixed = request.service_s is not None
        return self.model.blocks_for(request.prompt_tokens + (request.max_tokens if fixed else request.generated))

    def _grow(self, request: SimRequest) -> bool:
        """Reserve the block for ``request``'s next token, preempting the newest
        requests until it fits; False when ``request`` itself was preempted."""
        need = self.model.blocks_for(request.prompt_tokens + request.generated + 1) - request.blocks
        while need > self.free_blocks:
            victim = next((r for r in reversed(self.running) if r.due is None), None)
            self._preempt(victim)
            if victim is request:
                return False
        self.used_blocks += need
        request.blocks += need
        return True

    def _preempt(self, request: SimRequest) -> None:
        self.running.remove(request)
        self._free(request)
        request.computed = 0
        request.state = WAITING
        request.left_waiting = request.waited_for_room = True
        self.waiting.appendleft(request)
        self.counters.preemptions += 1

    def _admit(self, now: float, step: Step, budget: int) -> bool:
        m = self.model
        admitted = False
        skipped: list[SimRequest] = []
        while self.waiting and len(self.running) < m.capacity:
            request = self.waiting[0]
            if request.queued_at > now:  # arrives after this step begins
                break
            if request.defer_until > now:
                self.waiting.popleft()
                request.skipped = True
                skipped.append(request)
                continue
            fixed = request.service_s is not None
            need = self._blocks_to_admit(request)
            if need > self.free_blocks or (not fixed and budget <= 0):
                break
            self.waiting.popleft()
            request.waited_for_room |= self.room_stalls > request.room_mark
            request.state, request.blocks = RUNNING, need
            self.used_blocks += need
            self.running.append(request)
            self.max_running = max(self.max_running, len(self.running))
            admitted = True
            if request.first_scheduled is None:
                request.first_scheduled = now
                request.stall_until = now + request.hang_s
            if fixed:
                request.due = request.stall_until + request.service_s
            elif request.stall_until <= now:
                chunk = min(request.prefill_target, budget)
                step.prefill.append((request, chunk))
                budget -= chunk
        self.waiting.extendleft(reversed(skipped))  # skipped requests keep their places
        return admitted

    # --- outputs -------------------------------------------------------------------------

    def _complete_step(self, now: float, changed: list[SimRequest]) -> bool:
        step = self.step
        if not step.prefill and not step.decode:
            return False
        for request, chunk in step.prefill:
            request.computed += chunk
            self.counters.prompt_tokens += chunk
            if request.prefilled:
                self._emit(request, now, changed)
        for request in step.decode:
            if request.state == RUNNING:
                self._emit(request, now, changed)
        return True

    def _emit(self, request: SimRequest, now: float, changed: list[SimRequest]) -> None:
        """One new token for ``request`` at ``now``."""
        request.generated += 1
        request.computed = request.prefill_target
        self.counters.generation_tokens += 1
        if request.first_token_at is None:
            request.first_token_at = now
            self.counters.ttft.observe(now - request.arrived)
        else:
            self.counters.inter_token.observe(now - request.last_token_at)
        request.last_token_at = now
        changed.append(request)
        if request.fail_after is not None and request.generated >= request.fail_after:
            self._leave(request)
            request.state, request.error = FAILED, "injected failure during generation"
        elif request.generated >= request.max_tokens:
            self._finish(request, now)

    def _finish_whole(self, request: SimRequest, now: float) -> None:
        """A fixed-mode request: the whole answer at once (or its injected failure)."""
        if request.fail_after is not None:
            self._leave(request)
            request.state, request.error = FAILED, "injected failure during generation"
            return
        request.generated = request.max_tokens
        self.counters.prompt_tokens += request.prompt_tokens
        self.counters.generation_tokens += request.max_tokens
        request.first_token_at = request.last_token_at = now
        self.counters.ttft.observe(now - request.arrived)
        self._finish(request, now)

    def _finish(self, request: SimRequest, now: float) -> None:
        self.running.remove(request)
        self._free(request)
        request.state = FINISHED
        self.counters.success[request.finish_reason] += 1
        self.counters.e2e.observe(now - request.arrived)
        # vLLM records the queue time when the request finishes.
        self.counters.queue_time.observe(request.first_scheduled - request.arrived)

    def _free(self, request: SimRequest) -> None:
        self.used_blocks -= request.blocks
        request.blocks = 0

    # --- reporting -----------------------------------------------------------------------

    @property
    def free_blocks(self) -> int:
        return self.model.kv_blocks - self.used_blocks

    @property
    def kv_usage(self) -> float:
        return min(1.0, self.used_blocks / self.model.kv_blocks)

    def deferred(self, now: float) -> int:
        return sum(1 for r in self.waiting if r.skipped and r.defer_until > now)

    def snapshot(self, now: float, *, exact: bool = False) -> GaugeSnapshot:
        """The gauges now; ``exact`` counts every request not yet admitted,
        the scheduler's view (the default, what a step publishes) only those
        a schedule has already left waiting."""
        deferred = self.deferred(now)
        waiting = len(self.waiting) if exact else sum(1 for r in self.waiting if r.left_waiting)
        return GaugeSnapshot(at=now, running=len(self.running), waiting_capacity=waiting - deferred,
                             waiting_deferred=deferred, kv_usage=self.kv_usage)

    def unfinished(self) -> int:
        """Sequences not finished (vLLM's ``get_num_unfinished_requests``)."""
        return len(self.running) + len(self.waiting)

    def prefill_tokens_left(self) -> int:
        """Prompt tokens still to prefill, waiting or running (Dynamo's ``active_prefill_tokens``)."""
        return sum(r.prefill_target - r.computed for r in (*self.running, *self.waiting) if not r.prefilled)

    def queued_tokens(self) -> int:
        """Prompt tokens of requests still in prefill: no token out yet (vLLM's
        ``OutputProcessor.get_num_queued_tokens``; a preempted request that had
        emitted tokens is no longer prefilling there)."""
        return sum(r.prompt_tokens for r in (*self.running, *self.waiting) if r.generated == 0)

    def stats(self, now: float) -> dict[str, Any]:
        exact = self.snapshot(now, exact=True)
        return {
            "running": exact.running,
            "waiting": exact.waiting,
            "scheduler_waiting": self.snapshot(now).waiting,  # what the gauge would say, with no lag
            "waiting_capacity": exact.waiting_capacity,
            "waiting_deferred": exact.waiting_deferred,
            "kv_cache_usage": round(exact.kv_usage, 6),
            "kv_blocks_used": self.used_blocks,
            "max_running": self.max_running,
            "preemptions": self.counters.preemptions,
            "steps": self.counters.steps,
            "aborted": self.counters.aborted,
        }

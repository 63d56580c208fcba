"""What one simulated model is: its limits, overload answer, KV cache and timing laws.

A :class:`SimModel` is a typed, immutable description; the served model keeps
the live copy and replaces it (``dataclasses.replace``) when the admin endpoint
changes it, so every change goes through the same validation.

Two timing modes (see ``engine`` for the scheduler that applies them):

- ``service_ms`` set: a fixed total. The whole answer is ready ``service_ms``
  after admission (first token included), whatever else runs, which keeps
  simple benchmarks exact. Such a request reserves the KV blocks of its whole
  answer at admission and is never preempted.
- otherwise vLLM-like steps. Every running request advances by one token per
  engine step; a step that holds a prefill costs ``ttft_ms`` instead of
  ``per_token_ms``, plus ``prefill_ms_per_token`` per prompt token it
  processes (at most ``max_num_batched_tokens`` tokens per step, shared with
  the decodes), plus ``context_ms_per_1k`` per thousand tokens of context in
  the batch. Past ``knee`` the base cost grows with load (see
  :func:`knee_factor`). So a short prompt on an idle engine sees its first
  token after ``ttft_ms`` and the answer after ``ttft_ms + per_token_ms *
  (tokens - 1)``; a long prompt, a queue or a full batch make both longer.

``distribution="lognormal"`` multiplies the time (a fixed service time per
request, or each step) by a lognormal factor of mean 1 and log-sigma
``sigma``, so the configured time stays the mean. Draws come from a
``random.Random`` seeded with ``(seed, name, engine index)``: reproducible.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields
from typing import Literal

from lanes.errors import InvalidInput

Overflow = Literal["queue", "gateway"]
Kind = Literal["chat", "embedding"]
Distribution = Literal["fixed", "lognormal"]
MetricsFlavor = Literal["current", "0.12-0.19", "0.9.2-0.10", "legacy"]

OVERFLOWS = ("queue", "gateway")
KINDS = ("chat", "embedding")
DISTRIBUTIONS = ("fixed", "lognormal")
# Which vLLM releases each flavour's /metrics imitates: docs/SIMULATOR.md.
FLAVORS = ("current", "0.12-0.19", "0.9.2-0.10", "legacy")
DEFAULT_KNEE_SLOWDOWN = 0.5


@dataclass(frozen=True, kw_only=True)
class SimModel:
    """One model served by the simulator.

    ``capacity`` is vLLM's ``max_num_seqs`` (0 holds every request in the
    queue until raised). A request also waits while its prompt does not fit
    in the free KV blocks (``kv_blocks`` of ``block_size`` tokens) or the
    step's token budget is spent. When a running request needs a block for its
    next token and none is free, the newest running request is preempted.

    Overload, as vLLM answers it (``overflow="queue"``): the queue is
    unbounded unless ``max_num_queued_reqs`` (running plus waiting) or
    ``max_num_queued_tokens`` (their prompt tokens) is set, past which a
    request is answered 503. ``overflow="gateway"`` answers ``reject_status``
    (529 by default, as NVIDIA Dynamo does) whenever no slot is free.

    ``defer_ms`` keeps each request unschedulable that long (as vLLM does
    while a grammar compiles); it counts as waiting with reason ``deferred``
    once the scheduler has reached it and skipped it. ``tokenize_ms`` is spent
    before the engine sees a request: counted in flight, in no gauge.

    Failure injection at start (the admin endpoint changes them at runtime):
    ``fail_rate`` of requests answer ``fail_status``; ``down`` is a dead
    engine (500 per request, 503 on /health); ``hang_s`` is how long a request
    told to hang stalls.

    ``replicas`` engines serve the model behind one address: as separate
    servers behind a load balancer (each /metrics scrape answered by one of
    them), or with ``data_parallel`` as one server whose /metrics has a series
    per ``engine`` rank. Gauges in /metrics are published per engine step and
    become visible ``metrics_lag_s`` later; /admin/stats is exact.
    ``port`` serves the model on its own port instead of the main one.
    ``device`` names the GPUs the model runs on: models sharing a device are
    counted together too (``device_max_in_flight``).
    """

    name: str
    capacity: int = 16
    kind: Kind = "chat"
    overflow: Overflow = "queue"
    reject_status: int = 529
    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None
    kv_blocks: int = 4096
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    service_ms: float | None = None
    ttft_ms: float = 50.0
    per_token_ms: float = 10.0
    prefill_ms_per_token: float = 0.02
    context_ms_per_1k: float = 0.05
    tokens: int = 16
    distribution: Distribution = "fixed"
    sigma: float = 0.5
    seed: int = 0
    knee: float = 0.8
    knee_slowdown: float | None = None
    defer_ms: float = 0.0
    tokenize_ms: float = 0.0
    embedding_ms: float = 5.0
    embedding_dim: int = 8
    fail_rate: float = 0.0
    fail_status: int = 500
    down: bool = False
    hang_s: float = 3600.0
    metrics_flavor: MetricsFlavor = "current"
    metrics_lag_s: float = 3.0
    replicas: int = 1
    data_parallel: bool = False
    port: int | None = None
    device: str | None = None  # models on one device (a pool's GPUs) share its peak count

    def __post_init__(self) -> None:
        problems = list(_problems(self))
        if problems:
            raise InvalidInput(f"model {self.name!r}: " + "; ".join(problems))

    @property
    def slowdown(self) -> float:
        if self.knee_slowdown is not None:
            return self.knee_slowdown
        return 0.0 if self.service_ms is not None else DEFAULT_KNEE_SLOWDOWN

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)


FIELD_NAMES = frozenset(f.name for f in fields(SimModel))
# Fields that cannot change at runtime: the name is the key, the port is bound,
# the engines behind the address are made once.
FIXED_FIELDS = frozenset({"name", "port", "device", "replicas", "data_parallel"})
NON_NEGATIVE = ("ttft_ms", "per_token_ms", "prefill_ms_per_token", "context_ms_per_1k", "sigma",
                "defer_ms", "tokenize_ms", "embedding_ms", "hang_s", "metrics_lag_s")


def _problems(m: SimModel):
    if not isinstance(m.name, str) or not m.name.strip():
        yield f"name {m.name!r} must be a non-empty string"
    if not _is_int(m.capacity) or m.capacity < 0:
        yield f"capacity {m.capacity!r} must be an integer >= 0"
    if m.kind not in KINDS:
        yield f"kind {m.kind!r} must be one of {', '.join(KINDS)}"
    if m.overflow not in OVERFLOWS:
        yield f"overflow {m.overflow!r} must be one of {', '.join(OVERFLOWS)} (gateway answers reject_status when full)"
    for label in ("reject_status", "fail_status"):
        value = getattr(m, label)
        if not _is_int(value) or not 400 <= value <= 599:
            yield f"{label} {value!r} must be an HTTP error status 400-599"
    for label in ("max_num_queued_reqs", "max_num_queued_tokens"):
        value = getattr(m, label)
        if value is not None and (not _is_int(value) or value < 1):
            yield f"{label} {value!r} must be an integer >= 1 or null (unbounded)"
    for label in ("kv_blocks", "block_size", "max_num_batched_tokens", "replicas"):
        if not _is_int(getattr(m, label)) or getattr(m, label) < 1:
            yield f"{label} {getattr(m, label)!r} must be an integer >= 1"
    if m.service_ms is not None and not _non_negative(m.service_ms):
        yield f"service_ms {m.service_ms!r} must be a number >= 0 or null"
    for label in NON_NEGATIVE:
        if not _non_negative(getattr(m, label)):
            yield f"{label} {getattr(m, label)!r} must be a number >= 0"
    if not _is_int(m.tokens) or m.tokens < 1:
        yield f"tokens {m.tokens!r} must be an integer >= 1"
    if m.distribution not in DISTRIBUTIONS:
        yield f"distribution {m.distribution!r} must be one of {', '.join(DISTRIBUTIONS)}"
    if not _is_int(m.seed):
        yield f"seed {m.seed!r} must be an integer"
    if not isinstance(m.knee, (int, float)) or not 0 <= m.knee < 1:
        yield f"knee {m.knee!r} must be a fraction of capacity in [0, 1)"
    if m.knee_slowdown is not None and not _non_negative(m.knee_slowdown):
        yield f"knee_slowdown {m.knee_slowdown!r} must be a number >= 0 or null"
    if not _is_int(m.embedding_dim) or not 1 <= m.embedding_dim <= 4096:
        yield f"embedding_dim {m.embedding_dim!r} must be an integer in 1..4096"
    if not isinstance(m.fail_rate, (int, float)) or not 0 <= m.fail_rate <= 1:
        yield f"fail_rate {m.fail_rate!r} must be a probability in [0, 1]"
    for label in ("down", "data_parallel"):
        if not isinstance(getattr(m, label), bool):
            yield f"{label} {getattr(m, label)!r} must be true or false"
    if m.metrics_flavor not in FLAVORS:
        yield f"metrics_flavor {m.metrics_flavor!r} must be one of {', '.join(FLAVORS)}"
    if m.port is not None and (not _is_int(m.port) or not 1 <= m.port <= 65535):
        yield f"port {m.port!r} must be 1..65535 or null (the main port)"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _non_negative(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def new_rng(model: SimModel, index: int = 0) -> random.Random:
    # A string seed is hashed deterministically (sha512), unlike hash().
    return random.Random(f"{model.seed}:{model.name}:{index}")


def knee_factor(model: SimModel, load: float) -> float:
    """How much slower the engine is at ``load`` (0..1: the larger of
    running / capacity and KV usage): 1 up to the knee, then linearly up to
    ``1 + slowdown`` at full load."""
    slowdown = model.slowdown
    if slowdown == 0:
        return 1.0
    return 1.0 + slowdown * max(0.0, min(load, 1.0) - model.knee) / (1.0 - model.knee)


def jitter(model: SimModel, rng: random.Random) -> float:
    if model.distribution == "lognormal" and model.sigma > 0:
        # mu = -sigma^2/2 gives the factor a mean of exactly 1.
        return rng.lognormvariate(-model.sigma**2 / 2, model.sigma)
    return 1.0


def service_seconds(model: SimModel, rng: random.Random) -> float:
    """The fixed-mode time of one request (``service_ms`` or an embedding)."""
    base = model.service_ms if model.kind == "chat" else model.embedding_ms
    return (base or 0.0) / 1000 * jitter(model, rng)


def step_seconds(
    model: SimModel, rng: random.Random, *, load: float, prefill_tokens: int, context_tokens: int
) -> float:
    """How long one engine step takes.

    A step with prefill work costs ``ttft_ms`` as its base (a prefill pass),
    one with only decodes ``per_token_ms``; the base grows past the knee; the
    prompt tokens processed and the context attended add their own share.
    """
    base = model.ttft_ms if prefill_tokens else model.per_token_ms
    seconds = base * knee_factor(model, load) * jitter(model, rng)
    seconds += prefill_tokens * model.prefill_ms_per_token + context_tokens / 1000 * model.context_ms_per_1k
    return seconds / 1000

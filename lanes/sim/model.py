"""What one simulated model is: its limits, overload answer, KV cache and step-time law.

A :class:`SimModel` is a typed, immutable description; the served model keeps
the live copy and replaces it (``dataclasses.replace``) when the admin endpoint
changes it, so every change goes through the same validation.

The physical mode (the default) is vLLM's: every engine step gives each
running sequence one token (or a chunk of its prompt) and costs

    step = per_token_ms                      (a: the weights read once per step)
         + per_seq_ms x sequences in the step        (b)
         + context_ms_per_1k x context tokens / 1000 (c: the KV cache the step attends)
         + prefill_ms_per_token x prompt tokens it processes
         + ttft_ms if the step holds prefill work (a fixed extra, 0 by default)

so a request's time per token grows with the batch and its context from the
first request on; ``capacity`` (``max_num_seqs``) and the KV cache only limit
how many run. The defaults are a 7-8B model in BF16 on one H100 80GB, fitted to
published vLLM figures (see :data:`H100_LLAMA_8B`).

``service_ms`` set is the *fixed* mode: the whole answer ``service_ms`` after
admission, whatever else runs. It is not physical (a batch costs nothing, so
latency jumps from flat to a whole service time at ``max_num_seqs``); routing
benchmarks that need exact service times use it, and no control test does.

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
MetricsFlavor = Literal["current", "0.20-0.28", "0.12-0.19", "0.9.2-0.11", "legacy"]

OVERFLOWS = ("queue", "gateway")
KINDS = ("chat", "embedding")
DISTRIBUTIONS = ("fixed", "lognormal")
# Which vLLM releases each flavour's /metrics imitates: docs/SIMULATOR.md.
FLAVORS = ("current", "0.20-0.28", "0.12-0.19", "0.9.2-0.11", "legacy")
# vLLM's queue limits (--max-num-queued-reqs/-tokens) and their rejection counter exist
# only in the current flavour: an older server has neither.
QUEUE_LIMIT_FLAVORS = ("current",)
BALANCER_STATUSES = (502, 503)


@dataclass(frozen=True)
class StepTimes:
    """The step-time law's parameters for one model and GPU (milliseconds)."""

    per_token_ms: float  # a: a step's fixed cost (the weights read once)
    per_seq_ms: float  # b: per sequence in the step
    context_ms_per_1k: float  # c: per 1000 tokens of context the step attends
    prefill_ms_per_token: float  # per prompt token the step processes


# Llama-3.1-8B-Instruct (BF16) on one H100-80GB under vLLM 0.21, from the published
# concurrency sweep https://yobitelcomm.github.io/bench/recipes/concurrency-sweep/
# (TPOT p50 6.48 ms at 1 concurrent request, 6.59 ms at 4; TTFT p50 13.98 ms at 1):
# a + b = 6.48 and a + 4b = 6.59 give a = 6.44, b = 0.037. c is the KV cache read per
# step: 128 KiB per token (32 layers x 8 KV heads x 128 dims x K,V x 2 bytes) at the
# H100's 3.35 TB/s is 0.039 ms per 1000 tokens. The prefill cost is 16 GFLOP per token
# (2 x 8B parameters) at ~460 TFLOP/s effective, 0.035 ms, which puts the sweep's TTFT
# at its ~200-token chat prompts. The same sweep's 16- and 64-request points (TPOT
# 10.9 and 46.9 ms) are steeper than this law gives; docs/SIMULATOR.md compares them.
H100_LLAMA_8B = StepTimes(per_token_ms=6.44, per_seq_ms=0.037, context_ms_per_1k=0.039, prefill_ms_per_token=0.035)


@dataclass(frozen=True, kw_only=True)
class SimModel:
    """One model served by the simulator.

    ``capacity`` is vLLM's ``max_num_seqs`` (0 holds every request in the
    queue until raised): a limit, not the latency knob; the step law above
    sets the latency. A request also waits while its prompt does not fit in
    the free KV blocks (``kv_blocks`` of ``block_size`` tokens) or the step's
    token budget (``max_num_batched_tokens``, which chunks long prompts) is
    spent. When a running request needs a block for its next token and none
    is free, the newest running request is preempted. ``max_model_len`` caps
    prompt plus answer (default: the whole KV cache).

    Overload, as vLLM answers it (``overflow="queue"``): the queue is
    unbounded unless ``max_num_queued_reqs`` (sequences not finished: running
    plus waiting) or ``max_num_queued_tokens`` (prompt tokens of requests
    still in prefill) is set, as vLLM's ``AsyncLLM.check_admission`` counts
    them, past which a request is answered 503. ``overflow="gateway"``
    answers ``reject_status`` (529 by default, as NVIDIA Dynamo does) when
    every engine is busy: with Dynamo's thresholds set, an engine is busy when
    its KV blocks in use pass ``gateway_kv_threshold`` (a fraction, Dynamo's
    ``--active-decode-blocks-threshold``) or its prompt tokens still to
    prefill pass ``gateway_prefill_tokens_threshold``
    (``--active-prefill-tokens-threshold``); with neither set, when it holds
    ``capacity`` unfinished requests (a simple gateway, not Dynamo's rule).

    ``defer_ms`` keeps each request unschedulable that long (as vLLM does
    while a grammar compiles); it counts as waiting with reason ``deferred``
    once the scheduler has reached it and skipped it. ``tokenize_ms`` is spent
    before the engine sees a request: counted in flight, in no gauge.

    Failure injection at start (the admin endpoint changes them at runtime):
    ``fail_rate`` of requests answer ``fail_status``; ``down`` is a dead
    engine (500 per request, 503 on /health, and the server exits
    ``exit_after_death_s`` later, or at once after answering a request, unless
    ``keep_alive_on_engine_death``, vLLM's ``VLLM_KEEP_ALIVE_ON_ENGINE_DEATH``);
    ``down_replicas`` kills single replicas behind the load balancer;
    ``hang_s`` is how long a request told to hang stalls.

    ``replicas`` engines serve the model behind one address: as separate
    servers behind a load balancer (each /metrics scrape answered by one of
    them; a replica whose server is gone is answered ``balancer_status``, 502
    as nginx does or 503 as Envoy and HAProxy do), or with ``data_parallel``
    as one server whose /metrics has a series per ``engine`` rank. Gauges in
    /metrics are published per engine step and become visible
    ``metrics_lag_s`` later; /admin/stats is exact. ``port`` serves the model
    on its own port instead of the main one. ``device`` names the GPUs the
    model runs on: models sharing a device are counted together too
    (``device_max_in_flight``).
    """

    name: str
    capacity: int = 16
    kind: Kind = "chat"
    overflow: Overflow = "queue"
    reject_status: int = 529
    gateway_kv_threshold: float | None = None
    gateway_prefill_tokens_threshold: int | None = None
    max_num_queued_reqs: int | None = None
    max_num_queued_tokens: int | None = None
    kv_blocks: int = 4096
    block_size: int = 16
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    service_ms: float | None = None
    per_token_ms: float = H100_LLAMA_8B.per_token_ms
    per_seq_ms: float = H100_LLAMA_8B.per_seq_ms
    context_ms_per_1k: float = H100_LLAMA_8B.context_ms_per_1k
    prefill_ms_per_token: float = H100_LLAMA_8B.prefill_ms_per_token
    ttft_ms: float = 0.0
    tokens: int = 16
    distribution: Distribution = "fixed"
    sigma: float = 0.5
    seed: int = 0
    defer_ms: float = 0.0
    tokenize_ms: float = 0.0
    embedding_ms: float = 5.0
    embedding_dim: int = 8
    fail_rate: float = 0.0
    fail_status: int = 500
    down: bool = False
    down_replicas: tuple[int, ...] = ()
    keep_alive_on_engine_death: bool = False
    exit_after_death_s: float = 5.0
    balancer_status: int = 502
    hang_s: float = 3600.0
    metrics_flavor: MetricsFlavor = "current"
    metrics_lag_s: float = 3.0
    replicas: int = 1
    data_parallel: bool = False
    port: int | None = None
    device: str | None = None  # models on one device (a pool's GPUs) share its peak count

    def __post_init__(self) -> None:
        if isinstance(self.down_replicas, list):  # as JSON gives it
            object.__setattr__(self, "down_replicas", tuple(self.down_replicas))
        problems = list(_problems(self))
        if problems:
            raise InvalidInput(f"model {self.name!r}: " + "; ".join(problems))

    @property
    def context_limit(self) -> int:
        """The longest prompt plus answer: ``max_model_len``, or the whole KV cache."""
        return self.max_model_len if self.max_model_len is not None else self.kv_blocks * self.block_size

    @property
    def gateway_thresholds(self) -> bool:
        return self.gateway_kv_threshold is not None or self.gateway_prefill_tokens_threshold is not None

    def engine_down(self, index: int) -> bool:
        return self.down or index in self.down_replicas

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)


FIELD_NAMES = frozenset(f.name for f in fields(SimModel))
# Fields that cannot change at runtime: the name is the key, the port is bound,
# the engines behind the address are made once.
FIXED_FIELDS = frozenset({"name", "port", "device", "replicas", "data_parallel"})
NON_NEGATIVE = ("ttft_ms", "per_token_ms", "per_seq_ms", "prefill_ms_per_token", "context_ms_per_1k", "sigma",
                "defer_ms", "tokenize_ms", "embedding_ms", "hang_s", "metrics_lag_s", "exit_after_death_s")


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
        if value is not None and (not _is_int(value) or value < 0):
            yield f"{label} {value!r} must be an integer >= 0 or null (unbounded)"
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
    if not _is_int(m.embedding_dim) or not 1 <= m.embedding_dim <= 4096:
        yield f"embedding_dim {m.embedding_dim!r} must be an integer in 1..4096"
    if not isinstance(m.fail_rate, (int, float)) or not 0 <= m.fail_rate <= 1:
        yield f"fail_rate {m.fail_rate!r} must be a probability in [0, 1]"
    if m.gateway_kv_threshold is not None and (isinstance(m.gateway_kv_threshold, bool) or not isinstance(
            m.gateway_kv_threshold, (int, float)) or not 0 <= m.gateway_kv_threshold <= 1):
        yield f"gateway_kv_threshold {m.gateway_kv_threshold!r} must be a fraction in [0, 1] or null"
    if m.gateway_prefill_tokens_threshold is not None and (not _is_int(m.gateway_prefill_tokens_threshold)
                                                           or m.gateway_prefill_tokens_threshold < 0):
        yield f"gateway_prefill_tokens_threshold {m.gateway_prefill_tokens_threshold!r} must be an integer >= 0 or null"
    if m.max_model_len is not None and (not _is_int(m.max_model_len) or m.max_model_len < 1):
        yield f"max_model_len {m.max_model_len!r} must be an integer >= 1 or null (the whole KV cache)"
    if not isinstance(m.down_replicas, tuple) or not all(_is_int(i) and 0 <= i < m.replicas for i in m.down_replicas):
        yield (f"down_replicas {m.down_replicas!r} must be a list of replica indices in 0..{m.replicas - 1} "
               f"(the model has {m.replicas} replica(s))")
    if m.balancer_status not in BALANCER_STATUSES:
        yield f"balancer_status {m.balancer_status!r} must be 502 (nginx) or 503 (Envoy, HAProxy)"
    if m.metrics_flavor not in QUEUE_LIMIT_FLAVORS and (m.max_num_queued_reqs is not None
                                                        or m.max_num_queued_tokens is not None):
        yield (f"max_num_queued_reqs/max_num_queued_tokens need metrics_flavor 'current' (vLLM 0.29 and later); "
               f"a {m.metrics_flavor!r} server has no queue limits: unset them or change the flavour")
    for label in ("down", "data_parallel", "keep_alive_on_engine_death"):
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


def jitter(model: SimModel, rng: random.Random) -> float:
    if model.distribution == "lognormal" and model.sigma > 0:
        # mu = -sigma^2/2 gives the factor a mean of exactly 1.
        return rng.lognormvariate(-model.sigma**2 / 2, model.sigma)
    return 1.0


def service_seconds(model: SimModel, rng: random.Random) -> float:
    """The fixed-mode time of one request (``service_ms`` or an embedding)."""
    base = model.service_ms if model.kind == "chat" else model.embedding_ms
    return (base or 0.0) / 1000 * jitter(model, rng)


def step_seconds(model: SimModel, rng: random.Random, *, sequences: int, prefill_tokens: int,
                 context_tokens: int) -> float:
    """How long one engine step takes: the step law in the module docstring.

    ``sequences``: running sequences in the step (decodes and prefill chunks);
    ``prefill_tokens``: prompt tokens it processes; ``context_tokens``: tokens
    of KV cache its sequences attend.
    """
    ms = (model.per_token_ms + model.per_seq_ms * sequences + model.context_ms_per_1k * context_tokens / 1000
          + model.prefill_ms_per_token * prefill_tokens + (model.ttft_ms if prefill_tokens else 0.0))
    return ms * jitter(model, rng) / 1000

"""What one simulated model is: its capacity, overflow policy and service time.

A :class:`SimModel` is a typed, immutable description; the engine keeps the
live copy and replaces it (``dataclasses.replace``) when the admin endpoint
changes it, so every change goes through the same validation.

Service time (chat):

- ``service_ms`` set: a fixed total. The whole answer is ready after it (the
  first token arrives at ``service_ms``), which keeps simple benchmarks exact.
- otherwise token timing: the first of ``tokens`` tokens arrives after
  ``ttft_ms``, each next one ``per_token_ms`` later, so the total is
  ``ttft_ms + per_token_ms * (tokens - 1)``.

``distribution="lognormal"`` multiplies both by a lognormal factor of mean 1
and log-sigma ``sigma``, so the configured time stays the mean. Draws come from
a ``random.Random`` seeded with ``(seed, name)``: reproducible per model.

Like a real engine, a request admitted while the running batch is past
``knee`` x capacity is slower: factor ``1 + knee_slowdown * (load - knee) /
(1 - knee)`` where ``load = running / capacity`` (so ``1 + knee_slowdown`` at
full capacity). ``knee_slowdown`` defaults to 0.5 with token timing and to 0
with a fixed ``service_ms``, whose point is to be exact.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, fields
from typing import Literal

from lanes.errors import InvalidInput

Overflow = Literal["queue", "reject"]
Kind = Literal["chat", "embedding"]
Distribution = Literal["fixed", "lognormal"]
MetricsFlavor = Literal["current", "legacy"]

OVERFLOWS = ("queue", "reject")
KINDS = ("chat", "embedding")
DISTRIBUTIONS = ("fixed", "lognormal")
FLAVORS = ("current", "legacy")
DEFAULT_KNEE_SLOWDOWN = 0.5


@dataclass(frozen=True, kw_only=True)
class SimModel:
    """One model served by the simulator.

    ``capacity`` is vLLM's max running sequences (0 holds every request in the
    queue until raised). Beyond it a request waits FIFO (``overflow="queue"``,
    vLLM's behaviour) or is answered ``reject_status`` (``"reject"``); with
    ``max_queue`` set, a queue that long also rejects. ``defer_ms`` keeps each
    request waiting for that long with reason ``deferred`` before it competes
    for capacity (as vLLM does while, e.g., a grammar compiles).

    Failure injection at start (the admin endpoint changes them at runtime):
    ``fail_rate`` of requests answer ``fail_status``; ``down`` answers every
    request 503; ``hang_s`` is how long a request told to hang stalls.

    ``metrics_flavor="legacy"`` exports ``vllm:gpu_cache_usage_perc`` and no
    ``num_requests_waiting_by_reason``, like a vLLM older than 0.9.2.
    ``port`` serves the model on its own port instead of the main one.
    ``device`` names the GPUs the model runs on: models sharing a device are
    counted together too (``device_max_in_flight``), so a lane that several
    models share can be checked against its width.
    """

    name: str
    capacity: int = 16
    kind: Kind = "chat"
    overflow: Overflow = "queue"
    reject_status: int = 529
    max_queue: int | None = None
    service_ms: float | None = None
    ttft_ms: float = 50.0
    per_token_ms: float = 10.0
    tokens: int = 16
    distribution: Distribution = "fixed"
    sigma: float = 0.5
    seed: int = 0
    knee: float = 0.8
    knee_slowdown: float | None = None
    defer_ms: float = 0.0
    embedding_ms: float = 5.0
    embedding_dim: int = 8
    fail_rate: float = 0.0
    fail_status: int = 500
    down: bool = False
    hang_s: float = 3600.0
    metrics_flavor: MetricsFlavor = "current"
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


FIELD_NAMES = frozenset(f.name for f in fields(SimModel))
# Fields that cannot change at runtime: the name is the key, the port is bound.
FIXED_FIELDS = frozenset({"name", "port", "device"})


def _problems(m: SimModel):
    if not isinstance(m.name, str) or not m.name.strip():
        yield f"name {m.name!r} must be a non-empty string"
    if not _is_int(m.capacity) or m.capacity < 0:
        yield f"capacity {m.capacity!r} must be an integer >= 0"
    if m.kind not in KINDS:
        yield f"kind {m.kind!r} must be one of {', '.join(KINDS)}"
    if m.overflow not in OVERFLOWS:
        yield f"overflow {m.overflow!r} must be one of {', '.join(OVERFLOWS)}"
    for label in ("reject_status", "fail_status"):
        value = getattr(m, label)
        if not _is_int(value) or not 400 <= value <= 599:
            yield f"{label} {value!r} must be an HTTP error status 400-599"
    if m.max_queue is not None and (not _is_int(m.max_queue) or m.max_queue < 0):
        yield f"max_queue {m.max_queue!r} must be an integer >= 0 or null"
    if m.service_ms is not None and not _non_negative(m.service_ms):
        yield f"service_ms {m.service_ms!r} must be a number >= 0 or null"
    for label in ("ttft_ms", "per_token_ms", "sigma", "defer_ms", "embedding_ms", "hang_s"):
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
    if not isinstance(m.down, bool):
        yield f"down {m.down!r} must be true or false"
    if m.metrics_flavor not in FLAVORS:
        yield f"metrics_flavor {m.metrics_flavor!r} must be one of {', '.join(FLAVORS)}"
    if m.port is not None and (not _is_int(m.port) or not 1 <= m.port <= 65535):
        yield f"port {m.port!r} must be 1..65535 or null (the main port)"


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _non_negative(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


@dataclass(frozen=True)
class Timing:
    """When the tokens of one answer are due, relative to its admission."""

    ttft_s: float
    per_token_s: float
    tokens: int

    @property
    def total_s(self) -> float:
        return self.ttft_s + self.per_token_s * (self.tokens - 1)


def new_rng(model: SimModel) -> random.Random:
    # A string seed is hashed deterministically (sha512), unlike hash().
    return random.Random(f"{model.seed}:{model.name}")


def knee_factor(model: SimModel, running: int) -> float:
    """How much slower a request admitted with ``running`` in the batch is."""
    slowdown = model.slowdown
    if slowdown == 0 or model.capacity == 0:
        return 1.0
    load = running / model.capacity
    return 1.0 + slowdown * max(0.0, load - model.knee) / (1.0 - model.knee)


def sample_timing(model: SimModel, rng: random.Random, *, running: int, max_tokens: int | None) -> Timing:
    """Draw the timing of one chat answer admitted with ``running`` in the batch."""
    scale = knee_factor(model, running)
    if model.distribution == "lognormal" and model.sigma > 0:
        # mu = -sigma^2/2 gives the factor a mean of exactly 1.
        scale *= rng.lognormvariate(-model.sigma**2 / 2, model.sigma)
    tokens = model.tokens if not max_tokens else max(1, min(model.tokens, max_tokens))
    if model.service_ms is not None:
        return Timing(model.service_ms / 1000 * scale, 0.0, tokens)
    return Timing(model.ttft_ms / 1000 * scale, model.per_token_ms / 1000 * scale, tokens)

"""Every error Lanes raises, under one root.

::

    LanesError
    ├── InvalidInput                 bad input from a user or a file; nothing was changed
    │   ├── CatalogInvalid           a catalog file with one or more problems (``.problems``)
    │   └── NotFound                 a named pool, workflow or task does not exist
    ├── Conflict                     a change met another writer's and was not made; try again
    ├── ServiceUnavailable           a service Lanes needs did not answer in time
    │   ├── RedisUnavailable
    │   └── DatabaseUnavailable
    ├── LaneSignal                   how a lane wait ended, when it did not end in a grant
    │   ├── AcquireTimeout           the wait budget ran out; the caller holds nothing
    │   └── AcquireCancelled         the caller cancelled; the caller holds nothing
    ├── LeaseLost                    a holder's renewal was refused: stop using the slot
    ├── ResultLost                   a task's record is gone from the result store (a Redis lost it)
    └── RoutingError                 a routed request could not be served
        ├── CapacityWaitTimeout      no candidate admitted the request in its budget (retryable)
        ├── DeadlineExpired          the request's deadline passed on our side (queue, lane): never retried
        ├── BackendError             a backend answered badly or not at all
        │   ├── BackendOverloaded    429 / 503 / 529
        │   ├── BackendUnreachable   no connection: nothing was sent (another replica may take it)
        │   └── BackendTimeout       no first token (or answer) within the call's time limit
        └── CandidatesExhausted      every candidate failed and no retry budget is left

Control-flow signals (``LaneSignal``) are kept apart from failures so that the
walker can catch them without also catching real faults.
"""

from __future__ import annotations


class LanesError(Exception):
    """Root of every error Lanes raises."""


class InvalidInput(LanesError, ValueError):
    """Input was refused before anything was written or enqueued."""


class CatalogInvalid(InvalidInput):
    """A catalog document with problems; each names its key path and value."""

    # A message stays readable (and a log line stays a line) whatever the file held.
    MAX_SHOWN = 100
    MAX_LINE = 400

    def __init__(self, problems: list[str]) -> None:
        problems = list(problems)
        count = len(problems)
        self.problems = [_bounded(p, self.MAX_LINE) for p in problems[: self.MAX_SHOWN]]
        if count > self.MAX_SHOWN:
            self.problems.append(f"... and {count - self.MAX_SHOWN} more problems (fix these first)")
        head = f"{count} problem{'s' if count != 1 else ''} in the catalog; nothing was written"
        super().__init__(head + "\n" + "\n".join(f"  {p}" for p in self.problems))


def _bounded(line: str, limit: int) -> str:
    return line if len(line) <= limit else f"{line[: limit - 30]}... ({len(line)} characters in all)"


class NotFound(InvalidInput):
    """A request named a pool or workflow the catalog does not have (HTTP 404)."""


class Conflict(LanesError):
    """A change raced other writers and was not made; nothing was written (HTTP 409)."""


class ServiceUnavailable(LanesError):
    """A service did not answer within its bounded time."""


class RedisUnavailable(ServiceUnavailable):
    """Redis did not answer; lanes never fall back to counting in-process."""


class DatabaseUnavailable(ServiceUnavailable):
    """The catalog database did not answer."""


class ResultLost(LanesError):
    """The result store holds no record of a task submit accepted: its Redis lost it."""


class LaneSignal(LanesError):
    """A lane wait ended without a grant. The caller holds nothing."""


class AcquireTimeout(LaneSignal, TimeoutError):
    """The wait budget ran out before a slot was granted."""


class AcquireCancelled(LaneSignal):
    """The wait was cancelled before a slot was granted."""


class LeaseLost(LanesError):
    """The lane refused a renewal: the holder must stop using its slot now."""


class RoutingError(LanesError):
    """A routed request could not be served."""


class CapacityWaitTimeout(RoutingError):
    """No candidate admitted the request within its budget. Retry later."""

    retryable = True


class DeadlineExpired(RoutingError):
    """The request's deadline passed before a backend could be called.

    Time that ran out on our side (a queue, a lane wait): nothing is said
    about any backend, and a retry could only be later still.
    """


class BackendError(RoutingError):
    """A backend call failed: connection, timeout, 5xx or an overload answer."""

    # A 4xx other than 429 says the request itself is wrong: no other
    # candidate would take it, so the walker stops instead of falling back.
    def __init__(self, message: str, model: str | None = None, status: int | None = None) -> None:
        super().__init__(message)
        self.model = model
        self.status = status
        # Set by the backend client: the code a streamed 2xx carried, and the
        # first token's time when one came before the failure.
        self.stream_status: int | None = None
        self.ttft_seconds: float | None = None

    @property
    def request_rejected(self) -> bool:
        return self.status is not None and 400 <= self.status < 500 and self.status != 429


class BackendOverloaded(BackendError):
    """The backend said it is full (429, 503 or 529)."""


class BackendUnreachable(BackendError):
    """No connection could be made to the backend: nothing was sent."""


class BackendTimeout(BackendError):
    """The call was given up: no first token (``phase='first_token'``) or no whole
    answer (``phase='answer'``) within ``limit_seconds``."""

    def __init__(self, message: str, model: str | None = None, *, phase: str, limit_seconds: float) -> None:
        super().__init__(message, model)
        self.phase = phase
        self.limit_seconds = limit_seconds


class CandidatesExhausted(RoutingError):
    """Every candidate failed and the deadline leaves no room for a retry."""


__all__ = [
    "LanesError",
    "InvalidInput",
    "CatalogInvalid",
    "NotFound",
    "Conflict",
    "ServiceUnavailable",
    "RedisUnavailable",
    "DatabaseUnavailable",
    "LaneSignal",
    "AcquireTimeout",
    "AcquireCancelled",
    "LeaseLost",
    "RoutingError",
    "CapacityWaitTimeout",
    "DeadlineExpired",
    "BackendError",
    "BackendOverloaded",
    "BackendTimeout",
    "BackendUnreachable",
    "CandidatesExhausted",
]

"""Lanes: priority lanes for LLM inference fleets.

Import public names from here; the modules behind them are private detail.
"""

from lanes.errors import (
    AcquireCancelled,
    AcquireTimeout,
    BackendError,
    BackendOverloaded,
    BackendTimeout,
    CandidatesExhausted,
    CapacityWaitTimeout,
    CatalogInvalid,
    DatabaseUnavailable,
    DeadlineExpired,
    InvalidInput,
    LaneSignal,
    LanesError,
    LeaseLost,
    RedisUnavailable,
    RoutingError,
    ServiceUnavailable,
)
from lanes.lane import AsyncLane, AsyncPermit, CancelEvent, Generation, Lane, LaneStats, Permit
from lanes.priority import Priority
from lanes.settings import Settings, load_settings

__version__ = "0.1.0"

# Submitting needs Celery and the catalog; import them only when first used so
# that `import lanes` stays light for code that only wants a Lane.
_LAZY = {"submit": "lanes.routing.client", "LanesClient": "lanes.routing.client"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lanes' has no attribute {name!r}")

__all__ = [
    "LanesClient",
    "submit",
    "AcquireCancelled",
    "AcquireTimeout",
    "AsyncLane",
    "AsyncPermit",
    "BackendError",
    "BackendOverloaded",
    "BackendTimeout",
    "CancelEvent",
    "CandidatesExhausted",
    "CapacityWaitTimeout",
    "CatalogInvalid",
    "DatabaseUnavailable",
    "DeadlineExpired",
    "Generation",
    "InvalidInput",
    "Lane",
    "LaneSignal",
    "LaneStats",
    "LanesError",
    "LeaseLost",
    "Permit",
    "Priority",
    "RedisUnavailable",
    "RoutingError",
    "ServiceUnavailable",
    "Settings",
    "load_settings",
]

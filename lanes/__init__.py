"""Lanes: priority lanes for LLM inference fleets.

Import public names from here; the modules behind them are private detail.
"""

from lanes.errors import (
    AcquireCancelled,
    AcquireTimeout,
    BackendError,
    BackendOverloaded,
    CandidatesExhausted,
    CapacityWaitTimeout,
    CatalogInvalid,
    DatabaseUnavailable,
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

__all__ = [
    "AcquireCancelled",
    "AcquireTimeout",
    "AsyncLane",
    "AsyncPermit",
    "BackendError",
    "BackendOverloaded",
    "CancelEvent",
    "CandidatesExhausted",
    "CapacityWaitTimeout",
    "CatalogInvalid",
    "DatabaseUnavailable",
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

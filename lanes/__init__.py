"""Lanes: priority lanes for LLM inference fleets.

Import public names from here; the modules behind them are private detail.
"""

__version__ = "0.1.0"

# Every public name is imported on first use (PEP 562), so that `import lanes`
# costs nothing: the `lanes` command starts without loading Redis, pydantic or
# Celery, and code that only wants a Lane never pays for submitting.
_ERRORS = (
    "AcquireCancelled", "AcquireTimeout", "BackendError", "BackendOverloaded", "BackendTimeout", "BackendUnreachable",
    "CandidatesExhausted", "CapacityWaitTimeout", "CatalogInvalid", "Conflict", "DatabaseUnavailable", "DeadlineExpired",
    "InvalidInput", "LaneSignal",
    "LanesError", "LeaseLost", "NotFound", "RedisUnavailable", "RoutingError", "ServiceUnavailable",
)
_LAZY = {
    **{name: "lanes.errors" for name in _ERRORS},
    **{name: "lanes.lane" for name in ("AsyncLane", "AsyncPermit", "CancelEvent", "Generation", "Lane",
                                         "LaneStats", "Permit")},
    "Priority": "lanes.priority",
    "Settings": "lanes.settings",
    "load_settings": "lanes.settings",
    "submit": "lanes.routing.client",
    "LanesClient": "lanes.routing.client",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'lanes' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


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
    "BackendUnreachable",
    "CancelEvent",
    "CandidatesExhausted",
    "CapacityWaitTimeout",
    "CatalogInvalid",
    "Conflict",
    "DatabaseUnavailable",
    "DeadlineExpired",
    "Generation",
    "InvalidInput",
    "Lane",
    "LaneSignal",
    "LaneStats",
    "LanesError",
    "LeaseLost",
    "NotFound",
    "Permit",
    "Priority",
    "RedisUnavailable",
    "RoutingError",
    "ServiceUnavailable",
    "Settings",
    "load_settings",
]

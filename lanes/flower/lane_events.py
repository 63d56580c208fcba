"""The custom Celery task events a worker sends about each task's lanes.

One ``task-lane-calling`` when a task's call starts (its slot granted: from
then on it is calling, not waiting), one ``task-lane-admitted`` per backend
call made through a lane once it ended (the pool,
the model, how long the task waited for its slot, how the call ended) and
one ``task-lane-bypass`` per candidate passed over (why). They carry no
``result`` and no ``state`` field: stock Celery event consumers would turn an
unknown ``task-*`` type into the task's state (hiding a later revocation) and
merge every field of a late event into a finished task; Lanes' Flower
(:mod:`lanes.flower.server`) files them as the task's lane log instead and
leaves its state alone.
"""

from __future__ import annotations

ADMITTED = "task-lane-admitted"
BYPASS = "task-lane-bypass"
CALLING = "task-lane-calling"
TYPES = frozenset({ADMITTED, BYPASS, CALLING})

# Only these fields of an event are kept (never a result, never a state).
FIELDS = ("pool", "model", "priority", "wait_ms", "outcome", "reason", "at")


def describe(event: dict) -> str:
    """One line for the task page: what happened in which lane."""
    kind = event.get("type")
    pool = event.get("pool") or "no lane"
    if kind == ADMITTED:
        return (f"admitted to lane {pool} after {_ms(event.get('wait_ms'))} ({event.get('priority')}); "
                f"model {event.get('model')}: {event.get('outcome')}")
    if kind == BYPASS:
        return f"bypassed model {event.get('model')} (lane {pool}): {event.get('reason')}"
    if kind == CALLING:
        return f"calling model {event.get('model')} (lane {pool})"
    return str(kind)


def _ms(value) -> str:
    return "?" if value is None else f"{float(value):.0f} ms"

"""What waits in the broker: each fleet's Celery queues, per priority.

A message a worker has not yet taken sits in a Redis list of the broker:
kombu keeps one list per priority step (``lanes.<pool>`` for step 0,
``lanes.<pool>:3``...; the separator and steps are Lanes' Celery
configuration, :mod:`lanes.celery_client`), and each Lanes priority is sent
with one step to one of the fleet's two queues. So the lengths of those
lists are the broker's backlog per priority, read in one round trip. A
message a worker holds (reserved, or a task waiting in its lane) is no
longer in any list: it shows in the lane's own counts instead.
"""

from __future__ import annotations

from lanes.celery_client import broker_queued as fleet_broker_queued
from lanes.ops.pools import redis_errors


def broker_queued(redis_client, fleets) -> dict[str, dict[str, int]]:
    """``{fleet: {priority label: messages waiting in the broker}}`` for each fleet
    (:func:`lanes.celery_client.broker_queued`, the one reading of those lists)."""
    with redis_errors():
        return {fleet: {p.label: n for p, n in fleet_broker_queued(redis_client, fleet).items()}
                for fleet in sorted(set(fleets))}

"""How many worker threads a fleet runs, and which queues they take.

A fleet is one primary pool's Celery queues and workers, so one pool's
backlog never blocks another pool's work. Its size follows the pool's width:
``width x workers_per_lane``, clamped to the floor and cap, so a lane always
has a waiter ready when a slot frees. One slot is kept from background work,
so interactive work is never stuck in the Celery queue behind background
tasks parked in lane waits.
"""

from __future__ import annotations

from dataclasses import dataclass

from lanes.catalog import RoutingTable
from lanes.celery_client import HOSTED_FLEET, fleet_queues
from lanes.errors import InvalidInput
from lanes.settings import Settings


@dataclass(frozen=True)
class FleetPlan:
    fleet: str
    width: int
    concurrency: int
    background_limit: int
    foreground_queue: str
    background_queue: str

    @property
    def queues(self) -> tuple[str, str]:
        # Order matters: with the "priority" queue order strategy a worker
        # always drains the foreground queue first.
        return (self.foreground_queue, self.background_queue)


def fleet_names(table: RoutingTable) -> list[str]:
    return sorted({route.fleet or HOSTED_FLEET for route in table.workflows.values() if route.candidates})


def fleet_width(pool) -> int:
    """The most slots the pool's lane can have: its ceiling while a controller
    may move the width (the fleet must be able to fill whatever it learns),
    else exactly its configured width."""
    from lanes.pools import running_kinds

    return pool.ceiling if running_kinds(pool) else pool.width


def plan_fleet(table: RoutingTable, fleet: str, settings: Settings) -> FleetPlan:
    known = fleet_names(table)
    if fleet not in known:
        raise InvalidInput(f"unknown fleet {fleet!r} (known: {', '.join(known) or 'none; apply a catalog first'})")
    pool = table.pools.get(fleet)
    width = fleet_width(pool) if pool is not None else settings.fleet_min_workers
    concurrency = min(settings.fleet_max_workers, max(settings.fleet_min_workers, width * settings.workers_per_lane))
    foreground, background = fleet_queues(fleet)
    return FleetPlan(
        fleet=fleet,
        width=width,
        concurrency=concurrency,
        background_limit=concurrency - 1,
        foreground_queue=foreground,
        background_queue=background,
    )

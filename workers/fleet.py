"""How many messages a fleet's worker processes hold, and which queues they take.

A fleet is one primary pool's Celery queues and workers, so one pool's
backlog never blocks another pool's work. Its supervisor runs two worker
processes: one for the foreground queue (interactive and user-tool work) and
one for the background queue. Each runs Celery's gevent pool (the default,
``LANES_FLEET_POOL=gevent``): a message taken from the queue is a task on a green
thread of its own, which becomes a lane waiter at once and calls its backend
when granted. Waiting and calling cost no OS thread, so a process takes every
message that arrives, up to ``fleet_held_messages`` per queue (default 2,000;
never fewer than the pool's configured width), and all waiting work is in the
lane, where priority, each workflow's share, deadline minus reserve and the
fallbacks act on it; past the bound the broker keeps the rest, in priority
order. ``LANES_FLEET_POOL=threads`` runs Celery's threads pool instead (a
thread per held message, two per slot within 2..64), whose waiting work
beyond its threads stays in the broker.

Two processes rather than one: a background backlog turns its calls over in
bunches (every end is also the next start, handed over in the lane), and in
one process that bookkeeping competes with an urgent request's delivery and
admission for the one interpreter lock; in a process of its own, the urgent
request waits at most for a core, and the system's scheduler favours a
process that was idle (docs/BENCHMARKS_JOURNAL.md, "fifteenth round"). A background
holder is then asked for its slot across processes (the lane's pub/sub ask).
"""

from __future__ import annotations

from dataclasses import dataclass

from lanes.catalog import RoutingTable
from lanes.celery_client import fleet_names, fleet_queues  # noqa: F401 (fleet_names: its old home)
from lanes.errors import InvalidInput
from lanes.settings import Settings


@dataclass(frozen=True)
class FleetPlan:
    fleet: str
    width: int
    foreground_held: int
    background_held: int
    foreground_queue: str
    background_queue: str
    pool: str = "gevent"

    @property
    def held(self) -> int:
        """Messages both processes may hold at once."""
        return self.foreground_held + self.background_held

    @property
    def queues(self) -> tuple[str, str]:
        return (self.foreground_queue, self.background_queue)

    def worker_args(self) -> dict[str, list[str]]:
        """The arguments of ``python -m workers.main`` for each of the plan's
        processes, by role: ``foreground`` and ``background``."""
        return {
            "foreground": ["--fleet", self.fleet, "--foreground", str(self.foreground_held), "--pool", self.pool],
            "background": ["--fleet", self.fleet, "--background", str(self.background_held), "--pool", self.pool],
        }

    def describe(self) -> str:
        return (
            f"fleet {self.fleet}: width {self.width}; a process holding up to {self.foreground_held} messages "
            f"of {self.foreground_queue}, one up to {self.background_held} of {self.background_queue}"
        )


def fleet_width(pool) -> int:
    """The most slots the pool's lane can have: its ceiling while a controller
    may move the width (the fleet must be able to fill whatever it learns),
    else exactly its configured width."""
    from lanes.catalog.controllers import running_kinds

    return pool.ceiling if running_kinds(pool) else pool.width


def width_to_fill(table: RoutingTable, fleet: str, settings: Settings) -> int:
    """The number of lane slots this fleet's threads must be able to fill.

    The primary pool's width, or its ceiling while a controller may move the
    width (:func:`fleet_width`); a fleet with no lane counts as width 1.
    """
    pool = table.pools.get(fleet)
    return fleet_width(pool) if pool is not None else 1


# The threads pool's sizing: two threads per slot of the width to fill, within 2..64.
THREADS_PER_SLOT = 2
THREADS_FLOOR = 2
THREADS_CAP = 64


def held_per_queue(width: int, settings: Settings, *, fill: int | None = None) -> int:
    """Messages each of the fleet's processes holds at most, never fewer than
    ``width`` (the configured width), or one process could not fill the lane
    on its own. On the gevent pool: ``fleet_held_messages``. On the threads
    pool (a thread each): two per slot of ``fill`` (the width to fill,
    default ``width``) within 2..64 and ``fleet_held_messages``. A
    controller's ceiling above the bound is filled by more worker processes
    on the same fleet (a lane is shared by all)."""
    if settings.fleet_pool == "gevent":
        return max(width, settings.fleet_held_messages)
    fill = width if fill is None else fill
    threads = min(THREADS_CAP, settings.fleet_held_messages, max(THREADS_FLOOR, THREADS_PER_SLOT * fill))
    return max(width, threads)


def plan_fleet(table: RoutingTable, fleet: str, settings: Settings) -> FleetPlan:
    known = fleet_names(table)
    if fleet not in known:
        raise InvalidInput(f"unknown fleet {fleet!r} (known: {', '.join(known) or 'none; apply a catalog first'})")
    width = width_to_fill(table, fleet, settings)
    pool = table.pools.get(fleet)
    held = held_per_queue(pool.width if pool is not None else width, settings, fill=width)
    foreground, background = fleet_queues(fleet)
    return FleetPlan(
        fleet=fleet,
        width=width,
        foreground_held=held,
        background_held=held,
        foreground_queue=foreground,
        background_queue=background,
        pool=settings.fleet_pool,
    )

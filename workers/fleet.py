"""How many worker threads a fleet runs, and which queues they take.

A fleet is one primary pool's Celery queues and workers, so one pool's
backlog never blocks another pool's work. Its supervisor runs two worker
processes: one for the foreground queue (interactive and user-tool work) and
one for the background queue, each with its own set of threads. Each set
is sized from the width the fleet must be able to fill, ``width x
workers_per_lane`` clamped to the floor and cap (``fleet_max_workers``) but
never below the pool's configured width (a controller's headroom up to a
large ceiling is filled within the cap, by more workers if need be):

- background work alone can hold every slot and park a waiter per slot, so
  a freed slot is handed straight to the next background task;
- foreground work always has a thread per slot whatever background work
  holds, so urgent requests up to the width reach the lane at once, where
  they go ahead of every background waiter.

Two processes rather than one pool of both sets: a background backlog turns
its calls over in bunches (every end is also the next start, handed over in
the lane), and in one process that bookkeeping competes with an urgent
request's delivery and admission for the one interpreter lock; in a process
of its own, the urgent request waits at most for a core, and the system's
scheduler favours a process that was idle (docs/BENCHMARKS.md, "fifteenth
round"). A background holder is then asked for its slot across processes
(the lane's pub/sub ask, read by the background process's idle reader or a
parked waiter).
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
    foreground_threads: int
    background_threads: int
    foreground_queue: str
    background_queue: str

    @property
    def concurrency(self) -> int:
        """Threads of both processes."""
        return self.foreground_threads + self.background_threads

    @property
    def queues(self) -> tuple[str, str]:
        return (self.foreground_queue, self.background_queue)

    def worker_args(self) -> dict[str, list[str]]:
        """The arguments of ``python -m workers.main`` for each of the plan's
        processes, by role: ``foreground`` and ``background``."""
        return {
            "foreground": ["--fleet", self.fleet, "--foreground-threads", str(self.foreground_threads)],
            "background": ["--fleet", self.fleet, "--background-threads", str(self.background_threads)],
        }

    def describe(self) -> str:
        return (
            f"fleet {self.fleet}: width {self.width}; a process of {self.foreground_threads} threads for "
            f"{self.foreground_queue}, one of {self.background_threads} for {self.background_queue}"
        )


def fleet_width(pool) -> int:
    """The most slots the pool's lane can have: its ceiling while a controller
    may move the width (the fleet must be able to fill whatever it learns),
    else exactly its configured width."""
    from lanes.pools import running_kinds

    return pool.ceiling if running_kinds(pool) else pool.width


def width_to_fill(table: RoutingTable, fleet: str, settings: Settings) -> int:
    """The number of lane slots this fleet's threads must be able to fill.

    The one place a fleet's size comes from: the primary pool's width, or its
    ceiling while a controller may move the width (:func:`fleet_width`); a
    fleet with no lane counts as a pool of the floor's width.
    """
    pool = table.pools.get(fleet)
    return fleet_width(pool) if pool is not None else settings.fleet_min_workers


def threads_per_queue(width: int, settings: Settings, *, configured: int | None = None) -> int:
    """Threads for each of the fleet's two queues.

    ``workers_per_lane`` threads per slot of ``width`` keep a waiter ready in
    the lane for each slot; the floor and ``fleet_max_workers`` bound that.
    A queue never gets fewer threads than the ``configured`` width (default:
    ``width``), or it could not fill the lane on its own. The slots a
    controller may add above the configured width (up to the ceiling) are
    filled within the cap: a pool whose ceiling is 512 gets
    ``fleet_max_workers`` threads per queue here, not 512, and more worker
    processes on the same fleet fill the rest (a lane is shared by any number
    of workers).
    """
    configured = width if configured is None else configured
    wanted = min(settings.fleet_max_workers, max(settings.fleet_min_workers, width * settings.workers_per_lane))
    return max(configured, wanted)


def plan_fleet(table: RoutingTable, fleet: str, settings: Settings) -> FleetPlan:
    known = fleet_names(table)
    if fleet not in known:
        raise InvalidInput(f"unknown fleet {fleet!r} (known: {', '.join(known) or 'none; apply a catalog first'})")
    width = width_to_fill(table, fleet, settings)
    pool = table.pools.get(fleet)
    threads = threads_per_queue(width, settings, configured=pool.width if pool is not None else width)
    foreground, background = fleet_queues(fleet)
    return FleetPlan(
        fleet=fleet,
        width=width,
        foreground_threads=threads,
        background_threads=threads,
        foreground_queue=foreground,
        background_queue=background,
    )

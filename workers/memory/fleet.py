"""How many memory workers run; the fleet supervisor keeps them at that size.

Seed 004: memory workers = the memory primary's width x
``memory_workers_per_lane`` (2), at least ``memory_workers_floor``, at most
``memory_workers_cap`` (32). So the memory lane always has a waiter ready
when a slot frees, and a wider pool gets more memory workers.

The memory fleet is one process (:mod:`workers.memory.worker`, a threads
pool of that many threads) kept by the same supervisor as every routed fleet
(:class:`workers.supervisor.FleetSupervisor`): it checks the lane config at
start and on every reload, serves ``/metrics``, restarts a worker that dies
with a short backoff, and replaces the worker side by side when a catalog
change moves the plan (the threads pool cannot grow in place): the new one
first, then a warm stop of the old one within the memory models' longest
timeout, then a cold one.

    python -m workers.memory.fleet      (what ``lanes memory worker`` runs)
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass

from lanes.catalog import RoutingTable, load_routing
from lanes.errors import InvalidInput
from lanes.memory import MEMORY_WORKFLOW
from lanes.memory.schema import ensure_memory_schema
from lanes.settings import Settings, load_settings
from workers.supervisor import STOP_MARGIN_SECONDS, FleetSupervisor, run_until_signalled

FLEET = "memory"  # its name in messages and in its worker's node name (memory@host)


@dataclass(frozen=True)
class MemoryFleetPlan:
    pool: str | None
    width: int
    concurrency: int
    fleet: str = FLEET

    def worker_args(self) -> dict[str, list[str]]:
        """The arguments of ``python -m workers.memory.worker``: one process, by role."""
        return {"memory": ["--concurrency", str(self.concurrency)]}

    def describe(self) -> str:
        return f"memory fleet: {self.concurrency} worker threads for {self.pool or 'no pool'} width {self.width}"


def plan_memory_fleet(table: RoutingTable, settings: Settings) -> MemoryFleetPlan:
    route = table.workflows.get(MEMORY_WORKFLOW)
    if route is None or not route.candidates:
        known = ", ".join(sorted(table.workflows)) or "none; apply a catalog first"
        raise InvalidInput(f"the catalog has no {MEMORY_WORKFLOW!r} workflow with a model (workflows: {known})")
    pool = route.candidates[0].pool
    width = pool.width if pool is not None else settings.memory_workers_floor
    wanted = width * settings.memory_workers_per_lane
    concurrency = min(settings.memory_workers_cap, max(settings.memory_workers_floor, wanted))
    return MemoryFleetPlan(pool.name if pool is not None else None, width, concurrency)


class MemorySupervisor(FleetSupervisor):
    """The fleet supervisor, planning the memory fleet instead of a pool's."""

    worker_module = "workers.memory.worker"

    def __init__(self, settings: Settings, *, poll_seconds: float = 2.0, loglevel: str = "WARNING",
                 echo=print) -> None:
        super().__init__(settings, FLEET, poll_seconds=poll_seconds, loglevel=loglevel, echo=echo)
        ensure_memory_schema(self.engine)  # the memory tables at head before its worker starts

    def plan(self) -> MemoryFleetPlan:
        table = load_routing(self.engine)
        plan = plan_memory_fleet(table, self.settings)  # no memory workflow: refused here
        timeouts = [model.timeout_seconds for model in table.workflows[MEMORY_WORKFLOW].candidates]
        self._grace = max(timeouts, default=0.0) + STOP_MARGIN_SECONDS
        return plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.memory.fleet")
    parser.add_argument("--loglevel", default="WARNING")
    parser.add_argument("--poll-seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    return run_until_signalled(lambda: MemorySupervisor(
        load_settings(), poll_seconds=args.poll_seconds, loglevel=args.loglevel))


if __name__ == "__main__":
    sys.exit(main())

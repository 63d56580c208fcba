"""How many memory workers run, and keeping them at that size.

Seed 004: memory workers = the memory primary's width x
``memory_workers_per_lane`` (2), at least ``memory_workers_floor``, at most
``memory_workers_cap`` (32). So the memory lane always has a waiter ready
when a slot frees, and a wider pool gets more memory workers.

The threads pool cannot grow in place: when a catalog change moves the
plan, the worker is stopped gracefully (its lane waits are cancelled and
their messages handed back) and started again at the new size; a worker that
dies is restarted with a short backoff.

    python -m workers.memory_fleet      (what ``lanes memory worker`` runs)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from lanes.catalog import RoutingTable, catalog_stamp, load_routing
from lanes.errors import InvalidInput, LanesError
from lanes.memory import MEMORY_WORKFLOW, open_memory
from lanes.metrics.exposition import supervised
from lanes.routing.view import CatalogView
from lanes.settings import Settings, load_settings

STOP_GRACE_SECONDS = 30.0


@dataclass(frozen=True)
class MemoryFleetPlan:
    pool: str | None
    width: int
    concurrency: int


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


class MemorySupervisor:
    def __init__(self, settings: Settings, *, poll_seconds: float = 2.0, loglevel: str = "WARNING",
                 echo=print) -> None:
        self.settings = settings
        self.poll_seconds = poll_seconds
        self.loglevel = loglevel
        self.echo = echo
        self.engine = open_memory(settings)
        self._stop = threading.Event()
        self._child: subprocess.Popen | None = None
        self.metrics = None  # /metrics (LANES_METRICS_PORT), served here as by the fleet supervisor

    def plan(self) -> MemoryFleetPlan:
        return plan_memory_fleet(load_routing(self.engine), self.settings)

    def stop(self, *_) -> None:
        self._stop.set()

    def _start(self, plan: MemoryFleetPlan) -> subprocess.Popen:
        self.echo(f"memory fleet: {plan.concurrency} worker threads for {plan.pool or 'no pool'} width {plan.width}")
        return subprocess.Popen([sys.executable, "-m", "workers.memory", "--concurrency", str(plan.concurrency),
                                 "--loglevel", self.loglevel],
                                env={**os.environ, **self.metrics.child_env()} if self.metrics else None)

    def _exited(self, child: subprocess.Popen) -> None:
        if self.metrics is not None:
            self.metrics.child_exited(child.pid)

    def _stop_child(self) -> None:
        child = self._child
        if child is None:
            return
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
            try:
                child.wait(STOP_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        self._exited(child)

    def run(self) -> int:
        plan = self.plan()  # a catalog without the workflow fails here, before anything starts
        version = catalog_stamp(self.engine)
        self.metrics = supervised(self.settings, CatalogView(self.engine, refresh_seconds=5.0).table)
        self._child = self._start(plan)
        backoff = 1.0
        try:
            while not self._stop.wait(self.poll_seconds):
                if self._child.poll() is not None:
                    self.echo(f"memory fleet: worker exited with {self._child.returncode}; restarting")
                    self._exited(self._child)
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
                    self._child = self._start(plan)
                    continue
                backoff = 1.0
                current = catalog_stamp(self.engine)
                if current == version:
                    continue
                version = current
                new_plan = self.plan()
                if new_plan != plan:
                    self.echo("memory fleet: the catalog changed its size; restarting the worker")
                    self._stop_child()
                    plan = new_plan
                    self._child = self._start(plan)
        finally:
            self._stop_child()
            if self.metrics is not None:
                self.metrics.close()
            self.engine.dispose()
        return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m workers.memory_fleet")
    parser.add_argument("--loglevel", default="WARNING")
    parser.add_argument("--poll-seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    try:
        supervisor = MemorySupervisor(load_settings(), poll_seconds=args.poll_seconds, loglevel=args.loglevel)
        signal.signal(signal.SIGTERM, supervisor.stop)
        signal.signal(signal.SIGINT, supervisor.stop)
        return supervisor.run()
    except LanesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

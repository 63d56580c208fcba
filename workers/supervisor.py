"""Keeps one fleet's worker running at the size its pool's width calls for.

The threads pool cannot grow in place, so when the catalog changes a fleet's
size the worker is restarted gracefully: a warm shutdown cancels its lane
waits and hands their tasks back to the queue, then a new worker starts at
the new size. A worker that dies is restarted with a short backoff.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time

from lanes.catalog import catalog_stamp, load_routing, open_catalog
from lanes.settings import Settings
from workers.fleet import FleetPlan, plan_fleet

STOP_GRACE_SECONDS = 30.0


class FleetSupervisor:
    def __init__(self, settings: Settings, fleet: str, *, poll_seconds: float = 2.0, loglevel: str = "WARNING",
                 echo=print) -> None:
        self.settings = settings
        self.fleet = fleet
        self.poll_seconds = poll_seconds
        self.loglevel = loglevel
        self.echo = echo
        self.engine = open_catalog(settings)
        self._stop = threading.Event()
        self._child: subprocess.Popen | None = None

    def plan(self) -> FleetPlan:
        return plan_fleet(load_routing(self.engine), self.fleet, self.settings)

    def _start(self, plan: FleetPlan) -> subprocess.Popen:
        self.echo(plan.describe())
        return subprocess.Popen([sys.executable, "-m", "workers.main", *plan.worker_args(), "--loglevel", self.loglevel])

    def _stop_child(self) -> None:
        child = self._child
        if child is None or child.poll() is not None:
            return
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()

    def stop(self, *_) -> None:
        self._stop.set()

    def run(self) -> int:
        plan = self.plan()  # an unknown fleet fails here, before anything starts
        version = catalog_stamp(self.engine)
        self._child = self._start(plan)
        backoff = 1.0
        try:
            while not self._stop.wait(self.poll_seconds):
                if self._child.poll() is not None:
                    self.echo(f"fleet {self.fleet}: worker exited with {self._child.returncode}; restarting")
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
                    self.echo(f"fleet {self.fleet}: catalog changed the fleet; restarting its worker")
                    self._stop_child()
                    plan = new_plan
                    self._child = self._start(plan)
        finally:
            self._stop_child()
        return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    from lanes.errors import LanesError
    from lanes.settings import load_settings

    parser = argparse.ArgumentParser(prog="python -m workers.supervisor")
    parser.add_argument("--fleet", required=True)
    parser.add_argument("--loglevel", default="WARNING")
    parser.add_argument("--poll-seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    try:
        supervisor = FleetSupervisor(load_settings(), args.fleet, poll_seconds=args.poll_seconds, loglevel=args.loglevel)
        signal.signal(signal.SIGTERM, supervisor.stop)
        signal.signal(signal.SIGINT, supervisor.stop)
        return supervisor.run()
    except LanesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

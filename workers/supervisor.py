"""Keeps one fleet's workers running at the size its pool's width calls for.

A fleet has two worker processes, one per queue (workers/fleet.py); "the
worker" below is the pair. A pool cannot change its size in place, so when
the catalog changes what a fleet's workers hold the worker is replaced, without a gap
and without cutting calls short:

1. the new worker starts first and is waited for until it answers a ping, so
   the fleet keeps consuming while the old one winds down;
2. the old worker gets a warm shutdown (SIGTERM): it takes no new work, its
   lane waits are cancelled and handed back, and the calls in flight may run
   for the fleet's longest model timeout (plus a margin) to finish;
3. past that grace it gets a cold shutdown (SIGQUIT): Celery cancels what is
   left and closes its broker channel, which hands its unacknowledged messages
   back to the queue at once instead of after the visibility timeout; only a
   worker that still does not exit is killed.

The supervisor follows its pool by id, so a rename in the catalog restarts the
worker on the new name's queues and moves everything queued under the old
name there (:mod:`workers.drain`), then keeps draining the old queues.

At start (and on every catalog change) it refuses models whose timeout cannot
fit in the walk budget below Celery's visibility timeout: such a call would
make the broker hand the task to a second worker while the first still calls.
A worker process that dies is restarted with a short backoff, the other
left serving.

The memory fleet is kept by this same supervisor (:mod:`workers.memory.fleet`
plans it: one process, sized from the memory primary's width).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import redis
from sqlalchemy.exc import SQLAlchemyError

from lanes.catalog import RoutingTable, catalog_stamp, load_routing, open_catalog
from lanes.celery_client import HOSTED_FLEET, make_celery
from lanes.errors import DatabaseUnavailable, InvalidInput, LanesError
from lanes.metrics.exposition import supervised
from lanes.ops.lanecheck import check_and_record
from lanes.redis_conn import REDIS_UNAVAILABLE, connect, resolve_redis_url
from lanes.routing.view import CatalogView
from lanes.settings import Settings, broker_url_of
from workers.drain import drain_fleet
from workers.fleet import FleetPlan, plan_fleet

# Beyond the longest call, for a warm shutdown to finish its bookkeeping.
STOP_MARGIN_SECONDS = 10.0
# A cold shutdown cancels, hands messages back and closes: seconds, not minutes.
COLD_STOP_SECONDS = 15.0
READY_TIMEOUT_SECONDS = 60.0

Workers = dict[str, subprocess.Popen]  # a fleet's worker processes by role (FleetPlan.worker_args)


def fleet_timeout_seconds(table: RoutingTable, fleet: str) -> float:
    """The longest model timeout among the candidates of the fleet's workflows."""
    timeouts = [
        model.timeout_seconds
        for route in table.workflows.values()
        if (route.fleet or HOSTED_FLEET) == fleet
        for model in route.candidates
    ]
    return max(timeouts, default=0.0)


def check_timeouts_fit(table: RoutingTable, fleet: str, settings: Settings) -> None:
    """Refuse a fleet whose calls cannot fit in the walk budget below the visibility timeout."""
    budget = settings.background_wait_cap
    too_long = sorted(
        {
            (model.name, model.timeout_seconds)
            for route in table.workflows.values()
            if (route.fleet or HOSTED_FLEET) == fleet
            for model in route.candidates
            if model.timeout_seconds >= budget
        }
    )
    if too_long:
        names = ", ".join(f"{name} (timeout_ms {seconds * 1000:.0f})" for name, seconds in too_long)
        raise InvalidInput(
            f"fleet {fleet!r}: {names} cannot finish a call within the {budget:.0f}s a task may run before "
            f"Celery redelivers it (visibility timeout {settings.visibility_timeout_seconds}s); lower the "
            "model's timeout_ms in the catalog or raise LANES_VISIBILITY_TIMEOUT_SECONDS"
        )


class FleetSupervisor:
    # What each of the plan's processes runs, with the plan's arguments for its role.
    worker_module = "workers.main"

    def __init__(self, settings: Settings, fleet: str, *, poll_seconds: float = 2.0, loglevel: str = "WARNING",
                 echo=print) -> None:
        self.settings = settings
        self.fleet = fleet
        self.poll_seconds = poll_seconds
        self.loglevel = loglevel
        self.echo = echo
        self.engine = open_catalog(settings)
        self._stop = threading.Event()
        self._children: Workers = {}  # by role: foreground, background
        self._retiring: list[threading.Thread] = []
        self._retired: list[subprocess.Popen] = []  # children winding down: their names are still taken
        self._pool_id: int | None = None  # followed across renames
        self._old_names: set[str] = set()  # names this fleet had before: their queues are drained
        self._generation = 0
        self._grace = STOP_MARGIN_SECONDS
        self._redis: redis.Redis | None = None
        self._celery = None
        # /metrics of this fleet (LANES_METRICS_PORT): served here, where the port
        # outlives the worker children that are replaced side by side.
        self.metrics = None

    # --- the plan -------------------------------------------------------------

    def _current_name(self, table: RoutingTable) -> str:
        """The fleet's name now: its pool is found by id once known, so a rename is followed."""
        if self._pool_id is None:
            pool = table.pools.get(self.fleet) or next(
                (p for p in table.pools.values() if self.fleet in p.previous_names), None
            )
            if pool is not None:
                self._pool_id = pool.id
                self._old_names.update(name for name in pool.previous_names if name != pool.name)
                if pool.name != self.fleet:
                    self._old_names.add(self.fleet)
                return pool.name
            return self.fleet
        for pool in table.pools.values():
            if pool.id == self._pool_id:
                return pool.name
        raise InvalidInput(f"the pool of fleet {self.fleet!r} (id {self._pool_id}) is no longer in the catalog")

    def plan(self) -> FleetPlan:
        table = load_routing(self.engine)
        name = self._current_name(table)
        if name != self.fleet:
            self.echo(f"fleet {self.fleet}: its pool is now named {name!r}; following it")
            self._old_names.add(self.fleet)
            self.fleet = name
        self._old_names.discard(name)
        plan = plan_fleet(table, name, self.settings)
        check_timeouts_fit(table, name, self.settings)
        self._grace = fleet_timeout_seconds(table, name) + STOP_MARGIN_SECONDS
        return plan

    # --- children ---------------------------------------------------------------

    def _hostname(self, plan: FleetPlan, role: str, generation: int) -> str:
        """The first of this role's node names that no running child holds.

        Old and new answer pings side by side during a resize, so a new child
        takes another name than the one it replaces; but names are reused as
        soon as their child is gone, so Flower and ``celery inspect`` see the
        same one or two workers per role across any number of resizes, not a
        new (and soon offline) worker per resize.
        """
        # The plan's first role bears the host's own name (a fleet's foreground worker).
        first = next(iter(plan.worker_args()))
        host = socket.gethostname() if role == first else f"{socket.gethostname()}.{role}"
        self._retired = [child for child in self._retired if child.poll() is None]
        taken = {getattr(child, "lanes_hostname", None)
                 for child in (*self._children.values(), *self._retired) if child.poll() is None}
        slot = 0
        while True:
            name = f"{plan.fleet}@{host}{'' if slot == 0 else f'-{slot + 1}'}"
            if name not in taken:
                return name
            slot += 1

    def _start(self, plan: FleetPlan) -> Workers:
        """The plan's worker processes (foreground and background), started."""
        self.echo(plan.describe())
        generation = self._next_generation()
        return {role: self._start_one(plan, role, generation) for role in plan.worker_args()}

    def _next_generation(self) -> int:
        generation, self._generation = self._generation, self._generation + 1
        return generation

    def _start_one(self, plan: FleetPlan, role: str, generation: int) -> subprocess.Popen:
        hostname = self._hostname(plan, role, generation)
        child = subprocess.Popen(
            [sys.executable, "-m", self.worker_module, *plan.worker_args()[role], "--loglevel", self.loglevel,
             "--hostname", hostname],
            env={**os.environ, **self.metrics.child_env()} if self.metrics else None,
        )
        child.lanes_hostname = hostname
        return child

    def _wait_ready(self, workers: Workers) -> bool:
        """Until every child answers a ping (it consumes), one exits, or the time is up."""
        if self._celery is None:
            self._celery = make_celery(self.settings, resolve_redis_url(self.settings))
        waiting = {child.lanes_hostname: child for child in workers.values()}
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline and not self._stop.is_set():
            if any(child.poll() is not None for child in waiting.values()):
                return False
            try:
                replies = self._celery.control.ping(destination=list(waiting), timeout=1.0) or []
            except Exception:  # Redis away for a moment: ask again
                time.sleep(0.5)
                continue
            for reply in replies:
                for name in reply:
                    waiting.pop(name, None)
            if not waiting:
                return True
        return False

    def _exited(self, child: subprocess.Popen) -> None:
        if self.metrics is not None:
            self.metrics.child_exited(child.pid)

    def _stop_children(self, workers: Workers | None, grace: float) -> None:
        """Warm stop within ``grace``; then cold (messages handed back at once); then kill."""
        if not workers:
            return
        children = [child for child in workers.values() if child.poll() is None]
        try:
            self._stop_gracefully(children, grace)
        finally:
            for child in workers.values():
                self._exited(child)

    def _stop_gracefully(self, children: list[subprocess.Popen], grace: float) -> None:
        # Each step signals every child, then waits for them all within one deadline.
        for sig, within in ((signal.SIGTERM, grace), (signal.SIGQUIT, COLD_STOP_SECONDS)):
            for child in children:
                child.send_signal(sig)
            deadline = time.monotonic() + within
            for child in children:
                try:
                    child.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            children = [child for child in children if child.poll() is None]
            if not children:
                return
            if sig == signal.SIGTERM:
                self.echo(f"fleet {self.fleet}: worker still busy after {grace:.0f}s; cold shutdown")
        for child in children:
            child.kill()
            child.wait()

    def _retire(self, workers: Workers) -> None:
        """Stop ``workers`` in the background: the loop keeps watching the new ones."""
        grace = self._grace
        self._retired.extend(workers.values())
        thread = threading.Thread(target=self._stop_children, args=(workers, grace), name="lanes-retire", daemon=True)
        thread.start()
        self._retiring = [t for t in self._retiring if t.is_alive()] + [thread]

    def _replace(self, plan: FleetPlan) -> None:
        old = self._children
        new = self._start(plan)
        if not self._wait_ready(new):
            self.echo(f"fleet {plan.fleet}: the new worker did not answer yet; stopping the old one anyway")
        self._children = new
        if old:
            self._retire(old)

    # --- queues of old names --------------------------------------------------------

    def _check_lanes(self, where: str) -> None:
        """Seed 004: the lane config is checked at start and on every reload, in every process."""
        try:
            if self._redis is None:
                self._redis = connect(resolve_redis_url(self.settings), timeout=self.settings.redis_timeout_seconds)
        except LanesError as exc:
            self.echo(f"lane config (fleet {self.fleet} {where}): not checked: {exc}")
            return
        check_and_record(self.settings, self.engine, self._redis, where=f"fleet {self.fleet} {where}",
                         echo=lambda line: self.echo(line))

    def _drain_old_queues(self) -> None:
        if not self._old_names:
            return
        try:
            if self._redis is None:
                # The queues live on the broker's Redis (the lanes' unless LANES_BROKER_URL says otherwise).
                broker = broker_url_of(self.settings, resolve_redis_url(self.settings))
                self._redis = connect(broker, timeout=self.settings.redis_timeout_seconds)
            for old in sorted(self._old_names):
                moved = drain_fleet(self._redis, self.settings, old, self.fleet)
                if moved:
                    self.echo(f"fleet {self.fleet}: moved {moved} queued task(s) from old name {old!r}")
        except REDIS_UNAVAILABLE:
            pass  # next poll

    # --- the loop ---------------------------------------------------------------------

    def stop(self, *_) -> None:
        self._stop.set()

    def run(self) -> int:
        plan = self.plan()  # an unknown fleet or a timeout that cannot fit fails here, before anything starts
        version = catalog_stamp(self.engine)
        self.metrics = supervised(self.settings, CatalogView(self.engine, refresh_seconds=5.0).table)
        self._children = self._start(plan)
        self._check_lanes("start")
        self._drain_old_queues()
        backoff = 1.0
        catalog_away = False
        try:
            while not self._stop.wait(self.poll_seconds):
                self._drain_old_queues()
                exited = [role for role, child in self._children.items() if child.poll() is not None]
                if exited:
                    # Only the process that died: the other keeps serving its queue.
                    time.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
                    for role in exited:
                        child = self._children[role]
                        self.echo(f"fleet {self.fleet}: {role} worker exited with {child.returncode}; restarting")
                        self._exited(child)
                        self._children[role] = self._start_one(plan, role, self._next_generation())
                    continue
                backoff = 1.0
                try:
                    current = catalog_stamp(self.engine)
                except (SQLAlchemyError, DatabaseUnavailable) as exc:
                    # The catalog's database is away: the workers go on with the plan
                    # they have (they route from their last catalog read too).
                    if not catalog_away:
                        self.echo(f"fleet {self.fleet}: catalog database did not answer ({exc.__class__.__name__}); "
                                  "the worker keeps its plan")
                    catalog_away = True
                    continue
                catalog_away = False
                if current == version:
                    continue
                version = current
                self._check_lanes("reload")
                try:
                    new_plan = self.plan()
                except InvalidInput as exc:
                    self.echo(f"fleet {self.fleet}: catalog change refused, the worker keeps its plan: {exc}")
                    continue
                if new_plan != plan:
                    self.echo(f"fleet {self.fleet}: catalog changed the fleet; replacing its worker")
                    plan = new_plan
                    self._replace(plan)
        finally:
            self._stop_children(self._children, self._grace)
            for thread in self._retiring:
                thread.join()
            if self.metrics is not None:
                self.metrics.close()
        return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    from lanes.settings import load_settings

    parser = argparse.ArgumentParser(prog="python -m workers.supervisor")
    parser.add_argument("--fleet", required=True)
    parser.add_argument("--loglevel", default="WARNING")
    parser.add_argument("--poll-seconds", type=float, default=2.0)
    args = parser.parse_args(argv)
    return run_until_signalled(lambda: FleetSupervisor(
        load_settings(), args.fleet, poll_seconds=args.poll_seconds, loglevel=args.loglevel))


def run_until_signalled(build) -> int:
    """Run the supervisor ``build()`` makes until SIGTERM or SIGINT (a warm
    stop); a refusal while building or running is one line and exit 2."""
    from lanes.errors import LanesError

    try:
        supervisor = build()
        signal.signal(signal.SIGTERM, supervisor.stop)
        signal.signal(signal.SIGINT, supervisor.stop)
        return supervisor.run()
    except LanesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

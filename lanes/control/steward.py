"""The thread in every worker that keeps lane widths where the authority says.

Hosting: a daemon thread in each fleet worker, not a separate ``lanes
control`` process. The workers are what must run for a pool to be served
at all, they already hold Redis and the catalog, and an extra process is one
more thing an operator can forget to start (then nothing would ever follow a
width). Exactly one process acts per pool all the same: a pool's decisions
are made only under its Redis lease (with a fencing number checked on every
write, :mod:`lanes.control.store`), renewed every follow period and lasting
``LEASE_INTERVALS`` intervals, so when the leader dies another worker takes
over within two intervals.

Every period (``follow_seconds``, 0.5 s by default) the steward:

1. re-reads the catalog if its version moved (so ``catalog apply``,
   ``set-width`` and data revisions are seen within a second);
2. for each pool under control: takes or renews its lease, and when it
   leads and the pool's interval has passed, runs one control tick;
3. for every pool: brings the live lane to the authority's width (a worker
   that just started does this on its first pass).
"""

from __future__ import annotations

import logging
import threading

from lanes.catalog import PoolInfo
from lanes.catalog.controllers import running_kinds
from lanes.control.loop import ControlLoop, interval_of
from lanes.lane.base import new_token

log = logging.getLogger("lanes.control")

LEASE_INTERVALS = 1.75  # a dead leader's lease lapses within 1.75 intervals; the next pass takes it


class Steward:
    def __init__(self, runtime, *, follow_seconds: float = 0.5, memory_gated: bool = False) -> None:
        self.rt = runtime
        self.follow_seconds = follow_seconds
        self.token = new_token()
        self.loop = ControlLoop(runtime.control, runtime.events, memory_gated=memory_gated,
                                replicas=getattr(runtime, "replicas", None))
        self._leases: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Steward":
        self._thread = threading.Thread(target=self._run, name="lanes-steward", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.pass_once()
            except Exception:  # Redis or the database away: try again next period
                log.warning("width follow pass failed", exc_info=True)
            self._stop.wait(self.follow_seconds)

    def pass_once(self) -> None:
        table = self.rt.table()
        now = self.rt.clock.monotonic()
        present = set()
        for pool in table.pools.values():
            present.add(pool.id)
            lane = self.rt.lane(pool)
            if running_kinds(pool):
                self._lead(pool, table, lane, now)
            elif pool.id in self._leases:
                self._resign(pool.id)
            self.rt.authority.sync(pool, lane, current=self.rt.current_pool)
        for pool_id in [p for p in self._leases if p not in present]:
            self._resign(pool_id)

    def _lead(self, pool: PoolInfo, table, lane, now: float) -> None:
        ttl = max(LEASE_INTERVALS * interval_of(pool), 3 * self.follow_seconds)
        lease = self.rt.control.lease(pool.id, self.token, ttl)
        if lease is None:
            if self._leases.pop(pool.id, None) is not None:
                self.loop.forget(pool.id)
            return
        if self._leases.get(pool.id) != lease:
            self._leases[pool.id] = lease
            log.info("pool %s: this worker now runs its controllers (lease %s)", pool.name, lease)
        if self.loop.due(pool, now):
            self.loop.tick(pool, table, lane, lease, now)

    def _resign(self, pool_id: int) -> None:
        lease = self._leases.pop(pool_id)
        self.loop.forget(pool_id)
        try:
            self.rt.control.resign(pool_id, lease)
        except Exception:
            log.warning("could not resign the lease of pool id %s", pool_id, exc_info=True)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        for pool_id in list(self._leases):
            self._resign(pool_id)
        self.loop.close()

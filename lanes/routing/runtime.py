"""What one process needs to route: a fresh view of the catalog, one lane per
pool, the shared breakers, the event log, the backend client and traces.

Built lazily and shared by every worker thread of a process. Lane widths come
from the one width authority (:mod:`lanes.pools`): a lane is (re)created at
the authority's width, and a changed catalog is followed through it, never
by writing the catalog width over a learned one.

``observers`` is the list the walker reports every attempt and bypass to
(breakers, routing events, controllers, process metrics and the failover shares).
``control_generation`` is asked, right after a slot is granted,
which controller generation the admission falls under (None: no controller).
"""

from __future__ import annotations

import logging
import threading

import redis

from lanes.catalog import PoolInfo, RoutingTable, WorkflowRoute, open_catalog
from lanes.catalog.controllers import running_kinds
from lanes.clock import Clock, SystemClock
from lanes.control.replicas import Replicas
from lanes.control.store import ControlStore
from lanes.errors import InvalidInput
from lanes.lane import Lane
from lanes.namespace import Namespace
from lanes.pools import WidthAuthority, hosted_lane_key, lane_key, pool_lane
from lanes.redis_conn import connect, resolve_redis_url
from lanes.routing.backend import BackendClient
from lanes.routing.breaker import BreakerObserver, Breakers
from lanes.routing.control_observer import ControlObserver
from lanes.routing.events import EventLog, EventObserver
from lanes.routing.metrics_observer import MetricsObserver
from lanes.routing.observers import Observer
from lanes.routing.share import ShareController, ShareObserver, ShareStore
from lanes.routing.share_metrics import share_metrics
from lanes.routing.trace import TraceStore
from lanes.routing.view import CatalogView
from lanes.settings import Settings

__all__ = ["Runtime", "lane_key", "pool_lane", "provision_lanes"]

log = logging.getLogger("lanes.routing")


def provision_lanes(client: redis.Redis, settings: Settings, table: RoutingTable) -> list[str]:
    """Create the lanes of pools that have none yet, with no quiet period.

    Only for a deployment that knows nobody holds a slot (a new pool, a new
    Redis): a lane whose state vanished under live holders must instead come
    back through its quiet period, which is what happens without this call.
    Returns the names of the pools whose lanes were created.
    """
    authority = WidthAuthority(ControlStore(client, Namespace(settings.key_prefix)))
    return [
        pool.name for pool in table.pools.values()
        if pool_lane(client, settings, pool, width=authority.width(pool)).provision()
    ]


def http_pool_size(calls_at_once: int | None) -> dict:
    """The backend client's connection bound: one per walk at once (a call
    past the bound would wait for a connection, capping what is in flight)."""
    if calls_at_once is None:
        return {}
    return {"max_connections": max(256, calls_at_once)}


class Runtime:
    def __init__(
        self,
        settings: Settings,
        *,
        redis_url: str | None = None,
        clock: Clock | None = None,
        refresh_seconds: float = 1.0,
        engine=None,
        calls_at_once: int | None = None,
    ) -> None:
        """``calls_at_once``: the most walks this process runs at the same
        time (a fleet worker's held messages). The HTTP pool holds a
        connection for each, since every walk may be calling at once; the
        Redis pool is bounded (:func:`lanes.redis_conn.shared_pool_size`): a
        walk past it waits for a connection."""
        self.settings = settings
        self.clock = clock or SystemClock()
        self.redis_url = redis_url or resolve_redis_url(settings)
        self.client: redis.Redis = connect(self.redis_url, timeout=settings.redis_timeout_seconds,
                                           shared_by=calls_at_once)
        self.engine = engine or open_catalog(settings)
        self.breakers = Breakers(self.client, prefix=settings.key_prefix)
        self.events = EventLog(
            self.client, prefix=settings.key_prefix, max_len=settings.events_max, enabled=settings.events_enabled
        )
        self.traces = TraceStore(self.client, prefix=settings.key_prefix, ttl_seconds=settings.result_ttl_seconds)
        self.backend = BackendClient(**http_pool_size(calls_at_once))
        self.control = ControlStore(self.client, Namespace(settings.key_prefix))
        self.authority = WidthAuthority(self.control)
        self.replicas = Replicas(self.client, Namespace(settings.key_prefix))
        # Everything that wants to hear how each backend call ended (walker -> observers).
        self.shares = ShareController(ShareStore(self.client, Namespace(settings.key_prefix)), clock=self.clock,
                                      events=self.events, metrics=share_metrics())
        self.observers: list[Observer] = [
            BreakerObserver(self.breakers), EventObserver(self.events), ControlObserver(self), MetricsObserver(),
            ShareObserver(self),
        ]
        self.catalog = CatalogView(self.engine, refresh_seconds=refresh_seconds, on_change=self._follow_catalog)
        self._lock = threading.Lock()
        self._lanes: dict[int, Lane] = {}
        self._hosted: dict[tuple[str, str], Lane] = {}
        self._steward = None

    # --- catalog -----------------------------------------------------------

    def table(self) -> RoutingTable:
        """The routing table, re-read when the catalog version moves."""
        return self.catalog.table()

    def workflow(self, name: str) -> WorkflowRoute:
        return self.catalog.workflow(name)

    def pool_by_id(self, pool_id: int) -> PoolInfo:
        for pool in self.table().pools.values():
            if pool.id == pool_id:
                return pool
        raise InvalidInput(f"pool id {pool_id} is no longer in the catalog")

    def current_pool(self, pool_id: int) -> PoolInfo | None:
        """Pool ``pool_id`` as the catalog has it now (the stamp asked again), or None if gone."""
        for pool in self.catalog.table(recheck=True).pools.values():
            if pool.id == pool_id:
                return pool
        return None

    def _pool_width(self, pool_id: int) -> int:
        """The width a lane is (re)created at: the authority's, never the bare catalog's."""
        return self.authority.width(self.pool_by_id(pool_id))

    def _follow_catalog(self, table: RoutingTable) -> None:
        for pool in table.pools.values():
            lane = self._lanes.get(pool.id)
            if lane is not None:
                self.authority.sync(pool, lane, current=self.current_pool)
        try:
            self.shares.follow(table)
        except Exception:  # Redis away: the next change (or draw) catches up
            log.warning("failover shares could not follow the catalog", exc_info=True)

    # --- control -----------------------------------------------------------

    def control_generation(self, pool: PoolInfo) -> int | None:
        """Called by the walker right after a permit on ``pool``'s lane is granted:
        counts the admission and returns the controller generation it is under."""
        if not running_kinds(pool):
            return None
        return self.control.admit(pool.id)

    def start_steward(self, *, follow_seconds: float = 0.5, memory_gated: bool | None = None):
        """Start this process's width follower and control loop (see :mod:`lanes.control.steward`)."""
        from lanes.control.steward import Steward

        if self._steward is None:
            from lanes.control.loop import memory_gated as gate_configured

            # The same test as the worker's gate (workers/memgate.py): nonsensical marks are no gate.
            gated = gate_configured(self.settings) if memory_gated is None else memory_gated
            self._steward = Steward(self, follow_seconds=follow_seconds, memory_gated=gated).start()
        return self._steward

    # --- lanes -------------------------------------------------------------

    def lane(self, pool: PoolInfo) -> Lane:
        lane = self._lanes.get(pool.id)
        if lane is None:
            with self._lock:
                lane = self._lanes.get(pool.id)
                if lane is None:
                    lane = pool_lane(
                        self.client, self.settings, pool,
                        width=lambda pool_id=pool.id: self._pool_width(pool_id),
                    )
                    self._lanes[pool.id] = lane
        return lane

    def hosted_lane(self, model) -> Lane:
        """The lane that bounds a hosted model's calls at once (its catalog
        ``concurrency``), fleet-wide: keyed by the model's name, at exactly
        that width (no controller moves it)."""
        key = ("hosted", model.name)
        lane = self._hosted.get(key)
        if lane is None or lane.width_hint != model.concurrency:
            with self._lock:
                lane = Lane(self.client, hosted_lane_key(model.name), width=model.concurrency,
                            prefix=self.settings.key_prefix, lease_seconds=self.settings.lease_seconds,
                            renew_seconds=self.settings.renew_interval)
                lane.width_hint = model.concurrency
                self._hosted[key] = lane
                # A changed limit reaches the live lane at once.
                try:
                    lane.resize(model.concurrency)
                except Exception:  # Redis away: the lane is (re)created at the limit when it comes back
                    log.warning("hosted lane of %s not resized", model.name, exc_info=True)
        return lane

    def close(self) -> None:
        if self._steward is not None:
            self._steward.stop()
            self._steward = None
        self.events.close()
        self.backend.close()
        for lane in [*self._lanes.values(), *self._hosted.values()]:
            close = getattr(lane, "close", None)
            if close:
                close()
        self.client.close()

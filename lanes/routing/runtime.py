"""What one process needs to route: a fresh view of the catalog, one lane per
pool, the shared breakers, the event log, the backend client and traces.

Built lazily and shared by every worker thread of a process.

``observers`` is the list the walker reports every attempt and bypass to
(breakers and routing events to begin with; controllers and metrics add
themselves). ``control_generation`` is asked, right after a slot is granted,
which controller generation the admission falls under (None: no controller).
"""

from __future__ import annotations

import threading
from typing import Callable

import redis

from lanes.catalog import PoolInfo, RoutingTable, WorkflowRoute, open_catalog
from lanes.clock import Clock, SystemClock
from lanes.errors import InvalidInput
from lanes.lane import Lane
from lanes.redis_conn import connect, resolve_redis_url
from lanes.routing.backend import BackendClient
from lanes.routing.breaker import BreakerObserver, Breakers
from lanes.routing.events import EventLog, EventObserver
from lanes.routing.observers import Observer
from lanes.routing.trace import TraceStore
from lanes.routing.view import CatalogView
from lanes.settings import Settings


def lane_key(pool: PoolInfo) -> str:
    """Lanes are keyed by the pool's stable id: a rename keeps the same lane."""
    return f"pool:{pool.id}"


def pool_lane(client: redis.Redis, settings: Settings, pool: PoolInfo, *, width=None) -> Lane:
    """The lane of ``pool``, as every process of this deployment sees it."""
    return Lane(
        client,
        lane_key(pool),
        width=width if width is not None else pool.width,
        prefix=settings.key_prefix,
        lease_seconds=settings.lease_seconds,
        renew_seconds=settings.renew_interval,
    )


def provision_lanes(client: redis.Redis, settings: Settings, table: RoutingTable) -> list[str]:
    """Create the lanes of pools that have none yet, with no quiet period.

    Only for a deployment that knows nobody holds a slot (a new pool, a new
    Redis): a lane whose state vanished under live holders must instead come
    back through its quiet period, which is what happens without this call.
    Returns the names of the pools whose lanes were created.
    """
    return [pool.name for pool in table.pools.values() if pool_lane(client, settings, pool).provision()]


def _no_generation(pool: PoolInfo) -> int | None:
    return None


class Runtime:
    def __init__(
        self,
        settings: Settings,
        *,
        redis_url: str | None = None,
        clock: Clock | None = None,
        refresh_seconds: float = 1.0,
        engine=None,
    ) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.redis_url = redis_url or resolve_redis_url(settings)
        self.client: redis.Redis = connect(self.redis_url, timeout=settings.redis_timeout_seconds)
        self.engine = engine or open_catalog(settings)
        self.breakers = Breakers(self.client, prefix=settings.key_prefix)
        self.events = EventLog(
            self.client, prefix=settings.key_prefix, max_len=settings.events_max, enabled=settings.events_enabled
        )
        self.traces = TraceStore(self.client, prefix=settings.key_prefix, ttl_seconds=settings.result_ttl_seconds)
        self.backend = BackendClient()
        self.observers: list[Observer] = [BreakerObserver(self.breakers), EventObserver(self.events)]
        self.control_generation: Callable[[PoolInfo], int | None] = _no_generation
        self.catalog = CatalogView(self.engine, refresh_seconds=refresh_seconds, on_change=self._follow_widths)
        self._lock = threading.Lock()
        self._lanes: dict[int, Lane] = {}

    # --- catalog -----------------------------------------------------------

    def table(self) -> RoutingTable:
        """The routing table, re-read when the catalog version moves."""
        return self.catalog.table()

    def workflow(self, name: str) -> WorkflowRoute:
        return self.catalog.workflow(name)

    def _pool_width(self, pool_id: int) -> int:
        for pool in self.table().pools.values():
            if pool.id == pool_id:
                return pool.width
        raise InvalidInput(f"pool id {pool_id} is no longer in the catalog")

    def _follow_widths(self, table: RoutingTable) -> None:
        for pool in table.pools.values():
            lane = self._lanes.get(pool.id)
            if lane is not None and lane.stats().width != pool.width:
                lane.resize(pool.width)

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

    def close(self) -> None:
        self.events.close()
        self.backend.close()
        for lane in self._lanes.values():
            close = getattr(lane, "close", None)
            if close:
                close()
        self.client.close()

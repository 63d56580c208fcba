"""Every pool's live lane as all workers see it, and changing a pool's width.

:func:`pool_reports` is what ``lanes pools --json`` prints and ``GET
/v1/pools`` returns: configured and live width, in-flight, queued per
priority, mean hold, wait p50/p95, the controllers and their last decision,
and a utilisation snapshot (in-flight over live width).
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from lanes.catalog import PoolInfo, load_routing, set_pool_width
from lanes.control.store import ControlStore
from lanes.errors import InvalidInput, NotFound, RedisUnavailable
from lanes.namespace import Namespace
from lanes.pools import WidthAuthority, learned_applies, pool_lane, running_kinds
from lanes.presence import WorkerPresence
from lanes.priority import Priority
from lanes.redis_conn import REDIS_UNAVAILABLE, eviction_warning


@contextlib.contextmanager
def redis_errors() -> Iterator[None]:
    """A raw redis-py "did not answer" error as the one-line RedisUnavailable."""
    try:
        yield
    except REDIS_UNAVAILABLE as exc:
        raise RedisUnavailable(f"Redis did not answer: {exc}; check that it runs and LANES_REDIS_URL") from None


def authority(client) -> WidthAuthority:
    return WidthAuthority(ControlStore(client.redis, Namespace(client.settings.key_prefix)))


def live_lane(client, pool: PoolInfo):
    """The lane of ``pool``, (re)created if ever needed at the authority's width."""
    return pool_lane(client.redis, client.settings, pool, width=lambda: authority(client).width(pool))


def _ms(seconds) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def pool_reports(client, name: str | None = None) -> tuple[list[dict], str | None]:
    """(one row per pool, sorted by name; a Redis eviction warning or None).

    ``name`` narrows the rows to that pool (:class:`NotFound` if there is none).
    """
    table = load_routing(client.engine)
    pools = sorted(table.pools.values(), key=lambda p: p.name)
    if name is not None:
        pools = [p for p in pools if p.name == name]
        if not pools:
            raise NotFound(f"unknown pool {name!r} (known: {', '.join(sorted(table.pools)) or 'none'})")
    # A fleet is named after its primary pool; other pools have no workers of their own.
    fleets = sorted({route.fleet for route in table.workflows.values() if route.fleet})
    with redis_errors():
        workers = WorkerPresence(client.redis, prefix=client.settings.key_prefix).live_by_fleet(fleets)
        warning = eviction_warning(client.redis)
        rows = [_row(client, pool, workers.get(pool.name)) for pool in pools]
    return rows, warning


def _row(client, pool: PoolInfo, live_workers: list[str] | None) -> dict:
    width_authority = authority(client)
    stats = live_lane(client, pool).stats()
    state = width_authority.state(pool)
    width = stats.width if stats.exists else pool.width
    return {
        "pool": pool.name,
        "configured_width": pool.width,
        "width": width,
        "authority_width": width_authority.width(pool),
        "floor": pool.floor,
        "ceiling": pool.ceiling,
        "controllers": running_kinds(pool),
        # The loop's last decision, each controller's proposal, the signals it read.
        "control": state.as_dict() if learned_applies(pool, state) else None,
        "in_flight": stats.in_flight,
        "queued": {p.label: stats.queued.get(p, 0) for p in Priority},
        "utilisation": round(stats.in_flight / width, 3) if width else None,
        "mean_hold_ms": _ms(stats.mean_hold_seconds),
        "wait_p50_ms": _ms(stats.wait_p50_seconds),
        "wait_p95_ms": _ms(stats.wait_p95_seconds),
        "grants": stats.grants,
        "timeouts": stats.timeouts,
        "cancels": stats.cancels,
        "expired": stats.expired,
        "live_workers": live_workers,
    }


def follow_width(client, pool: PoolInfo) -> int:
    """Bring ``pool``'s live lane to the width authority's width now; the live width."""
    with redis_errors():
        lane = live_lane(client, pool)
        authority(client).sync(pool, lane)
        stats = lane.stats()
    return stats.width if stats.exists else authority(client).width(pool)


def set_width(client, name: str, width: int) -> tuple[PoolInfo, int]:
    """Set pool ``name``'s configured width, in the catalog and on its live lane at once.

    Returns the pool and its live width (the width authority's: with a
    controller on, ``width`` is where the controllers start again).
    """
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise InvalidInput(f"width {width!r} is not a width >= 1")
    pool = set_pool_width(client.engine, name, width)
    return pool, follow_width(client, pool)

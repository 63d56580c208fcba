"""Every pool's live lane as all workers see it, and changing a pool's width.

:func:`pool_reports` is what ``lanes pools --json`` prints and ``GET
/v1/pools`` returns: configured and live width, in-flight, queued per
priority, mean hold, wait p50/p95, the controllers and their last decision,
and a utilisation snapshot (in-flight over live width); each row is built by
:mod:`lanes.ops.lane_stats`, as ``lanes top`` and Flower build theirs.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from lanes.catalog import PoolInfo, load_routing, set_pool_width
from lanes.errors import InvalidInput, NotFound, RedisUnavailable
from lanes.ops import lane_stats
from lanes.pools import WidthAuthority
from lanes.presence import WorkerPresence
from lanes.redis_conn import REDIS_UNAVAILABLE, eviction_warning


@contextlib.contextmanager
def redis_errors() -> Iterator[None]:
    """A raw redis-py "did not answer" error as the one-line RedisUnavailable."""
    try:
        yield
    except REDIS_UNAVAILABLE as exc:
        raise RedisUnavailable(f"Redis did not answer: {exc}; check that it runs and LANES_REDIS_URL") from None


def authority(client) -> WidthAuthority:
    return lane_stats.authority(client.settings, client.redis)


def live_lane(client, pool: PoolInfo):
    """The lane of ``pool``, (re)created if ever needed at the authority's width."""
    return lane_stats.live_lane(client.settings, client.redis, pool)


def pool_reports(client, name: str | None = None) -> tuple[list[dict], str | None]:
    """(one row per pool, sorted by name; a Redis eviction warning or None).

    ``name`` narrows the rows to that pool (:class:`NotFound` if there is none).
    Rows come from :func:`lanes.ops.lane_stats.pool_rows`, as ``lanes top`` and Flower show them.
    """
    table = load_routing(client.engine)
    pools = list(table.pools.values())
    if name is not None:
        pools = [p for p in pools if p.name == name]
        if not pools:
            raise NotFound(f"unknown pool {name!r} (known: {', '.join(sorted(table.pools)) or 'none'})")
    # A fleet is named after its primary pool; other pools have no workers of their own.
    fleets = sorted({route.fleet for route in table.workflows.values() if route.fleet})
    with redis_errors():
        workers = WorkerPresence(client.redis, prefix=client.settings.key_prefix).live_by_fleet(fleets)
        warning = eviction_warning(client.redis)
        rows = lane_stats.pool_rows(client.settings, client.redis, pools, workers)
    return rows, warning


def follow_width(client, pool: PoolInfo) -> int:
    """Bring ``pool``'s live lane to the width authority's width now; the live width.

    A change of the live width is one ``width_change`` routing event with
    ``controller="operator"`` (as a controller's change is one with its own
    name), so ``lanes top`` and the event log count an operator's resizes too.
    """
    with redis_errors():
        lane = live_lane(client, pool)
        before = lane.stats()
        authority(client).sync(pool, lane)
        stats = lane.stats()
        if before.exists and stats.exists and stats.width != before.width:
            _record_operator_resize(client, pool, before.width, stats.width)
    return stats.width if stats.exists else authority(client).width(pool)


def _record_operator_resize(client, pool: PoolInfo, old: int, new: int) -> None:
    from lanes.routing.events import EventLog

    if not client.settings.events_enabled:
        return
    log = EventLog(client.redis, prefix=client.settings.key_prefix, max_len=client.settings.events_max)
    log.record("width_change", pool=pool.name, controller="operator", old=old, new=new,
               reason=f"operator change: configured width {pool.width}")
    log.close()  # written now: the answer that follows may be read together with it


def set_width(client, name: str, width: int) -> tuple[PoolInfo, int]:
    """Set pool ``name``'s configured width, in the catalog and on its live lane at once.

    Returns the pool and its live width (the width authority's: with a
    controller on, ``width`` is where the controllers start again).
    """
    if isinstance(width, bool) or not isinstance(width, int) or width < 1:
        raise InvalidInput(f"width {width!r} is not a width >= 1")
    pool = set_pool_width(client.engine, name, width)
    return pool, follow_width(client, pool)


SCRAPE_HIDDEN = "scrape failed (what it read is shown with the admin token)"


def public_row(row: dict) -> dict:
    """``row`` as a reader without the admin token sees it: no scrape URL, no scraped text.

    A controller's scrape error quotes what the metrics URL answered (a
    parser's complaint about its first line), and its URLs are the
    catalog's; both stay with the token holders who set them.
    """
    control = row.get("control")
    if not control:
        return row
    return {**row, "control": _hide_scrape(control)}


def _hide_scrape(value, key: str | None = None):
    if isinstance(value, dict):
        hidden = {}
        for name, child in value.items():
            if key == "scrape" and name in ("urls", "error"):
                hidden[name] = None if name == "urls" or child is None else SCRAPE_HIDDEN
                continue
            hidden[name] = _hide_scrape(child, name)
        return hidden
    if isinstance(value, list):
        return [_hide_scrape(child, key) for child in value]
    if isinstance(value, str) and value.startswith("scrape failed"):
        return SCRAPE_HIDDEN
    return value

"""Every pool's live lane as one row: what ``lanes pools``, ``lanes top`` and
the worker's Flower info all show, read the same way.

Reads Redis only (the lane, the width authority's controller state); the
caller owns the client and the routing table.
"""

from __future__ import annotations

from typing import Iterable

from lanes.catalog import PoolInfo
from lanes.celery_client import broker_client, broker_queued
from lanes.priority import Priority
from lanes.settings import Settings


def authority(settings: Settings, client):
    from lanes.control.store import ControlStore
    from lanes.namespace import Namespace
    from lanes.pools import WidthAuthority

    return WidthAuthority(ControlStore(client, Namespace(settings.key_prefix)))


def live_lane(settings: Settings, client, pool: PoolInfo, width_authority=None):
    """``pool``'s lane; a lane missing from Redis would be made at the authority's width."""
    from lanes.pools import pool_lane

    width_authority = width_authority or authority(settings, client)
    return pool_lane(client, settings, pool, width=lambda: width_authority.width(pool))


def _ms(seconds) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def pool_row(settings: Settings, client, pool: PoolInfo, width_authority=None,
             live_workers: list[str] | None = None) -> dict:
    """One pool's lane: widths, in flight, queued per priority, holds, waits, controllers."""
    from lanes.catalog.controllers import running_kinds
    from lanes.control.store import learned_applies

    width_authority = width_authority or authority(settings, client)
    stats = live_lane(settings, client, pool, width_authority).stats()
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
        # Why the controllers cannot go above the configured width (no memory gate), or None.
        "fail_closed": state.fail_closed if learned_applies(pool, state) else None,
        "endpoints": list(pool.endpoints),
        "in_flight": stats.in_flight,
        "queued": {p.label: stats.queued.get(p, 0) for p in Priority},
        # Taken by no worker yet: the pool's fleet queues (a worker takes
        # thousands, so this stays 0 until every worker of the fleet is full).
        "broker_queued": {p.label: n for p, n in broker_queued(broker_client(settings, client), pool.name).items()},
        # A snapshot: the share of the live width in use at this instant.
        "utilisation": round(stats.in_flight / width, 3) if width else None,
        "mean_hold_ms": _ms(stats.mean_hold_seconds),
        "wait_p50_ms": _ms(stats.wait_p50_seconds),
        "wait_p95_ms": _ms(stats.wait_p95_seconds),
        "grants": stats.grants,
        "timeouts": stats.timeouts,
        "cancels": stats.cancels,
        "expired": stats.expired,
        # Per priority and workflow with work: holders, waiters, slots still owed (shares).
        "workflows": [share.as_dict() for share in stats.workflows],
        "live_workers": live_workers,
        # Redis lost this lane's state (restart, flush): it admits no one new until
        # its holders re-register, and its counts are not the fleet's yet.
        "state_lost": not stats.exists,
        "quiet_seconds": round(stats.quiet_seconds, 1) if stats.quiet_seconds else 0.0,
    }


def queued_text(row: dict) -> str:
    """Queued per priority as ``i/u/b``, each the lane's count, ``+N`` more in the broker when any."""
    broker = row.get("broker_queued") or {}
    return "/".join(
        f"{row['queued'][p.label]}+{broker[p.label]}" if broker.get(p.label) else str(row["queued"][p.label])
        for p in Priority
    )


def pool_rows(settings: Settings, client, pools: Iterable[PoolInfo],
              workers: dict[str, list[str]] | None = None) -> list[dict]:
    """Rows of ``pools`` sorted by name; ``workers`` maps a fleet (its primary pool) to its live workers."""
    width_authority = authority(settings, client)
    workers = workers or {}
    return [
        pool_row(settings, client, pool, width_authority, workers.get(pool.name))
        for pool in sorted(pools, key=lambda p: p.name)
    ]

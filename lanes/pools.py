"""The one width authority: the width each pool's lane must run at, decided here only.

- Every controller of the pool off: exactly the configured width ("off means
  off"; turning the last controller off restores it at the next follow).
- Otherwise: the width the pool's control loop learned (kept in Redis,
  :mod:`lanes.control.store`) within [floor, ceiling], where the configured
  width is only where it starts. A learned width counts only while it was
  learned under the pool's present configuration (same configured width,
  same controllers): an operator who sets a width (``catalog apply``,
  ``pools set-width``, a data revision) restarts the controllers from it.

Everything that sizes a live lane asks this module: the width followers in
every worker (:class:`lanes.control.steward.Steward`, within a second of a
catalog or controller change, a freshly started worker included), the lane's
own re-creation after Redis lost its state, ``lanes pools set-width``. The
catalog width is never written over a learned one.
"""

from __future__ import annotations

import logging
from typing import Callable

from lanes.catalog import PoolInfo
from lanes.catalog.controllers import running_kinds
from lanes.control.store import ControlState, ControlStore, learned_applies
from lanes.instruments import width_changed
from lanes.lane import Lane
from lanes.settings import Settings

log = logging.getLogger("lanes.control")


def lane_key(pool: PoolInfo) -> str:
    """Lanes are keyed by the pool's stable id: a rename keeps the same lane."""
    return f"pool:{pool.id}"


def hosted_lane_key(model_name: str) -> str:
    """A hosted model's lane (its concurrency limit) is keyed by its name: it
    has no pool, and its limit belongs to the API account it calls."""
    return f"hosted:{model_name}"


def decide_width(pool: PoolInfo, state: ControlState | None) -> int:
    """The width ``pool``'s lane must run at, given its controller state."""
    if not running_kinds(pool):
        return pool.width
    if learned_applies(pool, state):
        return max(pool.floor, min(pool.ceiling, state.width))
    return max(pool.floor, min(pool.ceiling, pool.width))


class WidthAuthority:
    def __init__(self, store: ControlStore) -> None:
        self.store = store

    def state(self, pool: PoolInfo) -> ControlState | None:
        return self.store.read(pool.id) if running_kinds(pool) else None

    def width(self, pool: PoolInfo) -> int:
        return decide_width(pool, self.state(pool))

    def sync(self, pool: PoolInfo, lane: Lane, *, current: Callable[[int], PoolInfo | None] | None = None,
             ) -> int | None:
        """Bring ``lane`` to the authority's width if it differs; the new width, or None.

        A lane with no state in Redis is left alone: it is created at the
        authority's width (through its width callable) with its quiet period,
        so a Redis restart under live holders never over-admits.

        ``current`` (pool id -> the pool as the catalog has it now) is asked
        before a follower changes a width: its view of the catalog can be up to
        a refresh old, and an older view must not put back the width an
        operator has just set (``pools set-width`` resizes the lane at once).
        """
        wanted = self.width(pool)
        stats = lane.stats()
        if not stats.exists or stats.width == wanted:
            return None
        if current is not None:
            pool = current(pool.id)
            if pool is None:
                return None  # no longer in the catalog: nothing to follow
            wanted = self.width(pool)
            if stats.width == wanted:
                return None
        lane.resize(wanted)
        log.info("pool %s: lane width %d -> %d", pool.name, stats.width, wanted)
        if not running_kinds(pool):
            # The catalog's width (catalog apply, set-width, a controller turned off). A
            # controller's decision is counted once, by the loop that made it, not again
            # by every follower that brings its lane to it.
            width_changed(pool.name, "configured", stats.width, wanted)
        return wanted


def pool_lane(client, settings: Settings, pool: PoolInfo, *, width=None) -> Lane:
    """The lane of ``pool``, as every process of this deployment sees it.

    ``width`` (an int or a callable) is only used when the lane's state must
    be (re)created; pass the authority's, never the catalog's for a pool
    under control.
    """
    return Lane(
        client,
        lane_key(pool),
        width=width if width is not None else pool.width,
        prefix=settings.key_prefix,
        lease_seconds=settings.lease_seconds,
        renew_seconds=settings.renew_interval,
    )

"""Operator changes to one pool outside a catalog file (``lanes pools set-width``)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanes.catalog.engine import database_errors
from lanes.catalog.routing import PoolInfo, load_routing
from lanes.catalog.tables import Pool
from lanes.catalog.version import bump_version
from lanes.errors import InvalidInput


def set_pool_width(engine: Engine, name: str, width: int) -> PoolInfo:
    """Set ``name``'s configured width; it must stay within the pool's floor and ceiling."""
    table = load_routing(engine)
    pool = table.pools.get(name)
    if pool is None:
        known = ", ".join(sorted(table.pools)) or "none"
        raise InvalidInput(f"unknown pool {name!r} (known: {known})")
    if not pool.floor <= width <= pool.ceiling:
        raise InvalidInput(
            f"width {width} is outside pool {name!r}'s floor..ceiling {pool.floor}..{pool.ceiling}; "
            "change the floor or ceiling in the catalog file first"
        )
    if width != pool.width:
        pools = Pool.__table__
        with database_errors(engine), engine.begin() as conn:
            conn.execute(sa.update(pools).where(pools.c.id == pool.id).values(width=width))
            bump_version(conn)
    return load_routing(engine).pools[name]

"""Operator changes to one pool outside a catalog file (``lanes pools set-width``)."""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanes.catalog.engine import database_errors, writing
from lanes.catalog.routing import PoolInfo, load_routing
from lanes.catalog.state import pools_t
from lanes.catalog.version import bump_version, lock_version
from lanes.errors import InvalidInput, NotFound


def set_pool_width(engine: Engine, name: str, width: int) -> PoolInfo:
    """Set ``name``'s configured width; it must stay within the pool's floor and ceiling.

    The pool is read under the write lock, so a concurrent apply that renames
    or removes it cannot slip in between the check and the write.
    """
    with database_errors(engine), writing(engine) as conn:
        lock_version(conn)
        row = conn.execute(sa.select(pools_t).where(pools_t.c.name == name)).mappings().first()
        if row is None:
            names = sorted(conn.execute(sa.select(pools_t.c.name)).scalars())
            raise NotFound(f"unknown pool {name!r} (known: {', '.join(names) or 'none'})")
        if not row["floor"] <= width <= row["ceiling"]:
            raise InvalidInput(
                f"width {width} is outside pool {name!r}'s floor..ceiling {row['floor']}..{row['ceiling']}; "
                "change the floor or ceiling in the catalog file first"
            )
        if width != row["width"]:
            conn.execute(sa.update(pools_t).where(pools_t.c.id == row["id"]).values(width=width))
            bump_version(conn)
    return load_routing(engine).pools[name]

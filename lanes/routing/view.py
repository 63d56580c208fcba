"""A process's view of the catalog: re-read only when the catalog version moves.

The version is checked at most once per ``refresh_seconds``, so a busy
process asks the database one cheap question a second, not one per request.
While the database does not answer (PostgreSQL restarting, a network cut),
routing goes on from the last table read, and the version is asked again at
the next check: a catalog outage of a minute stops no request that had been
routable before it.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from lanes.catalog import RoutingTable, WorkflowRoute, refresh
from lanes.errors import DatabaseUnavailable, InvalidInput

log = logging.getLogger("lanes.catalog")


def first_line(exc: BaseException) -> str:
    return next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)


class CatalogView:
    def __init__(
        self,
        engine: Engine,
        *,
        refresh_seconds: float = 1.0,
        on_change: Callable[[RoutingTable], None] | None = None,
    ) -> None:
        self.engine = engine
        self._refresh_seconds = refresh_seconds
        self._on_change = on_change
        # Re-entrant: on_change may resize lanes, which may ask for a width.
        self._lock = threading.RLock()
        self._table: RoutingTable | None = None
        self._checked_at = 0.0
        self._stale = False  # the last check failed: serving the last table read

    def table(self, *, recheck: bool = False) -> RoutingTable:
        """The table; ``recheck`` asks the database now instead of within ``refresh_seconds``."""
        with self._lock:
            now = time.monotonic()
            if not recheck and self._table is not None and now - self._checked_at < self._refresh_seconds:
                return self._table
            self._checked_at = now
            try:
                fresh = refresh(self.engine, self._table)
            except (SQLAlchemyError, DatabaseUnavailable) as exc:
                if self._table is None:
                    raise DatabaseUnavailable(f"the catalog database did not answer: {first_line(exc)}") from None
                if not self._stale:
                    log.warning("catalog database did not answer (%s); routing from the last catalog read",
                                first_line(exc))
                self._stale = True
                return self._table
            if self._stale:
                log.info("catalog database answers again")
                self._stale = False
            if fresh is not self._table:
                self._table = fresh
                if self._on_change is not None:
                    self._on_change(fresh)
            return fresh

    def workflow(self, name: str) -> WorkflowRoute:
        """The workflow called ``name``, ready to route, or a clear refusal."""
        table = self.table()
        route = table.workflows.get(name)
        if route is None:
            known = ", ".join(sorted(table.workflows)) or "none; apply a catalog first"
            raise InvalidInput(f"unknown workflow {name!r} (known: {known})")
        if not route.candidates:
            raise InvalidInput(f"workflow {name!r} has no candidate models; add one to the catalog")
        return route

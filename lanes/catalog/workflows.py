"""Operator changes to one workflow outside a catalog file: its failover share override.

The admin API's ``PATCH /v1/workflows/{name}`` and ``lanes shares set`` call
:func:`patch_workflow_failover`, so both follow seed 003's PATCH semantics
(lanes/catalog/failover.py): omitted unchanged, ``None`` restores the
defaults, ``{"enabled": False}`` disables, an object replaces the old
override whole. The change is checked as a catalog file's would be and
written under the catalog's write lock; workers follow it within their
catalog refresh (a second).
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from lanes.catalog import failover
from lanes.catalog.engine import database_errors, writing
from lanes.catalog.state import candidates_t, models_t, named_row, workflows_t
from lanes.catalog.version import bump_version, lock_version
from lanes.errors import InvalidInput


def patch_workflow_failover(engine: Engine, name: str, change=failover.UNCHANGED) -> dict | None:
    """Apply a PATCH of ``change`` to workflow ``name``'s failover override; the override now stored."""
    with database_errors(engine), writing(engine) as conn:
        lock_version(conn)
        row = named_row(conn, workflows_t, name, "workflow")
        current = row["failover"]
        new = failover.patch(current, change, where=f"workflow {name!r}: failover")
        _check_budget(conn, row["id"], name, new)
        if new != current:
            conn.execute(sa.update(workflows_t).where(workflows_t.c.id == row["id"]).values(failover=new))
            bump_version(conn)
    return new


def _check_budget(conn, workflow_id: int, name: str, override: dict | None) -> None:
    """The same rule as a catalog file's: an explicit budget the primary's timeout can show."""
    params = failover.effective(override)
    if override is None or params is None:
        return
    query = (sa.select(models_t.c.name, models_t.c.timeout_ms)
             .join(candidates_t, candidates_t.c.model_id == models_t.c.id)
             .where(candidates_t.c.workflow_id == workflow_id, candidates_t.c.position == 0))
    primary = conn.execute(query).first()
    if primary is not None and params.latency_budget_ms > primary.timeout_ms:
        raise InvalidInput(
            f"workflow {name!r}: failover.latency_budget_ms {params.latency_budget_ms} is above the primary "
            f"{primary.name!r}'s timeout_ms {primary.timeout_ms}; a call is cut off before it could breach "
            "(lower the budget or raise the timeout)"
        )

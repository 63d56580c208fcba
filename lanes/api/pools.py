"""``/v1/pools`` and ``/v1/workflows``: live lanes, and changing them with PATCH.

A PATCH body names only the fields to change: left out, a field is
unchanged; ``null`` restores the default a catalog file gets when it leaves
the key out. It is validated as the catalog file is, written through the
catalog's writer, and a pool's new width reaches its live lane through the
width authority before the answer is sent (:mod:`lanes.ops.patch`).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Body, Depends, Request

from lanes.api.auth import may_see_details, require_admin
from lanes.api.body import CheckedRoute
from lanes.catalog import load_routing
from lanes.control.loop import fail_closed_warnings
from lanes.ops.patch import POOLS, WORKFLOWS, item_document, patch_pool, patch_workflow
from lanes.ops.pools import pool_reports, public_row

router = APIRouter(prefix="/v1", tags=["pools"], route_class=CheckedRoute)


def _patch_body(section) -> Any:
    return Body(
        description=(
            f"The {section.noun} fields to change, as in the catalog file: {', '.join(section.fields)}. "
            "A field left out is unchanged; null restores its default."
        ),
        examples=[{"width": 6, "ceiling": 8}] if section is POOLS else [{"reserve_ms": 500, "deadline_ms": None}],
    )


def _shown(request: Request, rows: list[dict]) -> list[dict]:
    # Scrape URLs and what they answered are for the admin token only.
    return rows if may_see_details(request) else [public_row(row) for row in rows]


@router.get("/pools")
def list_pools(request: Request) -> dict:
    """Every pool's lane as all workers see it (as ``lanes pools --json``; scrape details need the admin token)."""
    rows, warning = pool_reports(request.app.state.client)
    return {"pools": _shown(request, rows), "warnings": [warning] if warning else []}


@router.get("/pools/{name}")
def get_pool(name: str, request: Request) -> dict:
    """One pool's lane (scrape details need the admin token)."""
    rows, _ = pool_reports(request.app.state.client, name)
    return _shown(request, rows)[0]


@router.patch("/pools/{name}", dependencies=[Depends(require_admin)])
def change_pool(name: str, request: Request, changes: dict[str, Any] = _patch_body(POOLS)) -> dict:
    """Change a pool (width, floor, ceiling, controller...); a width change reaches the live lane now."""
    client = request.app.state.client
    changed, _live_width = patch_pool(client, name, changes)
    rows, _ = pool_reports(client, name)
    warnings = [w for w in fail_closed_warnings(client.settings, load_routing(client.engine))
                if w.startswith(f"pool {name}:")]
    return {"pool": rows[0], "catalog": item_document(client, POOLS, name), **_changes(changed),
            "warnings": warnings}


@router.get("/workflows/{name}")
def get_workflow(name: str, request: Request) -> dict:
    """A workflow as the catalog file says it."""
    return item_document(request.app.state.client, WORKFLOWS, name)


@router.patch("/workflows/{name}", dependencies=[Depends(require_admin)])
def change_workflow(name: str, request: Request, changes: dict[str, Any] = _patch_body(WORKFLOWS)) -> dict:
    """Change a workflow (priority, reserve_ms, deadline_ms, candidates...)."""
    client = request.app.state.client
    changed = patch_workflow(client, name, changes)
    return {"workflow": item_document(client, WORKFLOWS, name), **_changes(changed)}


def _changes(changed) -> dict:
    summary = changed.to_dict()
    return {"catalog_version": summary["version"], "changes": summary["changes"]}

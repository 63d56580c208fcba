"""Events, chat history, health, readiness and metrics."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from lanes.api.auth import require_submit
from lanes.api.body import CheckedRoute
from lanes.ops.events import MAX_LIMIT, list_events
from lanes.ops.health import readiness
from lanes.ops.history import add_history

router = APIRouter(route_class=CheckedRoute)


@router.get("/v1/events", tags=["events"])
def events(
    request: Request,
    kind: str | None = Query(None, description="lane_wait, lane_bypass, call_abandoned, lane_config_mismatch..."),
    pool: str | None = Query(None, description="only this pool's events"),
    workflow: str | None = Query(None, description="only this workflow's events"),
    since: float | None = Query(None, gt=0, description="only events of the last N seconds"),
    limit: int = Query(50, ge=1, le=MAX_LIMIT),
) -> dict:
    """Routing events, newest first (as ``lanes events --json``)."""
    found = list_events(request.app.state.client, kind=kind, pool=pool, workflow=workflow, since=since, limit=limit)
    return {"events": found}


class HistoryIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Each message is checked by the memory module itself, so its refusals
    # read as `lanes history add`'s do.
    messages: list[Any] = Field(description="{chat_id, at (ISO 8601 with a zone), role, text} objects")


@router.post("/v1/history", status_code=201, tags=["memory"], dependencies=[Depends(require_submit)])
def history(body: HistoryIn, request: Request) -> dict:
    """Add chat history for the memory runs: all messages, or none if any is bad."""
    return add_history(request.app.state.client.settings, body.messages)


@router.get("/healthz", tags=["service"])
def healthz() -> dict:
    """The process answers (nothing else is checked; see /readyz)."""
    return {"status": "ok"}


@router.get("/readyz", tags=["service"])
def readyz(request: Request) -> JSONResponse:
    """200 when Redis and the catalog answer, 503 when not; ``lane_config`` never fails it."""
    ready, detail = readiness(request.app.state.client)
    return JSONResponse(detail, status_code=200 if ready else 503)


@router.get("/metrics", tags=["service"])
def metrics() -> Response:
    """Prometheus text of the process's default registry."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

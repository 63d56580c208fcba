"""``/v1/tasks``: submit work, read its result and routing trace, revoke it.

Submitting goes through :meth:`lanes.routing.client.LanesClient.submit`, the
same call as ``lanes submit`` and ``lanes.submit``: the same checks against
the catalog, the same refusals, and nothing enqueued when one is refused.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Request
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from lanes.api.auth import require_submit
from lanes.api.body import CheckedRoute
from lanes.errors import InvalidInput

router = APIRouter(prefix="/v1/tasks", tags=["tasks"], route_class=CheckedRoute)


class TaskIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workflow: StrictStr = Field(description="a workflow of the catalog, e.g. 'dialog'")
    # Any JSON here: the workflow decides what its payload needs, and says so.
    payload: Any = Field(description="the request body for the backend: {'messages': [...]} or {'input': ...}")
    priority: Any = Field(None, description="interactive, user_tool or background (default: the workflow's)")
    deadline: float | StrictStr | None = Field(
        None, description="seconds from now, or an ISO 8601 time with a zone, by which the answer is due")
    idempotency_key: StrictStr | None = Field(
        None, description="repeat submits with this key return the first task instead of a new one")


def parse_deadline_field(value: float | str | None) -> float | datetime | None:
    if not isinstance(value, str):
        return value
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise InvalidInput(
            f"deadline {value!r} is neither seconds from now nor an ISO 8601 time with a zone "
            "(e.g. 30, or 2026-03-01T10:15:00Z)"
        ) from None


@router.post("", status_code=202, dependencies=[Depends(require_submit)])
def submit_task(task: TaskIn, request: Request) -> dict:
    """Submit work to a workflow; the task id to watch with ``GET /v1/tasks/{id}``."""
    client = request.app.state.client
    result = client.submit(
        task.workflow, task.payload, priority=task.priority, deadline=parse_deadline_field(task.deadline),
        idempotency_key=task.idempotency_key,
    )
    fleet = client.fleet_of(task.workflow)
    answer = {"task_id": result.id, "workflow": task.workflow, "fleet": fleet, "url": f"/v1/tasks/{result.id}"}
    if not client.live_workers(fleet):
        answer["warning"] = (
            f"fleet {fleet!r} has no live worker; the task waits in its queue until one runs "
            f"(`lanes worker --fleet {fleet}`)"
        )
    return answer


@router.get("/{task_id}")
def get_task(task_id: str, request: Request) -> dict:
    """State (PENDING, STARTED, SUCCESS, FAILURE, REVOKED...), answer or error, routing trace."""
    return request.app.state.client.result(task_id)


@router.delete("/{task_id}", status_code=202, dependencies=[Depends(require_submit)])
def revoke_task(task_id: str, request: Request) -> dict:
    """Revoke a task: a queued one is dropped, a lane wait is cancelled at once."""
    return request.app.state.client.revoke(task_id)

"""A routed request as it travels through Celery (JSON only)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime

from lanes.errors import InvalidInput
from lanes.priority import Priority


@dataclass(frozen=True, kw_only=True)
class RouteRequest:
    task_id: str
    workflow: str
    payload: dict
    priority: Priority
    deadline: float | None  # wall-clock epoch seconds for the answer; None: no deadline
    submitted_at: float
    idempotency_key: str | None = None
    # Candidates already called for this task by earlier deliveries (a requeue
    # or a retry carries them): they are not called again.
    called: tuple[str, ...] = ()
    # Times this task was requeued after a capacity wait timeout (workers/app.py).
    capacity_requeues: int = 0
    # Times this background task was sent back after every candidate failed
    # retryably (an outage): its backoff doubles with each (workers/outage.py).
    outage_retries: int = 0

    def to_message(self) -> dict:
        return {
            "task_id": self.task_id,
            "workflow": self.workflow,
            "payload": self.payload,
            "priority": self.priority.label,
            "deadline": self.deadline,
            "submitted_at": self.submitted_at,
            "idempotency_key": self.idempotency_key,
            "called": list(self.called),
            "capacity_requeues": self.capacity_requeues,
            "outage_retries": self.outage_retries,
        }

    @classmethod
    def from_message(cls, message: dict) -> "RouteRequest":
        return cls(
            task_id=message["task_id"],
            workflow=message["workflow"],
            payload=message["payload"],
            priority=Priority.parse(message["priority"]),
            deadline=message.get("deadline"),
            submitted_at=message["submitted_at"],
            idempotency_key=message.get("idempotency_key"),
            called=tuple(message.get("called") or ()),
            capacity_requeues=int(message.get("capacity_requeues") or 0),
            outage_retries=int(message.get("outage_retries") or 0),
        )


# The furthest deadline taken: a week. Past it a deadline means nothing to a
# lane wait, and a huge one (1e20) would overflow the epoch arithmetic of the
# Redis scripts and the broker's expiry.
MAX_DEADLINE_SECONDS = 7 * 86_400


def parse_deadline(deadline: float | int | datetime | None, *, now: float) -> float | None:
    """Seconds from now or an aware datetime, as epoch seconds; refuses the past and past a week."""
    at = _deadline_at(deadline, now=now)
    if at is not None and at - now > MAX_DEADLINE_SECONDS:
        shown = deadline.isoformat() if isinstance(deadline, datetime) else repr(deadline)
        raise InvalidInput(
            f"deadline {shown} is more than {MAX_DEADLINE_SECONDS} seconds (a week) from now; "
            "give a nearer one, or none for work that may wait"
        )
    return at


def _deadline_at(deadline: float | int | datetime | None, *, now: float) -> float | None:
    if deadline is None:
        return None
    if isinstance(deadline, datetime):
        if deadline.tzinfo is None:
            raise InvalidInput(
                f"deadline {deadline.isoformat()} has no time zone; pass an aware datetime or seconds from now"
            )
        at = deadline.timestamp()
        if at <= now:
            raise InvalidInput(f"deadline {deadline.isoformat()} is in the past; give a time in the future")
        return at
    if isinstance(deadline, bool) or not isinstance(deadline, (int, float)) or not math.isfinite(deadline):
        raise InvalidInput(f"deadline {deadline!r} is not a number of seconds or an aware datetime")
    if deadline <= 0:
        raise InvalidInput(f"deadline {deadline!r} is not in the future; give seconds from now > 0")
    return now + float(deadline)


def check_payload(payload: object, *, kind: str, workflow: str) -> dict:
    """A JSON object the workflow's backends can take."""
    if isinstance(payload, (str, bytes)):
        try:
            payload = json.loads(payload)
        except ValueError as exc:
            raise InvalidInput(f"payload is not JSON ({exc}); pass a JSON object") from None
    if not isinstance(payload, dict):
        raise InvalidInput(f"payload must be a JSON object, got {type(payload).__name__}")
    try:
        json.dumps(payload)
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"payload cannot be sent as JSON: {exc}") from None
    if kind == "embedding":
        if "input" not in payload:
            raise InvalidInput(f"workflow {workflow!r} embeds text: the payload needs an 'input' field")
    elif not isinstance(payload.get("messages"), list) or not payload["messages"]:
        raise InvalidInput(f"workflow {workflow!r} is a chat: the payload needs a non-empty 'messages' list")
    return payload

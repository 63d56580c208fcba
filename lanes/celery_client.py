"""The one Celery configuration, shared by publishers and workers.

``lanes`` publishes routed work by task name, so it never imports the task
modules in ``workers/``; the worker app is built from the same function.
"""

from __future__ import annotations

import time

from celery import Celery

from lanes.priority import Priority
from lanes.settings import Settings

ROUTE_TASK = "lanes.route"
QUEUE_PREFIX = "lanes."
HOSTED_FLEET = "hosted"

# kombu's Redis transport keeps one list per priority step; 0 is served first.
# Interactive and user-tool work share the foreground queue, ordered by these.
MESSAGE_PRIORITY = {Priority.INTERACTIVE: 0, Priority.USER_TOOL: 3, Priority.BACKGROUND: 6}


def fleet_queues(fleet: str) -> tuple[str, str]:
    """(foreground queue, background queue) of one fleet.

    Background work has a queue of its own so a worker can stop taking it when
    background tasks fill all but its reserved slot.
    """
    base = f"{QUEUE_PREFIX}{fleet}"
    return base, f"{base}.background"


def fleet_of_queue(queue: str) -> str | None:
    """The fleet whose queue ``queue`` is, or None for a queue Lanes does not name."""
    if not queue.startswith(QUEUE_PREFIX):
        return None
    fleet = queue[len(QUEUE_PREFIX):].removesuffix(".background")
    return fleet or None


def fleet_names(table) -> list[str]:
    """Every fleet of the routing table: each workflow's primary pool, or the hosted fleet."""
    return sorted({route.fleet or HOSTED_FLEET for route in table.workflows.values() if route.candidates})


def shown_arguments(*, workflow: str, priority: Priority, fleet: str, deadline: float | None) -> dict:
    """What Celery's events (and so Flower) show of a routed task instead of its arguments.

    The arguments hold the payload (a prompt, private text); events carry
    ``argsrepr``/``kwargsrepr`` in their place, so Flower's columns show the
    routing (workflow, priority, the pool whose lane it waits in first,
    deadline) and never the request.
    """
    when = "none" if deadline is None else time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(deadline))
    shown = {"workflow": workflow, "priority": priority.label, "pool": fleet, "deadline": when}
    return {"argsrepr": "(request hidden)", "kwargsrepr": repr(shown)}


def queue_for(fleet: str, priority: Priority) -> str:
    foreground, background = fleet_queues(fleet)
    return background if priority is Priority.BACKGROUND else foreground


# kombu resolves it when a connection is first made, so importing this module imports no transport.
BROKER_TRANSPORT = "lanes.broker:Transport"


def celery_config(settings: Settings, redis_url: str, *, kombu_transport: bool = False) -> dict:
    """Celery's settings for Lanes. ``kombu_transport``: keep kombu's own Redis transport
    (Flower, which reads the broker's kind from the URI scheme; the plain-Celery baselines)."""
    own = redis_url.startswith("redis://") and not kombu_transport
    return {
        "broker_url": redis_url,
        # kombu's Redis transport with one client per channel (lanes/broker.py);
        # other schemes (rediss, sentinel, socket) keep kombu's own.
        **({"broker_transport": BROKER_TRANSPORT} if own else {}),
        "result_backend": redis_url,
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        "result_expires": settings.result_ttl_seconds,
        # A result keeps the answer, never the request: the task's arguments
        # (the prompt, a privacy workflow's text) would otherwise sit in the
        # no-eviction Redis for result_expires after the work is done.
        "result_extended": False,
        # Prefetch defeats priority: take one message per free thread, ack after.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_track_started": True,
        # Flower sees tasks only through events, sent from both ends.
        "worker_send_task_events": True,
        "task_send_sent_event": True,
        "broker_connection_retry_on_startup": True,
        # A worker whose Redis went away waits for it to come back at the same
        # address (the embedded server keeps one port per state folder) rather
        # than giving up after a hundred tries.
        "broker_connection_max_retries": None,
        "broker_transport_options": {
            # Longer than any lane wait may last: a task is never redelivered
            # while it still waits or runs (background waits give their place
            # back and requeue before this).
            "visibility_timeout": settings.visibility_timeout_seconds,
            # Look for messages of dead workers every 10 s (kombu's default scans
            # every 10th tick, ~100 s): a SIGKILLed worker's task comes back
            # within the visibility timeout plus seconds, not minutes.
            "unacked_restore_interval": 10,
            "unacked_restore_throttle": 1,
            "queue_order_strategy": "priority",
            "priority_steps": sorted(set(MESSAGE_PRIORITY.values())),
            "sep": ":",
        },
        "result_backend_transport_options": {"retry_policy": {"timeout": 5.0}},
        "worker_hijack_root_logger": False,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
    }


def make_celery(settings: Settings, redis_url: str, *, main: str = "lanes", kombu_transport: bool = False) -> Celery:
    """A Celery app configured for Lanes (publishing, results, workers)."""
    app = Celery(main, set_as_current=False)
    app.conf.update(celery_config(settings, redis_url, kombu_transport=kombu_transport))
    return app

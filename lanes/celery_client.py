"""The one Celery configuration, shared by publishers and workers.

``lanes`` publishes routed work by task name, so it never imports the task
modules in ``workers/``; the worker app is built from the same function.
"""

from __future__ import annotations

import time

from celery import Celery

from lanes.priority import Priority
from lanes.settings import Settings, broker_url_of, normalise_tls, result_url_of

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


_broker_clients: dict[str, object] = {}


def broker_client(settings: Settings, lanes_client):
    """A client of the broker's Redis: ``lanes_client`` itself unless
    ``LANES_BROKER_URL`` names another server (one client per URL, kept)."""
    if settings.broker_url is None:
        return lanes_client
    client = _broker_clients.get(settings.broker_url)
    if client is None:
        from lanes.redis_conn import connect

        client = _broker_clients[settings.broker_url] = connect(settings.broker_url,
                                                                timeout=settings.redis_timeout_seconds)
    return client


def broker_queued(client, fleet: str) -> dict[Priority, int]:
    """Messages of ``fleet`` waiting in the broker (not yet taken by a worker), by priority.

    kombu's Redis transport keeps one list per queue and priority step
    (``QUEUE``, ``QUEUE:3``, ``QUEUE:6``; ``sep`` and ``priority_steps`` in
    :func:`celery_config`), and each priority has its own step.
    """
    keys = []
    for priority, step in MESSAGE_PRIORITY.items():
        queue = queue_for(fleet, priority)
        keys.append((priority, queue if step == 0 else f"{queue}:{step}"))
    with client.pipeline(transaction=False) as pipe:
        for _, key in keys:
            pipe.llen(key)
        counts = pipe.execute()
    return {priority: int(count) for (priority, _), count in zip(keys, counts)}


# kombu resolves it when a connection is first made, so importing this module imports no transport.
BROKER_TRANSPORT = "lanes.broker:Transport"
SENTINEL_TRANSPORT = "lanes.broker:SentinelTransport"


def _broker(broker_url: str, kombu_transport: bool) -> tuple[str, str | None, dict]:
    """The URL kombu reads, Lanes' transport for it (None: kombu's own) and its extra options.

    Lanes' transport takes and records a message in one step (lanes/broker.py)
    on every broker: ``redis://``, ``rediss://`` (kombu's channel makes TLS
    connections from the URL's ``ssl_*`` parameters, or Celery's
    ``broker_use_ssl`` when the URL has none) and ``sentinel://``.
    """
    scheme = broker_url.split("://", 1)[0].lower()
    if scheme == "sentinel":
        from lanes.sentinel import parse

        parsed = parse(broker_url)
        return parsed.kombu_url, None if kombu_transport else SENTINEL_TRANSPORT, {"master_name": parsed.master_name}
    if scheme == "rediss":
        # Named explicitly, the transport no longer comes from the scheme, and
        # kombu then makes TLS connections only when it has ssl options: the
        # URL always carries them (ssl_cert_reqs, required unless it says otherwise).
        broker_url = normalise_tls(broker_url)
    own = scheme in ("redis", "rediss") and not kombu_transport
    return broker_url, BROKER_TRANSPORT if own else None, {}


def celery_config(settings: Settings, redis_url: str, *, kombu_transport: bool = False) -> dict:
    """Celery's settings for Lanes. ``redis_url`` is the lanes' Redis; the broker and the
    result store use it unless ``LANES_BROKER_URL`` / ``LANES_RESULT_URL`` name their own.
    ``kombu_transport``: keep kombu's own Redis transport (Flower, which reads the
    broker's kind from the URI scheme; the plain-Celery baselines)."""
    broker_url, transport, broker_options = _broker(broker_url_of(settings, redis_url), kombu_transport)
    return {
        "broker_url": broker_url,
        # kombu's Redis transport taking in one step, one client per channel
        # (lanes/broker.py); a unix socket keeps kombu's own.
        **({"broker_transport": transport} if transport else {}),
        "result_backend": result_url_of(settings, redis_url),
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
            # The message lease: a live worker refreshes what it holds every
            # third of it (lanes.broker.HeldMessages), so a message never comes
            # back while its task waits or runs; a dead worker's messages come
            # back this long after its last refresh.
            "visibility_timeout": settings.message_lease_seconds,
            # Look for messages of dead workers every 10 s (kombu's default scans
            # every 10th tick, ~100 s): a SIGKILLed worker's task comes back
            # within the message lease plus seconds.
            "unacked_restore_interval": 10,
            "unacked_restore_throttle": 1,
            "queue_order_strategy": "priority",
            "priority_steps": sorted(set(MESSAGE_PRIORITY.values())),
            "sep": ":",
            # A publish on a connection whose Redis went silent fails within the
            # settings' Redis timeout instead of waiting forever (kombu's default),
            # so submit reports it (lanes/routing/client.py) and a worker reconnects.
            "socket_timeout": settings.redis_timeout_seconds,
            "socket_connect_timeout": settings.redis_timeout_seconds,
            **broker_options,
        },
        "result_backend_transport_options": {"retry_policy": {"timeout": 5.0}},
        "worker_hijack_root_logger": False,
        # A lost broker connection leaves the call in flight running (its run
        # lease keeps the redelivered copy from calling again; workers/runs.py).
        # Celery's "cancel" kills the task on the gevent pool: killed mid-call,
        # its lease released, the redelivery called the backend a second time
        # (the threads pool cannot kill a thread, so there it did nothing).
        "worker_cancel_long_running_tasks_on_connection_loss": False,
    }


def make_celery(settings: Settings, redis_url: str, *, main: str = "lanes", kombu_transport: bool = False) -> Celery:
    """A Celery app configured for Lanes (publishing, results, workers)."""
    app = Celery(main, set_as_current=False)
    app.conf.update(celery_config(settings, redis_url, kombu_transport=kombu_transport))
    from lanes.broker import HeldMessages

    # Any worker of this app keeps what it holds from coming back (lanes/broker.py).
    app.steps["consumer"].add(HeldMessages)
    return app

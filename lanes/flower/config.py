"""The configuration ``lanes flower`` runs Flower with.

- Every lane queue (each fleet's ``lanes.<pool>`` and ``lanes.<pool>.background``,
  and the memory runs' queue) is a queue of the Celery app Flower watches, and
  the Broker page lists them all, also while no worker consumes them (stock
  Flower lists only the queues some live worker consumes, so a fleet whose
  workers are all down would vanish from the page just when its backlog grows).
- The task list's columns show each task's routing: ``kwargs`` is the
  ``kwargsrepr`` every routed task is sent with (workflow, priority, pool,
  deadline; see :func:`lanes.celery_client.shown_arguments`), ``routing_key``
  its queue.
- Logins come from ``LANES_FLOWER_BASIC_AUTH`` (``user:password``, several
  separated by commas); without them ``lanes flower`` refuses to start unless
  told ``--no-auth``.
"""

from __future__ import annotations

from dataclasses import dataclass

from lanes.celery_client import fleet_names, fleet_queues, make_celery
from lanes.errors import InvalidInput
from lanes.settings import Settings

# Flower drops column names it does not know, silently: these are all its own.
TASKS_COLUMNS = "name,uuid,state,kwargs,routing_key,received,started,runtime,worker,retries"

def lane_queues(table) -> list[str]:
    """Every Celery queue Lanes sends work to under ``table``, sorted."""
    from lanes.memory.dispatch import MEMORY_QUEUE

    names = {MEMORY_QUEUE}
    for fleet in fleet_names(table):
        names.update(fleet_queues(fleet))
    return sorted(names)


def basic_auth(settings: Settings, *, no_auth: bool) -> list[str]:
    """Flower's ``basic_auth`` option: the logins, or [] when explicitly told ``--no-auth``."""
    if settings.flower_basic_auth is None:
        if no_auth:
            return []
        raise InvalidInput(
            "Flower would be open to anyone: set LANES_FLOWER_BASIC_AUTH=user:password "
            "(several separated by commas), or pass --no-auth to serve it without a login"
        )
    if no_auth:
        raise InvalidInput("--no-auth given while LANES_FLOWER_BASIC_AUTH is set; drop one of them")
    return [login.strip() for login in settings.flower_basic_auth.get_secret_value().split(",")]


@dataclass(frozen=True, kw_only=True)
class FlowerConfig:
    port: int
    address: str
    logins: list[str]
    tasks_columns: str = TASKS_COLUMNS
    # Flower asks workers for their stats (and so their lanes) with this timeout.
    inspect_timeout_ms: float = 2000.0
    max_tasks: int = 10_000

    def __repr__(self) -> str:  # never print a password
        return f"FlowerConfig(port={self.port}, address={self.address!r}, logins={len(self.logins)})"

    def tornado_options(self) -> dict:
        """Flower's options (its command-line names) for this configuration."""
        return {
            "port": self.port,
            "address": self.address,
            "basic_auth": list(self.logins),
            "tasks_columns": self.tasks_columns,
            "inspect_timeout": self.inspect_timeout_ms,
            "max_tasks": self.max_tasks,
            "persistent": False,
            "purge_offline_workers": 300,
        }


def celery_app(settings: Settings, redis_url: str, queues: list[str]):
    """The Celery app Flower watches: Lanes' broker settings, every lane queue."""
    from kombu import Queue

    # kombu's own transport: Flower reads the broker's kind from the connection's
    # URI scheme, which a transport named by class path would make unreadable.
    app = make_celery(settings, redis_url, main="lanes-flower", kombu_transport=True)
    app.conf.task_queues = [Queue(name) for name in queues]
    return app

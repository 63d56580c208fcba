"""Hand the work queued for a fleet's old name to the fleet under its new name.

Queues are named after the fleet (the primary pool's name). A pool renamed
in the catalog keeps its id, its lane and its fleet, but work already queued
under the old name (and tasks a stopping worker hands back there) would wait
for a consumer that never comes. The supervisor follows its pool by id and
moves those messages to the front of the new queues, every poll, for as long
as it runs.
"""

from __future__ import annotations

from functools import cache
from importlib.resources import files

import redis

from lanes.broker import bell_key
from lanes.celery_client import MESSAGE_PRIORITY, celery_config, fleet_queues
from lanes.settings import Settings

BATCH = 200


@cache
def _source() -> str:
    return (files("workers") / "scripts" / "drain_queue.lua").read_text()


def queue_keys(settings: Settings, queue: str) -> list[str]:
    """The Redis lists kombu keeps for ``queue``: one per priority step (step 0 is the bare name)."""
    sep = queue_separator(settings)
    return [queue if step == 0 else f"{queue}{sep}{step}" for step in sorted(set(MESSAGE_PRIORITY.values()))]


def queue_separator(settings: Settings) -> str:
    """What kombu puts between a queue's name and its priority step or bell."""
    return celery_config(settings, "redis://unused")["broker_transport_options"]["sep"]


def drain_fleet(client: redis.Redis, settings: Settings, old_fleet: str, new_fleet: str) -> int:
    """Move every message queued for ``old_fleet`` to ``new_fleet``'s queues; the count moved."""
    script = client.register_script(_source())
    moved = 0
    for old_queue, new_queue in zip(fleet_queues(old_fleet), fleet_queues(new_fleet)):
        bell = bell_key(new_queue, queue_separator(settings))
        for old_key, new_key in zip(queue_keys(settings, old_queue), queue_keys(settings, new_queue)):
            while True:
                count = int(script(keys=[old_key, new_key, bell], args=[old_queue, new_queue, BATCH]))
                moved += count
                if count < BATCH:
                    break
    return moved

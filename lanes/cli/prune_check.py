"""Whether pools a prune would remove are in use, asked of the live system.

A pool is in use while its lane (in Redis) has holders or waiters, or while
its fleet's Celery queues hold messages: removing it then strands that work
(tasks left ``STARTED``, a worker exiting with "unknown fleet"). The catalog
knows none of this, so ``lanes catalog apply --prune`` asks here first.
"""

from __future__ import annotations

import redis
from sqlalchemy.engine import Engine

from lanes.catalog import ChangeSet, load_routing
from lanes.errors import RedisUnavailable
from lanes.settings import Settings, mask_url


def pools_in_use(settings: Settings, engine: Engine, names: list[str]) -> dict[str, str]:
    """pool name -> what is on it ("2 holding, 1 waiting, 3 queued tasks"), for pools in use.

    Redis must answer: a prune that cannot check refuses (exit 3) unless forced.
    """
    from kombu.exceptions import ChannelError

    from lanes.celery_client import fleet_queues, make_celery
    from lanes.redis_conn import connect, resolve_redis_url
    from lanes.routing.runtime import pool_lane

    table = load_routing(engine)
    url = resolve_redis_url(settings, start_embedded=False)
    client = connect(url, timeout=settings.redis_timeout_seconds)
    app = make_celery(settings, url)
    found: dict[str, str] = {}
    try:
        client.ping()
        with app.connection_for_read() as connection:
            channel = connection.default_channel
            for name in names:
                pool = table.pools.get(name)
                if pool is None:
                    continue
                stats = pool_lane(client, settings, pool).stats()
                queued_tasks = 0
                for queue in fleet_queues(name):
                    try:
                        queued_tasks += channel.queue_declare(queue=queue, passive=True).message_count
                    except ChannelError:
                        pass  # no such queue: nothing was ever left in it
                parts = []
                if stats.in_flight:
                    parts.append(f"{stats.in_flight} holding a slot")
                waiting = sum(stats.queued.values())
                if waiting:
                    parts.append(f"{waiting} waiting in the lane")
                if queued_tasks:
                    parts.append(f"{queued_tasks} queued task(s)")
                if parts:
                    found[name] = ", ".join(parts)
    except (redis.RedisError, OSError) as exc:
        raise RedisUnavailable(
            f"cannot check whether the pools to prune are in use: Redis at {mask_url(url)} did not answer "
            f"({exc}); start it, or pass --force to prune without checking"
        ) from None
    finally:
        client.close()
    return found


def refusal(changes: ChangeSet, in_use: dict[str, str]) -> str | None:
    """Why a prune must not go ahead without --force, or None."""
    reasons = [f"pool {name} is in use ({what})" for name, what in sorted(in_use.items())]
    if changes.leaves_empty:
        reasons.append("the file names no pool, model or workflow, so the prune would empty the catalog")
    if not reasons:
        return None
    return "refusing to prune: " + "; ".join(reasons) + " (pass --force to prune anyway)"

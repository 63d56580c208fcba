"""What the Redis that holds lanes must be, and the check of it.

- **No eviction** (``maxmemory-policy noeviction``): an evicted holder set
  over-admits (a script that finds the holder count apart from ``inflight``
  repairs the count, but the evicted holders are gone).
- **No persistence** (``save ""``, ``appendonly no``): a restart that loads
  an older snapshot, or an AOF missing its last second, brings back stale
  holders and generations. The lanes detect it (each script compares the
  run_id of the server it reached with the one that wrote the lane's state,
  lib_state.lua) and start the lane over with a quiet period; the asyncio
  lane on Cluster and single-connection clients cannot tell. Keep the lanes
  on a Redis that does not persist, apart from a persistent Celery broker.
"""

from __future__ import annotations


def _value(config: dict, name: str) -> str | None:
    value = config.get(name)
    return value.decode() if isinstance(value, bytes) else value


def judge(config: dict) -> list[tuple[str, bool | None, str]]:
    """``(name, ok, detail)`` per requirement from ``CONFIG GET`` values
    (``ok`` None: not readable, e.g. CONFIG disabled on a managed Redis)."""
    policy = _value(config, "maxmemory-policy")
    save = _value(config, "save")
    appendonly = _value(config, "appendonly")
    out = []
    ok = None if policy is None else policy == "noeviction"
    out.append(("maxmemory-policy", ok, f"maxmemory-policy is {policy!r}" + (
        "; set 'maxmemory-policy noeviction' (an eviction of a lane's keys over-admits)" if ok is False else "")))
    ok = None if save is None else save.strip() == ""
    out.append(("save", ok, f"save is {save!r}" + (
        "; set save '' (a restart from an older snapshot restores stale holders)" if ok is False else "")))
    ok = None if appendonly is None else appendonly == "no"
    out.append(("appendonly", ok, f"appendonly is {appendonly!r}" + (
        "; set appendonly no (an AOF may miss its last second of grants)" if ok is False else "")))
    return out


def _read(client, name: str) -> dict:
    import redis

    try:
        return client.config_get(name)
    except redis.ResponseError:
        return {}  # CONFIG disabled: not readable


def check_lane_redis(client) -> list[tuple[str, bool | None, str]]:
    """The checks against a sync client (raises redis errors when it does not answer)."""
    config: dict = {}
    for name in ("maxmemory-policy", "save", "appendonly"):
        config.update(_read(client, name))
    return judge(config)


async def check_lane_redis_async(client) -> list[tuple[str, bool | None, str]]:
    import redis

    config: dict = {}
    for name in ("maxmemory-policy", "save", "appendonly"):
        try:
            config.update(await client.config_get(name))
        except redis.ResponseError:
            pass
    return judge(config)

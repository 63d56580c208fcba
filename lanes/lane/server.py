"""What the Redis that holds lanes must be, and the check of it.

- **No eviction** (``maxmemory-policy noeviction``): an evicted holder set
  over-admits (a script that finds the holder count apart from ``inflight``
  repairs the count, but the evicted holders are gone).
- **Persistence is allowed.** A restart that loads an older snapshot, or an
  AOF missing its last second, brings back stale holders and generations; the
  lanes detect it (each script compares the run_id of the server it reached
  with the one that wrote the lane's state, lib_state.lua) and start the lane
  over: a new epoch, no grant for one lease period while live holders
  re-register (tests/lane/test_snapshot_restore.py, test_restart.py). So one
  persistent Redis may hold lanes, broker and results. Two clients cannot
  tell a restart, the asyncio lane on Redis Cluster and a single-connection
  client: those keep the lanes on a Redis of their own without persistence
  (``LANES_REDIS_URL`` apart from ``LANES_BROKER_URL``/``LANES_RESULT_URL``).
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
    if save is None and appendonly is None:
        out.append(("persistence", None, "save and appendonly not readable"))
    else:
        persisting = appendonly == "yes" or bool((save or "").strip())
        out.append(("persistence", True, (
            f"appendonly is {appendonly!r}, save is {save!r}: a restart reloads older lane state, which the "
            "lanes detect (run_id) and start over with a quiet period of one lease")
            if persisting else f"appendonly is {appendonly!r}, save is {save!r}: a restart starts every lane empty"))
    return out


def _read(client, name: str) -> dict:
    import redis

    try:
        return client.config_get(name)
    except redis.ResponseError:
        return {}  # CONFIG disabled: not readable


def read_config(client) -> dict:
    """The settings the checks read (raises redis errors when Redis does not answer)."""
    config: dict = {}
    for name in ("maxmemory-policy", "save", "appendonly", "appendfsync"):
        config.update(_read(client, name))
    return config


def check_lane_redis(client) -> list[tuple[str, bool | None, str]]:
    """The checks against a sync client (raises redis errors when it does not answer)."""
    return judge(read_config(client))


async def check_lane_redis_async(client) -> list[tuple[str, bool | None, str]]:
    import redis

    config: dict = {}
    for name in ("maxmemory-policy", "save", "appendonly"):
        try:
            config.update(await client.config_get(name))
        except redis.ResponseError:
            pass
    return judge(config)

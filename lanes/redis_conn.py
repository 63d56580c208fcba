"""Redis connections built from settings, with bounded timeouts."""

from __future__ import annotations

import redis
import redis.asyncio
from redis.asyncio.connection import DefaultParser as AsyncDefaultParser
from redis.connection import DefaultParser

from lanes import sentinel
from lanes.embedded import EmbeddedRedis
from lanes.errors import RedisUnavailable
from lanes.settings import Settings

# Every redis-py error that means "Redis did not answer (usefully)", for the
# whole project: the lanes, breakers, events, traces and the worker's task all
# turn exactly these into RedisUnavailable (retryable), so no raw redis-py
# error reaches a caller. A full no-eviction Redis (OutOfMemoryError) refuses
# every write: for Lanes that is Redis not answering, not a bug in the request.
REDIS_UNAVAILABLE: tuple[type[Exception], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.TryAgainError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.BusyLoadingError,
)


def refusal_in_script(error: Exception) -> Exception:
    """A write a script was refused for a full server, as the OutOfMemoryError it is.

    Redis 7 passes the refusal out of a script with its own code (``OOM``);
    Redis 6.2 wraps it in a generic script error (``ERR Error running script
    ...: -OOM command not allowed ...``), which redis-py raises as a plain
    ResponseError, outside REDIS_UNAVAILABLE: a lane or breaker script on a
    full 6.2 server then ended a task with a raw redis-py error.
    """
    if type(error) is redis.exceptions.ResponseError and "-OOM command not allowed" in str(error):
        return redis.exceptions.OutOfMemoryError(str(error))
    return error


class _ScriptRefusalParser(DefaultParser):
    def parse_error(self, response):
        return refusal_in_script(super().parse_error(response))


class _AsyncScriptRefusalParser(AsyncDefaultParser):
    def parse_error(self, response):
        return refusal_in_script(super().parse_error(response))


def resolve_redis_url(settings: Settings, *, start_embedded: bool = True) -> str:
    """The configured Redis URL, or the embedded server's (started if needed)."""
    if settings.redis_url:
        return settings.redis_url
    embedded = EmbeddedRedis(settings.state_dir / "redis")
    if start_embedded:
        return embedded.ensure()
    return embedded.url


# The most connections a process's shared client opens to one Redis, however
# many green threads talk through it at once. Redis runs one command at a
# time, so connections past a few hundred add no throughput; they only count
# against Redis's ``maxclients`` (10,000): a fleet of four gevent processes
# holding 2,250 messages each opened one per message in a burst and was
# refused (docs/BENCHMARKS_JOURNAL.md, "every waiting request across processes").
SHARED_POOL_CONNECTIONS = 128


def shared_pool_size(calls_at_once: int) -> int:
    """Connections for a pool that ``calls_at_once`` threads share: one each
    plus spares for the process's own readers, up to SHARED_POOL_CONNECTIONS."""
    return min(SHARED_POOL_CONNECTIONS, max(100, calls_at_once + 64))


def connect(url: str, *, timeout: float = 5.0, shared_by: int | None = None, **kwargs) -> redis.Redis:
    """A sync client whose every call fails within ``timeout`` when Redis is gone.

    Blocking commands (``BLPOP``) pass their own, longer socket timeout. A
    ``sentinel://`` URL (a broker's, :mod:`lanes.sentinel`) gives a client of
    the primary its sentinels name. ``shared_by``: the threads (green or
    not) that may call at once; the client's pool is then bounded
    (:func:`shared_pool_size`) and a call past the bound waits for a
    connection, at most ``timeout``, instead of opening one more.
    """
    options = dict(socket_timeout=timeout, socket_connect_timeout=timeout, health_check_interval=0,
                   parser_class=_ScriptRefusalParser, **kwargs)
    if sentinel.is_sentinel(url):
        if shared_by is not None:
            options["max_connections"] = shared_pool_size(shared_by)
        return sentinel.primary_client(url, **options)
    if shared_by is None:
        return redis.Redis.from_url(url, **options)
    pool = redis.BlockingConnectionPool.from_url(url, max_connections=shared_pool_size(shared_by),
                                                 timeout=timeout, **options)
    return redis.Redis.from_pool(pool)


def connect_async(url: str, *, timeout: float = 5.0, **kwargs) -> redis.asyncio.Redis:
    return redis.asyncio.Redis.from_url(
        url, socket_timeout=timeout, socket_connect_timeout=timeout, parser_class=_AsyncScriptRefusalParser, **kwargs
    )


def eviction_warning(client: redis.Redis) -> str | None:
    """A warning when Redis may evict lane keys, or None when it is safe."""
    try:
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
    except redis.ResponseError:
        return None  # CONFIG disabled (managed Redis): nothing we can read
    except redis.RedisError as exc:
        raise RedisUnavailable(f"Redis did not answer: {exc}") from exc
    if policy and policy != "noeviction":
        return (
            f"Redis maxmemory-policy is {policy!r}: an eviction of a lane's keys would over-admit; "
            "set 'maxmemory-policy noeviction' on the Redis that holds lanes"
        )
    return None

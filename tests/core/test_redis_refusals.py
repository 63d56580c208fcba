"""A write refused inside a script on a full server is "Redis did not answer".

Redis 6.2 (the embedded server) wraps a refusal inside a script in a generic
script error; the clients Lanes builds read it as OutOfMemoryError, one of
REDIS_UNAVAILABLE, so lanes and breakers turn it into RedisUnavailable
instead of ending a task with a raw redis-py error.
"""

from __future__ import annotations

import asyncio

import pytest
import redis

from lanes.redis_conn import REDIS_UNAVAILABLE, connect, connect_async

WRITE = "return redis.call('SET', KEYS[1], 'x')"


@pytest.fixture
def full_url(fillable_redis):
    url, admin = fillable_redis
    admin.config_set("maxmemory", 1)
    return url


def test_a_plain_client_sees_a_generic_script_error(full_url):
    # What redis-py makes of it on its own: outside the "did not answer" list.
    with pytest.raises(redis.exceptions.ResponseError) as raised:
        redis.Redis.from_url(full_url).eval(WRITE, 1, "k")
    assert not isinstance(raised.value, REDIS_UNAVAILABLE)


def test_a_lanes_client_sees_redis_refusing_writes(full_url):
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        connect(full_url).eval(WRITE, 1, "k")
    assert connect(full_url).get("k") is None  # reads still answer


def test_an_async_lanes_client_sees_redis_refusing_writes(full_url):
    async def run():
        client = connect_async(full_url)
        try:
            await client.eval(WRITE, 1, "k")
        finally:
            await client.aclose()

    with pytest.raises(redis.exceptions.OutOfMemoryError):
        asyncio.run(run())

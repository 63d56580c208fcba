"""Scenario 2: Redis restarts and loads a snapshot taken before a grant. The
stale state is present, not absent: the lane must still see that another
server process wrote it, admit no one for a quiet period, let the live holder
re-register, and never repeat a generation. A private redis-server of the
test's own (SAVE by hand, SIGKILL, start again on the same folder)."""

from __future__ import annotations

import asyncio

import pytest
import redis

from lanes import Lane, Priority
from lanes.lane.hub import close_hubs
from tests.polling import eventually

pytestmark = pytest.mark.slow   # kills and restarts a private redis-server per test

I = Priority.INTERACTIVE
LEASE = 5.0   # longer than the restart takes: the holder must survive it


def _client(url: str, pool: str) -> redis.Redis:
    if pool == "bounded":
        # A bounded pool: the lane checks a connection out per call (no kept
        # connections) and still sends the run_id of the server it reached.
        return redis.Redis(connection_pool=redis.BlockingConnectionPool.from_url(
            url, max_connections=8, socket_timeout=1, socket_connect_timeout=1))
    return redis.Redis.from_url(url, socket_timeout=1, socket_connect_timeout=1)


@pytest.mark.parametrize("pool", ["plain", "bounded"])
def test_a_restart_from_an_older_snapshot_is_detected_and_over_admits_no_one(private_redis, pool):
    holder_client = _client(private_redis.url, pool)
    other_client = _client(private_redis.url, pool)
    holder_lane = Lane(holder_client, "pool:snap", width=1, lease_seconds=LEASE)
    other = Lane(other_client, "pool:snap", width=1, lease_seconds=LEASE)
    try:
        holder_lane.provision()
        assert other.stats().in_flight == 0
        holder_client.save()                       # the snapshot: an empty lane
        held = holder_lane.acquire(I, 2.0)         # granted after the snapshot
        restarts_before = int(holder_client.hget(holder_lane.keys.meta, "restarts") or 0)
        private_redis.kill()
        private_redis.ensure()                     # loads the older snapshot
        # The first caller after the restart finds the old state (no holder)
        # but must not trust it: nothing is granted during the quiet period.
        assert other.try_acquire(I) is None, "a grant on the restored, stale state"
        meta = other_client.hgetall(other.keys.meta)
        assert int(meta[b"restarts"]) == restarts_before + 1
        assert int(meta[b"epoch"]) > held.generation.epoch, "a new epoch: no generation is repeated"
        # The live holder re-registers by renewal and keeps its slot.
        eventually(lambda: holder_client.zscore(holder_lane.keys.all()[1], held.holder_id) is not None,
                   timeout=10, what="the holder re-registered")
        held.check()
        assert other.try_acquire(I) is None, "width 1 stays full while the holder holds"
        assert held.release()
        after = eventually(lambda: other.try_acquire(I), timeout=10, what="a grant after the release")
        assert after.generation > held.generation
        assert after.release()
    finally:
        for client in (holder_client, other_client):
            close_hubs(client)
            client.close()


async def test_the_async_lane_detects_a_restart_from_an_older_snapshot_too(private_redis):
    """The asyncio lane sends the run_id of the server its connection reached
    (``_lua.acall_with_run``), so the same restart is found the same way."""
    import redis.asyncio

    from lanes import AsyncLane

    holder_client = redis.asyncio.Redis.from_url(private_redis.url, socket_timeout=1, socket_connect_timeout=1)
    other_client = redis.asyncio.Redis.from_url(private_redis.url, socket_timeout=1, socket_connect_timeout=1)
    holder_lane = AsyncLane(holder_client, "pool:snap-async", width=1, lease_seconds=LEASE)
    other = AsyncLane(other_client, "pool:snap-async", width=1, lease_seconds=LEASE)
    try:
        await holder_lane.provision()
        assert (await other.stats()).in_flight == 0
        await holder_client.save()
        held = await holder_lane.acquire(I, 2.0)
        assert await other.try_acquire(I) is None   # other's hub is up before the restart
        restarts_before = int(await holder_client.hget(holder_lane.keys.meta, "restarts") or 0)
        private_redis.kill()
        private_redis.ensure()
        assert await other.try_acquire(I) is None, "a grant on the restored, stale state"
        # The test's own reads on a client made after the restart (the others'
        # pooled connections were cut by it; the lane replaces its own).
        probe = redis.asyncio.Redis.from_url(private_redis.url, socket_timeout=1)
        meta = await probe.hgetall(other.keys.meta)
        assert int(meta[b"restarts"]) == restarts_before + 1
        assert int(meta[b"epoch"]) > held.generation.epoch, "a new epoch: no generation is repeated"
        holders_key = holder_lane.keys.all()[1]
        for _ in range(400):
            if await probe.zscore(holders_key, held.holder_id) is not None:
                break
            await asyncio.sleep(0.025)
        else:
            raise AssertionError("the holder never re-registered")
        held.check()
        assert await other.try_acquire(I) is None, "width 1 stays full while the holder holds"
        assert await held.release()
        after = None
        for _ in range(400):
            after = await other.try_acquire(I)
            if after is not None:
                break
            await asyncio.sleep(0.025)
        assert after is not None and after.generation > held.generation
        assert await after.release()
        await probe.aclose()
    finally:
        await holder_lane.close()
        await other.close()
        for client in (holder_client, other_client):
            await client.aclose()

"""Scenario 1: a script reply lost after the command ran (a Redis stall longer
than the socket timeout). Nothing may be applied twice: ``inflight`` stays
equal to the holder count, no slot is stranded, a re-sent release says it
worked."""

from __future__ import annotations

import hashlib

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.asyncio.retry import Retry as AsyncRetry

from lanes import AcquireTimeout, AsyncLane, Lane, Priority, RedisUnavailable
from lanes.lane._lua import script_text
from lanes.lane.hub import close_hubs

I = Priority.INTERACTIVE
TIMEOUT = 0.5  # the proxied client's socket timeout


def sha(name: str) -> bytes:
    return hashlib.sha1(script_text(name).encode()).hexdigest().encode()


@pytest.fixture
def lanes_via_proxy(fault_proxy):
    """(proxied lane, direct lane) builders on the same lane key."""
    clients = []

    def build(width: int, lease: float = 3.0, key: str = "pool:lost"):
        direct_client = redis.Redis.from_url(fault_proxy.direct_url, socket_timeout=5)
        proxied_client = redis.Redis.from_url(fault_proxy.client_url, socket_timeout=TIMEOUT,
                                              socket_connect_timeout=TIMEOUT)
        clients.extend([direct_client, proxied_client])
        direct = Lane(direct_client, key, width=width, lease_seconds=lease)
        direct.provision()
        for name in ("acquire", "release", "leave"):
            direct_client.script_load(script_text(name))  # so the proxied call is the one EVALSHA
        return Lane(proxied_client, key, width=width, lease_seconds=lease), direct

    yield build
    for client in clients:
        close_hubs(client)
        client.close()


def books(lane: Lane) -> tuple[int, int, int]:
    """(inflight in meta, holder entries, queue entries), read directly."""
    meta, holders, _, queue = lane.keys.all()[:4]
    inflight = int(lane.client.hget(meta, "inflight") or 0)
    return inflight, lane.client.zcard(holders), lane.client.zcard(queue)


def test_a_lost_acquire_reply_never_counts_a_holder_twice(lanes_via_proxy, fault_proxy):
    proxied, direct = lanes_via_proxy(width=2)
    fault_proxy.drop_reply_to(sha("acquire"))
    permit = proxied.acquire(I, timeout=2.0)
    assert fault_proxy.dropped == 1
    assert books(direct) == (1, 1, 0), "one holder, counted once"
    assert permit.release()
    assert books(direct) == (0, 0, 0)
    # The whole width is still there for others.
    both = [direct.try_acquire(I), direct.try_acquire(I)]
    assert all(both)
    for held in both:
        held.release()


def test_a_lost_acquire_reply_on_a_full_lane_never_queues_the_holder_behind_itself(lanes_via_proxy, fault_proxy):
    proxied, direct = lanes_via_proxy(width=1)
    fault_proxy.drop_reply_to(sha("acquire"))
    permit = proxied.acquire(I, timeout=1.0)  # old: queued behind its own grant, timed out
    assert books(direct) == (1, 1, 0)
    assert permit.release()
    assert books(direct) == (0, 0, 0)


@pytest.mark.parametrize("call", ["acquire", "try_acquire"])
def test_an_acquire_whose_every_reply_is_lost_strands_no_slot(lanes_via_proxy, fault_proxy, call):
    proxied, direct = lanes_via_proxy(width=2)
    fault_proxy.drop_reply_to(sha("acquire"), times=5)
    with pytest.raises(RedisUnavailable):
        proxied.acquire(I, timeout=2.0) if call == "acquire" else proxied.try_acquire(I)
    assert books(direct) == (0, 0, 0), "the caller left: nothing held, nothing counted"


def test_a_release_whose_reply_was_lost_reports_that_it_worked(lanes_via_proxy, fault_proxy):
    proxied, direct = lanes_via_proxy(width=1)
    permit = proxied.acquire(I, timeout=2.0)
    fault_proxy.drop_reply_to(sha("release"))
    assert permit.release() is True
    assert fault_proxy.dropped == 1
    assert books(direct) == (0, 0, 0)
    assert permit.release() is False, "a second release still says it did nothing"


def test_an_urgent_waiter_whose_own_cut_lost_the_release_reply_takes_its_grant_from_a_renewal(
        lanes_via_proxy, fault_proxy):
    # The urgent thread cuts and releases a holder of its own process
    # (Lane._wait_queued); the release's reply, the only word of a grant
    # within one process, is lost. The re-sent release names nothing; the
    # hub renews its waiters at once, and the renewal finds the grant (the
    # regular renewal is 3.3 s away with a 10 s lease, past the 2 s budget).
    proxied, direct = lanes_via_proxy(width=1, lease=10.0)
    holder = proxied.acquire(Priority.BACKGROUND, timeout=2.0)
    holder.on_stop(lambda: True)  # "the call was cut here"
    fault_proxy.drop_reply_to(sha("release"))
    urgent = proxied.acquire(I, timeout=2.0)
    assert fault_proxy.dropped == 1
    assert holder.released and urgent.generation > holder.generation
    assert books(direct) == (1, 1, 0), "one holder, counted once"
    assert urgent.holder_id not in proxied._hub.book.delivered
    urgent.release()
    assert books(direct) == (0, 0, 0)


def test_the_acquire_script_is_idempotent_for_an_id_that_holds_or_waits(make_lane):
    lane = make_lane(width=1)
    args = ["tok-1.1", 0, 5000, lane.lease_ms, "1", "0", "0", "1", "", ""]   # fresh=1, the fast path
    first = lane._script("acquire", args)
    again = lane._script("acquire", args)
    assert first == again and first[0] == b"granted"
    waiting = ["tok-1.2", 0, 5000, lane.lease_ms, "1", "0", "0", "1", "", ""]
    assert lane._script("acquire", waiting)[0] == b"queued"
    assert lane._script("acquire", waiting)[0] == b"queued"
    assert books(lane) == (1, 1, 1), "one holder and one queue entry, whatever was re-sent"


def test_a_check_that_finds_inflight_apart_from_the_holders_repairs_and_records_it(make_lane):
    lane = make_lane(width=3)
    permit = lane.acquire(I, 1.0)
    lane.client.hset(lane.keys.meta, "inflight", 3)   # as an eviction or an old double count left it
    stats = lane.stats()
    assert books(lane) == (1, 1, 0)
    assert stats.repairs == 1 and stats.in_flight == 1
    assert lane.try_acquire(I) is not None, "the repaired lane admits up to its width again"
    permit.release()


async def test_an_async_client_with_redis_py_retries_never_counts_a_holder_twice(fault_proxy):
    direct = redis.Redis.from_url(fault_proxy.direct_url, socket_timeout=5)
    client = redis.asyncio.Redis.from_url(fault_proxy.client_url, socket_timeout=TIMEOUT,
                                          retry=AsyncRetry(NoBackoff(), 2))
    try:
        Lane(direct, "pool:lost-async", width=2).provision()
        direct.script_load(script_text("acquire"))
        lane = AsyncLane(client, "pool:lost-async", width=2, lease_seconds=3.0)
        fault_proxy.drop_reply_to(sha("acquire"))
        permit = await lane.acquire(I, timeout=2.0)
        assert fault_proxy.dropped == 1
        assert books(Lane(direct, "pool:lost-async", width=2)) == (1, 1, 0)
        assert await permit.release()
        assert books(Lane(direct, "pool:lost-async", width=2)) == (0, 0, 0)
        await lane.close()
    finally:
        await client.aclose()
        direct.close()

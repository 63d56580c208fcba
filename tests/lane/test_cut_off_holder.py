"""Scenario 3: a holder cut off from Redis (its host off the network). It must
know it may have lost its slot before the server can re-grant it: ``lost``
fires from its own clock, measured from the send time of its last successful
renewal, and renewals of several lanes do not wait for each other. Checked
with the default ratio of lease : renewal : socket timeout (30 : 10 : 5)."""

from __future__ import annotations

import threading
import time

import redis

from lanes import Lane, Priority
from lanes.lane.hub import close_hubs
from tests.polling import eventually

I = Priority.INTERACTIVE
LEASE, RENEW, SOCKET_TIMEOUT = 3.0, 1.0, 0.5   # the defaults' ratio (30 s, 10 s, 5 s)
LANES = 4


def test_a_cut_off_holder_is_lost_before_its_slots_are_granted_again(fault_proxy):
    cut_client = redis.Redis.from_url(fault_proxy.client_url, socket_timeout=SOCKET_TIMEOUT,
                                      socket_connect_timeout=SOCKET_TIMEOUT)
    other_client = redis.Redis.from_url(fault_proxy.direct_url, socket_timeout=5)
    keys = [f"pool:cut-{n}" for n in range(LANES)]
    cut_lanes = [Lane(cut_client, key, width=1, lease_seconds=LEASE, renew_seconds=RENEW) for key in keys]
    other_lanes = [Lane(other_client, key, width=1, lease_seconds=LEASE, renew_seconds=RENEW) for key in keys]
    for lane in other_lanes:
        lane.provision()
    lost_at: dict[str, float] = {}      # wall time the cut-off holder was told lost, per lane
    valid_until: dict[str, float] = {}  # wall time its check() stopped passing, per lane
    granted_at: dict[str, float] = {}   # server (wall) time the other process was granted, per lane
    try:
        held = [lane.acquire(I, 2.0) for lane in cut_lanes]
        # Let a renewal or two succeed first (the lease then runs from a renewal's send time).
        time.sleep(1.5 * RENEW)

        def watch(permit) -> None:
            permit.lost.wait(30)
            lost_at[permit.lane_key] = time.time()

        watchers = [threading.Thread(target=watch, args=(p,), daemon=True) for p in held]
        results: dict[str, object] = {}

        def wait_for(lane) -> None:
            results[lane.key] = lane.acquire(I, 30.0)

        waiters = [threading.Thread(target=wait_for, args=(lane,), daemon=True) for lane in other_lanes]
        for thread in watchers + waiters:
            thread.start()
        eventually(lambda: all(lane.stats().queued_total == 1 for lane in other_lanes), what="all waiting")
        fault_proxy.blackhole(True)
        for thread in waiters:
            thread.join(30)
        for thread in watchers:
            thread.join(30)
        wall_minus_mono = time.time() - time.monotonic()
        for permit in held:
            valid_until[permit.lane_key] = permit._lease_until - permit._lane.lost_guard + wall_minus_mono
        for lane in other_lanes:
            permit = results[lane.key]
            info = other_client.hget(lane.keys.all()[2], permit.holder_id).decode()
            granted_at[lane.key] = int(info.split(":")[2]) / 1000.0
            permit.release()
        for key in keys:
            # Server time is whole milliseconds (floored): allow that much.
            assert lost_at[key] <= granted_at[key] + 0.001, \
                f"{key}: told lost {lost_at[key] - granted_at[key]:+.3f} s after the slot was granted again"
            assert valid_until[key] <= granted_at[key] + 0.001, \
                f"{key}: check() passed {valid_until[key] - granted_at[key]:+.3f} s into the next holder's grant"
    finally:
        fault_proxy.blackhole(False)
        fault_proxy.cut()
        close_hubs(cut_client)
        close_hubs(other_client)
        cut_client.close()
        other_client.close()


async def test_an_async_cut_off_holder_is_lost_before_its_slots_are_granted_again(fault_proxy):
    import asyncio

    import redis.asyncio

    from lanes import AsyncLane

    cut_client = redis.asyncio.Redis.from_url(fault_proxy.client_url, socket_timeout=SOCKET_TIMEOUT,
                                              socket_connect_timeout=SOCKET_TIMEOUT)
    other_client = redis.Redis.from_url(fault_proxy.direct_url, socket_timeout=5)
    keys = [f"pool:acut-{n}" for n in range(LANES)]
    cut_lanes = [AsyncLane(cut_client, key, width=1, lease_seconds=LEASE, renew_seconds=RENEW) for key in keys]
    other_lanes = [Lane(other_client, key, width=1, lease_seconds=LEASE, renew_seconds=RENEW) for key in keys]
    for lane in other_lanes:
        lane.provision()
    lost_at: dict[str, float] = {}
    results: dict[str, object] = {}
    try:
        held = [await lane.acquire(I, 2.0) for lane in cut_lanes]
        await asyncio.sleep(1.5 * RENEW)

        def watch(permit) -> None:
            permit.lost.wait(30)
            lost_at[permit.lane_key] = time.time()

        def wait_for(lane) -> None:
            results[lane.key] = lane.acquire(I, 30.0)

        threads = [threading.Thread(target=watch, args=(p,), daemon=True) for p in held]
        threads += [threading.Thread(target=wait_for, args=(lane,), daemon=True) for lane in other_lanes]
        for thread in threads:
            thread.start()
        while not all(lane.stats().queued_total == 1 for lane in other_lanes):
            await asyncio.sleep(0.01)
        fault_proxy.blackhole(True)
        while any(thread.is_alive() for thread in threads):
            await asyncio.sleep(0.05)   # the event loop runs on: the hub's renewer and timer are tasks
        for lane in other_lanes:
            permit = results[lane.key]
            info = other_client.hget(lane.keys.all()[2], permit.holder_id).decode()
            granted_at = int(info.split(":")[2]) / 1000.0
            permit.release()
            assert lost_at[lane.key] <= granted_at + 0.001, \
                f"{lane.key}: told lost {lost_at[lane.key] - granted_at:+.3f} s after the slot was granted again"
    finally:
        fault_proxy.blackhole(False)
        fault_proxy.cut()
        for lane in cut_lanes[:1]:
            await lane.close()
        await cut_client.aclose()
        close_hubs(other_client)
        other_client.close()

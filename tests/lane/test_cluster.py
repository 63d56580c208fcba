"""The same scripts on a local 3-node Redis Cluster."""

from __future__ import annotations

import threading
import time

import pytest
from redis.cluster import RedisCluster

from lanes import AcquireTimeout, Lane, Priority
from lanes.lane.hub import close_hubs


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_lanes_work_unchanged_on_a_three_node_cluster(local_cluster):
    client = RedisCluster(host="127.0.0.1", port=local_cluster.ports[0], socket_timeout=5)
    try:
        lanes = [Lane(client, f"pool:{n}", width=1, lease_seconds=2.0) for n in range(6)]
        slots = {client.keyslot(lane.keys.meta) for lane in lanes}
        assert len({client.get_node_from_key(lane.keys.meta).port for lane in lanes}) > 1, slots
        for lane in lanes:
            assert {client.keyslot(k) for k in lane.keys.all()} == {client.keyslot(lane.keys.meta)}
            lane.provision()
            holder = lane.acquire(Priority.INTERACTIVE, 1.0)
            got = {}
            thread = threading.Thread(target=lambda: got.setdefault("p", lane.acquire(Priority.BACKGROUND, 5.0)))
            thread.start()
            deadline = time.monotonic() + 5
            while lane.stats().queued_total < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            holder.release()  # handoff through the doorbell, across nodes
            thread.join(5)
            assert got["p"].generation > holder.generation
            with pytest.raises(AcquireTimeout):
                lane.acquire(Priority.INTERACTIVE, 0.1)
            got["p"].release()
            assert lane.resize(2) == 1
            stats = lane.stats()
            assert (stats.width, stats.in_flight, stats.grants, stats.timeouts) == (2, 0, 2, 1)
    finally:
        close_hubs(client)
        client.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_cluster_node_restarted_from_an_older_snapshot_is_detected(local_cluster):
    """Cluster calls run on a connection of the slot's node and send that
    node's run_id (``_lua.SyncRunner._on_slot_node``): a node that comes back
    with an older snapshot starts the lane over, as a single server does."""
    import redis

    client = RedisCluster(host="127.0.0.1", port=local_cluster.ports[0], socket_timeout=2)
    other_client = RedisCluster(host="127.0.0.1", port=local_cluster.ports[0], socket_timeout=2)
    lane = Lane(client, "pool:snap", width=1, lease_seconds=5.0)
    other = Lane(other_client, "pool:snap", width=1, lease_seconds=5.0)
    try:
        lane.provision()
        port = client.get_node_from_key(lane.keys.meta).port
        node = redis.Redis(port=port, socket_timeout=2)
        node.save()                                     # the snapshot: an empty lane
        held = lane.acquire(Priority.INTERACTIVE, 2.0)  # granted after it
        assert other.try_acquire(Priority.INTERACTIVE) is None
        local_cluster.restart(port)
        deadline = time.monotonic() + 20
        while True:
            try:
                got = other.try_acquire(Priority.INTERACTIVE)
                break
            except Exception:  # the node is still loading or rejoining
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        assert got is None, "a grant on the restored, stale state"
        node = redis.Redis(port=port, socket_timeout=2)
        meta = node.hgetall(lane.keys.meta)
        assert int(meta[b"restarts"]) == 1
        assert int(meta[b"epoch"]) > held.generation.epoch
        node.close()
    finally:
        for c in (client, other_client):
            close_hubs(c)
            c.close()

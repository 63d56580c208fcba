"""Scenario 2: Redis restarts and loads a snapshot taken before a grant. The
stale state is present, not absent: the lane must still see that another
server process wrote it, admit no one for a quiet period, let the live holder
re-register, and never repeat a generation. A private redis-server of the
test's own (SAVE by hand, SIGKILL, start again on the same folder)."""

from __future__ import annotations

import redis

from lanes import Lane, Priority
from lanes.lane.hub import close_hubs
from tests.polling import eventually

I = Priority.INTERACTIVE
LEASE = 5.0   # longer than the restart takes: the holder must survive it


def test_a_restart_from_an_older_snapshot_is_detected_and_over_admits_no_one(private_redis):
    holder_client = redis.Redis.from_url(private_redis.url, socket_timeout=1, socket_connect_timeout=1)
    other_client = redis.Redis.from_url(private_redis.url, socket_timeout=1, socket_connect_timeout=1)
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

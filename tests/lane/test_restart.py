"""Redis restarts (no persistence) in the middle of load: no over-admission."""

from __future__ import annotations

import random
import threading
import time

import pytest
import redis

from lanes import AcquireTimeout, Lane, Priority, RedisUnavailable
from lanes.lane.hub import close_hubs

WIDTH = 3
LEASE, RENEW = 1.0, 0.25


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_redis_restart_under_load_never_over_admits(private_redis):
    client = redis.Redis.from_url(private_redis.url, socket_timeout=1, socket_connect_timeout=1)
    lane = Lane(client, "pool:restart", width=WIDTH, lease_seconds=LEASE, renew_seconds=RENEW)
    lane.provision()
    record: list[tuple[int, int, int, tuple]] = []  # (start, end, holder, generation)
    errors = {"unavailable": 0, "timeout": 0}
    lock = threading.Lock()
    stop = threading.Event()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            try:
                permit = lane.acquire(Priority(rng.randrange(3)), 0.5)
            except AcquireTimeout:
                with lock:
                    errors["timeout"] += 1
                continue
            except RedisUnavailable:
                with lock:
                    errors["unavailable"] += 1
                time.sleep(0.05)
                continue
            start = time.monotonic_ns()
            # Hold up to 0.4 s, stopping at once if the lease is lost (as the walker does).
            permit.lost.wait(rng.uniform(0, 0.4))
            end = time.monotonic_ns()
            with lock:
                record.append((start, end, permit.holder_id, permit.generation))
            try:
                permit.release()
            except RedisUnavailable:
                pass

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(1.5)
    first_epoch = lane.stats().epoch
    restart_at = time.monotonic_ns()
    private_redis.kill()
    time.sleep(0.3)
    private_redis.ensure()
    time.sleep(3.0)
    stop.set()
    for thread in threads:
        thread.join(10)

    events = sorted([(s, 1) for s, _, _, _ in record] + [(e, -1) for _, e, _, _ in record],
                    key=lambda e: (e[0], e[1]))
    holding = worst = 0
    for _, delta in events:
        holding += delta
        worst = max(worst, holding)
    assert worst <= WIDTH, f"{worst} held at once on a lane of width {WIDTH}"
    after = [r for r in record if r[0] > restart_at]
    assert after, "the lane admitted again after the restart"
    stats = lane.stats()
    assert stats.epoch > first_epoch, "the state was recreated with a new epoch"
    assert max(r[3] for r in record).epoch == stats.epoch
    close_hubs(client)
    client.close()

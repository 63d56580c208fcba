"""Process bodies of bench_lane.py (importable by spawned children)."""

from __future__ import annotations

import time

import redis

TRIVIAL = "return 1"


def bare_pair(client, script) -> None:
    """The baseline: two bare EVALSHA round trips of a trivial script."""
    script(keys=["lanes:bench:trivial"], args=[])
    script(keys=["lanes:bench:trivial"], args=[])


def throughput(url: str, prefix: str, key: str, mode: str, seconds: float, start_at: float, queue) -> None:
    """Count acquire+release pairs (mode 'lane') or bare pairs (mode 'bare') for ``seconds``."""
    from lanes import Lane, Priority

    client = redis.Redis.from_url(url)
    lane = Lane(client, key, width=100_000, prefix=prefix)
    script = client.register_script(TRIVIAL)
    lane.try_acquire(Priority.INTERACTIVE).release()  # warm: hub started, scripts loaded
    bare_pair(client, script)
    while time.time() < start_at:
        time.sleep(0.001)
    done = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if mode == "lane":
            lane.try_acquire(Priority.INTERACTIVE).release()
        else:
            bare_pair(client, script)
        done += 1
    queue.put(done)
    lane.close()


def hold_many(url: str, prefix: str, key: str, count: int, lease: float, renew: float, keep: float,
              ready, queue) -> None:
    """Acquire ``count`` permits, keep them alive by batched renewal for ``keep`` s."""
    from lanes import Lane, Priority

    client = redis.Redis.from_url(url)
    lane = Lane(client, key, width=10**9, prefix=prefix, lease_seconds=lease, renew_seconds=renew)
    permits = []
    for _ in range(count):
        permit = lane.try_acquire(Priority.BACKGROUND)
        if permit is None:
            break
        permits.append(permit)
    ready.put(len(permits))
    time.sleep(keep)
    lost = sum(p.lost.is_set() for p in permits)
    queue.put(lost)
    # Release in bulk is not the point here: let the parent delete the keys.
    lane.close()

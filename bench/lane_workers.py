"""Process bodies of bench_lane.py (importable by spawned children)."""

from __future__ import annotations

import time

import redis

TRIVIAL = "return 1"


def bare_pair(client, script) -> None:
    """For reference only: two EVALSHA round trips of a trivial script through
    redis-py's ``Script.__call__`` (the wrapped client)."""
    script(keys=["lanes:bench:trivial"], args=[])
    script(keys=["lanes:bench:trivial"], args=[])


def raw_pair(conn, sha: str) -> None:
    """The baseline: two EVALSHA of a trivial script sent on one connection held
    directly (no redis-py command wrapper), the path the lane's sync client uses."""
    conn.send_command("EVALSHA", sha, 1, "lanes:bench:trivial")
    conn.read_response()
    conn.send_command("EVALSHA", sha, 1, "lanes:bench:trivial")
    conn.read_response()


ORDER = ("bare", "lane", "raw", "raw", "lane", "bare")


def slice_modes(slices: int) -> list[str]:
    """Alternating sub-phases in mirrored order (bare, lane, raw, raw, lane,
    bare, ...), so a drift of the machine over the run lands on every mode
    alike. 'raw' (the pair on a directly held connection, the lane's own transport)
    is the baseline; 'bare' (through redis-py's Script) a reference only."""
    return [ORDER[i % len(ORDER)] for i in range(slices)]


def throughput(url: str, prefix: str, key: str, slices: int, slice_seconds: float, start_at: float,
               queue) -> None:
    """Count acquire+release pairs and bare pairs in alternating sub-phases of
    ``slice_seconds`` each (every process switches at the same wall-clock
    times); puts ``{mode: count}``."""
    from lanes import Lane, Priority

    client = redis.Redis.from_url(url)
    lane = Lane(client, key, width=100_000, prefix=prefix)
    script = client.register_script(TRIVIAL)
    lane.try_acquire(Priority.INTERACTIVE).release()  # warm: hub started, scripts loaded
    bare_pair(client, script)
    while time.time() < start_at:
        time.sleep(0.001)
    counts = {"bare": 0, "lane": 0, "raw": 0}
    conn = client.connection_pool.get_connection()
    for i, mode in enumerate(slice_modes(slices)):
        end = start_at + (i + 1) * slice_seconds
        done = 0
        if mode == "lane":
            while time.time() < end:
                lane.try_acquire(Priority.INTERACTIVE).release()
                done += 1
        elif mode == "bare":
            while time.time() < end:
                bare_pair(client, script)
                done += 1
        else:
            while time.time() < end:
                raw_pair(conn, script.sha)
                done += 1
        counts[mode] += done
    client.connection_pool.release(conn)
    queue.put(counts)
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


def handoff_waiter(url: str, prefix: str, key: str, conn) -> None:
    """The waiting side of a cross-process handoff: on each "go", queue on the
    lane, report the CLOCK_MONOTONIC time (system-wide on Linux) at which the
    grant arrived, give the slot back, and wait for the next round."""
    from lanes import Lane, Priority

    lane = Lane(redis.Redis.from_url(url), key, width=1, prefix=prefix)
    while conn.recv() == "go":
        permit = lane.acquire(Priority.INTERACTIVE, 5.0)
        granted = time.monotonic()
        permit.release()
        conn.send(granted)
    lane.close()


PUBLISH_ONLY = "return redis.call('PUBLISH', KEYS[1], ARGV[1])"


def floor_subscriber(url: str, channel: str, armed_key: str, conn) -> None:
    """The least a handoff through Redis pub/sub can cost, for comparison: a
    subscriber that does nothing but sleep in ``poll`` on its connection and
    read the message, with the lane's own doorbell read. On each "go" it
    marks itself armed (one round trip, as a waiter's enqueue is) and sleeps;
    it reports the CLOCK_MONOTONIC time at which the message was read."""
    import select

    from lanes.lane.wire import READ_SIZE, read_reply

    client = redis.Redis.from_url(url)
    pubsub = client.pubsub()
    pubsub.subscribe(channel)
    while pubsub.get_message(timeout=1.0) is None:
        pass
    connection = pubsub.connection
    poller = select.poll()
    poller.register(connection._sock.fileno(), select.POLLIN)
    buffer = bytearray(READ_SIZE)
    while conn.recv() == "go":
        client.set(armed_key, 1)
        poller.poll(5000)
        read_reply(connection, buffer)  # the lane's own doorbell read: the floor shares it
        conn.send(time.monotonic())
    pubsub.close()

"""One process of the lane stress test: threads acquiring with random
priorities, timeouts and cancels, writing an independent record.

Record lines (JSON, one ``os.write`` each on an O_APPEND file, so a SIGKILL
loses at most the line being written); times are CLOCK_MONOTONIC ns, shared
by every process of the machine:
  {"k": "a", "id", "p", "t0" call start, "tq" queued (or null), "t1" return,
   "o" outcome, "g" [epoch, counter]}            written after acquire returns
  {"k": "r", "id", "t"}                            written before release
  {"k": "lost", "id"}                              a lease was lost
  {"k": "unreleased", "id"}                        the release did not reach Redis (faults)
"""

from __future__ import annotations

import json
import os
import random
import threading
import time

import redis

from lanes import AcquireCancelled, AcquireTimeout, CancelEvent, Lane, Priority, RedisUnavailable


class RecordingLane(Lane):
    """Notes when the queue accepted us (the start of FIFO obligations)."""

    local = threading.local()

    def _acquire_call(self, hub, waiter_id, priority, timeout_ms, try_only, fresh=False, previous="", workflow="",
                      resume=False):
        parsed = super()._acquire_call(hub, waiter_id, priority, timeout_ms, try_only, fresh, previous,
                                       workflow=workflow, resume=resume)
        if parsed[0] == "queued":
            self.local.queued_at = time.monotonic_ns()
        return parsed


def run(url: str, key: str, width: int, lease: float, renew: float, count: int, threads: int,
        record_path: str, seed: int, hold_max: float, socket_timeout: float = 10.0) -> None:
    fd = os.open(record_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def log(entry: dict) -> None:
        os.write(fd, (json.dumps(entry, separators=(",", ":")) + "\n").encode())

    client = redis.Redis.from_url(url, socket_timeout=socket_timeout, socket_connect_timeout=socket_timeout)
    lane = RecordingLane(client, key, width=width, lease_seconds=lease, renew_seconds=renew)
    per_thread = count // threads

    def worker(index: int) -> None:
        rng = random.Random(seed * 1000 + index)
        for _ in range(per_thread):
            priority = Priority(rng.choice([0, 1, 1, 2, 2, 2]))
            roll = rng.random()
            timeout = None if roll < 0.3 else (rng.uniform(0.002, 0.05) if roll < 0.5 else 2.0)
            cancel = None
            if rng.random() < 0.1:
                cancel = CancelEvent()
                threading.Timer(rng.uniform(0, 0.02), cancel.set).start()
            RecordingLane.local.queued_at = None
            t0 = time.monotonic_ns()
            try:
                permit = lane.acquire(priority, timeout, cancel=cancel)
            except AcquireTimeout:
                outcome, permit = "timeout", None
            except AcquireCancelled:
                outcome, permit = "cancel", None
            except RedisUnavailable:
                outcome, permit = "unavailable", None
            else:
                outcome = "granted"
            t1 = time.monotonic_ns()
            entry = {"k": "a", "p": int(priority), "t0": t0, "tq": RecordingLane.local.queued_at,
                     "t1": t1, "o": outcome}
            if permit is not None:
                entry["id"] = permit.holder_id
                entry["g"] = list(permit.generation)
            log(entry)
            if permit is None:
                continue
            if not permit.lost.is_set():  # a permit lost at once (a late doorbell) is not used
                time.sleep(rng.uniform(0, hold_max))
            if permit.lost.is_set():
                log({"k": "lost", "id": permit.holder_id})
            log({"k": "r", "id": permit.holder_id, "t": time.monotonic_ns()})
            try:
                permit.release()
            except RedisUnavailable:
                log({"k": "unreleased", "id": permit.holder_id})  # its lease brings the slot back

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    os.close(fd)

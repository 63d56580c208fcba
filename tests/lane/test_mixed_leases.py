"""Scenario 5: two lease settings on one lane (a rolling upgrade that changes
the lease). A slot handed to a waiter gets the waiter's own lease, the one it
trusts and renews by, not the releaser's."""

from __future__ import annotations

import threading
import time

from lanes import Lane, Priority
from tests.polling import eventually

I = Priority.INTERACTIVE


def server_ms(client) -> int:
    seconds, micros = client.time()
    return seconds * 1000 + micros // 1000


def test_a_slot_handed_from_a_short_lease_to_a_long_lease_waiter_keeps_the_waiters_lease(make_lane):
    short = make_lane(width=1, lease_seconds=1.0)
    long = make_lane(width=1, lease_seconds=30.0, provision=False)
    third = make_lane(width=1, lease_seconds=1.0, provision=False)
    held = short.acquire(I, 2.0)
    got = {}
    waiter = threading.Thread(target=lambda: got.setdefault("permit", long.acquire(I, 10.0)), daemon=True)
    waiter.start()
    eventually(lambda: short.stats().queued_total == 1, what="the long-lease waiter queued")
    assert held.release()
    waiter.join(5)
    permit = got["permit"]
    holders = short.keys.all()[1]
    left_ms = short.client.zscore(holders, permit.holder_id) - server_ms(short.client)
    assert left_ms > 10_000, f"the handed-off slot carries the waiter's 30 s lease, not 1 s ({left_ms} ms left)"
    # Past the releaser's lease: the slot is still the waiter's, and nobody else gets it.
    time.sleep(1.5)
    permit.check()
    assert third.try_acquire(I) is None
    assert short.stats().in_flight == 1
    assert permit.release()


def test_a_slot_handed_from_a_long_lease_to_a_short_lease_waiter_keeps_the_waiters_lease(make_lane):
    long = make_lane(width=1, lease_seconds=30.0)
    short = make_lane(width=1, lease_seconds=1.0, provision=False)
    held = long.acquire(I, 2.0)
    got = {}
    waiter = threading.Thread(target=lambda: got.setdefault("permit", short.acquire(I, 10.0)), daemon=True)
    waiter.start()
    eventually(lambda: long.stats().queued_total == 1, what="the short-lease waiter queued")
    assert held.release()
    waiter.join(5)
    permit = got["permit"]
    left_ms = long.client.zscore(long.keys.all()[1], permit.holder_id) - server_ms(long.client)
    assert left_ms <= 1_000, "a short lease is not stretched by a long-lease releaser"
    assert permit.release()

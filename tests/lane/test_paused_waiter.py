"""Scenario 4: a waiter stopped (SIGSTOP: a GC or VM pause) past its lease,
granted by handoff meanwhile, its grant reaped and given to someone else,
then resumed. It must never pass check() while another process holds the
slot. Resumed, it reads one of two words first: the grant made to it before
the pause ended (its permit comes back already lost), or a renewal that finds
its place gone (it rejoins at the back of its class under a new id, and is
granted only once the slot is free)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time

from lanes import Priority
from tests.polling import eventually

I = Priority.INTERACTIVE
LEASE = 1.0

WAITER = textwrap.dedent("""
    import json, sys, redis
    from lanes import Lane, LeaseLost, Priority
    client = redis.Redis.from_url(sys.argv[1], socket_timeout=5)
    lane = Lane(client, sys.argv[2], width=1, lease_seconds=float(sys.argv[3]))
    permit = lane.acquire(Priority.INTERACTIVE, 60.0)
    try:
        permit.check()
        valid = True
    except LeaseLost:
        valid = False
    print(json.dumps({"valid": valid, "lost": permit.lost.is_set(), "id": permit.holder_id}), flush=True)
    permit.release()
""")


def test_a_waiter_resumed_after_its_grant_was_reaped_never_holds_the_slot_another_was_given(make_lane):
    holder = make_lane("pool:paused", width=1, lease_seconds=LEASE)
    third = make_lane("pool:paused", width=1, lease_seconds=30.0, provision=False)
    first = holder.acquire(I, 2.0)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen([sys.executable, "-c", WAITER, holder.make_url, "pool:paused", str(LEASE)],
                            stdout=subprocess.PIPE, env=env, text=True)
    reports: queue.Queue = queue.Queue()
    threading.Thread(target=lambda: [reports.put(json.loads(line)) for line in proc.stdout if line.strip()],
                     daemon=True).start()
    try:
        eventually(lambda: holder.stats().queued_total == 1, timeout=30, what="the waiter queued")
        os.kill(proc.pid, signal.SIGSTOP)
        assert first.release()        # handed to the stopped waiter: its doorbell waits unread
        stats = holder.stats()
        assert stats.in_flight == 1 and stats.queued_total == 0
        # Nobody renews the stopped waiter's grant: it is reaped, and the slot goes on.
        taken = eventually(lambda: third.try_acquire(I), timeout=10, what="the reaped slot re-granted")
        os.kill(proc.pid, signal.SIGCONT)
        # Nothing else queues on this lane: a queued waiter now is the resumed one, rejoined.
        first_word = eventually(lambda: ("read its grant" if not reports.empty() else
                                         "rejoined" if holder.stats().queued_total == 1 else None),
                                timeout=30, what="the resumed waiter to report or rejoin")
        if first_word == "read its grant":
            report = reports.get_nowait()
            assert report["valid"] is False and report["lost"] is True, \
                f"the resumed waiter's permit must be lost at once while another holds the slot: {report}"
            taken.check()
            assert taken.release()
        else:
            # Rejoined: it waits while the slot is held, for longer than its own lease.
            time.sleep(2 * LEASE)
            assert reports.empty(), f"granted while another process holds the slot: {reports.get_nowait()}"
            taken.check()
            assert taken.release()
            report = reports.get(timeout=30)
            assert report["valid"] is True and report["lost"] is False, report
        assert proc.wait(timeout=30) == 0
        eventually(lambda: holder.stats().in_flight == 0 and holder.stats().queued_total == 0,
                   timeout=10, what="the lane empty again")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()

"""Scenario 4: a waiter stopped (SIGSTOP: a GC or VM pause) past its lease,
granted by handoff meanwhile, its grant reaped and given to someone else,
then resumed. Its permit must be reported lost at once, never pass check()
while another process holds the slot."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

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


def test_a_waiter_resumed_after_its_grant_was_reaped_is_told_lost_at_once(make_lane):
    holder = make_lane("pool:paused", width=1, lease_seconds=LEASE)
    third = make_lane("pool:paused", width=1, lease_seconds=30.0, provision=False)
    first = holder.acquire(I, 2.0)
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen([sys.executable, "-c", WAITER, holder.make_url, "pool:paused", str(LEASE)],
                            stdout=subprocess.PIPE, env=env, text=True)
    try:
        eventually(lambda: holder.stats().queued_total == 1, timeout=30, what="the waiter queued")
        os.kill(proc.pid, signal.SIGSTOP)
        assert first.release()        # handed to the stopped waiter: its doorbell waits unread
        stats = holder.stats()
        assert stats.in_flight == 1 and stats.queued_total == 0
        # Nobody renews the stopped waiter's grant: it is reaped, and the slot goes on.
        taken = eventually(lambda: third.try_acquire(I), timeout=10, what="the reaped slot re-granted")
        os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=30)
        report = json.loads(out.strip().splitlines()[-1])
        assert report["valid"] is False and report["lost"] is True, \
            f"the resumed waiter's permit must be lost at once while another holds the slot: {report}"
        taken.check()
        assert taken.release()
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)
            proc.kill()
            proc.wait()

"""The review's "seen but not proven" items, each proven fixed here (the
lost-reply ones are in test_lost_reply.py)."""

from __future__ import annotations

import time

import pytest

from lanes import Priority
from lanes.lane._lua import script_text
from tests.polling import eventually

I = Priority.INTERACTIVE


def queue_waiters(lane, count: int) -> None:
    """``count`` queued waiters of a process that is not listening (notify 0:
    their grants stay theirs), written by the acquire script itself."""
    sha = lane.client.script_load(script_text("acquire"))
    pipe = lane.client.pipeline(transaction=False)
    for n in range(count):
        pipe.evalsha(sha, 8, *lane.keys.all(), f"quiet-0.{n}", 2, -1, 60_000, "", "0", "0", "1", "", "", "")
    replies = pipe.execute()
    assert all(reply[0] == b"queued" for reply in replies)


def test_a_resize_past_the_owners_width_hands_every_new_slot_to_a_waiter(make_lane):
    lane = make_lane(width=0)
    queue_waiters(lane, 1_000)
    assert lane.resize(1_000) == 0
    # Read directly (a stats() call would hand off 256 more itself). Old: the
    # follow-up handoffs were counted by the owner's width (0): 768 granted.
    _, holders, _, queue = lane.keys.all()[:4]
    assert (lane.client.zcard(holders), lane.client.zcard(queue)) == (1_000, 0)


def test_the_next_event_after_a_mass_expiry_is_never_negative(make_lane):
    lane = make_lane(width=200, lease_seconds=0.2)
    for n in range(100):
        assert lane._script("acquire", [f"gone-0.{n}", 0, 0, lane.lease_ms, "", "1", "0", "1", "", ""])[0] == b"granted"
    time.sleep(0.3)  # all 100 holders' leases end; their process is gone (nobody renews)
    # One renewal reaps 64 of them; the rest are still due, and the script must say so.
    reply = lane._script("renew", [lane.lease_ms, ""])
    assert int(reply[1]) >= 1, f"next event {int(reply[1])} ms: waiters would not wake to reap the rest"


def test_evicted_holder_entries_with_meta_kept_are_repaired_not_left_high(make_lane):
    lane = make_lane(width=2)
    held = [lane.acquire(I, 1.0), lane.acquire(I, 1.0)]
    meta, holders, hinfo = lane.keys.all()[:3]
    lane.client.delete(holders, hinfo)   # what an allkeys eviction of those two keys leaves
    stats = lane.stats()
    assert int(lane.client.hget(meta, "inflight")) == 0 and stats.repairs == 1
    # The holder counts per workflow are recounted from the entries too.
    assert stats.workflows == () and int(lane.client.hget(meta, "h:0:") or 0) == 0
    again = [lane.try_acquire(I), lane.try_acquire(I)]
    assert all(again), "the width is usable again"
    assert [(w.workflow, w.in_flight) for w in lane.stats().workflows] == [("", 2)]
    for permit in held + again:
        permit.release()


def test_closing_one_lane_tells_the_permits_of_every_lane_on_its_client_they_are_lost(make_lane):
    first = make_lane("pool:a", width=1)
    second = make_lane("pool:b", width=1, client=first.client)
    held = second.acquire(I, 1.0)
    first.close()
    assert held.lost.is_set(), "no renewer runs for it any more: it must not go on silently"
    assert held.release()


@pytest.mark.slow
def test_a_state_from_another_server_with_a_later_clock_never_makes_generations_go_back(make_lane):
    lane = make_lane(width=1)
    before = lane.acquire(I, 1.0)
    before.release()
    ahead = before.generation.epoch + 3_600_000   # the old server's clock was an hour ahead
    lane.client.hset(lane.keys.meta, mapping={"epoch": ahead, "run": "0" * 40})
    assert lane.try_acquire(I) is None, "a state written by another server starts over quietly"
    epoch = int(lane.client.hget(lane.keys.meta, "epoch"))
    assert epoch > ahead, "the new epoch is past the old one, not this server's (earlier) clock"
    after = eventually(lambda: lane.try_acquire(I), timeout=10, what="a grant after the quiet period")
    assert after.generation > before.generation and after.generation.epoch > ahead
    after.release()

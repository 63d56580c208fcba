"""Preemption: an urgent caller queued on a full lane asks background holders
for their slots (scripts/lib_yield.lua), never holding more than the width."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import redis

from lanes import Priority
from lanes.lane import Lane, doorbell
from lanes.lane.base import parse_doorbell
from lanes.lane.book import Waiter
from lanes.lane.hub import close_hubs
from lanes.lane.model import Generation
from tests.lane.test_lane import start_waiter, wait_queued
from tests.polling import aeventually, eventually

I, U, B = Priority.INTERACTIVE, Priority.USER_TOOL, Priority.BACKGROUND


def test_an_urgent_waiter_asks_the_newest_background_holder_and_gets_its_slot(make_lane):
    lane = make_lane(width=2)
    older = lane.acquire(B, 1.0)
    newer = lane.acquire(B, 1.0)
    stopped = threading.Event()
    newer.on_stop(stopped.set)
    _, results = start_waiter(lane, I, name="urgent")
    assert stopped.wait(5.0), "the background holder was not asked to yield"
    assert newer.yield_asked and newer.stopping
    assert not older.yield_asked, "one ask per urgent waiter, the newest grant first"
    newer.check()  # asked, not lost: the slot is still ours until we release
    assert lane.stats().in_flight == 2 and "urgent" not in results
    assert newer.release()
    urgent = eventually(lambda: results.get("urgent"), what="the urgent grant")
    assert urgent.priority is I
    assert urgent.asked_yield, "the grant says it asked background work for its slot"
    assert not older.asked_yield and not newer.asked_yield, "a free slot asks nobody"
    assert lane.stats().in_flight == 2
    urgent.release()
    older.release()


def test_a_holder_granted_just_now_is_asked_after_one_whose_call_is_under_way(make_lane):
    # A call granted under 20 ms ago has usually no answer head yet, and is cut
    # only once it has one (lib_yield.lua YIELD_MIN_AGE_MS): the older call goes.
    lane = make_lane(width=2)
    for _ in range(5):
        older = lane.acquire(B, 1.0)
        time.sleep(0.1)
        sent = time.time()
        newer = lane.acquire(B, 1.0)
        _, results = start_waiter(lane, I, name="urgent")
        asked = eventually(lambda: [p for p in (older, newer) if p.yield_asked], what="an ask")
        # The ask came this soon after the newer grant was asked for, so the
        # newer holder was younger than 20 ms when the urgent acquire ran.
        young = time.time() - sent < 0.020
        assert len(asked) == 1, "one ask per urgent waiter"
        assert asked[0].release()
        urgent = eventually(lambda: results.get("urgent"), what="the urgent grant")
        urgent.release()
        (newer if asked[0] is older else older).release()
        assert lane.stats().in_flight == 0
        if young:
            assert asked[0] is older, "a holder granted just now was asked before one whose call is under way"
            return
    pytest.skip("the machine never let an urgent acquire run within 20 ms of a grant")


def test_a_holder_whose_call_was_cut_gives_its_slot_back_from_the_thread_that_learned_it(make_lane):
    # The backend's cut hook says True once it has shut the call's connection:
    # the hub gives the slot to the urgent waiter at once, without the holder's
    # own thread (which here never wakes to release).
    lane = make_lane(width=1)
    holder = lane.acquire(B, 1.0)
    cut = threading.Event()

    def cut_call() -> bool:
        cut.set()
        return True

    holder.on_stop(cut_call)
    urgent = lane.acquire(I, 5.0)
    assert cut.is_set() and holder.yield_asked and holder.released
    assert lane.stats().in_flight == 1
    assert not holder.release(), "the holder's own release is a no-op after the hub's"
    assert lane.stats().in_flight == 1
    urgent.release()
    assert lane.stats().in_flight == 0


def test_an_urgent_waiter_cuts_a_holder_of_its_own_process_and_takes_the_slot_on_its_own_thread(make_lane):
    # Nobody reads the doorbells here (the test holds the reading), so the
    # ask and the grant can only travel in the replies: the acquire's names
    # the holder it asked, the release's names the waiter it granted. Within
    # one process neither rings a doorbell at all.
    lane = make_lane(width=1, lease_seconds=30.0)  # no renewal finds the grant in the meantime
    holder = lane.acquire(B, 1.0)
    cut_on: list[int] = []

    def cut_call() -> bool:
        cut_on.append(threading.get_ident())
        return True

    holder.on_stop(cut_call)
    hub = lane._hub
    assert hub._reader.acquire(timeout=5.0)
    try:
        urgent = lane.acquire(I, 5.0)  # with no doorbell read and no renewal, it would time out
    finally:
        hub._reader.release()
    assert cut_on == [threading.get_ident()], "cut by the urgent caller's own thread"
    assert holder.released and lane.stats().in_flight == 1
    # No doorbell follows the reply: nothing is kept to drop when it comes,
    # nothing for a waiter still to register.
    assert not hub.book.delivered and not hub.book.unclaimed
    urgent.release()


def test_a_waiter_of_the_releasing_process_takes_its_grant_from_the_release_reply(make_lane):
    lane = make_lane(width=1, lease_seconds=30.0)
    holder = lane.acquire(B, 1.0)
    hub = lane._hub
    assert hub._reader.acquire(timeout=5.0)  # nobody reads the doorbells
    try:
        _, results = start_waiter(lane, B, name="next")
        waiter = eventually(lambda: next(iter(hub.book.waiter_slot), None), what="the waiter to register")
        registered = hub.book._waiter(waiter)
        assert holder.release()
        # Set by the release call itself: no doorbell was read (or sent).
        assert registered.outcome is not None and registered.outcome[0] == "granted"
        assert not hub.book.delivered
        granted = eventually(lambda: results.get("next"), what="the waiter to wake")
    finally:
        hub._reader.release()
    assert granted.holder_id == waiter and lane.stats().in_flight == 1
    granted.release()


def test_a_holder_whose_call_could_not_be_cut_keeps_its_slot_until_it_releases(make_lane):
    lane = make_lane(width=1)
    holder = lane.acquire(B, 1.0)
    holder.on_stop(lambda: None)  # nothing cut (no connection yet): the call may still run
    _, results = start_waiter(lane, I, name="urgent")
    eventually(lambda: holder.yield_asked, what="the ask to yield")
    wait_queued(lane, 1)
    assert not holder.released and "urgent" not in results
    assert lane.stats().in_flight == 1
    assert holder.release()
    eventually(lambda: results.get("urgent"), what="the urgent grant").release()


def test_user_tool_work_asks_too_but_never_an_urgent_holder(make_lane):
    lane = make_lane(width=1)
    tool = lane.acquire(U, 1.0)
    _, results = start_waiter(lane, I, timeout=0.3, name="interactive")
    thread = eventually(lambda: "interactive" in results, what="the interactive wait to end")
    assert thread
    assert not tool.yield_asked, "only background holders yield"
    tool.release()

    background = lane.acquire(B, 1.0)
    _, results = start_waiter(lane, U, name="tool")
    eventually(lambda: background.yield_asked, what="the ask to yield")
    background.release()
    eventually(lambda: results.get("tool"), what="the user-tool grant").release()


def test_a_yielded_holder_queues_ahead_of_the_background_waiters(make_lane):
    lane = make_lane(width=1)
    holder = lane.acquire(B, 1.0)
    _, results = start_waiter(lane, B, name="queued_background")
    wait_queued(lane, 1)
    start_waiter(lane, I, name="urgent", results=results)
    eventually(lambda: holder.yield_asked, what="the ask to yield")
    holder.release()
    urgent = eventually(lambda: results.get("urgent"), what="the urgent grant")
    resumed = {}

    def resume():
        resumed["permit"] = lane.acquire(B, 10.0, resume=True)

    thread = threading.Thread(target=resume, daemon=True)
    thread.start()
    wait_queued(lane, 2)
    urgent.release()
    thread.join(5.0)
    assert resumed["permit"].priority is B, "the yielded holder is served before the background waiter"
    assert "queued_background" not in results
    resumed["permit"].release()
    eventually(lambda: results.get("queued_background"), what="the waiter after it").release()


def test_a_resumed_holder_is_never_asked_again(make_lane):
    # A background call is cut at most once per admission: a stream of
    # urgent callers waits for natural releases instead of cutting it again.
    lane = make_lane(width=1)
    holder = lane.acquire(B, 1.0)
    _, results = start_waiter(lane, I, name="first")
    eventually(lambda: holder.yield_asked, what="the ask to yield")
    holder.release()
    first = eventually(lambda: results.get("first"), what="the first urgent grant")
    resumed = {}
    thread = threading.Thread(target=lambda: resumed.update(permit=lane.acquire(B, 10.0, resume=True)),
                              daemon=True)
    thread.start()
    wait_queued(lane, 1)
    first.release()
    thread.join(5.0)
    again = resumed["permit"]
    start_waiter(lane, I, timeout=0.5, name="second", results=results)
    eventually(lambda: "second" in results, what="the second urgent wait to end")
    assert not again.yield_asked and not again.stopping
    assert int(lane.client.hget(lane.keys.meta, "yields")) == 1
    assert lane.stats().in_flight == 1
    again.release()

    # A resumed holder that finds a slot free (try_acquire) is spared too.
    spared = lane.try_acquire(B, resume=True)
    start_waiter(lane, I, timeout=0.5, name="third", results=results)
    eventually(lambda: "third" in results, what="the third urgent wait to end")
    assert not spared.yield_asked
    assert int(lane.client.hget(lane.keys.meta, "yields")) == 1
    spared.release()


def test_as_many_asks_as_urgent_waiters_and_none_twice(make_lane):
    lane = make_lane(width=3)
    holders = [lane.acquire(B, 1.0) for _ in range(3)]
    results: dict = {}
    start_waiter(lane, I, name="a", results=results)
    eventually(lambda: sum(p.yield_asked for p in holders) == 1, what="one ask")
    start_waiter(lane, I, name="b", results=results)
    eventually(lambda: sum(p.yield_asked for p in holders) == 2, what="a second ask")
    meta = lane.client.hgetall(lane.keys.meta)
    assert int(meta[b"yields"]) == 2
    asked = [p for p in holders if p.yield_asked]
    assert {f"y:{p.holder_id}".encode() for p in asked} <= set(meta)
    for permit in asked:
        permit.release()
    eventually(lambda: "a" in results and "b" in results, what="both urgent grants")
    meta = lane.client.hgetall(lane.keys.meta)
    assert not [field for field in meta if field.startswith(b"y:")], "a mark goes with its holder"
    assert lane.stats().in_flight == 3
    for permit in [results["a"], results["b"], *[p for p in holders if not p.yield_asked]]:
        permit.release()


def another_process(make_lane, lane: Lane, width: int) -> Lane:
    """The same lane through a client of its own: another hub, as another process has."""
    return make_lane(lane.key, width=width, provision=False)


def urgent_ask_reaches(asker: Lane, holder, what: str) -> None:
    """An urgent waiter on ``asker`` asks ``holder`` for its slot, and gets it."""
    _, results = start_waiter(asker, I, name="urgent")
    eventually(lambda: holder.yield_asked, what=what)
    holder.release()
    eventually(lambda: results.get("urgent"), what="the urgent grant").release()


def test_an_ask_reaches_a_holder_in_another_process_with_no_waiter_there(make_lane):
    lane = make_lane(width=1)
    holder = lane.acquire(B, 1.0)
    urgent_ask_reaches(another_process(make_lane, lane, 1), holder, "the ask across hubs")


def test_the_idle_reader_leads_as_soon_as_the_process_takes_a_slot_with_nobody_reading(make_lane, monkeypatch):
    # Its periodic look pushed out of reach: only being woken can make it lead.
    monkeypatch.setattr(doorbell, "IDLE_CHECK_SECONDS", 600.0)
    lane = make_lane(width=1)
    other = another_process(make_lane, lane, 1)
    other.acquire(B, 1.0).release()  # the other hub and its idle reader are up, looking rarely
    holder = other.acquire(B, 1.0)
    urgent_ask_reaches(lane, holder, "the ask read by the holder's idle reader")


def test_the_idle_reader_takes_over_when_the_last_waiter_of_a_process_holding_slots_is_granted(make_lane, monkeypatch):
    # A background worker process beside another process's urgent work: its
    # waiter leads the doorbell reading while it waits, is granted, and the
    # process then holds every slot with no waiter; asks must still be read.
    monkeypatch.setattr(doorbell, "IDLE_CHECK_SECONDS", 600.0)
    lane = make_lane(width=1)
    other = another_process(make_lane, lane, 1)
    first = other.acquire(B, 1.0)
    _, waiting = start_waiter(other, B, name="next")
    wait_queued(lane, 1)
    first.release()
    holder = eventually(lambda: waiting.get("next"), what="the background waiter's grant")
    urgent_ask_reaches(lane, holder, "the ask read after the waiter stopped leading")


async def test_an_asyncio_holder_is_asked_and_resumes_ahead(make_async_lane):
    lane = await make_async_lane(width=1)
    holder = await lane.acquire(B, 1.0)
    later = asyncio.create_task(lane.acquire(B, 5.0))
    urgent = asyncio.create_task(lane.acquire(I, 5.0))
    await aeventually(lambda: holder.yield_asked, what="the ask to an asyncio holder")
    await holder.release()
    granted = await urgent
    assert granted.asked_yield and not holder.asked_yield
    resumed = asyncio.create_task(lane.acquire(B, 5.0, resume=True))
    await asyncio.sleep(0)
    while (await lane.stats()).queued_total < 2:
        await asyncio.sleep(0.005)
    await granted.release()
    first = await resumed
    assert not later.done(), "the yielded holder goes before the background waiter queued earlier"
    await first.release()
    await (await later).release()


# A background holder in a process of its own: it reports its id, then holds
# until it hears the ask or the lease is lost, and says which it saw.
HOLDER = textwrap.dedent("""
    import json, sys, threading, redis
    from lanes import Lane, LeaseLost, Priority
    client = redis.Redis.from_url(sys.argv[1], socket_timeout=5)
    lane = Lane(client, sys.argv[2], width=1, lease_seconds=float(sys.argv[3]))
    permit = lane.acquire(Priority.BACKGROUND, 10.0)
    print(json.dumps({"id": permit.holder_id}), flush=True)
    stopped = threading.Event()
    permit.on_stop(stopped.set)
    stopped.wait(60)
    try:
        permit.check()
        valid = True
    except LeaseLost:
        valid = False
    # A pause past the lease: the ask may be read before the lease timer
    # fires, so the lost event is waited for (check() refuses at once).
    lost = permit.lost.wait(5) if not valid else permit.lost.is_set()
    print(json.dumps({"asked": permit.yield_asked, "lost": lost, "valid": valid}), flush=True)
    permit.release()
""")


def _holder_process(lane, lease: float):
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, lane.make_url, lane.key, str(lease)],
                            stdout=subprocess.PIPE, env=env, text=True)
    holder_id = json.loads(proc.stdout.readline())["id"]
    return proc, holder_id


def _end(proc) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait()


def test_an_asked_holder_that_dies_gives_its_slot_back_by_its_lease(make_lane):
    lane = make_lane("pool:asked-dies", width=1, lease_seconds=1.0)
    proc, holder_id = _holder_process(lane, 1.0)
    try:
        proc.kill()  # dies holding the slot: nobody hears the ask
        proc.wait()
        _, results = start_waiter(lane, I, timeout=10.0, name="urgent")
        urgent = eventually(lambda: results.get("urgent"), timeout=10, what="the slot back by its lease")
        assert lane.stats().in_flight == 1
        meta = lane.client.hgetall(lane.keys.meta)
        assert f"y:{holder_id}".encode() not in meta, "the dead holder's mark went with its entry"
        urgent.release()
    finally:
        _end(proc)


def test_an_asked_holder_paused_past_its_lease_is_told_lost_and_over_admits_nothing(make_lane):
    lane = make_lane("pool:asked-paused", width=1, lease_seconds=1.0)
    proc, holder_id = _holder_process(lane, 1.0)
    try:
        os.kill(proc.pid, signal.SIGSTOP)  # a GC or VM pause: the ask waits unread
        _, results = start_waiter(lane, I, timeout=10.0, name="urgent")
        eventually(lambda: lane.client.hget(lane.keys.meta, f"y:{holder_id}"), what="the ask")
        urgent = eventually(lambda: results.get("urgent"), timeout=10, what="the slot back by its lease")
        assert lane.stats().in_flight == 1
        os.kill(proc.pid, signal.SIGCONT)
        out, _ = proc.communicate(timeout=30)
        report = json.loads(out.strip().splitlines()[-1])
        assert report["lost"] and not report["valid"], report
        urgent.check()  # its late release took nothing from the urgent holder
        assert lane.stats().in_flight == 1
        assert urgent.release()
    finally:
        _end(proc)


def test_a_holder_that_has_not_begun_gives_its_slot_on_the_askers_thread_and_may_not_begin(make_lane):
    # Nobody reads the doorbells and the holder's thread does nothing: the
    # urgent caller's own thread takes the slot (it would time out otherwise).
    lane = make_lane(width=1, lease_seconds=30.0)
    holder = lane.acquire(B, 1.0)
    begin = holder.before_use()
    hub = lane._hub
    assert hub._reader.acquire(timeout=5.0)
    try:
        urgent = lane.acquire(I, 5.0)
    finally:
        hub._reader.release()
    assert holder.yield_asked and holder.released
    assert not begin(), "a slot given back may not be used"
    assert lane.stats().in_flight == 1
    urgent.release()


def test_a_holder_that_has_begun_keeps_its_slot_until_it_releases(make_lane):
    lane = make_lane(width=1)
    holder = lane.acquire(B, 1.0)
    assert holder.before_use()()
    _, results = start_waiter(lane, I, name="urgent")
    eventually(lambda: holder.yield_asked, what="the ask to yield")
    wait_queued(lane, 1)
    assert not holder.released and "urgent" not in results
    assert holder.release()
    eventually(lambda: results.get("urgent"), what="the urgent grant").release()


def test_an_ask_and_a_begin_that_race_settle_on_exactly_one_user_of_the_slot(make_lane):
    # Either the asker ends the holder's use (and may give the slot back) or
    # the holder begins (and the asker must leave it), never both, never neither.
    lane = make_lane(width=1)
    for _ in range(300):
        permit = lane.acquire(B, 1.0)
        begin = permit.before_use()
        got: dict[str, bool] = {}
        start = threading.Barrier(2)

        def ask() -> None:
            start.wait()
            got["ask"] = permit._ask_yield()

        asker = threading.Thread(target=ask)
        asker.start()
        start.wait()
        got["begin"] = begin()
        asker.join()
        assert got["ask"] != got["begin"], got
        permit.release()
    assert lane.stats().in_flight == 0


def test_an_ask_and_a_grant_within_the_callers_own_process_travel_in_the_replies_only(make_lane):
    # The urgent caller cuts the holder itself and takes its grant from the
    # release's reply, so no second thread of its process is woken by a
    # message about either (a holder or a waiter of another process still
    # gets one: see the test above and the one below).
    lane = make_lane(width=1)
    holder = lane.acquire(B, 1.0)
    holder.on_stop(lambda: True)
    listener_client = redis.Redis.from_url(make_lane.url, socket_timeout=5)
    listener = listener_client.pubsub(ignore_subscribe_messages=True)
    try:
        listener.subscribe(lane._hub.channel)
        eventually(lambda: listener_client.pubsub_numsub(lane._hub.channel)[0][1] == 2,
                   what="the listener's subscription beside the hub's")
        urgent = lane.acquire(I, 5.0)
        assert holder.yield_asked and holder.released
        urgent.release()
        heard = []
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            message = listener.get_message(timeout=0.1)
            if message is not None:
                heard.append(parse_doorbell(message["data"]))
        assert heard == [], "neither the ask nor the grant rang the process's doorbell"
    finally:
        listener.close()
        listener_client.close()


def test_a_release_rings_for_a_waiter_of_another_process(make_lane):
    # Two clients, two hubs, two tokens: to the script they are two processes.
    lane = make_lane(width=1)
    other = make_lane(width=1)
    listener_client = redis.Redis.from_url(make_lane.url, socket_timeout=5)
    listener = listener_client.pubsub(ignore_subscribe_messages=True)
    try:
        listener.subscribe(other._hub.channel)
        holder = lane.acquire(B, 1.0)
        eventually(lambda: listener_client.pubsub_numsub(other._hub.channel)[0][1] >= 1,
                   what="the listener's subscription")
        _, results = start_waiter(other, B, name="other")
        wait_queued(lane, 1)
        assert holder.release()
        granted = eventually(lambda: results.get("other"), what="the other process's grant")
        heard = []
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline and not heard:
            message = listener.get_message(timeout=0.1)
            if message is not None:
                heard.append(parse_doorbell(message["data"]))
        assert [waiter for waiter, _ in heard] == [granted.holder_id], "its grant's doorbell"
        granted.release()
    finally:
        listener.close()
        listener_client.close()


def test_a_grant_told_by_the_reply_alone_before_its_waiter_registers_is_kept_for_it(make_lane):
    # A waiter registers once its acquire's reply is read; a release on
    # another thread of the process can grant it first. With no doorbell to
    # follow, the reply's word is kept until the waiter registers.
    lane = make_lane(width=1)
    hub = lane._hub
    waiter_id = f"{hub.token}.early"
    generation = Generation(1, 7)
    hub.deliver_own(waiter_id, generation, rang=False)
    waiter = Waiter(id=waiter_id, priority=B)
    hub.add_waiter(lane, waiter)
    assert waiter.outcome is not None and waiter.outcome[:2] == ("granted", generation)
    hub.remove_waiter(waiter_id)
    # A grant whose doorbell rang is left to the doorbell, for a waiter still to come.
    hub.deliver_own(f"{hub.token}.rang", generation, rang=True)
    assert f"{hub.token}.rang" not in hub.book.unclaimed

"""Preemption: an urgent caller queued on a full lane asks background holders
for their slots (scripts/lib_yield.lua), never holding more than the width."""

from __future__ import annotations

import asyncio
import threading

import redis

from lanes import Priority
from lanes.lane import Lane
from lanes.lane.hub import close_hubs
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
    assert lane.stats().in_flight == 2
    urgent.release()
    older.release()


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


def test_an_ask_reaches_a_holder_in_another_process_with_no_waiter_there(make_lane):
    lane = make_lane(width=1)
    holder = lane.acquire(B, 1.0)
    other_client = redis.Redis.from_url(make_lane.url, socket_timeout=5)
    try:
        other = Lane(other_client, lane.key, width=1, lease_seconds=5.0)
        _, results = start_waiter(other, I, name="urgent")
        eventually(lambda: holder.yield_asked, what="the ask across hubs")
        holder.release()
        eventually(lambda: results.get("urgent"), what="the urgent grant").release()
    finally:
        close_hubs(other_client)
        other_client.close()


async def test_an_asyncio_holder_is_asked_and_resumes_ahead(make_async_lane):
    lane = await make_async_lane(width=1)
    holder = await lane.acquire(B, 1.0)
    later = asyncio.create_task(lane.acquire(B, 5.0))
    urgent = asyncio.create_task(lane.acquire(I, 5.0))
    await aeventually(lambda: holder.yield_asked, what="the ask to an asyncio holder")
    await holder.release()
    granted = await urgent
    resumed = asyncio.create_task(lane.acquire(B, 5.0, resume=True))
    await asyncio.sleep(0)
    while (await lane.stats()).queued_total < 2:
        await asyncio.sleep(0.005)
    await granted.release()
    first = await resumed
    assert not later.done(), "the yielded holder goes before the background waiter queued earlier"
    await first.release()
    await (await later).release()

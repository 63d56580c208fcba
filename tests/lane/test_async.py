"""AsyncLane: the same behaviour through asyncio."""

from __future__ import annotations

import asyncio

import pytest

from lanes import AcquireCancelled, AcquireTimeout, AsyncLane, Priority

I, B = Priority.INTERACTIVE, Priority.BACKGROUND


async def wait_queued(lane: AsyncLane, count: int) -> None:
    for _ in range(500):
        if (await lane.stats()).queued_total >= count:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("waiter never queued")


async def test_async_acquire_release_and_handoff_in_priority_order(make_async_lane):
    lane = await make_async_lane(width=1)
    holder = await lane.acquire(I, 1.0)
    background = asyncio.create_task(lane.acquire(B, 5.0))
    await wait_queued(lane, 1)
    interactive = asyncio.create_task(lane.acquire(I, 5.0))
    await wait_queued(lane, 2)
    await holder.release()
    first = await asyncio.wait_for(interactive, 5)
    assert not background.done()
    assert first.generation > holder.generation
    await first.release()
    second = await asyncio.wait_for(background, 5)
    assert await second.release() is True
    assert await second.release() is False


async def test_async_context_manager_and_try_acquire(make_async_lane):
    lane = await make_async_lane(width=1)
    async with await lane.acquire(I, timeout=1.0) as permit:
        assert await lane.try_acquire(I) is None
        assert permit.holder_id
    assert (await lane.stats()).in_flight == 0
    assert lane.forecast is not None and await lane.forecast(I) == 0.0


async def test_async_timeout_cancel_event_and_task_cancellation_hold_nothing(make_async_lane):
    lane = await make_async_lane(width=1)
    holder = await lane.acquire(I, 1.0)
    with pytest.raises(AcquireTimeout):
        await lane.acquire(I, 0.1)
    cancel = asyncio.Event()
    waiting = asyncio.create_task(lane.acquire(I, None, cancel=cancel))
    await wait_queued(lane, 1)
    cancel.set()
    with pytest.raises(AcquireCancelled):
        await waiting
    task = asyncio.create_task(lane.acquire(I, None))
    await wait_queued(lane, 1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    stats = await lane.stats()
    assert (stats.queued_total, stats.in_flight, stats.timeouts, stats.cancels) == (0, 1, 1, 2)
    await holder.release()


async def test_async_holds_are_renewed_and_crashed_holders_reaped(make_async_lane):
    # Leases of a second: the renewals must keep up on a busy machine.
    lane = await make_async_lane(width=1, lease_seconds=1.0)
    permit = await lane.acquire(I, 1.0)
    await asyncio.sleep(3.0)  # three leases
    permit.check()
    other = await make_async_lane(width=1, lease_seconds=1.0, provision=False)
    await lane.close()  # this process "dies": its holder stops renewing
    got = await other.acquire(I, 30.0)  # reaped at lease expiry by the waiter's own hub
    assert got.generation > permit.generation
    await got.release()


async def test_async_resize_grants_waiters_at_once(make_async_lane):
    lane = await make_async_lane(width=0)
    waiting = [asyncio.create_task(lane.acquire(B, 5.0)) for _ in range(3)]
    await wait_queued(lane, 3)
    assert await lane.resize(3) == 0
    permits = await asyncio.wait_for(asyncio.gather(*waiting), 5)
    assert len({p.holder_id for p in permits}) == 3
    for permit in permits:
        await permit.release()

"""Wait cancellation: the worker's own parts (fleet sizing: tests/workers/test_fleet_plan.py)."""

from lanes.namespace import Namespace
from lanes.routing.client import REVOKES_KEPT
from workers.cancel import CancelRegistry, RevokeFeed


def test_a_revoked_task_id_cancels_its_wait(monkeypatch):
    from celery.worker import state

    registry = CancelRegistry(watch_interval=0.01)
    item = registry.register("t-1")
    other = registry.register("t-2")
    state.revoked.add("t-1")
    try:
        assert item.event.wait(2)
        assert item.reason == "revoked"
        assert not other.event.is_set()
    finally:
        state.revoked.discard("t-1")


def test_shutdown_cancels_every_wait_and_any_that_starts_after():
    registry = CancelRegistry()
    first = registry.register("a")
    registry.cancel_all("shutdown")
    assert first.event.is_set() and first.reason == "shutdown"
    late = registry.register("b")
    assert late.event.is_set() and late.reason == "shutdown"


def test_a_revoke_in_the_stream_cancels_its_wait_without_a_broadcast(redis_client):
    # The worker's in-memory set never hears of "t-3" (its broadcast was lost):
    # the revokes stream, written as LanesClient.revoke writes it, is enough.
    key = Namespace("feed-test").revokes
    redis_client.delete(key)
    redis_client.xadd(key, {"task": "t-0"})  # revoked before the feed began, and long done with
    registry = CancelRegistry(watch_interval=0.01)
    registry.follow(RevokeFeed(redis_client, key))
    waiting = registry.register("t-3")
    other = registry.register("t-4")
    redis_client.xadd(key, {"task": "t-3"}, maxlen=REVOKES_KEPT, approximate=True)
    assert waiting.event.wait(5)
    assert waiting.reason == "revoked"
    assert not other.event.is_set()


def test_the_feed_reads_every_revoke_of_a_burst_larger_than_one_read(redis_client):
    key = Namespace("feed-test").revokes
    redis_client.delete(key)
    feed = RevokeFeed(redis_client, key)
    with redis_client.pipeline(transaction=False) as pipe:
        for n in range(2_500):
            pipe.xadd(key, {"task": f"burst-{n}"})
        pipe.execute()
    assert feed.read() == {f"burst-{n}" for n in range(2_500)}
    assert feed.read() == set()  # each revoke is read once


def test_a_revoke_heard_by_broadcast_shows_when_the_event_is_read_before_the_watcher_turns():
    # The lane reads its cancel every 50 ms and the walker once more at a
    # grant: neither waits for the watcher's next turn (an hour away here).
    from celery.worker import state

    registry = CancelRegistry(watch_interval=3600)
    item = registry.register("t-6")
    other = registry.register("t-7")
    state.revoked.add("t-6")
    try:
        assert item.event.is_set() and item.reason == "revoked"
        assert not other.event.is_set() and other.reason is None
    finally:
        state.revoked.discard("t-6")


def test_two_deliveries_of_one_task_each_keep_their_cancel_until_each_ends(redis_client):
    # A copy handed back while the first delivery still ends: the copy's end
    # must not take the first delivery's cancel out of the watcher's reach.
    key = Namespace("feed-test").revokes
    redis_client.delete(key)
    registry = CancelRegistry(watch_interval=0.01)
    registry.follow(RevokeFeed(redis_client, key))
    first = registry.register("t-8")
    copy = registry.register("t-8")
    assert len(registry) == 2
    registry.unregister(copy)
    assert len(registry) == 1
    redis_client.xadd(key, {"task": "t-8"}, maxlen=REVOKES_KEPT, approximate=True)
    assert first.event.wait(5) and first.reason == "revoked"
    assert copy.reason is None
    registry.unregister(first)
    assert len(registry) == 0

"""The sync lane's behaviour against real Redis (6.2 embedded and 7 machine)."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest
import redis

from lanes import AcquireCancelled, AcquireTimeout, CancelEvent, Generation, Lane, LeaseLost, Priority, RedisUnavailable
from lanes.errors import InvalidInput
from lanes.lane.hub import close_hubs
from lanes.lane.keys import wake_channel
from lanes.lane.keys import LaneKeys
from tests.polling import eventually

I, U, B = Priority.INTERACTIVE, Priority.USER_TOOL, Priority.BACKGROUND


def start_waiter(lane, priority, timeout=10.0, results=None, name=None, cancel=None):
    """Acquire in a thread; the outcome (Permit or exception) lands in results[name]."""
    results = results if results is not None else {}

    def run():
        try:
            results[name] = lane.acquire(priority, timeout, cancel=cancel)
        except Exception as exc:  # recorded for the test to assert on
            results[name] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, results


def wait_queued(lane, count, within=5.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if lane.stats().queued_total >= count:
            return
        time.sleep(0.005)
    raise AssertionError(f"expected {count} queued on {lane.key}, got {lane.stats().queued_total}")


def test_grants_at_once_while_below_width_and_nobody_waits(make_lane):
    lane = make_lane(width=2)
    first, second = lane.acquire(I, 1.0), lane.acquire(B, 1.0)
    assert second.generation > first.generation
    assert lane.try_acquire(I) is None
    stats = lane.stats()
    assert (stats.width, stats.in_flight, stats.grants) == (2, 2, 2)
    assert first.release() and second.release()
    assert lane.stats().in_flight == 0


def test_a_context_manager_releases_on_exit_even_on_error(make_lane):
    lane = make_lane(width=1)
    with pytest.raises(RuntimeError):
        with lane.acquire(I, timeout=1.0) as permit:
            assert permit.holder_id
            raise RuntimeError("boom")
    assert lane.stats().in_flight == 0


def test_release_is_idempotent_and_a_stale_generation_changes_nothing(make_lane):
    lane = make_lane(width=1)
    permit = lane.acquire(I, 1.0)
    assert permit.release() is True
    assert permit.release() is False and lane.release(permit) is False
    holder = lane.acquire(I, 1.0)
    # A forged release with an older generation of the same holder id.
    script_release = lane._script("release", [holder.holder_id, holder.generation.epoch,
                                              holder.generation.counter - 1, lane.lease_ms, 1])
    assert int(script_release[0]) == 0
    assert lane.stats().in_flight == 1
    holder.release()


def test_release_hands_the_slot_to_the_head_waiter_and_wakes_exactly_it(make_lane):
    lane = make_lane(width=1)
    holder = lane.acquire(I, 1.0)
    results = {}
    threads = []
    for name, prio in (("bg", B), ("tool", U), ("inter", I)):
        threads.append(start_waiter(lane, prio, results=results, name=name)[0])
        wait_queued(lane, len(threads))
    holder.release()
    deadline = time.monotonic() + 5
    while "inter" not in results and time.monotonic() < deadline:
        time.sleep(0.002)
    time.sleep(0.05)
    assert set(results) == {"inter"}, "only the head waiter (interactive) may run"
    assert results["inter"].generation > holder.generation
    assert lane.stats().in_flight == 1
    results["inter"].release()
    threads[1].join(5)
    assert set(results) == {"inter", "tool"}
    results["tool"].release()
    threads[0].join(5)
    results["bg"].release()


def test_arrival_order_within_one_priority(make_lane):
    lane = make_lane(width=1)
    holder = lane.acquire(U, 1.0)
    results, order = {}, []
    threads = []
    for index in range(4):
        threads.append(start_waiter(lane, U, results=results, name=index)[0])
        wait_queued(lane, index + 1)
    holder.release()
    for index in range(4):
        threads[index].join(5)
        order.append(index)
        results[index].release()
    assert [results[i].generation for i in range(4)] == sorted(results[i].generation for i in range(4))


def test_a_timeout_leaves_the_queue_and_holds_nothing(make_lane):
    lane = make_lane(width=1)
    holder = lane.acquire(I, 1.0)
    started = time.monotonic()
    with pytest.raises(AcquireTimeout):
        lane.acquire(I, 0.2)
    assert time.monotonic() - started > 0.15  # it waited out its timeout (how much longer is the machine's)
    stats = lane.stats()
    assert stats.queued_total == 0 and stats.timeouts == 1
    holder.release()
    assert lane.stats().in_flight == 0


def test_a_slot_granted_in_the_same_instant_as_the_timeout_goes_back(make_lane):
    lane = make_lane(width=1)
    holder = lane.acquire(I, 1.0)
    # A queued waiter (script level), then the release grants to it, then it
    # leaves on timeout before reading its doorbell: the slot must pass on.
    hub = lane._start_hub()
    late, nxt_id = f"{hub.token}.late", f"{hub.token}.next"  # ids of this process: its channel
    waiter = lane._acquire_call(hub, late, I, 10_000, try_only=False)
    nxt = lane._acquire_call(hub, nxt_id, I, 10_000, try_only=False)
    assert waiter[0] == nxt[0] == "queued"
    holder.release()
    leave = [lane.member_of(late, 10_000), "timeouts", lane.lease_ms]
    assert lane._script("leave", leave) in (b"returned", "returned")
    holders = lane.client.zrange(LaneKeys(lane.prefix, lane.key).all()[1], 0, -1)
    assert holders == [nxt_id.encode()]
    assert lane.stats().timeouts == 1


def test_timeout_none_waits_without_limit_and_keeps_its_place_by_renewing(make_lane):
    lane = make_lane(width=1, lease_seconds=1.0)  # >= 1 s: its renewals must keep up on a busy machine
    holder = lane.acquire(B, None)
    thread, results = start_waiter(lane, B, timeout=None, name="w")
    time.sleep(3.0)  # three waiter leases: it stays queued because it renews
    assert "w" not in results and lane.stats().queued_total == 1
    holder.release()
    thread.join(5)
    results["w"].release()


@pytest.mark.parametrize("event_type", [CancelEvent, threading.Event])
def test_cancel_ends_a_wait_with_a_typed_error_and_no_slot(make_lane, event_type):
    lane = make_lane(width=1)
    holder = lane.acquire(I, 1.0)
    cancel = event_type()
    thread, results = start_waiter(lane, I, timeout=None, name="w", cancel=cancel)
    wait_queued(lane, 1)
    cancel.set()
    thread.join(30)  # the wait has no time limit and the holder never releases: only the cancel ends it
    assert isinstance(results["w"], AcquireCancelled)
    stats = lane.stats()
    assert stats.cancels == 1 and stats.queued_total == 0 and stats.in_flight == 1
    holder.release()


def test_a_crashed_holders_slot_returns_when_its_lease_expires_with_no_one_else_acting(make_lane):
    lane = make_lane(width=1, lease_seconds=1.0)  # the waiter renews its place meanwhile: >= 1 s
    crashed = make_lane(width=1, lease_seconds=1.0, provision=False)
    started = time.monotonic()
    dead = crashed.acquire(I, 1.0)
    close_hubs(crashed.client)  # the holder's process "dies": no more renewals
    # Nobody releases: the waiter's own hub reaps at expiry, never before it
    # (the wait's limit only bounds a busy machine's delay).
    permit = lane.acquire(I, 30.0)
    assert time.monotonic() - started >= 1.0
    assert permit.generation > dead.generation
    assert lane.stats().expired == 1
    permit.release()


def test_a_refused_renewal_sets_lost_and_check_raises(make_lane):
    lane = make_lane(width=1, lease_seconds=0.3)
    permit = lane.acquire(I, 1.0)
    permit.check()
    # Someone (an operator, a state loss) removed the holder: the next renewal is refused.
    lane.client.hdel(LaneKeys(lane.prefix, lane.key).all()[2], permit.holder_id)
    assert permit.lost.wait(15.0)
    with pytest.raises(LeaseLost):
        permit.check()
    assert permit.release() is False


def test_long_holds_are_renewed_in_the_background(make_lane):
    lane = make_lane(width=1, lease_seconds=1.0)  # >= 1 s: the renewals must keep up on a busy machine
    permit = lane.acquire(I, 1.0)
    time.sleep(3.0)  # three leases
    assert not permit.lost.is_set()
    permit.check()
    assert lane.stats().expired == 0
    assert permit.release() is True


def test_a_waiter_granted_by_handoff_is_renewed_as_a_holder(make_lane):
    # The woken waiter registers its permit without the hub's lock; the
    # renewer must still move it from waiter to holder and keep it alive.
    lane = make_lane(width=1, lease_seconds=1.0)
    holder = lane.acquire(I, 1.0)
    thread, results = start_waiter(lane, I, name="w")
    wait_queued(lane, 1)
    holder.release()
    thread.join(5.0)
    permit = results["w"]
    assert not isinstance(permit, Exception)
    time.sleep(3.0)  # three leases
    assert not permit.lost.is_set()
    permit.check()
    book = lane._hub.book
    with lane._hub.lock:
        book.due_batches(0.0)  # folds pending registrations; nothing is due at time 0
        assert permit.holder_id not in book.waiter_slot, "the granted waiter is no longer renewed as a waiter"
        assert any(permit.holder_id in slot.holders for slot in book.slots.values())
    stats = lane.stats()
    assert stats.expired == 0 and stats.in_flight == 1
    assert permit.release() is True
    with lane._hub.lock:
        assert all(permit.holder_id not in slot.holders for slot in book.slots.values())
    assert lane.stats().in_flight == 0


def test_a_waiter_whose_place_lapsed_rejoins_with_one_entry(make_lane):
    lane = make_lane(width=1, lease_seconds=1.0)  # the holder must keep its slot throughout
    holder = lane.acquire(I, 5.0)
    thread, results = start_waiter(lane, I, timeout=5.0, name="w")
    wait_queued(lane, 1)
    queue, wexp = lane.keys.all()[3:5]
    [member] = lane.client.zrange(queue, 0, -1)
    # Its place goes (as after renewals it missed): its next renewal finds it
    # gone, and it rejoins with what is left of its budget.
    lane.client.zrem(queue, member)
    lane.client.zrem(wexp, member)
    again = eventually(lambda: lane.client.zrange(queue, 0, -1), timeout=15.0, what="the waiter to rejoin")
    assert len(again) == 1 and again[0] != member, "one new entry, with the remaining budget"
    lapsed_id = member.rsplit(b":", 1)[1].decode()
    assert again[0].rsplit(b":", 1)[1].decode() != lapsed_id, "a new waiter id"
    assert lane.client.zrange(wexp, 0, -1) == again
    # A doorbell still on its way for the lapsed place (a grant the server
    # reaped while this process was paused, say) grants the new place nothing.
    lane.client.publish(wake_channel(lane.prefix, lane._hub.token), f"{lapsed_id} 1 999")
    time.sleep(0.5)
    assert "w" not in results, "granted by the lapsed place's doorbell while the holder still holds"
    holder.release()
    thread.join(5.0)
    permit = results["w"]
    assert not isinstance(permit, Exception)
    permit.release()
    assert lane.stats().queued_total == 0 and lane.stats().in_flight == 0


def test_a_crashed_waiter_never_strands_a_slot(make_lane):
    lane = make_lane(width=1, lease_seconds=1.0)  # the holder must keep its slot while the ghost's lapses
    ghost = make_lane(width=1, lease_seconds=0.3, provision=False)
    holder = lane.acquire(I, 1.0)
    hub = ghost._start_hub()
    assert ghost._acquire_call(hub, "ghost", I, -1, try_only=False)[0] == "queued"
    close_hubs(ghost.client)  # the waiter's process dies: no renewals, nobody hears the doorbell
    time.sleep(0.4)
    holder.release()
    assert lane.stats().in_flight == 0, "the slot must not go to a waiter nobody listens for"
    permit = lane.acquire(I, 1.0)
    permit.release()


def test_resize_grows_at_once_for_waiters_and_a_shrink_drains(make_lane):
    lane = make_lane(width=1)
    holder = lane.acquire(I, 1.0)
    results = {}
    threads = [start_waiter(lane, I, results=results, name=i)[0] for i in range(2)]
    wait_queued(lane, 2)
    assert lane.resize(3) == 1
    for thread in threads:
        thread.join(5)
    assert lane.stats().in_flight == 3
    assert lane.resize(1) == 3
    assert lane.stats().in_flight == 3, "a shrink revokes nobody"
    results[0].release()
    results[1].release()
    assert lane.try_acquire(I) is None, "still one holder at width 1"
    holder.release()
    assert lane.try_acquire(I) is not None


def test_statistics_and_forecast(make_lane):
    lane = make_lane(width=2)
    assert lane.forecast(I) == 0.0
    a, b = lane.acquire(I, 1.0), lane.acquire(I, 1.0)
    assert lane.forecast(I) is None, "no hold measured yet"
    time.sleep(0.1)
    a.release()
    a = lane.acquire(I, 1.0)
    stats = lane.stats()
    hold = stats.mean_hold_seconds
    assert 0.08 < hold < 1.0
    results = {}
    threads = [start_waiter(lane, B, results=results, name="b")[0]]
    wait_queued(lane, 1)
    threads.append(start_waiter(lane, I, results=results, name="i")[0])
    wait_queued(lane, 2)
    assert lane.forecast(I) == pytest.approx((1 + 1) / 2 * hold)
    assert lane.forecast(B) == pytest.approx((2 + 1) / 2 * hold)
    stats = lane.stats()
    assert stats.queued == {I: 1, U: 0, B: 1}
    a.release()
    b.release()
    for thread in threads:
        thread.join(5)
    stats = lane.stats()
    assert stats.grants == 5 and stats.wait_p95_seconds > 0
    assert stats.wait_p50_by_priority[B] is not None
    for permit in results.values():
        permit.release()


def test_state_loss_admits_no_one_for_a_lease_and_holders_re_register(make_lane):
    lane = make_lane(width=2, lease_seconds=1.0)
    a, b = lane.acquire(I, 1.0), lane.acquire(I, 1.0)
    lane.client.flushdb()  # Redis forgot everything
    time.sleep(0.05)
    assert lane.try_acquire(I) is None, "quiet period: nothing new"
    deadline = time.monotonic() + 15
    while lane.stats().in_flight < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert lane.stats().in_flight == 2, "live holders re-registered by renewal"
    assert not a.lost.is_set() and not b.lost.is_set()
    with pytest.raises(AcquireTimeout):
        lane.acquire(I, 1.0)  # the lane is full with the re-registered holders
    a.release()
    c = lane.acquire(I, 10.0)
    assert c.generation.epoch > a.generation.epoch
    b.release()
    c.release()


def test_a_callable_width_is_asked_only_when_state_must_be_created(make_lane):
    calls = []

    def owner() -> int:
        calls.append(1)
        return 3

    lane = make_lane(width=owner, provision=False, lease_seconds=1.0)
    permit = lane.acquire(I, 15.0)  # no state: created (quiet for one lease), then granted
    assert calls, "the owner was asked for the width"
    assert lane.stats().width == 3
    count = len(calls)
    permit.release()
    lane.try_acquire(I).release()
    assert len(calls) == count


def test_noscript_is_handled_after_a_script_flush(make_lane):
    lane = make_lane(width=1)
    lane.acquire(I, 1.0).release()
    lane.client.script_flush()
    lane.acquire(I, 1.0).release()


@pytest.mark.slow  # a few seconds of waiting; the fast tier keeps to its 8 minutes
def test_unreachable_redis_fails_with_a_typed_error_in_bounded_time():
    from lanes.embedded import free_port

    client = redis.Redis(port=free_port(), socket_timeout=0.5, socket_connect_timeout=0.5)
    lane = Lane(client, "pool:gone", width=1)
    started = time.monotonic()
    with pytest.raises(RedisUnavailable):
        lane.acquire(I, 30.0)
    assert time.monotonic() - started < 10.0
    close_hubs(client)


def test_eviction_policy_other_than_noeviction_is_warned(make_lane, caplog, one_redis_url):
    client = redis.Redis.from_url(one_redis_url)
    client.config_set("maxmemory-policy", "allkeys-lru")
    try:
        with caplog.at_level(logging.WARNING, logger="lanes.lane"):
            lane = make_lane(width=1, client=client)
            lane.acquire(I, 1.0).release()
        assert any("noeviction" in record.message for record in caplog.records)
    finally:
        client.config_set("maxmemory-policy", "noeviction")
        close_hubs(client)
        client.close()


def test_bad_arguments_are_refused_with_the_value(make_lane):
    client = redis.Redis()
    with pytest.raises(InvalidInput, match="pool:{x}"):
        Lane(client, "pool:{x}", width=1)
    with pytest.raises(InvalidInput, match="-1"):
        Lane(client, "pool:1", width=-1)
    with pytest.raises(InvalidInput, match="renew_seconds"):
        Lane(client, "pool:1", width=1, lease_seconds=1.0, renew_seconds=2.0)
    lane = make_lane(width=1)
    with pytest.raises(InvalidInput, match="urgent"):
        lane.acquire("urgent", 1.0)


def test_generation_orders_by_epoch_then_counter():
    assert Generation(2, 1) > Generation(1, 99)
    assert str(Generation(5, 7)) == "5:7"


def test_a_release_hands_off_past_a_queued_waiter_whose_process_is_gone(make_lane):
    # The release script's inline handoff: the head waiter's channel has no
    # subscriber (its process died), so the slot is taken back and goes on to
    # the next waiter in the same call.
    lane = make_lane(width=1)
    holder = lane.acquire(I, 1.0)
    # Its id names a process token nobody subscribes for.
    ghost = ["nobody.1", int(I), 60_000, lane.lease_ms, "1", "0", "1", "1", "", ""]
    assert lane._script("acquire", ghost)[0] in (b"queued", "queued")
    thread, results = start_waiter(lane, I, name="live")
    wait_queued(lane, 2)
    assert holder.release()
    thread.join(5.0)
    permit = results["live"]
    assert not isinstance(permit, Exception) and permit.generation > holder.generation
    stats = lane.stats()
    assert stats.in_flight == 1 and stats.queued_total == 0 and stats.lapsed_waiters == 1
    permit.release()


def test_a_forked_child_never_uses_the_parents_script_connections(make_lane):
    lane = make_lane(width=2)
    lane.acquire(I, 1.0).release()
    runner = lane._scripts
    kept = list(runner._free)  # referenced, so no new object can reuse their ids
    parents = {id(conn) for conn in kept}
    assert parents, "the runner keeps a connection between calls"
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        verdict = b"no"
        try:
            emptied = runner._free == []
            reply = lane._script("peek", [lane.lease_ms, 0])
            fresh = all(id(conn) not in parents for conn in runner._free)
            verdict = b"ok" if emptied and fresh and int(reply[0]) == 2 else b"no"
        finally:
            os.write(write_end, verdict)
            os._exit(0)
    os.close(write_end)
    verdict = os.read(read_end, 16)
    os.waitpid(pid, 0)
    os.close(read_end)
    assert verdict == b"ok"
    lane.acquire(I, 1.0).release()  # the parent's kept connection still works


def test_a_script_connection_dropped_by_the_server_is_replaced(make_lane):
    lane = make_lane(width=2)
    lane.acquire(I, 1.0).release()
    runner = lane._scripts
    assert runner._pool is not None and runner._free, "the plain pool takes the direct path"
    conn = runner._free[-1]
    conn.send_command("CLIENT", "ID")
    lane.client.client_kill_filter(_id=conn.read_response())
    for _ in range(3):
        lane.acquire(I, 1.0).release()
    assert lane.stats().in_flight == 0


def test_a_small_bounded_pool_keeps_redis_pys_own_command_path(make_lane):
    # Two connections: the runner's kept ones would leave none to the pool
    # (a worker's shared pool of 128 takes the direct path: test_shared_connections).
    pool = redis.BlockingConnectionPool.from_url(make_lane.url, max_connections=2, timeout=5)
    client = redis.Redis(connection_pool=pool)
    try:
        lane = make_lane(width=1, client=client)
        assert lane._scripts is None or lane._scripts._pool is None
        lane.acquire(I, 1.0).release()
        assert lane._scripts._pool is None and not lane._scripts._free
        assert client.ping()
    finally:
        close_hubs(client)
        client.close()


def test_scripts_are_packed_by_hiredis_directly_or_by_the_clients_own_packer(make_lane):
    from redis.connection import HiredisRespSerializer, PythonRespSerializer
    from redis._parsers.encoders import Encoder

    lane = make_lane(width=1)
    lane.acquire(I, 1.0).release()
    assert type(lane._scripts._free[-1]._command_packer) is HiredisRespSerializer
    # A client that packs another way (here redis-py's pure-Python packer)
    # keeps its own packer on the direct path.
    packer = PythonRespSerializer(6000, Encoder("utf-8", "strict", False).encode)
    client = redis.Redis.from_url(make_lane.url, command_packer=packer)
    try:
        other = make_lane(width=1, client=client, key=lane.key)
        permit = other.acquire(I, 1.0)
        assert other._scripts._pool is not None
        assert lane.try_acquire(I) is None, "both clients see the same lane"
        assert other.release(permit)
        assert lane.stats().in_flight == 0
    finally:
        close_hubs(client)
        client.close()


@pytest.mark.parametrize("leader_leaves_by", ["grant", "timeout"])
def test_when_the_reading_waiter_leaves_another_waiter_takes_over_the_doorbell(make_lane, leader_leaves_by):
    # Leases of 30 s renew every 10 s: a doorbell nobody reads would only be
    # found by the next renewal, far beyond the 3 s allowed here.
    lane = make_lane(width=1, lease_seconds=30.0)
    holder = lane.acquire(I, 1.0)
    results = {}
    first, _ = start_waiter(lane, I, timeout=0.3 if leader_leaves_by == "timeout" else 10.0,
                            results=results, name="first")
    wait_queued(lane, 1)
    second, _ = start_waiter(lane, B, timeout=10.0, results=results, name="second")
    wait_queued(lane, 2)
    if leader_leaves_by == "grant":
        holder.release()
        first.join(3)
        holder = results["first"]
        assert lane.stats().queued_total == 1
    else:
        first.join(3)
        assert isinstance(results["first"], AcquireTimeout)
    holder.release()
    second.join(3)
    assert not second.is_alive(), "the remaining waiter did not hear its doorbell"
    assert lane.stats().in_flight == 1
    results["second"].release()


@pytest.mark.parametrize("protocol", [2, 3])
def test_both_protocols_take_the_direct_script_path(make_lane, protocol):
    client = redis.Redis.from_url(make_lane.url, socket_timeout=5, protocol=protocol)
    try:
        lane = make_lane(width=1, client=client)
        holder = lane.acquire(I, 1.0)
        assert lane._scripts._pool is not None and lane._scripts._free
        assert lane._scripts._free[-1].protocol == protocol
        assert lane.try_acquire(I) is None
        assert lane.release(holder)
        assert lane.stats().in_flight == 0
    finally:
        close_hubs(client)
        client.close()

"""The asyncio lane client: :class:`AsyncLane`, and its per-client hub.

Same method names and semantics as :class:`lanes.lane.Lane` (the context
manager form is ``async with await lane.acquire(...) as permit``); the hub's
listener and renewer are tasks on the client's event loop instead of threads.
Cancelling the task that awaits ``acquire`` leaves the queue (a slot granted
in the same instant goes back) and re-raises ``CancelledError``; an
``asyncio.Event`` passed as ``cancel`` ends the wait with AcquireCancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import weakref

import redis
from redis.exceptions import NoScriptError

from lanes.errors import AcquireCancelled, AcquireTimeout, InvalidInput, RedisUnavailable
from lanes.lane._lua import ReplyLost, acall_with_run, scripts_for
from lanes.lane.base import (HAND_OFF_CALLS_MAX, UNAVAILABLE, LaneBase, is_cluster, new_id, new_token,
                             parse_doorbell, rejoin_id, text, unavailable)
from lanes.lane.book import Book, Waiter
from lanes.lane.keys import wake_channel
from lanes.lane.model import AsyncPermit, LaneStats
from lanes.lane.server import check_lane_redis_async

log = logging.getLogger("lanes.lane")

_hubs: "weakref.WeakKeyDictionary[object, dict[str, AsyncHub]]" = weakref.WeakKeyDictionary()


def _reset_hubs_after_fork() -> None:
    """In a forked child: the hubs' tasks and connections are the parent's
    (as in hub.py): closed without I/O, their permits lost here."""
    for by_prefix in list(_hubs.values()):
        for hub in list(by_prefix.values()):
            hub.closed = True
            hub._tasks = []
            hub._pubsub = None
            hub.book.orphan("the process forked: this wait belongs to the parent")
    _hubs.clear()


os.register_at_fork(after_in_child=_reset_hubs_after_fork)


class AsyncHub:
    """The asyncio twin of :class:`lanes.lane.hub.SyncHub` (see its docstring)."""

    def __init__(self, client, prefix: str) -> None:
        self.client = client
        self.token = new_token()
        self.channel = wake_channel(prefix, self.token)
        self.book = Book()
        self._changed = asyncio.Event()
        self._start_lock = asyncio.Lock()
        self._pubsub = None
        self._tasks: list[asyncio.Task] = []
        self.closed = False

    async def start(self) -> None:
        if self._tasks:
            return
        async with self._start_lock:
            if self._tasks:
                return
            pubsub = self.client.pubsub()
            try:
                # subscribe() returns once Redis confirmed: no later grant is missed.
                await pubsub.subscribe(self.channel)
                async with asyncio.timeout(10.0):
                    while True:
                        message = await pubsub.get_message(timeout=1.0)
                        if message and message.get("type") == "subscribe":
                            break
            except BaseException:
                await pubsub.aclose()
                raise
            pubsub.ignore_subscribe_messages = True
            if pubsub.connection is not None:
                pubsub.connection.register_connect_callback(self._on_reconnect)
            self._pubsub = pubsub
            try:
                for _, ok, detail in await check_lane_redis_async(self.client):
                    if ok is False:
                        log.warning("Redis is unsafe for lanes: %s", detail)
            except redis.RedisError:
                pass  # unreadable: nothing to say
            self._tasks = [asyncio.create_task(self._listen(), name="lanes-doorbell"),
                           asyncio.create_task(self._renew_loop(), name="lanes-renewer")]

    async def close(self) -> None:
        self.closed = True
        self.book.abandon("the lane's client was closed (AsyncLane.close)")
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(BaseException):
                await task
        if self._pubsub is not None:
            with contextlib.suppress(Exception):
                await self._pubsub.aclose()

    async def _on_reconnect(self, connection) -> None:
        self.book.kick_all()
        self._changed.set()

    def changed(self) -> None:
        self._changed.set()

    def replan(self) -> None:
        """Wake the renewer only when a lane got its first entry (a new time to plan)."""
        if self.book.new_slot:
            self.book.new_slot = False
            self._changed.set()

    async def _listen(self) -> None:
        failures = 0
        while not self.closed:
            try:
                message = await self._pubsub.get_message(ignore_subscribe_messages=True, timeout=None)
                failures = 0
            except UNAVAILABLE as exc:
                failures += 1
                log.debug("doorbell connection failed (%s); reconnecting", exc)
                await asyncio.sleep(min(0.05 * 2 ** failures, 1.0))
                continue
            if not message or message.get("type") != "message":
                continue
            parsed = parse_doorbell(message["data"])
            if parsed is None:
                log.warning("ignored malformed doorbell message %r", message["data"])
                continue
            waiter_id, generation = parsed
            if generation is None:
                # An urgent waiter asks one of our background holders for its slot.
                permit = self.book.ask_yield(waiter_id)
                if permit is not None:
                    permit._ask_yield()
                continue
            self.book.deliver_grant(waiter_id, generation, time.monotonic())

    async def _renew_loop(self) -> None:
        """Plans renewals and times leases (see SyncHub._renew_loop): each
        renewal call is a task of its own, never awaited here."""
        calls: set[asyncio.Task] = set()
        while not self.closed:
            now = time.monotonic()
            self.book.expire(now)
            upcoming = self.book.next_wakeup()
            if upcoming is None or upcoming > now:
                self._changed.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), None if upcoming is None else upcoming - now)
                continue
            for slot, entries in self.book.due_batches(time.monotonic()):
                task = asyncio.create_task(self._renew(slot, entries))
                calls.add(task)  # kept referenced until done
                task.add_done_callback(calls.discard)

    async def _renew(self, slot, entries) -> None:
        try:
            await self._renew_call(slot, entries)
        finally:
            slot.renewing -= 1
            self._changed.set()  # the renewer plans this lane again

    async def _renew_call(self, slot, entries) -> None:
        lane = slot.lane
        sent_at = time.monotonic()
        try:
            reply = await lane._script("renew", Book.renew_args(slot, entries, lane.width_arg(False)))
            if text(reply[0]) == "nostate":
                reply = await lane._script("renew", Book.renew_args(slot, entries, lane.width_arg(True)))
        except Exception as exc:
            if not isinstance(exc, (*UNAVAILABLE, redis.RedisError)):
                log.exception("lane %r renewal failed", lane.key)
            self.book.failed(slot, entries, time.monotonic(), f"renewal failed: {exc}")
            return
        if self.book.apply(slot, entries, reply, sent_at, time.monotonic()):
            slot.due = 0.0


def _hub_for(client, prefix: str) -> AsyncHub:
    by_prefix = _hubs.setdefault(client, {})
    hub = by_prefix.get(prefix)
    if hub is None or hub.closed:
        hub = by_prefix[prefix] = AsyncHub(client, prefix)
    return hub


class AsyncLane(LaneBase):
    """The asyncio twin of :class:`lanes.lane.Lane`; every method is awaited."""

    async def _script(self, name: str, args: list):
        """Run a lane script with the run_id of the server its connection
        reached (lib_base.lua RUN), as the sync lane does (``_lua.acall_with_run``);
        ``NOSCRIPT`` loads it and runs it once more. A Cluster client goes
        through redis-py's own path, where the node is not known here: run ''."""
        scripts = self._scripts
        if scripts is None:
            scripts = self._scripts = scripts_for(self.client)
        script = scripts[name]
        pool = self._direct_pool
        if pool is None:
            return await script(keys=self._key_list, args=[*args, ""])
        try:
            return await acall_with_run(pool, script.sha, self._key_list, args)
        except NoScriptError:
            script.sha = await self.client.script_load(script.script)
            return await acall_with_run(pool, script.sha, self._key_list, args)

    @property
    def _direct_pool(self):
        if is_cluster(self.client) or getattr(self.client, "connection", None) is not None:
            return None  # Cluster, or a single-connection client (its one connection is its own)
        return self.client.connection_pool

    async def _run(self, name: str, args: list, what: str):
        """Run a script; a lost reply is asked once more (every lane script is
        idempotent: see ``Lane._run``). Raises RedisUnavailable."""
        try:
            return await self._script(name, args)
        except ReplyLost:
            pass
        except UNAVAILABLE as exc:
            raise unavailable(exc, what) from exc
        try:
            return await self._script(name, args)
        except UNAVAILABLE as exc:
            raise unavailable(exc, what) from exc

    async def _start_hub(self) -> AsyncHub:
        hub = self._hub_cache
        if hub is None or hub.closed:
            hub = self._hub_cache = _hub_for(self.client, self.prefix)
        if hub._tasks:
            return hub
        try:
            await hub.start()
        except UNAVAILABLE as exc:
            raise unavailable(exc, "subscribing to the wake channel") from exc
        return hub

    async def _acquire_call(self, hub, waiter_id, priority, timeout_ms, try_only, fresh=False,
                            previous: str = "", workflow: str = "", resume: bool = False) -> tuple:
        args = self.acquire_args(waiter_id, priority, timeout_ms, try_only, fresh, previous, workflow, resume)
        parsed = self.parse_acquire(await self._run("acquire", args, f"acquiring lane {self.key!r}"))
        if parsed[0] == "nostate":
            args[4] = self.width_arg(True)
            parsed = self.parse_acquire(await self._run("acquire", args, f"acquiring lane {self.key!r}"))
        return parsed

    def _permit(self, hub, holder_id, generation, priority, started, lease_until, workflow="") -> AsyncPermit:
        permit = AsyncPermit(self, holder_id=holder_id, generation=generation, priority=priority,
                             waited_seconds=time.monotonic() - started, lease_until=lease_until, workflow=workflow)
        hub.book.add_holder(self, permit)
        hub.replan()
        return permit

    async def try_acquire(self, priority, *, workflow: str | None = None,
                          resume: bool = False) -> AsyncPermit | None:
        priority = self._priority(priority)
        workflow = self.workflow_name(workflow)
        hub = await self._start_hub()
        holder_id = new_id(hub.token, resume)
        sent_at = time.monotonic()
        try:
            parsed = await self._acquire_call(hub, holder_id, priority, 0, True, True, workflow=workflow)
        except BaseException:
            # The script may have granted before the reply was lost: give it back.
            with contextlib.suppress(AcquireCancelled, AcquireTimeout, RedisUnavailable):
                await asyncio.shield(self._leave(hub, Waiter(id=holder_id, priority=priority,
                                                             member=self.member_of(holder_id, 0, workflow)),
                                                 "cancels"))
            raise
        if parsed[0] != "granted":
            return None
        return self._permit(hub, holder_id, parsed[1], priority, sent_at, sent_at + self.lease_seconds, workflow)

    async def acquire(self, priority, timeout: float | None, *,
                      cancel: asyncio.Event | None = None, workflow: str | None = None,
                      resume: bool = False) -> AsyncPermit:
        """See :meth:`lanes.lane.Lane.acquire`. ``async with await lane.acquire(...) as permit:``
        releases on exit. A real coroutine, so ``asyncio.create_task`` takes it."""
        priority = self._priority(priority)
        workflow = self.workflow_name(workflow)
        timeout_ms = self.timeout_ms(timeout)
        if cancel is not None and cancel.is_set():
            raise AcquireCancelled(f"acquire on lane {self.key!r} cancelled before it started")
        hub = await self._start_hub()
        started = time.monotonic()
        waiter_id = new_id(hub.token, resume)
        waiter = Waiter(id=waiter_id, priority=priority, member=self.member_of(waiter_id, timeout_ms, workflow),
                        workflow=workflow, renewed_at=started)
        # One round trip when a slot is free: the waiter is registered with the
        # hub only once the script says we wait (the hub keeps an early doorbell).
        queued = True  # until the first reply says otherwise; then: in the queue, no outcome yet
        registered = False
        asked_yield = False  # a reply named background holders asked for a slot (Permit.asked_yield)
        event = relay = None
        try:
            parsed = await self._acquire_call(hub, waiter.id, priority, timeout_ms, False, True, workflow=workflow,
                                              resume=resume)
            deadline = None if timeout is None else started + timeout
            while True:
                if parsed[0] == "granted":
                    queued = False
                    if registered:
                        hub.book.remove_waiter(waiter.id)
                    return self._permit(hub, waiter.id, parsed[1], priority, started, started + self.lease_seconds,
                                        workflow)
                waiter.epoch = parsed[1]
                asked_yield = asked_yield or bool(parsed[3])
                if not registered:
                    event = asyncio.Event()
                    waiter.wake = event.set
                    if cancel is not None:
                        relay = asyncio.create_task(self._relay(cancel, event))
                    hub.book.add_waiter(self, waiter)
                    registered = True
                if hub.book.note_event(self, parsed[2], time.monotonic()):
                    hub.changed()
                hub.replan()
                outcome = await self._wait(waiter, event, deadline, cancel)
                if outcome[0] == "granted":
                    hub.book.remove_waiter(waiter.id)
                    queued = False
                    # Bounded by the last call that found us queued (see Lane._start_granted_lease).
                    permit = self._permit(hub, waiter.id, outcome[1], priority, started,
                                          waiter.renewed_at + self.lease_seconds, workflow)
                    permit.asked_yield = asked_yield
                    if time.monotonic() > permit._lease_until:
                        permit._mark_lost()
                    return permit
                if outcome[0] in ("timeouts", "cancels"):
                    queued = False
                    await self._leave(hub, waiter, outcome[0])
                if outcome[0] == "unavailable":
                    queued = False
                    hub.book.remove_waiter(waiter.id)
                    raise RedisUnavailable(f"lane {self.key!r}: {outcome[1]}")
                # 'gone': our place lapsed (a missed renewal or doorbell); rejoin.
                remaining_ms = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
                started_call = time.monotonic()
                # A new id (base.rejoin_id); the new member first: if the reply
                # is lost, the leave below must name the entry this call may
                # have made.
                previous = waiter.member
                hub.book.remove_waiter(waiter.id)
                waiter.id = rejoin_id(hub.token, waiter.id)
                waiter.member = self.member_of(waiter.id, remaining_ms, workflow)
                hub.book.add_waiter(self, waiter)
                parsed = await self._acquire_call(hub, waiter.id, priority, remaining_ms, False,
                                                  previous=previous, workflow=workflow)
                if parsed[0] == "granted":
                    hub.book.remove_waiter(waiter.id)
                    queued = False
                    return self._permit(hub, waiter.id, parsed[1], priority, started,
                                        started_call + self.lease_seconds, workflow)
                waiter.renewed_at = started_call
        except BaseException:
            if queued:
                # Task cancelled or Redis failed mid-wait: leave the queue,
                # shielded so the cancellation itself cannot cut the leave short.
                with contextlib.suppress(AcquireCancelled, AcquireTimeout, RedisUnavailable):
                    await asyncio.shield(self._leave(hub, waiter, "cancels"))
            raise
        finally:
            if relay is not None:
                relay.cancel()

    @staticmethod
    async def _relay(cancel: asyncio.Event, event: asyncio.Event) -> None:
        await cancel.wait()
        event.set()

    async def _wait(self, waiter, event, deadline, cancel) -> tuple:
        while True:
            outcome = waiter.outcome
            if outcome is not None:
                if outcome[0] == "gone":
                    waiter.outcome = None
                    event.clear()
                return outcome
            if cancel is not None and cancel.is_set():
                return ("cancels",)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return ("timeouts",)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), remaining)
            if waiter.outcome is None:
                event.clear()  # woken by cancel or nothing: the checks above decide

    async def _leave(self, hub, waiter, reason) -> None:
        hub.book.remove_waiter(waiter.id)
        outcome = text(await self._run("leave", [waiter.member, reason, self.lease_ms], f"leaving lane {self.key!r}"))
        if reason == "cancels":
            raise AcquireCancelled(f"acquire on lane {self.key!r} cancelled ({outcome}); nothing is held")
        raise AcquireTimeout(f"no slot on lane {self.key!r} within the wait budget ({outcome}); nothing is held")

    async def release(self, permit: AsyncPermit) -> bool:
        if permit._lane is not self and permit.lane_key != self.key:
            raise InvalidInput(f"permit of lane {permit.lane_key!r} released on lane {self.key!r}")
        if not permit._claim_release():
            return False
        owner = permit._lane  # the lane (and so the hub) that renews this permit
        hub = owner._hub_cache if owner._hub_cache is not None else _hub_for(owner.client, owner.prefix)
        hub.book.remove_holder(owner, permit.holder_id)
        gen = permit.generation
        # own=0: the asyncio hub takes every grant from its doorbell.
        args = [permit.holder_id, gen.epoch, gen.counter, self.lease_ms, 0]
        sent_at = time.monotonic()
        try:
            reply = await self._script("release", args)
        except ReplyLost:
            # Asked again; an entry gone now was released by the lost call (see Lane.release).
            reply = await self._run("release", args, f"releasing on lane {self.key!r}")
            if not int(reply[0]) and sent_at <= permit._lease_until and not permit._lost:
                reply = [1, reply[1]]
        except UNAVAILABLE as exc:
            raise unavailable(exc, f"releasing on lane {self.key!r}") from exc
        if int(reply[1]):
            await self._hand_off_rest()
        return int(reply[0]) == 1

    async def _hand_off_rest(self) -> None:
        for _ in range(HAND_OFF_CALLS_MAX):  # see Lane._hand_off_rest
            reply = await self._run("renew", [self.lease_ms, self.width_arg(False)], f"handing off on {self.key!r}")
            if text(reply[0]) == "nostate" or not int(reply[2]):
                return

    async def resize(self, width: int) -> int:
        self._check_width(width)
        reply = await self._run("resize", [width, self.lease_ms], f"resizing lane {self.key!r}")
        if int(reply[1]):
            await self._hand_off_rest()
        return int(reply[0])

    async def provision(self) -> bool:
        return int(await self._run("provision", [self.owner_width()], f"provisioning lane {self.key!r}")) == 1

    async def stats(self) -> LaneStats:
        return self.stats_from(await self._run("peek", [self.lease_ms, 1], f"reading lane {self.key!r}"))

    async def forecast(self, priority) -> float | None:
        priority = self._priority(priority)
        reply = await self._run("peek", [self.lease_ms, 0], f"reading lane {self.key!r}")
        return self.forecast_from(self.stats_from(reply), priority)

    async def close(self) -> None:
        hubs = _hubs.pop(self.client, {})
        for hub in hubs.values():
            await hub.close()

    def __repr__(self) -> str:
        return f"AsyncLane({self.key!r}, prefix={self.prefix!r}, lease={self.lease_seconds}s)"

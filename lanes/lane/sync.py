"""The sync lane client: :class:`Lane`."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from lanes.errors import AcquireCancelled, AcquireTimeout, InvalidInput, RedisUnavailable
from lanes.lane._lua import ReplyLost, close_runner, runner_for
from lanes.lane.base import HAND_OFF_CALLS_MAX, UNAVAILABLE, LaneBase, new_id, rejoin_id, text, unavailable
from lanes.lane.book import Waiter
from lanes.lane.cancel import PLAIN_EVENT_CHECK_SECONDS, CancelEvent
from lanes.lane.hub import SyncHub, close_hubs, hub_for
from lanes.lane.keys import DEFAULT_PREFIX, lane_of_meta, meta_pattern
from lanes.lane.model import Generation, LaneStats, Permit
from lanes.priority import Priority


class Lane(LaneBase):
    """A fleet-wide priority lane of width W, kept in Redis.

    ``key`` is the caller's stable id (e.g. ``pool:42``); ``width`` (or a
    callable giving it) is the owner's width, used whenever the lane's state
    must be (re)created. Leases and renewals use ``lease_seconds`` and
    ``renew_seconds`` (default a third of the lease).
    """

    # --- plumbing ---------------------------------------------------------------

    def _script(self, name: str, args: list):
        """Run a lane script (EVALSHA; NOSCRIPT reloads). Raw redis errors."""
        runner = self._scripts
        if runner is None:
            runner = self._scripts = runner_for(self.client)
        return runner(name, self._key_list, args)

    def _run(self, name: str, args: list, what: str):
        """Run a script; a lost reply is asked once more. Every lane script is
        idempotent (an acquire for an id that holds or waits answers with that
        state, a release or leave of what is gone changes nothing, a renewal
        sets the same lease again), so asking again only reads what the lost
        call did. Raises RedisUnavailable."""
        try:
            return self._script(name, args)
        except ReplyLost:
            pass
        except UNAVAILABLE as exc:
            raise unavailable(exc, what) from exc
        try:
            return self._script(name, args)
        except UNAVAILABLE as exc:
            raise unavailable(exc, what) from exc

    @property
    def _hub(self) -> SyncHub:
        hub = self._hub_cache
        if hub is None or hub.closed:
            hub = self._hub_cache = hub_for(self.client, self.prefix)
        return hub

    def _start_hub(self) -> SyncHub:
        hub = self._hub
        if hub._threads:
            return hub
        try:
            hub.start()
        except UNAVAILABLE as exc:
            raise unavailable(exc, "subscribing to the wake channel") from exc
        return hub

    def _acquire_call(self, hub: SyncHub, waiter_id: str, priority: Priority, timeout_ms: int,
                      try_only: bool, fresh: bool = False, previous: str = "", workflow: str = "",
                      resume: bool = False) -> tuple:
        """One acquire script call (see ``acquire_args``)."""
        # The reply's asked holders of this process are cut by this thread (hub.yield_own).
        args = self.acquire_args(waiter_id, priority, timeout_ms, try_only, fresh, previous, workflow, resume,
                                 cuts_own=True)
        parsed = self.parse_acquire(self._run("acquire", args, f"acquiring lane {self.key!r}"))
        if parsed[0] == "nostate":
            args[4] = self.width_arg(True)
            parsed = self.parse_acquire(self._run("acquire", args, f"acquiring lane {self.key!r}"))
        return parsed

    def _permit(self, hub: SyncHub, holder_id: str, generation: Generation, priority: Priority,
                started: float, lease_until: float, workflow: str = "") -> Permit:
        permit = Permit(self, holder_id=holder_id, generation=generation, priority=priority,
                        waited_seconds=time.monotonic() - started, lease_until=lease_until, workflow=workflow)
        hub.add_holder(self, permit)
        return permit

    # --- acquire / release ----------------------------------------------------------

    def try_acquire(self, priority: Priority | str | int, *, workflow: str | None = None,
                    resume: bool = False) -> Permit | None:
        """A permit if a slot is free and nobody waits, else None. Never queues.
        ``workflow`` and ``resume``: see :meth:`acquire`."""
        priority = self._priority(priority)
        workflow = self.workflow_name(workflow)
        hub = self._start_hub()
        holder_id = new_id(hub.token, resume)
        sent_at = time.monotonic()
        try:
            parsed = self._acquire_call(hub, holder_id, priority, 0, True, True, workflow=workflow)
        except BaseException:
            # The script may have granted before the reply was lost: give it back.
            try:
                self._leave(hub, Waiter(id=holder_id, priority=priority,
                                        member=self.member_of(holder_id, 0, workflow)), "cancels")
            except (AcquireCancelled, AcquireTimeout, RedisUnavailable):
                pass
            raise
        if parsed[0] != "granted":
            return None
        return self._permit(hub, holder_id, parsed[1], priority, sent_at, sent_at + self.lease_seconds, workflow)

    def acquire(self, priority: Priority | str | int, timeout: float | None, *,
                cancel: threading.Event | None = None, workflow: str | None = None,
                resume: bool = False) -> Permit:
        """Wait for a slot: priority order; within a priority, each workflow
        with work gets its guaranteed share (docs/SCHEDULING.md, "Shares"), and arrival
        order within a workflow.

        ``workflow`` names the caller's workflow (None: one anonymous
        workflow, which with no other workflow is plain arrival order).
        ``resume=True`` is for a holder that gave its slot back because it
        was asked to (``Permit.yield_asked``): it was served before every
        waiter of its priority, so it queues ahead of them; and it is not
        asked to yield again (one cut call per admission, however many urgent
        callers come).
        ``timeout=None`` waits without limit. Raises :class:`AcquireTimeout`
        or :class:`AcquireCancelled` (the caller then holds nothing), or
        :class:`RedisUnavailable` when Redis does not answer in bounded time.
        """
        priority = self._priority(priority)
        workflow = self.workflow_name(workflow)
        timeout_ms = self.timeout_ms(timeout)
        if cancel is not None and cancel.is_set():
            raise AcquireCancelled(f"acquire on lane {self.key!r} cancelled before it started")
        hub = self._start_hub()
        started = time.monotonic()
        waiter_id = new_id(hub.token, resume)
        # One round trip when a slot is free: nothing is registered with the
        # hub until the script says we wait (the hub keeps an early doorbell).
        try:
            parsed = self._acquire_call(hub, waiter_id, priority, timeout_ms, False, True, workflow=workflow,
                                        resume=resume)
        except BaseException:
            # The script may have queued us before the reply was lost: leave.
            try:
                self._leave(hub, Waiter(id=waiter_id, priority=priority,
                                        member=self.member_of(waiter_id, timeout_ms, workflow)), "cancels")
            except (AcquireCancelled, AcquireTimeout, RedisUnavailable):
                pass
            raise
        if parsed[0] == "granted":
            return self._permit(hub, waiter_id, parsed[1], priority, started, started + self.lease_seconds, workflow)
        waiter = Waiter(id=waiter_id, priority=priority, member=self.member_of(waiter_id, timeout_ms, workflow),
                        workflow=workflow, epoch=parsed[1], renewed_at=started)
        deadline = None if timeout is None else started + timeout
        return self._wait_queued(hub, waiter, parsed[2], started, deadline, cancel, parsed[3])

    def _wait_queued(self, hub: SyncHub, waiter: Waiter, next_event_ms: int, started: float,
                     deadline: float | None, cancel: threading.Event | None,
                     asked: Sequence[str] = ()) -> Permit:
        """We are in the queue: wait for the doorbell (rejoining if our place
        lapsed) until granted, timed out or cancelled."""
        event = threading.Event()

        def wake() -> None:
            hub.ring(waiter, event)

        waiter.wake = wake
        queued = True  # in the lane's queue, with no outcome yet
        # Made before the wait, so that the woken waiter only fills in its
        # grant: the doorbell's path runs cold after a long sleep.
        permit = Permit(self, holder_id=waiter.id, generation=None, priority=waiter.priority,
                        waited_seconds=0.0, lease_until=0.0, workflow=waiter.workflow)
        permit.asked_yield = bool(asked)
        try:
            if isinstance(cancel, CancelEvent):
                cancel.add_callback(wake)
            hub.add_waiter(self, waiter)
            hub.note_event(self, next_event_ms)
            if asked:
                # Holders of our own process asked to yield for us: cut and
                # release them from this thread, now; the release's reply
                # names our grant (see release()). The same asks reach the
                # hub's doorbell too, and only one of the two acts on each.
                hub.yield_own(asked)
            while True:
                outcome = self._wait(hub, waiter, event, deadline, cancel)
                if outcome[0] == "granted":
                    queued = False
                    now = time.monotonic()
                    permit.generation = outcome[1]
                    permit.waited_seconds = now - started
                    permit.acquired_at = now
                    self._start_granted_lease(permit, waiter, now)
                    hub.add_holder(self, permit, waiter.id)
                    return permit
                if outcome[0] in ("timeouts", "cancels"):
                    queued = False
                    self._leave(hub, waiter, outcome[0])
                if outcome[0] == "unavailable":
                    queued = False
                    hub.remove_waiter(waiter.id)
                    raise RedisUnavailable(f"lane {self.key!r}: {outcome[1]}")
                # 'gone': our place lapsed (a missed renewal or doorbell); rejoin.
                remaining_ms = -1 if deadline is None else max(0, int((deadline - time.monotonic()) * 1000))
                sent_at = time.monotonic()
                # A new id (base.rejoin_id), registered before the call so that
                # an early doorbell for it is kept; the new member first: if the
                # reply is lost, the leave below must name the entry this call
                # may have made.
                previous = waiter.member
                hub.remove_waiter(waiter.id)
                waiter.id = permit.holder_id = rejoin_id(hub.token, waiter.id)
                waiter.member = self.member_of(waiter.id, remaining_ms, waiter.workflow)
                hub.add_waiter(self, waiter)
                parsed = self._acquire_call(hub, waiter.id, waiter.priority, remaining_ms, False,
                                            previous=previous, workflow=waiter.workflow)
                if parsed[0] == "granted":
                    hub.remove_waiter(waiter.id)
                    queued = False
                    return self._permit(hub, waiter.id, parsed[1], waiter.priority, started,
                                        sent_at + self.lease_seconds, waiter.workflow)
                waiter.epoch = parsed[1]
                waiter.renewed_at = sent_at
                hub.note_event(self, parsed[2])
                if parsed[3]:
                    permit.asked_yield = True
                    hub.yield_own(parsed[3])
        except BaseException:
            if queued:
                # Interrupted (KeyboardInterrupt, Redis error mid-wait): leave
                # the queue if we can; otherwise our waiter lease lapses.
                try:
                    self._leave(hub, waiter, "cancels")
                except (AcquireCancelled, AcquireTimeout, RedisUnavailable):
                    pass
            raise
        finally:
            if isinstance(cancel, CancelEvent):
                cancel.remove_callback(wake)
            hub.promote(waiter)

    def _start_granted_lease(self, permit: Permit, waiter: Waiter, now: float) -> None:
        """A woken waiter's lease. The server granted after it last found the
        waiter queued (the call that queued it, or a renewal answering 'q'),
        so the lease runs at least until that call's send time + the lease:
        a bound that holds however late the doorbell is read (a paused
        process). Already past it: the slot may be someone else's now."""
        permit._lease_until = waiter.renewed_at + self.lease_seconds
        if now > permit._lease_until:
            permit._mark_lost()

    def _wait(self, hub: SyncHub, waiter: Waiter, event: threading.Event, deadline: float | None,
              cancel: threading.Event | None) -> tuple:
        """Block until the doorbell, the deadline or a cancel. No Redis calls
        beyond reading the doorbells when this thread leads (see hub.py)."""
        check_plain = cancel is not None and not isinstance(cancel, CancelEvent)
        while True:
            outcome = waiter.outcome  # a grant is final: taken without the lock
            if outcome is not None and outcome[0] == "granted":
                return outcome
            event.clear()  # every wake sets it before the state the checks below read
            outcome = hub.take_outcome(waiter, event)
            if outcome is not None:
                return outcome
            if cancel is not None and cancel.is_set():
                return ("cancels",)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return ("timeouts",)
            if check_plain:
                remaining = PLAIN_EVENT_CHECK_SECONDS if remaining is None else min(remaining, PLAIN_EVENT_CHECK_SECONDS)
            until = time.monotonic() + (3600.0 if remaining is None else remaining)
            if not hub.lead(waiter, event, until):
                event.wait(remaining)

    def _leave(self, hub: SyncHub, waiter: Waiter, reason: str) -> None:
        """Leave the queue; a slot granted in the same instant goes back. Always raises."""
        hub.remove_waiter(waiter.id)
        outcome = text(self._run("leave", [waiter.member, reason, self.lease_ms], f"leaving lane {self.key!r}"))
        if reason == "cancels":
            raise AcquireCancelled(f"acquire on lane {self.key!r} cancelled ({outcome}); nothing is held")
        raise AcquireTimeout(f"no slot on lane {self.key!r} within the wait budget ({outcome}); nothing is held")

    def release(self, permit: Permit) -> bool:
        """Give the slot back (handed to the head waiter at once). Idempotent:
        returns False for a second call or a stale generation."""
        if permit._lane is not self and permit.lane_key != self.key:
            raise InvalidInput(f"permit of lane {permit.lane_key!r} released on lane {self.key!r}")
        if not permit._claim_release():
            return False
        gen = permit.generation
        owner = permit._lane  # the lane (and so the hub) that renews this permit
        # own=1: a grant to a waiter of the permit's hub (the holder id's
        # token) comes back in the reply only, with no doorbell, and is
        # handed over below.
        args = [permit.holder_id, gen.epoch, gen.counter, self.lease_ms, 1]
        sent_at = time.monotonic()
        try:
            try:
                reply = self._script("release", args)
            except ReplyLost:
                # Asked again (fenced: it changes nothing if the lost call ran).
                # Sent within the local lease, the lost call found the holder
                # entry still there (the server's lease ends later), so an
                # entry gone now was released by it. The lost call may have
                # granted a waiter of ours without a doorbell: every waiter
                # of the hub renews at once, and a renewal finds such a
                # grant; this call rings for any grant of its own.
                owner._hub.renew_waiters_now()
                args[4] = 0
                reply = self._run("release", args, f"releasing on lane {self.key!r}")
                if not int(reply[0]) and sent_at <= permit._lease_until and not permit._lost:
                    reply = [1, reply[1]]
            except UNAVAILABLE as exc:
                raise unavailable(exc, f"releasing on lane {self.key!r}") from exc
        finally:
            # After the call, off the handoff's path: a renewal racing it skips
            # the permit (it is marked released), so this order is safe.
            owner._hub.remove_holder(owner, permit.holder_id)
        if len(reply) > 3:
            # The slot went to a waiter, maybe one of our own process: it
            # takes its grant from here (for a waiter of ours, the only word
            # of it unless the doorbell rang too).
            owner._hub.deliver_own(text(reply[2]), Generation(int(reply[3]), int(reply[4])), rang=int(reply[5]) == 1)
        elif int(reply[1]):
            self._hand_off_rest()
        return int(reply[0]) == 1

    def _hand_off_rest(self) -> None:
        # A script grants at most 256 per call; keep going while it says more.
        # Each call that says more granted 256, so the loop ends once the
        # slots or the waiters run out, whatever the width now is (a resize
        # may have made it larger than the owner's); the cap only bounds a
        # lane that keeps filling as fast as it drains.
        for _ in range(HAND_OFF_CALLS_MAX):
            reply = self._run("renew", [self.lease_ms, self.width_arg(False)], f"handing off on {self.key!r}")
            if text(reply[0]) == "nostate" or not int(reply[2]):
                return

    # --- width, statistics -------------------------------------------------------------

    def resize(self, width: int) -> int:
        """Set the width now; returns the old width. Nobody is revoked."""
        self._check_width(width)
        reply = self._run("resize", [width, self.lease_ms], f"resizing lane {self.key!r}")
        if int(reply[1]):
            self._hand_off_rest()
        return int(reply[0])

    def provision(self) -> bool:
        """Create the lane's state with no quiet period if it is absent.

        Only for an owner that knows no holder can be alive (a new pool).
        Returns whether it created the state.
        """
        return int(self._run("provision", [self.owner_width()], f"provisioning lane {self.key!r}")) == 1

    def stats(self) -> LaneStats:
        return self.stats_from(self._run("peek", [self.lease_ms, 1], f"reading lane {self.key!r}"))

    def forecast(self, priority: Priority | str | int) -> float | None:
        """Expected wait (seconds) for a new arrival at ``priority``; 0 if a slot
        is free; None before the first hold has been measured."""
        priority = self._priority(priority)
        return self.forecast_from(self.stats_from(self._run("peek", [self.lease_ms, 0], f"reading lane {self.key!r}")),
                                  priority)

    def close(self) -> None:
        """Stop this client's background listener and renewer (at shutdown).
        They serve every lane on the same client: all of that client's
        permits are told lost at once (release them as usual)."""
        close_hubs(self.client)
        close_runner(self.client)
        self._scripts = None

    def __repr__(self) -> str:
        return f"Lane({self.key!r}, prefix={self.prefix!r}, lease={self.lease_seconds}s)"


def scan_lane_keys(client, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """The keys of every lane with state under ``prefix`` (for ``lanes pools``)."""
    found = set()
    try:
        for name in client.scan_iter(match=meta_pattern(prefix), count=500):
            key = lane_of_meta(prefix, text(name))
            if key is not None:
                found.add(key)
    except UNAVAILABLE as exc:
        raise unavailable(exc, "listing lanes") from exc
    return sorted(found)

"""The renewal book: which holders and waiters a process keeps alive on which
lanes, when each lane is next due, and what a renewal reply means for each.

Shared by the sync hub (a thread) and the asyncio hub (a task); it does no I/O
and takes no locks (the sync hub holds its lock around every call).

Why one book per client: renewal must be batched. A process keeping thousands
of holders alive sends one script call per lane per renewal period (chunked
to ``BATCH`` entries so a script never runs long), not one per holder.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from lanes.lane.base import text
from lanes.lane.model import Generation, Permit
from lanes.priority import Priority

BATCH = 500  # entries per renew script call: ~1 ms of server time
UNCLAIMED_KEEP = 1024  # doorbells kept for waiters not registered yet (oldest dropped)


@dataclass
class Waiter:
    """A queued acquisition, as the waiting caller and the hub both see it."""

    id: str
    priority: Priority
    member: str = ""  # its record in the lane's queue (LaneBase.member_of)
    workflow: str = ""  # its share within the priority ('' = the anonymous workflow)
    epoch: int = 0
    renewed_at: float = field(default_factory=time.monotonic)
    # None while waiting; then ('granted', Generation, t) | ('gone',) | ('unavailable', message)
    outcome: tuple | None = None
    wake: Callable[[], None] = lambda: None


@dataclass
class Slot:
    """One lane's entries in this process."""

    lane: Any
    holders: dict[str, Permit] = field(default_factory=dict)
    waiters: dict[str, Waiter] = field(default_factory=dict)
    due: float = 0.0                # next renewal (monotonic)
    wake_at: float | None = None    # earliest event that may free a slot (waiters wake then)
    # Earliest local lease end among the holders (None: none known): the
    # renewer wakes then to tell them lost, whether or not a renewal answered.
    expiry: float | None = None
    renewing: int = 0               # renewal calls of this lane in flight (none is started meanwhile)

    def empty(self) -> bool:
        return not self.holders and not self.waiters

    def next_time(self) -> float | None:
        times = [] if self.expiry is None else [self.expiry]
        if not self.renewing:
            times.append(self.due)
            if self.waiters and self.wake_at is not None:
                times.append(self.wake_at)
        return min(times) if times else None

    def note_lease(self, permit: Permit) -> None:
        until = permit._lease_until - self.lane.lost_guard
        if self.expiry is None or until < self.expiry:
            self.expiry = until


class Book:
    def __init__(self) -> None:
        self.new_slot = False  # set when a lane got its first entry: the renewer must re-plan
        self.slots: dict[int, Slot] = {}
        self.waiter_slot: dict[str, Slot] = {}
        # A waiter registers once its first acquire call answered 'queued', so
        # its doorbell can arrive first: kept here for it to claim. Bounded: a
        # dropped one costs that waiter one renewal period (the renewal finds
        # the grant), as any lost doorbell does.
        self.unclaimed: dict[str, tuple] = {}
        # Granted waiters turned holders, registered without the lock (see
        # defer_holder) and folded in by the next locked call.
        self.pending: deque = deque()
        # Holders asked to yield before they were registered here (the ask
        # came between the grant and the registration): asked on registration.
        self.early_yields: dict[str, None] = {}
        # Waiters that took their grant from a release's reply in this process
        # (deliver_own): the doorbell that follows is dropped, not kept.
        self.delivered: dict[str, None] = {}

    def _slot(self, lane) -> Slot:
        slot = self.slots.get(id(lane))
        if slot is None:
            self.new_slot = True
            slot = Slot(lane, due=time.monotonic() + lane.renew_seconds)
            self.slots[id(lane)] = slot
        return slot

    def _drop_if_empty(self, slot: Slot) -> None:
        # Kept until its next due time (see due_batches): a lane used in a
        # loop keeps one plan instead of waking the renewer on every acquire.
        pass

    # --- registration -------------------------------------------------------------

    def defer_holder(self, lane, permit: Permit, waiter_id: str) -> None:
        """Register a granted waiter's permit without the lock: the woken
        waiter returns at once, and the next locked call (at the latest the
        renewer's next plan, due within a renewal period) moves the entry
        from waiter to holder. Only for a waiter still registered on the
        lane: its entry keeps the lane's slot, and so its renewal plan, alive
        until then. (``deque.append`` is atomic.)"""
        self.pending.append((lane, permit, waiter_id))

    def _fold_pending(self) -> None:
        pending = self.pending
        while pending:
            lane, permit, waiter_id = pending.popleft()
            self._unregister_waiter(waiter_id)
            slot = self._slot(lane)
            slot.holders[permit.holder_id] = permit
            slot.note_lease(permit)
            if self.early_yields:
                self._early_yield(permit)

    def settle(self) -> None:
        """Fold in the holders registered without the lock."""
        if self.pending:
            self._fold_pending()

    def _early_yield(self, permit: Permit) -> None:
        if self.early_yields.pop(permit.holder_id, False) is None:
            permit._ask_yield()

    def ask_yield(self, holder_id: str) -> Permit | None:
        """The permit of ``holder_id``, which an urgent waiter asks to yield
        (the caller asks it, outside the hub's lock). An id not registered
        yet is kept, and its permit asked when it registers."""
        if self.pending:
            self._fold_pending()
        for slot in self.slots.values():
            permit = slot.holders.get(holder_id)
            if permit is not None:
                return permit
        if len(self.early_yields) >= UNCLAIMED_KEEP:
            self.early_yields.pop(next(iter(self.early_yields)))
        self.early_yields[holder_id] = None
        return None

    def add_waiter(self, lane, waiter: Waiter) -> None:
        if self.pending:
            self._fold_pending()
        slot = self._slot(lane)
        slot.waiters[waiter.id] = waiter
        self.waiter_slot[waiter.id] = slot
        early = self.unclaimed.pop(waiter.id, None) if self.unclaimed else None
        if early is not None and waiter.outcome is None:
            waiter.outcome = early

    def remove_waiter(self, waiter_id: str) -> Waiter | None:
        if self.pending:
            self._fold_pending()
        return self._unregister_waiter(waiter_id)

    def _unregister_waiter(self, waiter_id: str) -> Waiter | None:
        slot = self.waiter_slot.pop(waiter_id, None)
        if slot is None:
            return None
        waiter = slot.waiters.pop(waiter_id, None)
        self._drop_if_empty(slot)
        return waiter

    def add_holder(self, lane, permit: Permit) -> None:
        if self.pending:
            self._fold_pending()
        slot = self._slot(lane)
        slot.holders[permit.holder_id] = permit
        slot.note_lease(permit)
        if self.early_yields:
            self._early_yield(permit)

    def remove_holder(self, lane, holder_id: str) -> None:
        if self.pending:
            self._fold_pending()
        slot = self.slots.get(id(lane))
        if slot is not None:
            slot.holders.pop(holder_id, None)
            self._drop_if_empty(slot)

    def note_event(self, lane, in_ms: int, now: float) -> bool:
        """A script said something may free a slot in ``in_ms`` ms. Returns
        whether that is earlier than anything planned (the renewer must re-plan)."""
        slot = self.slots.get(id(lane))
        if slot is not None and in_ms >= 0:
            at = now + in_ms / 1000.0
            if slot.wake_at is None or at < slot.wake_at or slot.wake_at <= now:
                slot.wake_at = at
                return at < slot.due
        return False

    def abandon(self, message: str) -> None:
        """The hub stops (``Lane.close``): nobody renews these entries any
        more, so every holder is told lost now (it may still release) and
        every waiter ends unavailable, rather than lapsing unannounced."""
        if self.pending:
            self._fold_pending()
        for slot in self.slots.values():
            for permit in slot.holders.values():
                if not permit._released:
                    permit._mark_lost()
            for waiter in slot.waiters.values():
                if waiter.outcome is None:
                    waiter.outcome = ("unavailable", message)
                    waiter.wake()

    def orphan(self, message: str) -> None:
        """In a forked child: every entry is the parent's. Holders are lost
        here (and cannot be released here); waiters end unavailable."""
        for slot in list(self.slots.values()):
            for permit in list(slot.holders.values()):
                permit._orphan()
            for waiter in list(slot.waiters.values()):
                if waiter.outcome is None:
                    waiter.outcome = ("unavailable", message)
        for _, permit, _ in list(self.pending):
            permit._orphan()
        self.slots = {}
        self.waiter_slot = {}
        self.pending.clear()
        self.unclaimed = {}

    def kick_all(self) -> None:
        """Renew every lane with waiters now (e.g. after the doorbell reconnected)."""
        for slot in self.slots.values():
            if slot.waiters:
                slot.due = 0.0

    # --- doorbell -------------------------------------------------------------------

    def deliver_grant(self, waiter_id: str, generation: Generation, now: float) -> bool:
        """Hand a doorbell's grant to its waiter and wake it."""
        if self.delivered and waiter_id in self.delivered:
            del self.delivered[waiter_id]
            return False  # it came with the release's reply (deliver_own)
        return self._grant_or_keep(waiter_id, generation, now)

    def _grant_or_keep(self, waiter_id: str, generation: Generation, now: float) -> bool:
        """The only word of a grant: to its waiter, or kept for it until it registers."""
        waiter = self._waiter(waiter_id)
        if waiter is None:
            self.unclaimed[waiter_id] = ("granted", generation, now)
            if len(self.unclaimed) > UNCLAIMED_KEEP:
                del self.unclaimed[next(iter(self.unclaimed))]
            return False
        return self._grant(waiter, generation, now)

    def deliver_own(self, waiter_id: str, generation: Generation, now: float, *, rang: bool) -> bool:
        """Hand a grant read from a release's reply to its waiter, if it waits
        here with no outcome yet. ``rang``: its doorbell went out too, and
        is dropped when it comes (else the doorbell, which follows, does
        what it must). Without a doorbell the reply is the only word, so a
        waiter still to register (its acquire's reply not yet read) finds
        the grant kept for it, as it would a doorbell that came first."""
        if not rang:
            return self._grant_or_keep(waiter_id, generation, now)
        waiter = self._waiter(waiter_id)
        if waiter is None or not self._grant(waiter, generation, now):
            return False
        if len(self.delivered) >= UNCLAIMED_KEEP:
            del self.delivered[next(iter(self.delivered))]
        self.delivered[waiter_id] = None
        return True

    def _waiter(self, waiter_id: str) -> Waiter | None:
        slot = self.waiter_slot.get(waiter_id)
        return slot.waiters.get(waiter_id) if slot else None

    @staticmethod
    def _grant(waiter: Waiter, generation: Generation, now: float) -> bool:
        """Give a waiter with no outcome yet its grant, and wake it."""
        if waiter.outcome is not None:
            return False
        waiter.outcome = ("granted", generation, now)
        waiter.wake()
        return True

    # --- renewal ----------------------------------------------------------------------

    def next_wakeup(self) -> float | None:
        times = [t for t in (slot.next_time() for slot in self.slots.values()) if t is not None]
        return min(times) if times else None

    def expire(self, now: float) -> None:
        """Tell every holder whose local lease is ending that it is lost, from
        the clock alone: its last successful renewal (or grant) was sent
        almost a lease ago, so the server may soon reap and re-grant its slot,
        whether or not a renewal is still waiting for a reply. ``lost_guard``
        before the end, so that a late thread wake-up still sets ``lost``
        before the server can re-grant (a healthy holder renews long before)."""
        if self.pending:
            self._fold_pending()
        for slot in self.slots.values():
            if slot.expiry is None or slot.expiry > now:
                continue
            earliest = None
            guard = slot.lane.lost_guard
            for permit in slot.holders.values():
                if permit._released or permit._lost:
                    continue
                until = permit._lease_until - guard
                if until <= now:
                    permit._mark_lost()
                elif earliest is None or until < earliest:
                    earliest = until
            slot.expiry = earliest

    def due_batches(self, now: float) -> list[tuple[Slot, list[tuple[str, Any]]]]:
        """(slot, entries) chunks of every lane that is due; entries are
        ('h', Permit) or ('w', Waiter)."""
        if self.pending:
            self._fold_pending()
        out = []
        for slot in list(self.slots.values()):
            if slot.renewing:
                continue
            upcoming = min(slot.due, slot.wake_at) if slot.waiters and slot.wake_at is not None else slot.due
            if upcoming > now:
                continue
            if slot.empty():
                del self.slots[id(slot.lane)]
                continue
            slot.due = now + slot.lane.renew_seconds
            slot.wake_at = None
            entries: list[tuple[str, Any]] = [("h", p) for p in slot.holders.values()
                                              if not p.released and not p._lost]
            slot.expiry = min((p._lease_until - slot.lane.lost_guard for _, p in entries), default=None)
            entries += [("w", w) for w in slot.waiters.values() if w.outcome is None]
            if not entries:
                out.append((slot, []))
                slot.renewing += 1
                continue
            for start in range(0, len(entries), BATCH):
                out.append((slot, entries[start:start + BATCH]))
                slot.renewing += 1
        return out

    @staticmethod
    def renew_args(slot: Slot, entries, width_arg: str) -> list:
        args: list = [slot.lane.lease_ms, width_arg]
        for kind, item in entries:
            if kind == "h":
                gen = item.generation
                args += ["h", item.holder_id, gen.epoch, gen.counter, int(item.priority), item.workflow]
            else:
                args += ["w", item.member, item.epoch, 0, int(item.priority), ""]
        return args

    def apply(self, slot: Slot, entries, reply, sent_at: float, now: float) -> bool:
        """Apply one renew reply (the call's ``renewing`` count is the
        caller's to take back). Returns whether the lane has more to hand off.
        A holder already told lost stays lost, whatever a late reply says."""
        lane = slot.lane
        self.note_event(lane, int(reply[1]), now)
        for (kind, item), raw in zip(entries, reply[3:]):
            code = text(raw)
            if kind == "h":
                if code in ("ok", "rereg"):
                    item._lease_until = sent_at + lane.lease_seconds
                    slot.note_lease(item)
                else:
                    item._mark_lost()
            elif item.outcome is None:
                if code == "q":
                    item.renewed_at = sent_at
                elif code.startswith("g:"):
                    _, epoch, counter = code.split(":")
                    item.outcome = ("granted", Generation(int(epoch), int(counter)), now)
                    item.wake()
                else:
                    item.outcome = ("gone",)
                    item.wake()
        return int(reply[2]) == 1

    def failed(self, slot: Slot, entries, now: float, message: str) -> None:
        """Redis did not answer: holders past their local lease are lost;
        waiters that could not renew for a whole lease give up."""
        lane = slot.lane
        slot.due = now + min(lane.renew_seconds, 0.5)
        for kind, item in entries:
            if kind == "h":
                if now > item._lease_until:
                    item._mark_lost()
            elif item.outcome is None and now - item.renewed_at > lane.lease_seconds:
                item.outcome = ("unavailable", message)
                item.wake()

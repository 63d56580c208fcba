"""Values a lane hands out: generations, permits, statistics. No I/O here."""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

from lanes.errors import LeaseLost
from lanes.priority import Priority

log = logging.getLogger("lanes.lane")


class Generation(NamedTuple):
    """A grant's fencing token: ``(epoch, counter)``, compared in that order.

    ``epoch`` is the Redis server time (ms) when the lane's state was created;
    ``counter`` counts grants within it. So generations strictly increase for
    the life of a lane, across a Redis state loss too.
    """

    epoch: int
    counter: int

    def __str__(self) -> str:
        return f"{self.epoch}:{self.counter}"


# Guards the lazy creation of Permit.lost against a concurrent _mark_lost.
_lost_lock = threading.Lock()


def _new_lost_lock_after_fork() -> None:
    # Another thread of the parent may have held it at the fork.
    global _lost_lock
    _lost_lock = threading.Lock()


os.register_at_fork(after_in_child=_new_lost_lock_after_fork)


class Permit:
    """A held slot of a lane. Release it exactly once (more calls do nothing).

    ``lost`` (a ``threading.Event``) is set when the lane refuses a renewal
    (or renewals could not reach Redis for a whole lease): the holder must
    stop using the slot. The event is made on first use, so a short hold that
    never looks at it costs no event.

    ``yield_asked`` is set when an urgent waiter asked this background
    holder to give its slot back (scripts/lib_yield.lua): the slot is still
    ours, but the holder should stop its work, release, and queue again with
    ``acquire(..., resume=True)`` (when a stop hook already ended the work,
    the hub has released it: see :meth:`on_stop`). ``stopping`` is either of the two, and
    :meth:`on_stop` runs a callback at that moment (e.g. to cut a backend
    call short).
    """

    def __init__(self, lane: Any, *, holder_id: str, generation: Generation, priority: Priority,
                 waited_seconds: float, lease_until: float, workflow: str = "") -> None:
        self._lane = lane
        self.holder_id = holder_id
        self.generation = generation
        self.priority = priority
        self.workflow = workflow  # its share within the priority ('' = the anonymous workflow)
        self.waited_seconds = waited_seconds
        self._lost = False
        self._lost_event: threading.Event | None = None
        self.acquired_at = time.monotonic()
        # Local (monotonic) time until which the lease is known to be valid:
        # set from the send time of the last renewal that Redis accepted.
        self._lease_until = lease_until
        self._released = False
        self._release_lock = threading.Lock()
        self.yield_asked = False
        # Its acquire found the lane full and asked background holders for a
        # slot (scripts/lib_yield.lua): a trace tells a preempting admission
        # from one that found a slot free or waited its turn.
        self.asked_yield = False
        self._stop_hooks: list[Callable[[], bool | None]] | None = None
        self._handover: threading.Event | None = None  # set once a slot asked back was given back

    @property
    def lane_key(self) -> str:
        return self._lane.key

    @property
    def released(self) -> bool:
        return self._released

    @property
    def lost(self) -> threading.Event:
        event = self._lost_event
        if event is None:
            with _lost_lock:
                event = self._lost_event
                if event is None:
                    event = threading.Event()
                    if self._lost:
                        event.set()
                    self._lost_event = event
        return event

    def check(self) -> None:
        """Raise :class:`LeaseLost` if the holder must stop."""
        # It stops passing when ``lost`` would fire (the lane's lost guard
        # before the local lease end), not at the end itself: the guard
        # absorbs a client clock that runs slower than the server's.
        if self._lost or time.monotonic() > self._lease_until - self._lane.lost_guard:
            raise LeaseLost(
                f"lease of holder {self.holder_id} (generation {self.generation}) on lane "
                f"{self.lane_key!r} was lost: stop using the slot"
            )

    @property
    def stopping(self) -> bool:
        """The holder must stop its work: the slot was lost or asked back."""
        return self._lost or self.yield_asked

    def on_stop(self, hook: Callable[[], bool | None]) -> Callable[[], None]:
        """Run ``hook`` (once, on the thread that learns it) when the slot is
        lost or asked back; at once if it already was. Returns a function
        that unregisters it.

        A hook returns True when it ended the holder's use of the slot there
        and then (it shut the backend call's connection): a slot asked back
        is then given back by the thread that learned it, without waiting for
        the holder's thread to wake and do it (see :meth:`_ask_yield`)."""
        with _lost_lock:
            stopped = self.stopping
            if not stopped:
                hooks = self._stop_hooks
                if hooks is None:
                    hooks = self._stop_hooks = []
                hooks.append(hook)
        if stopped:
            _run_hooks([hook])
            return _nothing

        def remove() -> None:
            with _lost_lock:
                if self._stop_hooks is not None and hook in self._stop_hooks:
                    self._stop_hooks.remove(hook)
        return remove

    def before_use(self) -> Callable[[], bool]:
        """Say that the holder has not used its slot yet. Until the returned
        ``begin()`` is called, an urgent waiter's ask takes the slot at once,
        on the asker's thread: there is no call to cut, so the slot need not
        wait for the holder's thread to wake and give it back. ``begin()``,
        called right before the slot's first use, returns False when the
        slot was asked back (or lost) first: the holder must not use it."""
        remove = self.on_stop(_unused)

        def begin() -> bool:
            # An ask that took the hook set yield_asked under the same lock
            # first, so after remove() either the hook is gone unrun or
            # ``stopping`` already says why it ran.
            remove()
            return not self.stopping
        return begin

    def _mark_lost(self) -> None:
        with _lost_lock:
            self._lost = True
            event = self._lost_event
            hooks, self._stop_hooks = self._stop_hooks, None
        if event is not None:
            event.set()
        _run_hooks(hooks)

    def _ask_yield(self, hands_over: bool = False) -> bool:
        """An urgent waiter asked for this slot (the hub's yield listener).
        True when a stop hook ended the holder's use of it: the caller may
        then release it at once. A caller that does (``hands_over``) calls
        :meth:`_handed_over` once it has; until then the cut call's thread
        steps aside (:meth:`wait_handed_over`)."""
        with _lost_lock:
            if self._released or self.yield_asked:
                return False
            self.yield_asked = True
            hooks, self._stop_hooks = self._stop_hooks, None
            # Made before the hooks run: the cut call's thread may wait on it at once.
            handover = self._handover = threading.Event()
        ended = _run_hooks(hooks)
        if not (ended and hands_over):
            handover.set()  # the holder's own thread gives the slot back: nothing to wait for
        return ended

    def _handed_over(self) -> None:
        """The thread that cut this holder's call has given its slot back."""
        if self._handover is not None:
            self._handover.set()

    def wait_handed_over(self, timeout: float) -> None:
        """Block the holder's thread, woken by the cut of its call, until the
        slot asked back has been given back (at most ``timeout`` seconds), so
        that its unwinding does not compete with the urgent waiter's hand-over
        (see lanes.routing.backend). Returns at once for a slot that was lost
        rather than asked back."""
        handover = self._handover
        if handover is not None:
            handover.wait(timeout)

    def _orphan(self) -> None:
        """In a forked child: this permit is the parent's (the parent renews
        and releases it). Lost here, and releasing it here changes nothing."""
        self._release_lock = threading.Lock()
        self._release_lock.acquire()
        self._released = True
        self._mark_lost()

    def _claim_release(self) -> bool:
        """True exactly once: the caller that gets True sends the release."""
        # The lock is taken once and never given back: only the first
        # caller gets it.
        if not self._release_lock.acquire(False):
            return False
        self._released = True
        return True

    def release(self):
        return self._lane.release(self)

    def __enter__(self) -> "Permit":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.release()
        except Exception:
            if exc_type is None:
                raise  # otherwise the body's own error is the one to see

    def __repr__(self) -> str:
        state = "released" if self._released else ("lost" if self._lost else "held")
        return (f"Permit(lane={self.lane_key!r}, holder={self.holder_id!r}, "
                f"generation={self.generation}, priority={self.priority.label}, {state})")


def _run_hooks(hooks: list[Callable[[], bool | None]] | None) -> bool:
    """Run every hook; True if one of them ended the holder's use of the slot."""
    ended = False
    for hook in hooks or ():
        try:
            ended = hook() is True or ended
        except Exception:  # a hook's fault must not stop the renewer or the listener
            log.warning("a permit's stop hook failed", exc_info=True)
    return ended


def _nothing() -> None:
    return None


def _unused() -> bool:
    return True  # the holder has not begun: nothing to cut, the slot may go back now


class AsyncPermit(Permit):
    """A :class:`Permit` of an :class:`~lanes.lane.AsyncLane`: ``await permit.release()``."""

    async def release(self) -> bool:  # type: ignore[override]
        return await self._lane.release(self)

    def __enter__(self):
        raise TypeError("an AsyncPermit is used with 'async with', not 'with'")

    async def __aenter__(self) -> "AsyncPermit":
        return self

    async def __aexit__(self, exc_type, exc, tb) -> None:
        try:
            await self.release()
        except Exception:
            if exc_type is None:
                raise


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (``q`` in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class WorkflowShare:
    """One workflow's books at one priority of a lane (issue 14): its holders,
    its waiters, and the slots still owed to it (its share, max(1, W / the
    workflows with work at that priority), less what it holds; 0 when it
    does not wait)."""

    priority: Priority
    workflow: str
    in_flight: int
    waiting: int
    owed: int

    def as_dict(self) -> dict:
        return {"priority": self.priority.label, "workflow": self.workflow, "in_flight": self.in_flight,
                "waiting": self.waiting, "owed": self.owed}


@dataclass(frozen=True)
class LaneStats:
    """One consistent reading of a lane, as every process sees it."""

    key: str
    width: int
    in_flight: int
    queued: dict[Priority, int]
    mean_hold_seconds: float | None
    wait_p50_seconds: float | None
    wait_p95_seconds: float | None
    wait_p50_by_priority: dict[Priority, float | None]
    wait_p95_by_priority: dict[Priority, float | None]
    grants: int
    timeouts: int
    cancels: int
    expired: int
    lapsed_waiters: int
    epoch: int | None
    quiet_seconds: float
    exists: bool = True
    samples: int = field(default=0)
    # Times a script found the in-flight count apart from the holder entries
    # and repaired it (an eviction, or a count from an older script run twice).
    repairs: int = field(default=0)
    # Per priority and workflow with work (holding or waiting), by priority then name.
    workflows: tuple[WorkflowShare, ...] = field(default=())

    @property
    def queued_total(self) -> int:
        return sum(self.queued.values())

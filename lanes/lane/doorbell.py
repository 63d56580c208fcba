"""How a sync hub's waiting threads read their doorbells (a mixin of
:class:`lanes.lane.hub.SyncHub`, which owns the connection, the wake pipe and
the book these methods use).

- One pub/sub connection per hub is subscribed to the process's wake
  channel. A release script publishes ``"<waiter id> <epoch> <counter>"``
  there when it hands a slot to one of our waiters. The waiting threads read
  it themselves, one at a time (leader/follower): the *leader* blocks on the
  socket (and on a local wake pipe, for cancels and renewal outcomes) and
  hands every doorbell to its waiter. A grant to the leader itself wakes one
  thread, not two (no listener thread in between); a grant to a follower is
  handed over by the leader. A leader whose wait ends wakes one follower to
  take over. With no waiter nobody reads: doorbells stay in the socket until
  the next waiter leads (an early one is kept for its waiter, see
  ``Book.unclaimed``). One connection serves every waiter of the process (a
  blocked connection per waiter would not scale).
- A lane full of background work asks a background holder for its slot when
  urgent work queues (scripts/lib_yield.lua): the holder's id alone, on the
  same channel. A holder busy with its call reads nothing, so while the
  process holds slots and no waiter leads, the hub's *idle reader* thread
  leads instead; a waiter that registers takes over from it at once, and
  it takes over again as soon as the last waiter stops leading or the
  process takes a slot with nobody reading (a process whose background
  threads hold every slot without a waiter parked, such as a worker of
  background work beside another process's urgent work, would otherwise
  miss every ask until the idle reader's next look).
- Both messages have a shortcut within one process, where urgent and
  background threads run side by side (a worker given both of a fleet's
  queues; a fleet's supervisor runs a process per queue): an urgent acquire's
  reply names the holders it asked, and the urgent thread cuts and releases
  those of its own process itself (``yield_own``); a release's reply names
  the waiter it granted, and a waiter of the releasing process takes its
  grant from there (``deliver_own``, kept for a waiter still to register).
  Neither rings this process's doorbell: only the thread that read the reply
  acts, and no reader wakes for a message that repeats it (in a background
  drain, one handoff = one release's reply, not also a doorbell read by a
  parked thread). A lost reply is covered otherwise: a lost acquire reply
  costs the urgent waiter a wait for the next release, as a lost ask would;
  after a lost release reply the hub renews its waiters at once (a renewal
  finds a grant) and the re-sent release rings for any grant of its own. A
  permit acts on the first ask only.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections.abc import Sequence

from lanes.lane.base import UNAVAILABLE, parse_doorbell
from lanes.lane.book import Waiter
from lanes.lane.wire import read_reply
from lanes.priority import Priority

log = logging.getLogger("lanes.lane")

IDLE_CHECK_SECONDS = 0.2  # how often the idle reader looks whether it should lead
IDLE_LEAD_SECONDS = 1.0   # and how long it leads before it looks again


class DoorbellReader:
    """Leader/follower reading of the hub's pub/sub connection."""

    def _init_idle_reader(self) -> None:
        self._idle = Waiter(id="", priority=Priority.BACKGROUND)  # never named by a doorbell
        self._idle_event = threading.Event()  # set: the idle reader stops leading
        self._idle_wake = threading.Event()   # set: the idle reader looks again now

    def _idle_loop(self) -> None:
        """Lead the doorbell reading while the process holds slots and no
        waiter does, so that an ask to yield reaches a holder busy with its
        call. Blocked in ``poll`` while it leads: no cost but a thread."""
        while not self.closed:
            with self.lock:
                # Cleared under the lock: a waiter registering after this
                # look sets it again, and the lead below ends at once.
                self._idle_event.clear()
                self.book.settle()
                wanted = not self.book.waiter_slot and any(slot.holders for slot in self.book.slots.values())
            if wanted and self._pubsub is not None:
                if self.lead(self._idle, self._idle_event, time.monotonic() + IDLE_LEAD_SECONDS):
                    continue
            self._idle_wake.wait(IDLE_CHECK_SECONDS)
            self._idle_wake.clear()

    def _stop_idle_reading(self) -> None:
        """A waiter registered: it leads, not the idle reader (the caller holds the lock)."""
        self._idle_event.set()
        if self._leader is self._idle:
            self._poke()

    def ring(self, waiter: Waiter, event: threading.Event) -> None:
        """Wake a waiting thread: its event, and the socket wait if it leads."""
        event.set()
        if self._leader is waiter and threading.get_ident() != self._leader_thread:
            self._poke()

    def _poke(self) -> None:
        try:
            os.write(self._pipe_w, b"x")
        except (BlockingIOError, OSError):
            pass  # the pipe is full (a wake is pending anyway) or closed

    def lead(self, waiter: Waiter, event: threading.Event, until: float) -> bool:
        """Read the doorbells as the leader until ``event`` is set or ``until``
        (monotonic). Returns False at once if another thread leads."""
        if self.closed or self._pubsub is None or not self._reader.acquire(blocking=False):
            return False
        try:
            self._leader_thread = threading.get_ident()
            self._leader = waiter
            self._read_until(event, until)
        finally:
            self._leader = None
            self._leader_thread = 0
            self._reader.release()
            self.promote(waiter)
        return True

    def promote(self, leaving: Waiter) -> None:
        """Wake one other waiting thread so that it leads (if nobody does)."""
        # Unlocked early-outs (nobody but ``leaving`` is registered): the reader
        # was released before this call, so a waiter registering after these
        # reads finds the reader free and leads.
        registered = self.book.waiter_slot
        if self._reader.locked():
            return
        if not registered or (len(registered) == 1 and leaving.id in registered):
            # No waiter left to lead: the idle reader takes over now if the
            # process holds slots (an ask to yield may come at any moment),
            # not at its next periodic look.
            self._idle_wake.set()
            return
        with self.lock:
            for slot in self.book.slots.values():
                for other in slot.waiters.values():
                    if other is not leaving and other.outcome is None:
                        other.wake()
                        return

    def _read_until(self, event: threading.Event, until: float) -> None:
        pubsub = self._pubsub
        leader = self._leader  # its own grant ends the read without a wake (see _dispatch_data)
        poller = select.poll()
        failures = 0
        while not event.is_set() and leader.outcome is None and not self.closed:
            try:
                # Buffered messages first (the parser may hold several).
                message = pubsub.get_message(timeout=0)
                failures = 0
            except UNAVAILABLE as exc:
                failures = min(failures + 1, 5)  # capped: 2 ** n stays a small float
                log.debug("doorbell connection failed (%s); reconnecting", exc)
                pause = min(0.05 * 2 ** failures, 1.0, until - time.monotonic())
                if pause <= 0:
                    return  # our wait is over: no busy retry past it
                event.wait(pause)
                continue
            except Exception:
                if self.closed:
                    return
                log.exception("doorbell reader error")
                event.wait(0.1)
                continue
            if message is not None:
                self._dispatch(message)
                continue
            remaining = until - time.monotonic()
            if remaining <= 0:
                return
            sock = getattr(pubsub.connection, "_sock", None)
            if sock is None:
                event.wait(min(remaining, 0.01))  # reconnecting: the next read connects
                continue
            fd = sock.fileno()
            poller.register(fd, select.POLLIN)
            poller.register(self._pipe_r, select.POLLIN)
            try:
                ready = poller.poll(remaining * 1000.0)
            finally:
                poller.unregister(fd)
                poller.unregister(self._pipe_r)
            readable = False
            for ready_fd, _ in ready:
                if ready_fd == self._pipe_r:
                    try:
                        while os.read(self._pipe_r, 4096):
                            pass
                    except (BlockingIOError, OSError):
                        pass
                elif ready_fd == fd:
                    readable = True
            if readable and not event.is_set() and leader.outcome is None:
                self._read_one(pubsub)

    def _read_one(self, pubsub) -> None:
        """The socket is readable: read one reply straight off the connection
        (the doorbell's hot path; ``get_message`` adds a readiness poll, a
        retry closure and a dict per message, and see wire.py) and dispatch
        it. Anything but a plain message goes through redis-py's own
        ``handle_message``; a failure disconnects, and the next
        ``get_message`` reconnects and resubscribes as usual."""
        conn = pubsub.connection
        if conn is None:
            return
        try:
            response = read_reply(conn, self._read_buffer)
        except UNAVAILABLE as exc:
            log.debug("doorbell connection failed (%s); reconnecting", exc)
            return
        except Exception:
            if self.closed:
                return
            log.exception("doorbell reader error")
            return
        if isinstance(response, list) and len(response) == 3 and response[0] in (b"message", "message"):
            self._dispatch_data(response[2])
            return
        message = pubsub.handle_message(response, ignore_subscribe_messages=True)
        if message is not None:
            self._dispatch(message)

    def _dispatch(self, message) -> None:
        if message.get("type") != "message":
            return
        self._dispatch_data(message["data"])

    def _dispatch_data(self, data) -> None:
        parsed = parse_doorbell(data)
        if parsed is None:
            log.warning("ignored malformed doorbell message %r", data)
            return
        waiter_id, generation = parsed
        if generation is None:
            self._ask_yield(waiter_id)
            return
        leader = self._leader
        if leader is not None and leader.outcome is None and leader.id == waiter_id:
            # The reading thread's own grant (the common case: the only
            # waiter of its process). Set without the lock: only this thread
            # consumes its outcome, and the renewer, which sets outcomes under
            # the lock, sets one only while it is None, and for a waiter that
            # holds a grant it can only find that same grant.
            leader.outcome = ("granted", generation, time.monotonic())
            return
        with self._cond:
            self.book.deliver_grant(waiter_id, generation, time.monotonic())

    def yield_own(self, holder_ids: Sequence[str]) -> None:
        """Ask the holders of this process among ``holder_ids`` (an urgent
        acquire's reply names those it asked) to yield, on the calling
        thread: the urgent waiter's own, which then needs no thread to hand
        it the slot. Each ask also comes as a doorbell; a permit acts on the
        first of the two only."""
        mine = self.token + "."
        for holder_id in holder_ids:
            if holder_id.startswith(mine):
                self._ask_yield(holder_id)

    def deliver_own(self, waiter_id: str, generation, *, rang: bool) -> None:
        """A release's reply granted ``waiter_id``: if it waits in this
        process, it has its grant now, not after the doorbell's trip (and
        with no doorbell at all when ``rang`` is False)."""
        if waiter_id.startswith(self.token + "."):
            with self.lock:
                self.book.deliver_own(waiter_id, generation, time.monotonic(), rang=rang)

    def _ask_yield(self, holder_id: str) -> None:
        """An urgent waiter asks our holder ``holder_id`` for its slot."""
        with self.lock:
            permit = self.book.ask_yield(holder_id)
        if permit is not None and permit._ask_yield(hands_over=True):
            # The holder's call was cut here: hand its slot to the urgent
            # waiter now rather than after the holder's thread wakes to do it
            # (a thread switch fewer on the urgent request's way in). The
            # holder's own release is then a no-op.
            try:
                permit.release()
            except Exception:  # the reader must go on; the lease ends the slot
                log.warning("could not give back the slot of holder %s asked back; its lease will expire",
                            holder_id, exc_info=True)
            finally:
                permit._handed_over()

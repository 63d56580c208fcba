"""One hub per sync Redis client (and key prefix): the process's doorbell
listener and batched renewer, shared by every :class:`~lanes.lane.Lane` on
that client.

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
- The **renewer** thread sleeps on a condition until the next lane is due:
  its renewal period, or (for lanes where we wait) the earliest lease expiry
  the scripts reported, so crashed holders are reaped and their slots handed
  off even when no one else acts, or a holder's lease is about to end with no
  renewal answered (it is told ``lost`` then, from the clock alone). No
  polling: it wakes only for those times. It never waits for Redis itself:
  each renewal call runs on a short-lived thread of its own, one at a time
  per lane, so a call stuck until its socket timeout holds up nothing else.
- After ``os.fork`` the child drops the parent's hubs (their threads,
  sockets, token) without touching them and makes its own on next use.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
import weakref

import redis

from lanes.lane.base import UNAVAILABLE, new_token, text
from lanes.lane.book import Book, Waiter
from lanes.lane.keys import wake_channel
from lanes.lane.model import Generation, Permit
from lanes.lane.server import check_lane_redis
from lanes.lane.wire import READ_SIZE, read_reply

log = logging.getLogger("lanes.lane")

_hubs: "weakref.WeakKeyDictionary[object, dict[str, SyncHub]]" = weakref.WeakKeyDictionary()
_hubs_lock = threading.Lock()


def _close_fds(*fds: int) -> None:
    for fd in fds:
        try:
            os.close(fd)
        except OSError:
            pass


def _reset_hubs_after_fork() -> None:
    """In a forked child: the hubs, their threads, tokens and sockets are the
    parent's. Each is marked closed without touching its connection (a new
    hub with its own token, subscription and renewer is made on next use),
    and every permit it kept is the parent's: lost here."""
    global _hubs_lock
    _hubs_lock = threading.Lock()  # another thread may have held it at the fork
    for by_prefix in list(_hubs.values()):
        for hub in list(by_prefix.values()):
            hub._orphan()
    _hubs.clear()


os.register_at_fork(after_in_child=_reset_hubs_after_fork)


def hub_for(client, prefix: str) -> "SyncHub":
    with _hubs_lock:
        by_prefix = _hubs.setdefault(client, {})
        hub = by_prefix.get(prefix)
        if hub is None or hub.closed:
            hub = by_prefix[prefix] = SyncHub(client, prefix)
        return hub


def close_hubs(client) -> None:
    """Stop the listener and renewer of ``client``: its permits, on every lane
    of that client, stop being renewed and are told lost at once."""
    with _hubs_lock:
        hubs = list(_hubs.pop(client, {}).values())
    for hub in hubs:
        hub.close()


class SyncHub:
    def __init__(self, client, prefix: str) -> None:
        self.client = client
        self.token = new_token()
        self.channel = wake_channel(prefix, self.token)
        self.book = Book()
        self.lock = threading.Lock()
        self._cond = threading.Condition(self.lock)
        self._start_lock = threading.Lock()
        self._pubsub = None
        self._threads: list[threading.Thread] = []
        self.closed = False
        # Leader/follower reading of the pub/sub connection (see the module doc).
        self._reader = threading.Lock()
        self._leader: Waiter | None = None
        self._leader_thread = 0
        self._read_buffer = bytearray(READ_SIZE)  # used by the leading thread only
        self._pipe_r, self._pipe_w = os.pipe()
        os.set_blocking(self._pipe_r, False)
        os.set_blocking(self._pipe_w, False)
        # Closed when the hub is collected (not in close(): a late poke must
        # never write into a reused descriptor).
        weakref.finalize(self, _close_fds, self._pipe_r, self._pipe_w)

    # --- lifecycle -------------------------------------------------------------

    def start(self) -> None:
        """Subscribe (confirmed, so no grant published after this is missed)
        and start both threads. Idempotent."""
        if self._threads:
            return
        with self._start_lock:
            if self._threads:
                return
            pubsub = self.client.pubsub()
            try:
                pubsub.subscribe(self.channel)
                deadline = time.monotonic() + 10.0
                while time.monotonic() < deadline:
                    message = pubsub.get_message(timeout=1.0)
                    if message and message.get("type") == "subscribe":
                        break
                else:
                    raise redis.exceptions.TimeoutError("no SUBSCRIBE confirmation within 10 s")
            except Exception:
                pubsub.close()
                raise
            pubsub.ignore_subscribe_messages = True
            if pubsub.connection is not None:
                # After a reconnect, grants published in the gap were lost:
                # renew every lane with waiters at once to find them.
                pubsub.connection.register_connect_callback(self._on_reconnect)
            self._pubsub = pubsub
            self._warn_eviction()
            threads = [threading.Thread(target=self._renew_loop, name="lanes-renewer", daemon=True)]
            for thread in threads:
                thread.start()
            self._threads = threads

    def _warn_eviction(self) -> None:
        """Warn once per hub when the Redis is not what lanes need (server.py)."""
        try:
            checks = check_lane_redis(self.client)
        except redis.RedisError:
            return  # unreadable: nothing to say
        for _, ok, detail in checks:
            if ok is False:
                log.warning("Redis is unsafe for lanes: %s", detail)

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self.book.abandon("the lane's client was closed (Lane.close)")
            self._cond.notify_all()
        self._poke()  # a leading waiter stops reading now
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout=3.0)
        if self._pubsub is not None and self._reader.acquire(timeout=3.0):
            try:
                self._pubsub.close()
            except Exception:  # closing a broken connection: nothing left to do
                pass
            finally:
                self._reader.release()

    def _orphan(self) -> None:
        # No locks (their holders may not exist in the child), no socket calls.
        self.closed = True
        self._threads = []
        self._pubsub = None
        self.lock = threading.Lock()
        self._cond = threading.Condition(self.lock)
        self._reader = threading.Lock()
        self._start_lock = threading.Lock()
        self.book.orphan("the process forked: this wait belongs to the parent")

    def _on_reconnect(self, connection) -> None:
        with self._cond:
            self.book.kick_all()
            self._cond.notify_all()

    # --- registration (called by Lane) --------------------------------------------

    # The hot paths take the plain lock (the condition's own lock) and wake
    # the renewer only when a lane appeared (its plan has a new time): waking
    # it on every acquire would cost a thread switch per call.

    def add_waiter(self, lane, waiter: Waiter) -> None:
        with self.lock:
            self.book.add_waiter(lane, waiter)
            if self.book.new_slot:
                self.book.new_slot = False
                self._cond.notify_all()

    def remove_waiter(self, waiter_id: str) -> Waiter | None:
        with self.lock:
            return self.book.remove_waiter(waiter_id)

    def add_holder(self, lane, permit: Permit, was_waiter: str | None = None) -> None:
        """Register a permit; ``was_waiter`` (a granted waiter's id, still
        registered) is unregistered in the same step, without the lock on
        the handoff's path (Book.defer_holder)."""
        if was_waiter is not None:
            self.book.defer_holder(lane, permit, was_waiter)
            return
        with self.lock:
            self.book.add_holder(lane, permit)
            if self.book.new_slot:
                self.book.new_slot = False
                self._cond.notify_all()

    def remove_holder(self, lane, holder_id: str) -> None:
        with self.lock:
            self.book.remove_holder(lane, holder_id)

    def note_event(self, lane, in_ms: int) -> None:
        with self._cond:
            if self.book.note_event(lane, in_ms, time.monotonic()):
                self._cond.notify_all()

    def take_outcome(self, waiter: Waiter, event: threading.Event):
        """The waiter's outcome; a 'gone' one is consumed (the caller rejoins)."""
        with self._cond:
            outcome = waiter.outcome
            if outcome is not None and outcome[0] == "gone":
                waiter.outcome = None
                event.clear()
            return outcome

    # --- threads ---------------------------------------------------------------------

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
        if self._reader.locked() or not registered or (len(registered) == 1 and leaving.id in registered):
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
        try:
            waiter_id, epoch, counter = (data.decode() if data.__class__ is bytes else data).split(" ")
            generation = Generation(int(epoch), int(counter))
        except ValueError:
            log.warning("ignored malformed doorbell message %r", data)
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

    def _renew_loop(self) -> None:
        """Plans renewals and times leases; never waits for Redis itself.
        Each renewal call runs on a thread of its own, so a call stuck until
        its socket timeout neither delays other lanes' renewals nor the
        moment a holder is told lost (``Book.expire``)."""
        while True:
            with self._cond:
                while not self.closed:
                    now = time.monotonic()
                    self.book.expire(now)
                    upcoming = self.book.next_wakeup()
                    if upcoming is not None and upcoming <= now:
                        break
                    self._cond.wait(None if upcoming is None else upcoming - now)
                if self.closed:
                    return
                batches = self.book.due_batches(time.monotonic())
            for slot, entries in batches:
                threading.Thread(target=self._renew, args=(slot, entries), name="lanes-renew-call",
                                 daemon=True).start()

    def _renew(self, slot, entries) -> None:
        try:
            self._renew_call(slot, entries)
        finally:
            with self._cond:
                slot.renewing -= 1
                self._cond.notify_all()  # the renewer plans this lane again

    def _renew_call(self, slot, entries) -> None:
        lane = slot.lane
        sent_at = time.monotonic()
        try:
            reply = lane._script("renew", Book.renew_args(slot, entries, lane.width_arg(False)))
            if text(reply[0]) == "nostate":
                reply = lane._script("renew", Book.renew_args(slot, entries, lane.width_arg(True)))
        except (*UNAVAILABLE, redis.RedisError) as exc:
            with self._cond:
                self.book.failed(slot, entries, time.monotonic(), f"renewal failed: {exc}")
            return
        except Exception as exc:  # the owner's width callable failed: keep trying
            log.exception("lane %r renewal failed", lane.key)
            with self._cond:
                self.book.failed(slot, entries, time.monotonic(), f"renewal failed: {exc}")
            return
        with self._cond:
            if self.book.apply(slot, entries, reply, sent_at, time.monotonic()):
                slot.due = 0.0

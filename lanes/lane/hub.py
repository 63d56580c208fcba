"""One hub per sync Redis client (and key prefix): the process's doorbell
listener and batched renewer, shared by every :class:`~lanes.lane.Lane` on
that client.

- Its doorbell reading (leader/follower, one pub/sub connection for every
  waiter of the process) is :class:`lanes.lane.doorbell.DoorbellReader`;
  its batched renewals and lease timing are
  :class:`lanes.lane.renewer.Renewer`. This module keeps the hub's life:
  one per client and prefix, start, close, and the book of its entries.
- After ``os.fork`` the child drops the parent's hubs (their threads,
  sockets, token) without touching them and makes its own on next use.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref

import redis

from lanes.lane.base import new_token
from lanes.lane.book import Book, Waiter
from lanes.lane.doorbell import DoorbellReader
from lanes.lane.keys import wake_channel
from lanes.lane.model import Permit
from lanes.lane.renewer import Renewer
from lanes.lane.server import check_lane_redis
from lanes.lane.wire import READ_SIZE

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


class SyncHub(DoorbellReader, Renewer):
    """The process's hub for one client and prefix (see the module doc)."""

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
        self._init_idle_reader()
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
            threads = [threading.Thread(target=self._renew_loop, name="lanes-renewer", daemon=True),
                       threading.Thread(target=self._idle_loop, name="lanes-idle-reader", daemon=True)]
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
        self._idle_event.set()
        self._idle_wake.set()
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
        self.renew_waiters_now()

    def renew_waiters_now(self) -> None:
        """Renew every waiter of this hub at once: a renewal finds a grant
        whose word was lost (a doorbell while reconnecting, a release's reply)."""
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
            self._stop_idle_reading()
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
        if self._leader is None:
            # Nobody reads the doorbells: an ask for this slot must not wait
            # for the idle reader's next look (doorbell.py).
            self._idle_wake.set()

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

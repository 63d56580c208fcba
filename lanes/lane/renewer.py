"""A sync hub's renewer (a mixin of :class:`lanes.lane.hub.SyncHub`, which
owns the book, the condition and the closed flag these methods use).

- The **renewer** thread sleeps on a condition until the next lane is due:
  its renewal period, or (for lanes where we wait) the earliest lease expiry
  the scripts reported, so crashed holders are reaped and their slots handed
  off even when no one else acts, or a holder's lease is about to end with no
  renewal answered (it is told ``lost`` then, from the clock alone). No
  polling: it wakes only for those times. It never waits for Redis itself:
  each renewal call runs on a short-lived thread of its own, one at a time
  per lane, so a call stuck until its socket timeout holds up nothing else.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from lanes.lane.base import UNAVAILABLE, text
from lanes.lane.book import Book

log = logging.getLogger("lanes.lane")


class Renewer:
    """Plans renewals, times leases, and runs each renewal call on a thread of its own."""

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

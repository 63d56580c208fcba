"""What the sync and asyncio lanes share: validation, script arguments and
reply parsing. No I/O here; :mod:`lanes.lane.sync` and :mod:`lanes.lane.aio`
do the talking."""

from __future__ import annotations

import itertools
import os
import uuid
from typing import Callable

import redis
import redis.asyncio.cluster
import redis.cluster

from lanes.errors import InvalidInput, RedisUnavailable
from lanes.lane.keys import DEFAULT_PREFIX, LaneKeys
from lanes.redis_conn import REDIS_UNAVAILABLE
from lanes.lane.model import Generation, LaneStats, WorkflowShare, percentile
from lanes.priority import Priority

# Errors that mean "Redis did not answer (usefully)": they become RedisUnavailable.
# One list for the whole project, kept beside the connections.
UNAVAILABLE = REDIS_UNAVAILABLE

# Follow-up handoff calls after a release or resize that said "more" (256
# grants each): bounds the loop at a million grants.
HAND_OFF_CALLS_MAX = 4096

# Longest workflow name a lane takes (it is part of every queue entry of it).
WORKFLOW_MAX = 200

_ids = itertools.count(1)


def _new_ids_after_fork() -> None:
    # A child's ids start afresh under its own hub's token (hub.py resets the hubs).
    global _ids
    _ids = itertools.count(1)


os.register_at_fork(after_in_child=_new_ids_after_fork)


# The id suffix of an acquisition by a holder that already gave its slot
# back once (lib_yield.lua never asks it again, so a background call is cut
# at most once per admission, not once per urgent arrival).
YIELDED_ONCE = "y"


def new_id(token: str, resume: bool = False) -> str:
    """A holder/waiter id unique across processes: the hub's token + a counter
    (+ ``YIELDED_ONCE`` for a holder resuming after a yield)."""
    return f"{token}.{next(_ids)}{YIELDED_ONCE if resume else ''}"


def rejoin_id(token: str, lapsed: str) -> str:
    """A new id for a waiter whose place lapsed (a renewal said 'gone'), with
    the lapsed id's ``YIELDED_ONCE``: a doorbell still on its way for the
    lapsed place (a grant the server has since reaped, say while the process
    was paused) names the old id, and must not grant the new place."""
    return new_id(token, lapsed.endswith(YIELDED_ONCE))


def parse_doorbell(data) -> tuple[str, Generation | None] | None:
    """A message on a process's wake channel: ``(waiter id, generation)`` for a
    grant ("<id> <epoch> <counter>", lib_handoff.lua), ``(holder id, None)``
    for an ask to yield (the id alone, lib_yield.lua), None if malformed."""
    parts = (data.decode() if data.__class__ is bytes else data).split(" ")
    if len(parts) == 1:
        return parts[0], None
    try:
        waiter_id, epoch, counter = parts
        return waiter_id, Generation(int(epoch), int(counter))
    except ValueError:
        return None


def new_token() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def unavailable(exc: Exception, what: str) -> RedisUnavailable:
    return RedisUnavailable(f"Redis did not answer while {what}: {exc}; the lane admits no one without Redis")


def text(value) -> str:
    return value.decode() if isinstance(value, (bytes, bytearray)) else str(value)


def is_cluster(client) -> bool:
    return isinstance(client, (redis.cluster.RedisCluster, redis.asyncio.cluster.RedisCluster))


class LaneBase:
    """Configuration and pure logic of one lane (see :class:`lanes.lane.Lane`)."""

    def __init__(self, client, key: str, *, width: int | Callable[[], int], prefix: str = DEFAULT_PREFIX,
                 lease_seconds: float = 30.0, renew_seconds: float | None = None) -> None:
        self.client = client
        self.keys = LaneKeys(prefix, key)
        self.key = key
        self.prefix = prefix
        self._key_list = self.keys.all()
        if not callable(width):
            self._check_width(width)
        self._width = width
        # A known width is sent on every acquire: format it once.
        self._width_text = None if callable(width) else str(width)
        self._scripts = None  # sync: the client's _lua.SyncRunner; asyncio: {name: Script}; looked up once
        self._hub_cache = None  # this client's hub, looked up once while open
        if not lease_seconds or lease_seconds < 0.001:
            raise InvalidInput(f"lease_seconds {lease_seconds!r} must be at least 0.001")
        renew = lease_seconds / 3 if renew_seconds is None else renew_seconds
        if not 0 < renew < lease_seconds:
            raise InvalidInput(
                f"renew_seconds {renew_seconds!r} must be positive and shorter than lease_seconds {lease_seconds}")
        self.lease_seconds = float(lease_seconds)
        # How long before its local lease end a holder that could not renew
        # is told lost (Book.expire): a tenth of the lease, at most 0.5 s, and
        # less than half the slack between a renewal and the lease's end.
        self.lost_guard = min(0.1 * self.lease_seconds, 0.5, (self.lease_seconds - renew) / 2)
        self.lease_ms = max(1, int(round(lease_seconds * 1000)))
        self.renew_seconds = float(renew)
        # In Cluster, PUBLISH counts only the receivers on the lane's own node,
        # so "nobody heard the grant" cannot be trusted there.
        self.notify_flag = "0" if is_cluster(client) else "1"

    def acquire_args(self, waiter_id: str, priority, timeout_ms: int, try_only: bool, fresh: bool,
                     previous: str, workflow: str, resume: bool, cuts_own: bool = False) -> list:
        """acquire.lua's ARGV (but the run_id, added by the runner). ``fresh``:
        the first call with this id (the script then skips its checks for a
        rejoining waiter); ``previous``: the member of this id's earlier queue
        entry, if any; ``resume`` (with fresh): a holder that yielded its slot
        queues ahead of the waiters of its priority; ``cuts_own``: the caller
        cuts the holders of its own process that the reply names as asked, so
        the script sends them no ask of their own."""
        return [waiter_id, int(priority), timeout_ms, self.lease_ms, self.width_arg(False),
                "1" if try_only else "0", self.notify_flag, ("2" if resume else "1") if fresh else "0", previous,
                workflow, "1" if cuts_own else "0"]

    def member_of(self, waiter_id: str, timeout_ms: int, workflow: str = "") -> str:
        """A waiter's record in the lane's queue, as acquire.lua writes it."""
        member = f"{self.notify_flag}:{timeout_ms}:{self.lease_ms}:{waiter_id}"
        return f"{member}:{workflow}" if workflow else member

    @staticmethod
    def workflow_name(workflow) -> str:
        """The workflow whose share a call counts in ('' = the anonymous one)."""
        if workflow is None:
            return ""
        if not isinstance(workflow, str) or len(workflow) > WORKFLOW_MAX:
            raise InvalidInput(f"workflow {workflow!r} must be a string of at most {WORKFLOW_MAX} characters "
                               "(the task's workflow name), or None for the anonymous workflow")
        return workflow

    @staticmethod
    def _check_width(width) -> int:
        if isinstance(width, bool) or not isinstance(width, int) or width < 0:
            raise InvalidInput(f"lane width {width!r} must be an integer >= 0")
        return width

    def owner_width(self) -> int:
        """The width from the lane's owner (used only to (re)create its state)."""
        return self._check_width(self._width() if callable(self._width) else self._width)

    def width_arg(self, ask: bool) -> str:
        """ARGV width: known ints always; a callable owner only when the script asked."""
        if self._width_text is not None:
            return self._width_text
        return str(self.owner_width()) if ask else ""

    @staticmethod
    def _priority(value) -> Priority:
        # The common case (a Priority) without Priority.parse's checks.
        return value if value.__class__ is Priority else Priority.parse(value)

    @staticmethod
    def timeout_ms(timeout: float | None) -> int:
        if timeout is None:
            return -1
        if timeout != timeout or timeout < 0:  # NaN or negative
            raise InvalidInput(f"timeout {timeout!r} must be None or >= 0 seconds")
        return int(timeout * 1000)

    # --- replies --------------------------------------------------------------

    @staticmethod
    def parse_acquire(reply) -> tuple:
        kind = reply[0]
        if kind.__class__ is bytes:
            kind = kind.decode()
        # int() reads bytes and str alike.
        if kind == "granted":
            return kind, Generation(int(reply[1]), int(reply[2]))
        if kind == "queued":  # then the background holders this call asked to yield
            return kind, int(reply[1]), int(reply[2]), [text(asked) for asked in reply[3:]]
        if kind == "busy":
            return kind, int(reply[1])
        return (kind,)

    def stats_from(self, reply) -> LaneStats:
        if not reply:
            none_by = {p: None for p in Priority}
            return LaneStats(
                key=self.key, width=self.owner_width(), in_flight=0, queued={p: 0 for p in Priority},
                mean_hold_seconds=None, wait_p50_seconds=None, wait_p95_seconds=None,
                wait_p50_by_priority=none_by, wait_p95_by_priority=dict(none_by), grants=0, timeouts=0,
                cancels=0, expired=0, lapsed_waiters=0, epoch=None, quiet_seconds=0.0, exists=False)
        width, in_flight = int(reply[0]), int(reply[1])
        queued = {p: int(reply[2 + p]) for p in Priority}
        ewma = text(reply[5])
        measured = int(reply[6]) == 1
        samples: dict[Priority, list[float]] = {p: [] for p in Priority}
        every: list[float] = []
        books = int(reply[15])
        workflows = []
        for raw in reply[16:16 + books]:
            prio, held, waiting, owed, name = text(raw).split(":", 4)
            workflows.append(WorkflowShare(priority=Priority(int(prio)), workflow=name, in_flight=int(held),
                                           waiting=int(waiting), owed=int(owed)))
        for raw in reply[16 + books:]:
            prio, ms = text(raw).split(":")
            seconds = int(ms) / 1000.0
            samples[Priority(int(prio))].append(seconds)
            every.append(seconds)
        return LaneStats(
            key=self.key, width=width, in_flight=in_flight, queued=queued,
            mean_hold_seconds=(float(ewma) / 1000.0) if ewma and measured else None,
            wait_p50_seconds=percentile(every, 50), wait_p95_seconds=percentile(every, 95),
            wait_p50_by_priority={p: percentile(samples[p], 50) for p in Priority},
            wait_p95_by_priority={p: percentile(samples[p], 95) for p in Priority},
            grants=int(reply[7]), timeouts=int(reply[8]), cancels=int(reply[9]), expired=int(reply[10]),
            lapsed_waiters=int(reply[11]), epoch=int(text(reply[12])), quiet_seconds=int(reply[13]) / 1000.0,
            samples=len(every), repairs=int(reply[14]), workflows=tuple(workflows))

    @staticmethod
    def forecast_from(stats: LaneStats, priority: Priority) -> float | None:
        """Expected wait of a new arrival at ``priority``, per the lane's rule:
        0 when a slot is free; otherwise (waiters ahead at the same or higher
        priority + 1) / W x mean hold; None before the first hold is measured."""
        if stats.quiet_seconds <= 0 and stats.in_flight < stats.width and stats.queued_total == 0:
            return 0.0
        if stats.mean_hold_seconds is None:
            return None
        if stats.width <= 0:
            return float("inf")  # a lane drained to width 0 admits no one until resized
        ahead = sum(n for p, n in stats.queued.items() if p <= priority)
        wait = (ahead + 1) / stats.width * stats.mean_hold_seconds
        return max(wait, stats.quiet_seconds)

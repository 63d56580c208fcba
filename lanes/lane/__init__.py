"""The lane: a fleet-wide priority lane queue in Redis.

One lane per pool, shared by every worker on every machine: a width W,
holders with leases and fencing generations, and a wait queue ordered by
priority then arrival, with direct handoff on release.

Public names (also exported from :mod:`lanes`):

- :class:`Lane` (sync) and :class:`AsyncLane` (asyncio): same method names;
- :class:`Permit` / :class:`AsyncPermit`: a held slot (context managers);
- :class:`Generation`: a grant's fencing token ``(epoch, counter)``;
- :class:`LaneStats`: one reading of a lane's statistics;
- :class:`CancelEvent`: a ``threading.Event`` that wakes waiters at once;
- :func:`scan_lane_keys`: the keys of every lane under a prefix.

Design notes (the choices ARCHITECTURE.md leaves open):

- *Waking*: one pub/sub connection per process (the "hub"), not a blocked
  connection per waiter. The sync waiters read it themselves in turns
  (leader/follower, see ``hub.py``), so a grant to the reading waiter costs
  one thread wake; the asyncio hub reads it in a task. The grant itself is
  written in Redis (the waiter's mailbox is its holder entry); the message is
  only a doorbell, so a lost one costs at most one renewal period: the
  waiter's renewal reports the grant.
- *Scripts*: helpers in small ``scripts/lib_*.lua`` files that each script
  includes by name (``_lua.py``); acquire and release run an inline fast path
  before including the reap/handoff helpers, because every call runs the top
  level of everything a script includes.
- *Script calls*: the sync lane sends ``EVALSHA`` on connections it keeps
  checked out of the client's pool (``_lua.SyncRunner``), skipping redis-py's
  per-command wrapper; a failed connection is dropped and the call goes
  through redis-py's own path (retry policy, reconnect). Cluster, bounded
  pools and the asyncio lane use redis-py's path.
- *Sync/async*: mirror classes over a shared non-I/O base (``base.py``,
  ``book.py``); the scripts are the same.
- *State loss*: a script that finds no state recreates it with a new epoch
  and grants nothing for one lease period, during which live holders
  re-register (capped at W). A failover to a replica that missed the last
  grants is not detectable this way: the replica has state, just stale
  state, so it may re-grant slots whose grants it never saw. Running
  ``WAIT 1 <ms>`` after each grant would make a grant count only once a
  replica has it (at one more round trip per acquire); we do not do that.
"""

from lanes.lane.aio import AsyncLane
from lanes.lane.cancel import CancelEvent
from lanes.lane.model import AsyncPermit, Generation, LaneStats, Permit
from lanes.lane.sync import Lane, scan_lane_keys

__all__ = [
    "AsyncLane",
    "AsyncPermit",
    "CancelEvent",
    "Generation",
    "Lane",
    "LaneStats",
    "Permit",
    "scan_lane_keys",
]

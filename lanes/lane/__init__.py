"""The lane: a fleet-wide priority lane queue in Redis.

One lane per pool, shared by every worker on every machine: a width W,
holders with leases and fencing generations, and a wait queue ordered by
priority, then each workflow's guaranteed share within the priority
(``scripts/lib_share.lua``), then arrival within a workflow, with direct
handoff on release.

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
  through a connection checked out for that call. Cluster calls go to the
  slot's node; the asyncio lane checks a connection out per call.
- *Sync/async*: mirror classes over a shared non-I/O base (``base.py``,
  ``book.py``); the scripts are the same.
- *State loss*: a script that finds no state recreates it with a new epoch
  and grants nothing for one lease period, during which live holders
  re-register (capped at W). Stale state (a restart that loaded an older
  snapshot, a failover to a replica that missed the last grants) is found
  by the server's run_id: both lanes learn it once per connection (on
  Cluster, a connection of the node serving the lane's slot) and send it with
  every script (``_lua.call_with_run`` / ``acall_with_run``), and a state
  written by another server process starts over the same way, with an epoch
  past the old one. The asyncio lane on Cluster and single-connection
  clients cannot send it: with those, keep the lanes on a Redis of their own
  without persistence (docs/DEPLOYMENT.md, "The lanes' Redis"); the sync and asyncio
  lanes on one server make persistence safe (``lanes redis status`` checks
  each role).
- *Faults* (issue 9): every script is idempotent, so a lost reply is asked
  again rather than re-sent blindly (``_lua.ReplyLost``); a holder is told
  ``lost`` from its own clock a guard before its lease, counted from its last
  successful renewal's send time, can end (renewal calls run on threads of
  their own, never one behind another); a woken waiter's lease counts from
  the last call that found it queued; a waiter's lease travels in its queue
  entry; after a fork the child gets its own hubs and ids.
- *Left as they are, on purpose*: a waiter whose doorbell connection is
  reconnecting at the instant of its grant is dropped (the grant finds no
  listener, and an unheard grant is taken back so that a crashed process
  never strands a slot) and rejoins at the back of its class after its next
  renewal: an order break, never an over-admission or a lost slot. A
  half-open doorbell connection is not probed: each grant to that process
  then waits for the renewal that reports it (at most one renewal period);
  the client's ``socket_keepalive`` options bound how long it stays half-open.
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

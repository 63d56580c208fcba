"""Which replica of a pool a call goes to: the one with the least in flight, fleet-wide.

A pool that lists its replicas' ``endpoints`` in the catalog has one lane
(its width is the sum of theirs) and many addresses. Each call is counted on
the replica it goes to, in Redis, so every worker of every fleet sees the
same counts; the next call goes to the replica with the fewest, the last
scrape's running count breaking ties (``replica_pick.lua``). A call is a
member with a lease (the call's own time limit plus a margin), so a worker
that dies mid-call leaves no count behind for longer than that.

A replica that cannot be reached (connection refused or timed out: nothing
was sent) is marked down for ``DOWN_SECONDS``, so it stops receiving calls
within one failed call, and the walker tries the next replica at once. It
comes back when the mark lapses, or sooner when the controller's scrape
finds it answering (:mod:`lanes.control.loop`). If every replica is marked
down, calls go to all of them anyway (the marks may be older than the
recovery), as the Gateway API Inference Extension does.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from importlib import resources

import redis

from lanes.namespace import Namespace

DOWN_SECONDS = 10.0
LEASE_MARGIN_SECONDS = 30.0


def _load(name: str) -> str:
    return resources.files("lanes.control").joinpath("scripts", f"{name}.lua").read_text(encoding="utf-8")


@dataclass(frozen=True)
class ReplicaCall:
    """One call counted on one replica; give it back with :meth:`Replicas.release`."""

    pool_id: int
    endpoint: str
    call_id: str


class Replicas:
    def __init__(self, client: redis.Redis, namespace: Namespace) -> None:
        self.client = client
        self.ns = namespace
        self._pick = client.register_script(_load("replica_pick"))
        self._release = client.register_script(_load("replica_release"))
        self._mark = client.register_script(_load("replica_mark"))

    def pick(self, pool_id: int, endpoints: tuple[str, ...], *, call_seconds: float,
             avoid: tuple[str, ...] = ()) -> ReplicaCall:
        """Count a call on the least busy replica that is up (and not in ``avoid``)."""
        counts, calls, down, load = self.ns.replicas(pool_id)
        choices = [e for e in endpoints if e not in avoid] or list(endpoints)
        call_id = uuid.uuid4().hex
        lease_ms = int((call_seconds + LEASE_MARGIN_SECONDS) * 1000)
        endpoint = self._pick(keys=[counts, calls, down, load], args=[call_id, lease_ms, *choices])
        return ReplicaCall(pool_id, endpoint.decode() if isinstance(endpoint, bytes) else endpoint, call_id)

    def release(self, call: ReplicaCall) -> bool:
        counts, calls, _, _ = self.ns.replicas(call.pool_id)
        return bool(int(self._release(keys=[counts, calls], args=[call.endpoint, call.call_id])))

    def mark_down(self, pool_id: int, endpoint: str, seconds: float = DOWN_SECONDS) -> None:
        self._mark(keys=[self.ns.replicas(pool_id)[2]], args=[endpoint, max(1, int(seconds * 1000))])

    def mark_up(self, pool_id: int, endpoint: str) -> None:
        self._mark(keys=[self.ns.replicas(pool_id)[2]], args=[endpoint, 0])

    def in_flight(self, pool_id: int) -> dict[str, int]:
        """Calls in flight per endpoint, by the lanes' own accounting."""
        raw = self.client.hgetall(self.ns.replicas(pool_id)[0])
        return {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}

    def down(self, pool_id: int) -> dict[str, float]:
        """Endpoint -> seconds it stays marked down (only those still marked)."""
        key = self.ns.replicas(pool_id)[2]
        seconds, micros = self.client.time()
        now_ms = seconds * 1000 + micros // 1000
        raw = self.client.hgetall(key)
        return {(k.decode() if isinstance(k, bytes) else k): (int(v) - now_ms) / 1000
                for k, v in raw.items() if int(v) > now_ms}

    def record_load(self, pool_id: int, running: dict[str, float]) -> None:
        """The last scrape's running count per endpoint: the tie-break between equal counts."""
        key = self.ns.replicas(pool_id)[3]
        pipe = self.client.pipeline(transaction=False)
        pipe.delete(key)
        if running:
            pipe.hset(key, mapping={e: float(v) for e, v in running.items()})
        pipe.execute()

"""Every Redis name Lanes uses outside a lane's own keys, built in one place.

A lane's keys (meta, holders, queue...) and its wake channels are built by
:mod:`lanes.lane.keys`, which the lane scripts rely on; everything else that
Lanes keeps in Redis is named here, under the deployment's ``key_prefix``
(``lanes:v2`` by default)::

    {prefix}:events                         stream  routing events
    {prefix}:trace:<task id>                list    a task's routing trace
    {prefix}:run:<task id>                  string  the run lease of the delivery running a task (left to lapse when the task ends)
    {prefix}:submitted:<task id>            string  a task submitted through Lanes (its workflow), for the result TTL
    {prefix}:revoked:<task id>              string  a task revoked through Lanes, read by every later delivery, for the result TTL
    {prefix}:idem:<workflow>:<key>          string  idempotency key -> task id
    {prefix}:accepted:<task id>             string  a task submit queued (on the result store's Redis)
    {{prefix}:breaker:<model>}:state        hash    a backend's breaker
    {{prefix}:breaker:<model>}:window       list    its recent outcomes
    {{prefix}:control:<pool id>}:state      hash    a pool controller's state
    {{prefix}:control:<pool id>}:leader     string  the pool's control-loop lease
    {{prefix}:share:<workflow>}:state       hash    a workflow's failover share (seed 003)
    {{prefix}:share:<workflow>}:window      list    its primary's recent outcomes
    {prefix}:workers:<fleet>                zset    live workers of a fleet (heartbeats)
    {prefix}:beat:lock                      string  the one active beat's lock (celery-redbeat's)
    {prefix}:beat:<entry>                   hash    a redbeat schedule entry (redbeat key prefix {prefix}:beat:)
    {prefix}:beat::schedule, ::statics      zset/set  redbeat's due times and static entry names
    {prefix}:beat:active                    hash    who holds the beat lock, since when
    {prefix}:lane_config                    string  the last lane-config check's report (JSON)
    {prefix}:server                         hash    the Redis server identity marker
    {prefix}:memory:epoch                   string  the broker epoch memory-run messages were sent in

The broker's keys are kombu's (a list per queue and priority step, ``unacked``,
``unacked_index``), named by the queues (:mod:`lanes.celery_client`), never
prefixed, with one of Lanes' own beside each queue (:func:`lanes.broker.bell_key`)::

    <queue>:bell                            stream  one entry, added by every publish to the queue

Pool-keyed names use the pool's stable id, never its name, so a rename keeps
them. A key that several keys of one script must share a Redis Cluster slot
with carries a hash tag (the braces).
"""

from __future__ import annotations

from dataclasses import dataclass

from lanes.lane.keys import check_prefix


@dataclass(frozen=True)
class Namespace:
    prefix: str

    def __post_init__(self) -> None:
        check_prefix(self.prefix)

    @property
    def events(self) -> str:
        return f"{self.prefix}:events"

    def trace(self, task_id: str) -> str:
        return f"{self.prefix}:trace:{task_id}"

    def submitted(self, task_id: str) -> str:
        return f"{self.prefix}:submitted:{task_id}"

    def revoked(self, task_id: str) -> str:
        return f"{self.prefix}:revoked:{task_id}"

    @property
    def revokes(self) -> str:
        """The stream of task ids revoked through Lanes, newest last: every
        worker reads it, so a revoke whose broadcast a worker missed still
        ends that worker's lane wait (workers/cancel.py)."""
        return f"{self.prefix}:revokes"

    def task_run(self, task_id: str) -> str:
        return f"{self.prefix}:run:{task_id}"

    def accepted(self, task_id: str) -> str:
        return f"{self.prefix}:accepted:{task_id}"

    def idempotency(self, key: str, workflow: str | None = None) -> str:
        return f"{self.prefix}:idem:{workflow}:{key}" if workflow else f"{self.prefix}:idem:{key}"

    def breaker(self, model: str) -> tuple[str, str]:
        tag = f"{{{self.prefix}:breaker:{model}}}"
        return f"{tag}:state", f"{tag}:window"

    def control_state(self, pool_id: int) -> str:
        # Tagged with the leader key: the lease and commit scripts touch both.
        return f"{{{self.prefix}:control:{pool_id}}}:state"

    def control_leader(self, pool_id: int) -> str:
        return f"{{{self.prefix}:control:{pool_id}}}:leader"

    def replicas(self, pool_id: int) -> tuple[str, str, str, str]:
        """(calls in flight per endpoint, the calls with their leases, down marks, scraped load)."""
        tag = f"{{{self.prefix}:replicas:{pool_id}}}"
        return f"{tag}:counts", f"{tag}:calls", f"{tag}:down", f"{tag}:load"

    def share(self, workflow: str) -> tuple[str, str]:
        tag = f"{{{self.prefix}:share:{workflow}}}"
        return f"{tag}:state", f"{tag}:window"

    def workers(self, fleet: str) -> str:
        return f"{self.prefix}:workers:{fleet}"

    @property
    def beat_lock(self) -> str:
        return f"{self.prefix}:beat:lock"

    @property
    def beat_prefix(self) -> str:
        """celery-redbeat's key prefix: its schedule and entries live under it."""
        return f"{self.prefix}:beat:"

    @property
    def beat_active(self) -> str:
        return f"{self.prefix}:beat:active"

    @property
    def lane_config(self) -> str:
        return f"{self.prefix}:lane_config"

    @property
    def memory_epoch(self) -> str:
        return f"{self.prefix}:memory:epoch"

    @property
    def server_marker(self) -> str:
        return f"{self.prefix}:server"

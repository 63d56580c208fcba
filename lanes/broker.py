"""The Redis broker transport: kombu's, keeping one client per channel.

Celery uses it for every ``redis://`` broker (``BROKER_TRANSPORT`` in
:mod:`lanes.celery_client`).

kombu's Redis channel builds a new ``redis.Redis`` for every synchronous
call it makes (each acknowledgement, publish, task event and unacked-index
update goes through ``conn_or_acquire``). With redis-py 8 building one costs
about 140 us of CPU (its response-callback table is rebuilt each time), and
a fleet worker makes six to eight of them per task: about a tenth of the
worker's CPU per task, measured with a sampling profiler on a background
drain (docs/BENCHMARKS.md). A ``redis.Redis`` keeps no state of its own
between commands (each takes a connection from the channel's pool), so one
per channel serves every thread; it is made again whenever the channel's
pool is (a reconnect closes the pool and kombu opens a new one).
"""

from __future__ import annotations

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _sync_client = None

    def _create_client(self, asynchronous: bool = False):
        if asynchronous:  # BRPOP and pub/sub clients hold state of their own: kombu's, unchanged
            return super()._create_client(asynchronous=True)
        client = self._sync_client
        if client is None or client.connection_pool is not self.pool:
            client = self._sync_client = super()._create_client()
        return client


class Transport(kombu_redis.Transport):
    Channel = Channel

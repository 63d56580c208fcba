"""The Redis broker transport: kombu's, keeping one client per channel.

Celery uses it for every broker Lanes is given (:mod:`lanes.celery_client`):
:class:`Transport` for ``redis://`` and ``rediss://`` (kombu's channel makes
the TLS connections from the URL's ``ssl_*`` parameters or Celery's
``broker_use_ssl``), :class:`SentinelTransport` for ``sentinel://`` (the
primary its sentinels name, asked again on every new connection).

kombu's Redis channel builds a new ``redis.Redis`` for every synchronous
call it makes (each acknowledgement, publish, task event and unacked-index
update goes through ``conn_or_acquire``). With redis-py 8 building one costs
about 140 us of CPU (its response-callback table is rebuilt each time), and
a fleet worker makes six to eight of them per task: about a tenth of the
worker's CPU per task, measured with a sampling profiler on a background
drain (docs/BENCHMARKS_JOURNAL.md). A ``redis.Redis`` keeps no state of its own
between commands (each takes a connection from the channel's pool), so one
per channel serves every thread; it is made again whenever the channel's
pool is (a reconnect closes the pool and kombu opens a new one).

A message is taken and recorded in one step. kombu's channel pops it with
BRPOP and records it in its unacknowledged hash and index with a second
command: a worker killed between the two (the chaos runs lost one task in
two of five; a soak one in 1,096) or a Redis gone between them lost the
message, a task ``submit`` had acknowledged. Here the consumer's connection
sends a script instead (``scripts/broker_take.lua``) that moves the next
message of its queues, in kombu's order, into that record: a worker that dies
anywhere after it leaves a message that no one refreshes, which a live worker
gives back one message lease later (:func:`restore_stale`).

No Redis command blocks on several lists without popping from them (a
script cannot block, and BLMOVE takes one source, while a consumer takes
each of its queues at three priority steps), so the take does not wait.
Every publish also adds to its queue's *bell*, a stream one entry long; a
take that finds its queues empty returns the bells' last entry ids, and the
connection then waits with ``XREAD BLOCK`` for an entry after them: a
publish made between the take and the wait still wakes it at once, and
nothing is popped by the wait (a renamed fleet's drain,
``workers/scripts/drain_queue.lua``, rings the new queue's bell too). A
message queued without a bell (kombu's own transport publishing) is taken
within the transport's ``brpop_timeout`` (1 s), when the wait ends anyway.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from importlib.resources import files
from queue import Empty

import redis
from celery import bootsteps
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.encoding import bytes_to_str
from kombu.utils.json import dumps, loads

log = logging.getLogger("lanes.worker")

TAKE = files("lanes").joinpath("scripts", "broker_take.lua").read_text(encoding="utf-8")
TAKE_SHA = hashlib.sha1(TAKE.encode()).hexdigest()


def bell_key(queue: str, sep: str) -> str:
    """The stream every publish to ``queue`` adds to (lanes/namespace.py lists it)."""
    return f"{queue}{sep}bell"


class QoS(kombu_redis.QoS):
    """kombu's QoS, not recording again what the take recorded."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.taken: set = set()  # delivery tags the take recorded whose delivery has not reached append

    def append(self, message, delivery_tag) -> None:
        if delivery_tag in self.taken:
            self.taken.discard(delivery_tag)
            virtual.QoS.append(self, message, delivery_tag)
        else:  # delivered another way (basic_get, a message the take could not record)
            super().append(message, delivery_tag)

    def restore_visible(self, start=0, num=10, interval=10) -> None:
        """kombu's periodic sweep (a worker with an event loop runs it), giving
        back only what is still stale when it is given back (:func:`restore_if_stale`)."""
        self._vrestore_count += 1
        if (self._vrestore_count - 1) % (interval or 1):
            return
        restore_stale(self.channel, self.visibility_timeout, time.time(), limit=num or 1_000)


class Channel(kombu_redis.Channel):
    QoS = QoS
    _sync_client = None
    # The bells' ids of the last take that found the queues empty: the next
    # command waits for a publish after them instead of taking.
    _bells: tuple | None = None
    _waiting = False  # the pending command is that wait, not a take
    _taking: list | None = None  # the queues of the pending take, in its keys' order

    # Seconds a synchronous call waits for a free connection of the channel's
    # pool, or None for kombu's pool, which refuses a call past
    # ``max_connections`` ("Too many connections"). A worker of the green pool
    # sets it (workers/main.py ``green_transport``): its held tasks acknowledge
    # at once when a lane drains, and a pool bounded by waiting keeps the
    # process's connections to Redis in the hundreds, not one per held message.
    pool_wait_seconds: float | None = None
    from_transport_options = kombu_redis.Channel.from_transport_options + ("pool_wait_seconds",)

    def _get_pool(self, asynchronous: bool = False):
        if asynchronous or self.pool_wait_seconds is None:
            return super()._get_pool(asynchronous)
        params = self._connparams(asynchronous=False)
        self.keyprefix_fanout = self.keyprefix_fanout.format(db=params["db"])
        return redis.BlockingConnectionPool(timeout=self.pool_wait_seconds, **params)

    def _create_client(self, asynchronous: bool = False):
        if asynchronous:  # BRPOP and pub/sub clients hold state of their own: kombu's, unchanged
            return super()._create_client(asynchronous=True)
        client = self._sync_client
        if client is None or client.connection_pool is not self.pool:
            client = self._sync_client = super()._create_client()
        return client

    # -- publishing: every message rings its queue's bell -----------------------------------

    def _ring(self, pipe, queue: str) -> None:
        pipe.xadd(bell_key(queue, self.sep), {"m": ""}, maxlen=1, approximate=False)

    def _put(self, queue, message, **kwargs) -> None:
        batch = kwargs.get("_publish_batch")
        if batch is not None or (self._expires and queue in self._expires):
            super()._put(queue, message, **kwargs)
            if batch is not None:
                batch.add("xadd", bell_key(queue, self.sep), {"m": ""}, "*", 1, False)
            else:
                with self.conn_or_acquire() as client:
                    self._ring(client, queue)
            return
        # kombu's plain LPUSH, and the bell after it in the same round trip.
        key = self._q_for_pri(queue, self._get_message_priority(message, reverse=False))
        with self.conn_or_acquire() as client:
            pipe = client.pipeline(transaction=False)
            pipe.lpush(key, dumps(message))
            self._ring(pipe, queue)
            pipe.execute()

    def _do_restore_message(self, payload, exchange, routing_key, pipe, leftmost=False) -> None:
        super()._do_restore_message(payload, exchange, routing_key, pipe, leftmost)
        try:
            queues = self._lookup(exchange, routing_key)
        except Exception:  # kombu's restore logged it; the message was not put back either
            return
        for queue in queues:
            self._ring(pipe, queue)

    def _delete(self, queue, *args, **kwargs) -> None:
        super()._delete(queue, *args, **kwargs)
        with self.conn_or_acquire(client=kwargs.get("client")) as client:
            client.delete(bell_key(queue, self.sep))

    # -- consuming: take and record in one step, or wait for a bell --------------------------

    def __init__(self, *args, **kwargs) -> None:
        self._no_ack_queues: set = set()
        super().__init__(*args, **kwargs)

    def basic_consume(self, queue, no_ack, *args, **kwargs):
        (self._no_ack_queues.add if no_ack else self._no_ack_queues.discard)(queue)
        return super().basic_consume(queue, no_ack, *args, **kwargs)

    def _update_queue_cycle(self) -> None:
        self._bells = None  # the queues changed: take before waiting on their bells
        super()._update_queue_cycle()

    def _brpop_start(self, timeout=None):
        if self.global_keyprefix:  # kombu prefixes BRPOP's arguments only
            return super()._brpop_start(timeout)
        if timeout is None:
            timeout = self.brpop_timeout
        if self._bells is not None:
            streams, ids = self._bells
            self._send(True, "XREAD", "BLOCK", int((timeout or 0) * 1000), "STREAMS", *streams, *ids)
            return
        queues = self._queue_cycle.consume(len(self.active_queues))
        if not queues:
            return
        self._taking = queues
        self._send(False, "EVALSHA", TAKE_SHA, *self._take_arguments(queues))

    def _take_arguments(self, queues: list) -> list:
        lists = [self._q_for_pri(queue, pri) for pri in self.priority_steps for queue in queues]
        bells = [bell_key(queue, self.sep) for queue in queues]
        return [len(lists) + 2 + len(bells), *lists, self.unacked_key, self.unacked_index_key, *bells,
                len(lists), time.time()]

    def _send(self, waiting: bool, *command) -> None:
        self._waiting = waiting
        self._in_poll = self.client.connection
        self._brpop_sent_at = time.monotonic()
        self.client.connection.send_command(*command)

    def _brpop_read(self, **options):
        if self.global_keyprefix:
            return super()._brpop_read(**options)
        connection = self.client.connection
        refused = None
        try:
            try:
                reply = self.client.parse_response(connection, "XREAD" if self._waiting else "EVALSHA", **options)
            except self.connection_errors:
                connection.disconnect()  # the next turn reconnects
                raise
            except redis.exceptions.ResponseError as exc:
                reply, refused = None, exc
        finally:
            self._in_poll = None
            self._flush_brpop_reauth()
        if self._waiting:
            self._bells = None
            raise Empty()  # a publish, or the wait's end: the next turn takes
        queues = self._taking
        bells = [bell_key(queue, self.sep) for queue in queues]
        if isinstance(refused, redis.exceptions.NoScriptError):  # a restarted Redis forgot it
            with self.conn_or_acquire() as client:
                client.script_load(TAKE)
            raise Empty()
        if refused is not None:
            # A full or read-only server refuses the take's record before
            # anything is taken; the next turn waits for a bell first rather
            # than asking again at once.
            log.warning("the broker refused to hand over a message (%s); trying again", refused)
            self._bells = (bells, ["$"] * len(bells))
            raise Empty()
        if int(reply[0]) == 0:
            self._bells = (bells, [bytes_to_str(entry) for entry in reply[1:]])
            raise Empty()  # the next turn waits for a bell
        return self._deliver_taken(int(reply[0]) - 1, reply[1], bool(int(reply[2])))

    def _deliver_taken(self, index: int, raw: bytes, recorded: bool) -> bool:
        queue = self._taking[index % len(self._taking)]
        try:
            payload = loads(bytes_to_str(raw))
            tag = payload["properties"]["delivery_tag"]
        except Exception:  # not a kombu message: kombu's BRPOP would have failed on it too
            log.error("dropped a message of queue %s that is not a kombu message: %.200r", queue, raw)
            raise Empty() from None
        if recorded:
            self.qos.taken.add(tag)
        self._queue_cycle.rotate(queue)
        try:
            self.connection._deliver(payload, queue)
        except Exception:
            if tag in self.qos.taken:  # it failed before the QoS saw it; kombu's own would have lost it
                self._drop_record(tag)
            raise
        finally:
            unseen = tag in self.qos.taken
            self.qos.taken.discard(tag)
        # Unseen by this QoS either because the consumer takes no acks (drop the
        # record: nothing will acknowledge it) or because no consumer took it and
        # kombu requeued it through another channel (which removed the record; the
        # record now there may be another worker's).
        if unseen and queue in self._no_ack_queues:
            self._drop_record(tag)
        return True

    def _drop_record(self, tag) -> None:
        try:
            self.qos._remove_from_indices(tag).execute()
        except self.connection_errors:  # left recorded: given back after a lease
            log.warning("could not drop the record of delivery %s", tag)


class Transport(kombu_redis.Transport):
    Channel = Channel


class SentinelChannel(Channel, kombu_redis.SentinelChannel):
    """This channel's take, bells and client, on the primary kombu's Sentinel channel finds.

    Everything of the take runs on one primary: the script and the record it
    writes are one step there. A failover moves the queues, the record and
    the bells to the new primary together, up to what the old one had not yet
    replicated (Redis replicates asynchronously): a take the old primary
    answered but did not pass on is taken again there (delivered twice, which
    a run lease joins into one call; workers/runs.py), and a publish it had
    not passed on is lost with it, as with kombu's own transport; so is what
    it accepts after the promotion until the Sentinel demotes it.
    """

    # kombu's Sentinel pool (a bounded wait is the plain channel's only).
    from_transport_options = kombu_redis.SentinelChannel.from_transport_options
    _get_pool = kombu_redis.SentinelChannel._get_pool


class SentinelTransport(kombu_redis.SentinelTransport):
    Channel = SentinelChannel


def takes_atomically(channel) -> bool:
    """Whether ``channel`` records each message it takes in the same step (this transport's)."""
    return isinstance(channel, Channel) and not channel.global_keyprefix


# --- messages a live worker holds -----------------------------------------------------------

def held_tags(channels) -> list:
    """Delivery tags the given channels hold unacknowledged (kombu's QoS record)."""
    tags: list = []
    for channel in channels:
        delivered = getattr(getattr(channel, "qos", None), "_delivered", None)
        if delivered:
            tags.extend(list(delivered))
    return tags


def refresh_held(channel, tags: list, now: float) -> int:
    """Mark ``tags`` as held now in the broker's unacknowledged index.

    kombu gives a message back to its queue once its index entry is older
    than the visibility timeout (``restore_visible``). A live worker moves its
    entries forward here, so the timeout no longer bounds how long a message
    may wait in a lane; a worker that dies stops moving them, and its
    messages return one message lease after its last refresh. ``XX``: an entry
    acknowledged (removed) meanwhile is never added back.
    """
    if not tags:
        return 0
    key = channel.unacked_index_key
    refreshed = 0
    # A client of its own from the channel's pool: ``channel.client`` is the
    # one that blocks on BRPOP for the consumer.
    with channel.conn_or_acquire() as client:
        for start in range(0, len(tags), 1_000):
            batch = tags[start:start + 1_000]
            refreshed += client.zadd(key, {tag: now for tag in batch}, xx=True, ch=True) or 0
    return refreshed


def restore_stale(channel, lease_seconds: float, now: float, limit: int = 1_000) -> int:
    """Give back to their queues the messages whose holder stopped refreshing
    them a lease ago (a dead worker's); how many were given back.

    kombu's own sweep (``restore_visible``) does not run in a worker of the
    gevent pool (no event loop); this is the same sweep, one message at a
    time through :func:`restore_if_stale`.
    """
    cutoff = now - lease_seconds
    with channel.conn_or_acquire() as client:
        stale = client.zrangebyscore(channel.unacked_index_key, "-inf", cutoff, start=0, num=limit)
        return sum(restore_if_stale(channel, client, bytes_to_str(tag), cutoff) for tag in stale)


def restore_if_stale(channel, client, tag: str, cutoff: float, attempts: int = 20) -> bool:
    """Put the message recorded under ``tag`` back in its queue if its index
    entry is still older than ``cutoff``; whether it was put back.

    kombu's ``restore_by_tag`` restores whatever the record holds by then. But
    every worker sweeps the one index, and a message keeps its delivery tag
    when it goes back: between one sweep's read of the stale tags and its
    restore, another sweep can give the message back and a live worker take it
    again under the same tag, fresh, and the restore then copied that live
    delivery into the queue (the same task twice in flight; the copy's
    acknowledgement later removed the live delivery's record). So the staleness
    is checked inside the transaction, which watches the record and the index:
    a take, restore, refresh or acknowledgement of the tag meanwhile makes it
    look again. Under heavy churn it gives up after ``attempts`` and leaves the
    message to the next sweep.
    """
    with client.pipeline() as pipe:
        for _ in range(attempts):
            try:
                pipe.watch(channel.unacked_key, channel.unacked_index_key)
                score = pipe.zscore(channel.unacked_index_key, tag)
                if score is None or score > cutoff:
                    return False
                payload = pipe.hget(channel.unacked_key, tag)
                pipe.multi()
                channel.qos._remove_from_indices(tag, pipe)
                if payload:
                    message, exchange, routing_key = loads(bytes_to_str(payload))
                    channel._do_restore_message(message, exchange, routing_key, pipe)
                pipe.execute()
                return payload is not None
            except redis.WatchError:
                continue
    return False


class HeldMessages(bootsteps.StartStopStep):
    """A consumer step of every Lanes worker app (:func:`lanes.celery_client.make_celery`):
    every third of the message lease (the transport's visibility timeout), it
    refreshes the unacknowledged-index entries of every message this worker holds."""

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, c, **kwargs) -> None:
        self._stop = threading.Event()
        options = c.app.conf.broker_transport_options or {}
        self.lease_seconds = float(options.get("visibility_timeout", 3600))
        super().__init__(c, **kwargs)

    def start(self, c) -> None:
        self._stop = threading.Event()
        threading.Thread(target=self._run, args=(c, self._stop), name="lanes-held-messages", daemon=True).start()

    @staticmethod
    def _channels(c) -> list:
        channels = [getattr(c.task_consumer, "channel", None)]
        background = c.blueprint.steps.get("workers.background.BackgroundConsumer")
        if background is not None and getattr(background, "consumer", None) is not None:
            channels.append(background.consumer.channel)
        return [channel for channel in channels if channel is not None]

    def _run(self, c, stop: threading.Event) -> None:
        while not stop.wait(self.lease_seconds / 3):
            try:
                channels = self._channels(c)
                if channels:
                    now = time.time()
                    refresh_held(channels[0], held_tags(channels), now)
                    restored = restore_stale(channels[0], self.lease_seconds, now)
                    if restored:
                        log.warning("gave %d message(s) of a worker that stopped back to their queues", restored)
            except Exception as exc:  # Redis away: the next turn tries again
                log.debug("held messages not refreshed: %s", exc)

    def stop(self, c) -> None:
        self._stop.set()

    def shutdown(self, c) -> None:
        self._stop.set()

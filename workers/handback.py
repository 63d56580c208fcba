"""Handing tasks back at shutdown, once this worker takes no more.

A warm shutdown cancels every lane wait at once, and a task delivered after
that moment is cancelled as it starts. Each is handed back to the front of
its queue. Celery keeps its consumers running until the worker's blueprint
stops them, so a task handed back in that window was taken again, at once,
by the same stopping worker (its BRPOP was already waiting on the queue),
cancelled again and handed back again, round and round until the consumers
stopped; the fault harness lost background tasks at the end of such loops
(left STARTED with two "cancelled" attempts and no message anywhere).

So a task handed back at shutdown first waits until this worker has stopped
taking work (:class:`StopTaking`, the first consumer step to stop), then goes
back to the front of its queue for the other workers of its fleet.

"Stopped taking" includes the BRPOPs already sent: cancelling a consumer
does not withdraw them, and for up to the transport's ``brpop_timeout`` the
server still pops the next message of the queue into this worker's socket,
where kombu reads it only when the connection closes, at the very end of the
warm shutdown (after every call in flight). A task handed back into such a
BRPOP, or a new one queued at that moment, was lost when the stopping worker
was then killed: the harness's tasks left PENDING with no trace. So the step
reads the reply of every BRPOP still pending before it says so (as kombu's
own channel close does first): a message it brings is requeued at once.
A reply that came but cannot be read (or whose message cannot be put back),
or one that does not come in time, may be a message gone from its queue
with no other trace: it is logged and counted
(``lanes_handback_possibly_lost_total``, by reason), never passed over.

On Lanes' own broker transport (every broker Lanes configures: ``redis://``,
``rediss://``, ``sentinel://``; lanes/broker.py) a pending command pops
nothing unrecorded: a take records the message it returns in kombu's unacked
record in the same step, and a wait on the bells takes nothing. Its reply is
still read (a message in it is requeued at once rather than one message
lease later), but one that cannot be read loses nothing, and nothing is
counted.

On kombu's two-step receive (a channel given kombu's ``global_keyprefix``
option, which Lanes never sets) the worker that takes a handed-back task can
itself die in the instant between popping the message and recording it in
kombu's unacked record: a message caught between the two steps is gone. So
there each hand-back also leaves a spare: a second unacked record of the
message, owned by no one, stamped so that kombu's visibility sweep restores
it after ``SPARE_FUSE_SECONDS``. If the task already ran, the spare's
delivery finds it ended and is dropped; if it still runs, the spare finds
its run lease taken and looks again later; only if the message was lost does
the spare run it. A hand-back costs one extra delivery there, never a second call.
"""

from __future__ import annotations

import logging
import selectors
import threading
import time
import uuid
from queue import Empty

from celery import bootsteps
from celery.worker import state as worker_state
from kombu.common import ignore_errors
from kombu.transport import virtual
from kombu.utils.json import dumps

from lanes.broker import takes_atomically
from lanes.instruments import handback_possibly_lost

from workers.background import BackgroundConsumer

log = logging.getLogger("lanes.worker")

# How long a task waits for its worker to stop taking work before it is
# requeued the ordinary way (well inside the supervisor's stop grace).
STOP_TAKING_WAIT_SECONDS = 20.0
# A hand-back's spare comes back after this (see the module's docstring).
SPARE_FUSE_SECONDS = 30.0
# Beyond the BRPOP timeout, for the server's empty reply to arrive.
BRPOP_MARGIN_SECONDS = 1.0


class StopTaking(bootsteps.StartStopStep):
    """Stops both consumers first when the worker stops, and says so.

    Requires the background consumer, so it starts after both consumers and
    stops before either: it cancels them itself (their own stops then find
    nothing to do) and sets the app's ``lanes_not_taking`` event.
    """

    requires = {BackgroundConsumer}

    def start(self, c) -> None:
        c.app.lanes_not_taking.clear()

    def stop(self, c) -> None:
        if c.task_consumer is not None:
            ignore_errors(c, c.task_consumer.cancel)
        background = c.blueprint.steps.get(BackgroundConsumer.name)
        channels = [getattr(c.task_consumer, "channel", None)]
        if background is not None:
            channels.append(getattr(background.consumer, "channel", None))
            background.stop(c)
        for channel in channels:
            finish_pending_brpop(channel)
        c.app.lanes_not_taking.set()

    def shutdown(self, c) -> None:
        if not c.app.lanes_not_taking.is_set():
            self.stop(c)


def finish_pending_brpop(channel) -> None:
    """Read the reply of the channel's pending BRPOP, if any.

    With its consumer cancelled, a message in that reply has no callback and
    kombu requeues it ("Requeuing undeliverable message"); an empty reply
    ends the BRPOP, and kombu sends no new one for a cancelled queue. The
    same private calls kombu's ``Channel.close`` makes, made earlier; the
    reply is read only once it has arrived (the server answers within
    ``brpop_timeout``), so a connection that went silent cannot hold the
    shutdown here.
    """
    if channel is None or not getattr(channel, "_in_poll", None):
        return
    try:
        sock = channel.client.connection._sock
    except Exception:  # the connection is gone: no BRPOP of it can pop anything now
        return
    if sock is None:
        return
    wait = (getattr(channel, "brpop_timeout", None) or 1) + BRPOP_MARGIN_SECONDS
    try:
        answered = _readable_within(sock, wait)
    except (OSError, ValueError):  # closed under us: nothing was read, nothing can be
        return
    if not answered:
        if takes_atomically(channel):  # whatever it takes is recorded: given back within a message lease
            return
        # Still pending: the server may pop a message into it yet, which only
        # kombu's own close would read (lost if this worker is killed first).
        _possibly_lost("reply_unanswered", f"no reply to a pending BRPOP within {wait:.1f} s")
        return
    try:
        channel._brpop_read()
    except Empty:
        pass  # the empty reply: nothing was popped
    except Exception as exc:
        if takes_atomically(channel):
            log.warning("a stopping worker's pending take could not be read (%r); what it took is "
                        "recorded and goes back to its queue within a message lease", exc)
            return
        # The reply had come, so the server may have popped a message into
        # it: a reply that cannot be read (or a message that cannot be put
        # back) may be a message gone from its queue with no other trace.
        _possibly_lost("reply_unread", f"the pending BRPOP's reply could not be read or requeued ({exc!r})")


def _readable_within(sock, seconds: float) -> bool:
    # A selector, not select.select: a worker holding many connections has
    # sockets numbered past select's limit of 1024, where select.select raises
    # ValueError and the pending reply would go unread and uncounted.
    with selectors.DefaultSelector() as selector:
        selector.register(sock, selectors.EVENT_READ)
        return bool(selector.select(seconds))


def _possibly_lost(reason: str, what: str) -> None:
    handback_possibly_lost(reason)
    log.warning("hand-back at shutdown may have lost a message: %s; its queue may be one short "
                "(lanes_handback_possibly_lost_total{reason=%r})", what, reason)


def hand_back_at_front(task_id: str, not_taking: threading.Event, *, wait: float = STOP_TAKING_WAIT_SECONDS) -> bool:
    """Put a task given up at shutdown back at the serving end of its queue.

    Celery's requeue (``Reject(requeue=True)``) pushes the message at the far
    end of the Redis list, behind every task queued since: an interactive task
    handed back by a restart would lose its place. kombu's own restore (what
    a closing channel does with unacknowledged messages) puts it back at the
    front. False when the worker did not stop taking work within ``wait``, or
    the message cannot be found or restored that way (the caller then requeues
    it the ordinary way).

    Once restored, the message is the queue's: the request is marked
    acknowledged here, so no acknowledgement follows the task's end. One did,
    and a message keeps its delivery tag across deliveries: when another
    worker of the fleet had taken it back in the meantime (it waits on the
    queue's bell and takes within a millisecond), that acknowledgement deleted
    the new holder's record, and if the new holder was stopped too, its own
    hand-back found nothing to restore (the fault harness's background tasks
    left STARTED with every attempt "cancelled" and no message anywhere).
    """
    if not not_taking.wait(wait):
        return False
    for request in tuple(worker_state.active_requests):
        if request.id != task_id:
            continue
        message = request.message
        restore = getattr(getattr(message.channel, "qos", None), "restore_by_tag", None)
        if restore is None:
            return False
        try:
            restore(message.delivery_tag, leftmost=False)
        except Exception:
            log.warning("could not hand %s back to the front of its queue", task_id, exc_info=True)
            return False
        # This channel's own bookkeeping ends as an acknowledgement's would
        # (its prefetch slot, its held tags); the broker's record is left alone.
        virtual.QoS.ack(message.channel.qos, message.delivery_tag)
        request.acknowledged = True
        if not takes_atomically(message.channel):
            leave_a_spare(message)
        return True
    return False


def keep_unacknowledged_when_cancelled(consumer) -> None:
    """Make the consumer's ``cancel_active_requests`` (Celery's cold shutdown)
    leave the messages it cancels unacknowledged.

    On the gevent pool Celery's cancel kills the task's green thread, and the
    pool reports a killed task as a success, so the message of a task cut off
    mid-call was acknowledged and gone; on the threads pool (which cannot
    kill a thread) it stayed unacknowledged. Left unacknowledged, the closing
    channel puts it back at the front of its queue, after it has read the
    reply of any BRPOP still pending (a message put back earlier could be
    popped into that reply by the server and lost with this worker), and the
    next worker takes it at once, not after the visibility timeout.
    """
    cancel = consumer.cancel_active_requests

    def cancel_keeping_messages() -> None:
        for request in tuple(worker_state.active_requests):
            if request.task.acks_late and not request.acknowledged:
                request._on_ack = _keep_message
        cancel()

    consumer.cancel_active_requests = cancel_keeping_messages


def _keep_message(*_args) -> None:
    """The acknowledgement of a task killed by a cold shutdown: none (see above)."""


def leave_a_spare(message, *, fuse: float = SPARE_FUSE_SECONDS) -> None:
    """Record ``message`` once more in kombu's unacked record, under a tag
    no consumer holds, due for the visibility sweep ``fuse`` seconds from now."""
    channel, delivery = message.channel, message.delivery_info
    qos = channel.qos
    record = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
    tag = str(uuid.uuid4())
    due = time.time() - qos.visibility_timeout + fuse
    try:
        with channel.conn_or_acquire() as client:
            client.pipeline().hset(qos.unacked_key, tag, record).zadd(qos.unacked_index_key, {tag: due}).execute()
    except Exception:  # the hand-back itself is done; only its insurance is missing
        log.warning("could not leave a spare of a handed-back message", exc_info=True)

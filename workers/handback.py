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

The worker that takes a handed-back task can itself die in the instant
between popping the message and recording it in kombu's unacked record (a
restart and a kill often come together): kombu's Redis transport pops and
records in two steps, and a message caught between them is gone. So each
hand-back also leaves a spare: a second unacked record of the message, owned
by no one, stamped so that kombu's visibility sweep restores it after
``SPARE_FUSE_SECONDS``. If the task already ran, the spare's delivery finds
it ended and is dropped; if it still runs, the spare finds its run lease
taken and looks again later; only if the message was lost does the spare run
it. A hand-back costs one extra delivery, never a second call.
"""

from __future__ import annotations

import logging
import select
import threading
import time
import uuid

from celery import bootsteps
from celery.worker import state as worker_state
from kombu.common import ignore_errors
from kombu.utils.json import dumps

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
        wait = (getattr(channel, "brpop_timeout", None) or 1) + BRPOP_MARGIN_SECONDS
        if sock is not None and select.select([sock], [], [], wait)[0]:
            channel._brpop_read()
    except Exception:  # Empty (nothing came) or the connection is gone: nothing pending either way
        pass


def hand_back_at_front(task_id: str, not_taking: threading.Event, *, wait: float = STOP_TAKING_WAIT_SECONDS) -> bool:
    """Put a task given up at shutdown back at the serving end of its queue.

    Celery's requeue (``Reject(requeue=True)``) pushes the message at the far
    end of the Redis list, behind every task queued since: an interactive task
    handed back by a restart would lose its place. kombu's own restore (what
    a closing channel does with unacknowledged messages) puts it back at the
    front; the acknowledgement that follows the task's end then finds nothing
    left to remove. False when the worker did not stop taking work within
    ``wait``, or the message cannot be found or restored that way (the caller
    then requeues it the ordinary way).
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
        leave_a_spare(message)
        return True
    return False


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

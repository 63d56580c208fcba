"""The fleet's background queue, consumed on a channel of its own.

A worker given both of a fleet's queues (``python -m workers.main`` with
both sets of threads; the supervisor runs a process per queue instead, see
workers/fleet.py) is one Celery worker process with two consumers over one
thread pool: Celery's own task consumer takes the foreground queue
(interactive and user-tool work), and :class:`BackgroundConsumer` takes the
background queue on a second channel whose prefetch limit is the number of
threads kept for background work. The pool has a thread for every message
the two may hold at once, so

- background work always has its threads, enough to hold every slot of the
  lane and park a waiter per slot, so a freed slot goes straight to the next
  background task (the lane's handoff) and the backend stays at its width;
- foreground work always has its own threads, at least one per lane slot,
  so any number of urgent requests up to the width reach the lane at once
  and go ahead of every parked background waiter there;
- the background queue is consumed steadily, one message per freed thread,
  so its messages keep their order (nothing is handed back to its tail).

This replaces a gate that stopped and restarted consuming the background
queue as its count crossed a limit (``cancel_task_queue`` /
``add_task_queue``) and rejected messages that slipped in (kombu puts a
rejected message back at the tail). Measured (docs/BENCHMARKS_JOURNAL.md):

- on the Redis transport a re-added queue is polled only once the BRPOP
  already pending for the other queue returns, up to ``brpop_timeout`` (1 s)
  later: each resume was followed by 0.5-1 s without a new background task
  while the lane's parked waiters drained in one service time;
- the switches were posted with ``call_soon``, which kombu's hub keeps in a
  set, so a pause and a resume posted in one loop turn ran in either order;
  resume-then-pause left the queue cancelled with the gate open, and no
  background task could ever start again on that worker.
"""

from __future__ import annotations

from dataclasses import dataclass

from celery import bootsteps
from kombu import Consumer
from kombu.common import ignore_errors


@dataclass(frozen=True)
class BackgroundQueue:
    """Which queue the background consumer takes, and how many threads it may hold."""

    name: str
    threads: int

    def __post_init__(self) -> None:
        if self.threads < 1:
            raise ValueError(f"background threads {self.threads} must be >= 1")


class BackgroundConsumer(bootsteps.StartStopStep):
    """Consumes the app's ``lanes_background`` queue beside Celery's task consumer.

    Messages go through Celery's own task handler, so a background task is
    received, acknowledged (late) and rejected exactly like a foreground one;
    only its channel, and so its prefetch limit, is its own.
    """

    requires = {"celery.worker.consumer.tasks:Tasks"}

    def __init__(self, c, **kwargs) -> None:
        self.queue: BackgroundQueue | None = getattr(c.app, "lanes_background", None)
        self.consumer: Consumer | None = None
        super().__init__(c, **kwargs)

    def start(self, c) -> None:
        if self.queue is None:
            return
        # The channel belongs to the consumer's connection, which closes it;
        # a reconnect runs start() again on the new connection.
        channel = c.connection.channel()
        # Delivered and not yet acknowledged (tasks ack late): at most one
        # message per background thread; the rest wait in the queue, in order.
        # A retry waiting out its countdown holds one of these until it runs
        # (Celery lends the foreground consumer one more meanwhile), so the
        # pool never has more work than threads.
        channel.basic_qos(prefetch_size=0, prefetch_count=self.queue.threads, apply_global=False)
        self.consumer = Consumer(
            channel,
            queues=[c.app.amqp.queues[self.queue.name]],
            on_message=c.create_task_handler(),
            accept=c.app.conf.accept_content,
        )
        self.consumer.consume()

    def pause(self) -> None:
        """Stop taking background messages (the memory gate); run on the consumer's loop."""
        if self.consumer is not None:
            self.consumer.cancel()

    def resume(self) -> None:
        """Take background messages again; run on the consumer's loop."""
        if self.consumer is not None:
            self.consumer.consume()

    def stop(self, c) -> None:
        if self.consumer is not None:
            ignore_errors(c, self.consumer.cancel)

    def shutdown(self, c) -> None:
        self.stop(c)
        self.consumer = None

    def info(self, c) -> dict:
        # Shown by `celery inspect stats` and on Flower's worker page.
        if self.queue is None:
            return {}
        return {"background": {"queue": self.queue.name, "threads": self.queue.threads}}

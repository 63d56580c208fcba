"""Celery's task consumer takes at most one message per thread kept for its queue.

Celery sizes its consumer's prefetch from the whole pool (``concurrency x
worker_prefetch_multiplier``). A worker that takes both of a fleet's queues
has a pool that also holds the background threads (workers/background.py),
so without this step a width-1 worker would take four urgent messages for
its two foreground threads: the two it cannot start are invisible to every
other worker, and lost for a whole visibility timeout when this one is
killed.

The limit is set as Celery's own starting prefetch count
(``consumer.initial_prefetch_count``), before the ``Tasks`` step opens the
consumer, so Celery's ``QoS`` object starts from it and its later moves
(one more while an ETA/countdown task waits, one less when it runs) stay
relative to it. Setting the channel's limit behind that object's back
(``qos.set`` after ``Tasks`` started) is undone by its next update, which
re-applies its own value: the whole pool again.
"""

from __future__ import annotations

from celery import bootsteps


class ConsumerPrefetch(bootsteps.StartStopStep):
    """Sets the task consumer's prefetch to the app's ``lanes_consumer_threads``."""

    requires = {"celery.worker.consumer.connection:Connection"}

    def __init__(self, c, **kwargs) -> None:
        threads = getattr(c.app, "lanes_consumer_threads", None)
        if threads is not None:
            # Read by the Tasks step when it opens the consumer, on every
            # (re)connect; with the prefetch reduction after a reconnect off
            # (see create_app), nothing resets it to the pool's size.
            c.initial_prefetch_count = threads * c.prefetch_multiplier
        super().__init__(c, **kwargs)

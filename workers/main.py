"""Run a fleet's Celery worker in this process (the supervisor's child).

    python -m workers.main --fleet aifarm-gpu0-dialog --foreground-threads 8
    python -m workers.main --fleet aifarm-gpu0-dialog --background-threads 8
    python -m workers.main --fleet aifarm-gpu0-dialog --foreground-threads 8 --background-threads 8

A process takes the fleet's queues whose threads are given. The supervisor
runs the two in processes of their own (workers/fleet.py says why); given
both, one process takes both queues over one thread pool: Celery's task
consumer the foreground queue, the background consumer
(workers/background.py) the background queue, each holding at most its own
threads.
"""

from __future__ import annotations

import argparse
import logging
import socket

from lanes.celery_client import fleet_queues
from lanes.settings import load_settings
from workers.app import create_app
from workers.background import BackgroundQueue


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workers.main")
    parser.add_argument("--fleet", required=True)
    parser.add_argument("--foreground-threads", type=int, default=None)
    parser.add_argument("--background-threads", type=int, default=None)
    parser.add_argument("--loglevel", default="WARNING")
    parser.add_argument("--hostname", default=None)
    args = parser.parse_args(argv)
    if args.foreground_threads is None and args.background_threads is None:
        parser.error("give --foreground-threads, --background-threads or both (the queues this process takes)")
    for name in ("foreground_threads", "background_threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} {value} must be >= 1")
    logging.basicConfig(level=args.loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if logging.getLevelName(args.loglevel) >= logging.WARNING:
        # Celery logs every rejected-and-requeued task at WARNING with a
        # traceback; for Lanes that is routine (a wait given up at shutdown
        # or at the wait cap), not a warning.
        logging.getLogger("celery.app.trace").setLevel(logging.ERROR)

    foreground, background = fleet_queues(args.fleet)
    if args.foreground_threads is None:
        # Background work alone: Celery's own consumer takes the background
        # queue, one message per thread, in order.
        app = create_app(load_settings(), consumer_threads=args.background_threads)
        queue, threads = background, args.background_threads
    else:
        extra = BackgroundQueue(background, args.background_threads) if args.background_threads else None
        app = create_app(load_settings(), background=extra, consumer_threads=args.foreground_threads)
        queue, threads = foreground, args.foreground_threads + (args.background_threads or 0)
    app.worker_main(
        [
            "--quiet",
            "worker",
            "--pool", "threads",
            # A thread for every message the consumers may hold at once.
            "--concurrency", str(threads),
            "--queues", queue,
            "--hostname", args.hostname or f"{args.fleet}@{socket.gethostname()}",
            "--loglevel", args.loglevel,
            "--task-events",
            "--without-gossip",
            "--without-mingle",
        ]
    )


if __name__ == "__main__":
    main()

"""Run one fleet's Celery worker in this process (the supervisor's child).

    python -m workers.main --fleet aifarm-gpu0-dialog --foreground-threads 8 --background-threads 8

One worker process, one thread pool of both sets: Celery's task consumer
takes the foreground queue, the background consumer (workers/background.py)
the background queue, each holding at most its own threads.
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
    parser.add_argument("--foreground-threads", type=int, required=True)
    parser.add_argument("--background-threads", type=int, required=True)
    parser.add_argument("--loglevel", default="WARNING")
    parser.add_argument("--hostname", default=None)
    args = parser.parse_args(argv)
    for name in ("foreground_threads", "background_threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)} must be >= 1")
    logging.basicConfig(level=args.loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if logging.getLevelName(args.loglevel) >= logging.WARNING:
        # Celery logs every rejected-and-requeued task at WARNING with a
        # traceback; for Lanes that is routine (a wait given up at shutdown
        # or at the wait cap), not a warning.
        logging.getLogger("celery.app.trace").setLevel(logging.ERROR)

    foreground, background = fleet_queues(args.fleet)
    app = create_app(load_settings(), background=BackgroundQueue(background, args.background_threads),
                     foreground_threads=args.foreground_threads)
    app.worker_main(
        [
            "--quiet",
            "worker",
            "--pool", "threads",
            # A thread for every message the two consumers may hold at once.
            "--concurrency", str(args.foreground_threads + args.background_threads),
            "--queues", foreground,
            "--hostname", args.hostname or f"{args.fleet}@{socket.gethostname()}",
            "--loglevel", args.loglevel,
            "--task-events",
            "--without-gossip",
            "--without-mingle",
        ]
    )


if __name__ == "__main__":
    main()

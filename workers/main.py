"""Run one fleet's Celery worker in this process (the supervisor's child).

    python -m workers.main --fleet aifarm-gpu0-dialog --concurrency 8 --background-limit 7
"""

from __future__ import annotations

import argparse
import logging
import socket

from lanes.celery_client import fleet_queues
from lanes.settings import load_settings
from workers.app import create_app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m workers.main")
    parser.add_argument("--fleet", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--background-limit", type=int, required=True)
    parser.add_argument("--loglevel", default="WARNING")
    parser.add_argument("--hostname", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if logging.getLevelName(args.loglevel) >= logging.WARNING:
        # Celery logs every rejected-and-requeued task at WARNING with a
        # traceback; for Lanes that is routine (a background message handed
        # back, a wait given up at shutdown), not a warning.
        logging.getLogger("celery.app.trace").setLevel(logging.ERROR)

    foreground, background = fleet_queues(args.fleet)
    app = create_app(load_settings(), background_limit=args.background_limit, background_queue=background)
    app.worker_main(
        [
            "--quiet",
            "worker",
            "--pool", "threads",
            "--concurrency", str(args.concurrency),
            "--queues", f"{foreground},{background}",
            "--hostname", args.hostname or f"{args.fleet}@{socket.gethostname()}",
            "--loglevel", args.loglevel,
            "--task-events",
            "--without-gossip",
            "--without-mingle",
        ]
    )


if __name__ == "__main__":
    main()

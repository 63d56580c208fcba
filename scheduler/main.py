"""Run the beat in this process (``lanes beat`` execs this).

    python -m scheduler.main [--loglevel INFO]
"""

from __future__ import annotations

import argparse
import logging
import sys

from lanes.errors import LanesError
from lanes.redis_conn import resolve_redis_url
from lanes.settings import load_settings
from scheduler.beat import LanesBeatScheduler, make_beat_app
from scheduler.jobs import SchedulerJobs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scheduler.main")
    parser.add_argument("--loglevel", default="INFO")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.loglevel, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings()
        redis_url = resolve_redis_url(settings)
        app = make_beat_app(settings, redis_url)
        app.lanes_settings = settings
        app.lanes_jobs = SchedulerJobs(settings, redis_url)
        if settings.metrics_port:
            # The beat's counts (memory runs it created) and the lane gauges.
            from lanes.metrics import install
            from lanes.metrics.exposition import serve

            install(settings)
            serve(settings.metrics_port, addr=settings.metrics_host)
    except LanesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        app.Beat(scheduler=LanesBeatScheduler, loglevel=args.loglevel, quiet=True).run()
    finally:
        app.lanes_jobs.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A plain Celery worker that calls the simulator directly: the routing
benchmarks' baseline. Same Celery settings as Lanes (JSON, acks_late,
prefetch 1), no lanes, no priorities, no routing.

    python bench/plain_worker.py --concurrency 4 --queue plain
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lanes.catalog import ModelInfo  # noqa: E402
from lanes.celery_client import make_celery  # noqa: E402
from lanes.redis_conn import resolve_redis_url  # noqa: E402
from lanes.routing.backend import BackendClient  # noqa: E402
from lanes.settings import load_settings  # noqa: E402

PLAIN_TASK = "bench.plain_call"


def create_app():
    settings = load_settings()
    app = make_celery(settings, resolve_redis_url(settings), main="plain", kombu_transport=True)  # plain Celery
    backend = BackendClient()

    @app.task(name=PLAIN_TASK, acks_late=True)
    def plain_call(base_url: str, model: str, payload: dict) -> dict:
        started = time.time()
        info = ModelInfo(name=model, base_url=base_url, kind="chat", pool=None, service=None,
                         timeout_seconds=120.0, api_key_env=None)
        backend.call(info, payload, timeout=120.0)
        return {"started_at": started}

    return app


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--queue", default="plain")
    args = parser.parse_args()
    create_app().worker_main([
        "--quiet", "worker", "--pool", "threads", "--concurrency", str(args.concurrency), "--queues", args.queue,
        "--hostname", f"plain-{args.queue}@%h", "--loglevel", "WARNING", "--without-gossip", "--without-mingle",
    ])


if __name__ == "__main__":
    main()

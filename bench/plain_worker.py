"""A plain Celery worker that calls the simulator directly: the routing
benchmarks' baseline. Same Celery settings as Lanes (JSON, acks_late,
prefetch 1), no lanes, no priorities, no routing.

    python bench/plain_worker.py --concurrency 4 --queue plain
    python bench/plain_worker.py --concurrency 2000 --queue plain --pool gevent

On the gevent pool (bench_waiting.py's in-flight baseline) it is plain Celery
tuned as a green worker must be: one result backend for the process (Celery's
default builds one per green thread) and broker and HTTP pools with room for
every task at once (kombu's pool of 10 refuses the rest).
"""

from __future__ import annotations

import sys

if __name__ == "__main__" and "gevent" in sys.argv:
    # Before anything imports socket, ssl or threading (as workers/main.py does).
    from gevent import monkey

    monkey.patch_all()

import argparse  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from lanes.catalog import ModelInfo  # noqa: E402
from lanes.celery_client import make_celery  # noqa: E402
from lanes.redis_conn import resolve_redis_url  # noqa: E402
from lanes.routing.backend import BackendClient  # noqa: E402
from lanes.settings import load_settings  # noqa: E402

PLAIN_TASK = "bench.plain_call"


def create_app(concurrency: int = 0, green: bool = False):
    settings = load_settings()
    app = make_celery(settings, resolve_redis_url(settings), main="plain", kombu_transport=True)  # plain Celery
    backend = BackendClient(max_connections=max(256, concurrency))
    if green:
        app.conf.result_backend_thread_safe = True
        app.conf.broker_transport_options = {**(app.conf.broker_transport_options or {}),
                                             "max_connections": concurrency + 64}

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
    parser.add_argument("--pool", default="threads", choices=["threads", "gevent"])
    args = parser.parse_args()
    create_app(args.concurrency, green=args.pool == "gevent").worker_main([
        "--quiet", "worker", "--pool", args.pool, "--concurrency", str(args.concurrency), "--queues", args.queue,
        "--hostname", f"plain-{args.queue}@%h", "--loglevel", "WARNING", "--without-gossip", "--without-mingle",
    ])


if __name__ == "__main__":
    main()

"""A fleet worker's connections are the process's, not each task's.

On the gevent pool a thread-local is a green thread's own, and every held
message is a green thread: whatever Celery or the runtime keeps per thread is
built again for every task. Real Celery app, real Redis, real runtime.
"""

from __future__ import annotations

import threading

from lanes.catalog import open_catalog
from lanes.celery_client import ROUTE_TASK
from lanes.routing.runtime import Runtime
from workers.app import create_app


def test_every_thread_of_the_worker_app_stores_results_through_one_backend(make_settings, one_redis_url):
    app = create_app(make_settings(redis_url=one_redis_url))
    task = app.tasks[ROUTE_TASK]
    # Built once (two threads asking first at the same moment may each build
    # one; the last is kept): then every thread gets that one.
    seen = [task.backend]
    threads = [threading.Thread(target=lambda: seen.append(task.backend)) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Celery's default builds a backend (and a Redis connection pool) per thread.
    assert len({id(backend) for backend in seen}) == 1, "a result backend per thread"
    app.close()


def test_the_runtime_sizes_its_connection_pools_to_the_walks_it_runs_at_once(make_settings, one_redis_url):
    settings = make_settings(redis_url=one_redis_url)
    held = Runtime(settings, redis_url=one_redis_url, engine=open_catalog(settings), calls_at_once=2000)
    plain = Runtime(settings, redis_url=one_redis_url, engine=open_catalog(settings))
    try:
        # One Redis connection and one HTTP connection per walk between grant and release.
        assert held.client.connection_pool.max_connections >= 2000
        assert held.backend.max_connections >= 2000
        # Without a count: redis-py's and the client's own defaults.
        assert plain.client.connection_pool.max_connections == 100
        assert plain.backend.max_connections == 256
    finally:
        held.close()
        plain.close()


def test_the_shared_result_backend_has_a_connection_for_every_held_message(make_settings, one_redis_url):
    app = create_app(make_settings(redis_url=one_redis_url), consumer_threads=2000)
    try:
        # redis-py's default of 100 refused the 101st task storing its state at once.
        assert app.backend.client.connection_pool.max_connections >= 2000
    finally:
        app.close()

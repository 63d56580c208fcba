"""A fleet worker's connections are the process's, not each task's, and bounded.

On the gevent pool a thread-local is a green thread's own, and every held
message is a green thread: whatever Celery or the runtime keeps per thread is
built again for every task. Real Celery app, real Redis, real runtime.
"""

from __future__ import annotations

import threading

import redis
from kombu.transport import redis as kombu_redis

from lanes.broker import SentinelChannel
from lanes.catalog import open_catalog
from lanes.celery_client import ROUTE_TASK
from lanes.lane._lua import SyncRunner
from lanes.redis_conn import SHARED_POOL_CONNECTIONS, connect
from lanes.routing.runtime import Runtime
from workers.app import create_app
from workers.main import green_transport


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


def names_connected(client: redis.Redis, name: str) -> int:
    return sum(1 for c in client.client_list() if c.get("name") == name)


def test_the_runtime_sizes_its_http_pool_to_the_walks_and_bounds_its_redis_pool(make_settings, one_redis_url):
    settings = make_settings(redis_url=one_redis_url)
    held = Runtime(settings, redis_url=one_redis_url, engine=open_catalog(settings), calls_at_once=2000)
    plain = Runtime(settings, redis_url=one_redis_url, engine=open_catalog(settings))
    try:
        # An HTTP connection per walk that may be calling at once.
        assert held.backend.max_connections >= 2000
        # Redis: a bounded pool whose callers wait past the bound, not one
        # connection per walk (thousands a process against Redis's maxclients).
        pool = held.client.connection_pool
        assert isinstance(pool, redis.BlockingConnectionPool)
        assert pool.max_connections == SHARED_POOL_CONNECTIONS
        # Without a count: redis-py's and the client's own defaults.
        assert plain.client.connection_pool.max_connections == 100
        assert plain.backend.max_connections == 256
    finally:
        held.close()
        plain.close()


def test_more_callers_than_the_bound_all_get_their_answer_on_at_most_the_bound_of_connections(one_redis_url):
    # Each caller holds its connection for a blocking command, so a pool that
    # opened one per caller would open 3x the bound.
    callers = 3 * SHARED_POOL_CONNECTIONS
    shared = connect(one_redis_url, timeout=10.0, shared_by=2000, client_name="lanes-bound-test")
    watcher = redis.Redis.from_url(one_redis_url)
    answers: list = []

    def call() -> None:
        answers.append(shared.blpop(["lanes-bound-test:nothing"], timeout=0.2))

    try:
        threads = [threading.Thread(target=call) for _ in range(callers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert answers == [None] * callers  # every call answered (the wait timed out at Redis, not at the pool)
        assert 0 < names_connected(watcher, "lanes-bound-test") <= SHARED_POOL_CONNECTIONS
        # The lane scripts' direct path runs on the bounded pool too.
        assert SyncRunner(shared, {}).__dict__["_pool"] is shared.connection_pool
    finally:
        shared.close()
        watcher.close()


def test_the_shared_result_backend_is_bounded_and_waits_for_a_connection(make_settings, one_redis_url):
    app = create_app(make_settings(redis_url=one_redis_url), consumer_threads=2000)
    try:
        pool = app.backend.client.connection_pool
        # redis-py's default of 100 refused the 101st task storing its state at
        # once; one per held message counted thousands against maxclients.
        assert isinstance(pool, redis.BlockingConnectionPool)
        assert pool.max_connections == SHARED_POOL_CONNECTIONS
        stored: list = []
        threads = [threading.Thread(target=lambda n=n: stored.append(
            app.backend.store_result(f"bound-{n}", {"n": n}, "SUCCESS"))) for n in range(300)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(stored) == 300
        assert app.backend.get_task_meta("bound-299")["result"] == {"n": 299}
    finally:
        app.close()


def test_a_green_workers_broker_channel_is_bounded_and_a_sentinel_channel_keeps_kombus_pool(make_settings,
                                                                                             one_redis_url):
    app = create_app(make_settings(redis_url=one_redis_url), consumer_threads=2000)
    green_transport(app, 2000, 5.0)
    try:
        with app.connection_for_write() as conn:
            pool = conn.default_channel.pool
            assert isinstance(pool, redis.BlockingConnectionPool)
            assert pool.max_connections == SHARED_POOL_CONNECTIONS
            assert pool.timeout == 5.0
    finally:
        app.close()
    # The Sentinel channel takes its pool from the sentinels, as kombu's does.
    assert SentinelChannel._get_pool is kombu_redis.SentinelChannel._get_pool
    assert "master_name" in SentinelChannel.from_transport_options

"""What each Redis role needs: the lanes no eviction (persistence allowed: they
detect a restart), the broker and results no eviction and an append-only file.
``lanes redis status`` checks each role on private redis-servers of the test's own."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import redis

from lanes import Lane, Priority
from lanes.embedded import EmbeddedRedis, free_port
from lanes.lane.hub import close_hubs


@pytest.fixture
def persistent_redis(tmp_path):
    server = EmbeddedRedis(tmp_path / "persistent", port=free_port(),
                           extra_args=("--appendonly", "yes", "--maxmemory-policy", "allkeys-lru"))
    server.ensure()
    client = redis.Redis.from_url(server.url)
    client.config_set("save", "60 1")  # the test's own server: snapshots as a broker Redis often does
    client.close()
    yield server
    server.stop()


def status(url: str, tmp_path, **roles: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, LANES_REDIS_URL=url, LANES_STATE_DIR=str(tmp_path / "state"))
    env.update({f"LANES_{name.upper()}": value for name, value in roles.items()})
    return subprocess.run([sys.executable, "-m", "lanes.cli", "redis", "status"], env=env,
                          capture_output=True, text=True, timeout=60)


def _line(result, name: str) -> str:
    return next(line for line in result.stdout.splitlines() if line.strip().startswith(name))


def test_redis_status_fails_an_evicting_redis_for_every_role(persistent_redis, tmp_path):
    result = status(persistent_redis.url, tmp_path)
    assert result.returncode == 1, result
    assert "UNSAFE" in _line(result, "maxmemory-policy (lanes)")
    assert "UNSAFE" in _line(result, "maxmemory-policy (broker and results)")
    # Persistence itself is what the broker and results need, and the lanes tolerate.
    assert "UNSAFE" not in _line(result, "persistence (lanes)")
    assert " ok:" in _line(result, "persistence (broker and results)")


def test_redis_status_fails_a_broker_and_results_without_persistence(private_redis, tmp_path):
    result = status(private_redis.url, tmp_path)
    assert result.returncode == 1, result
    line = _line(result, "persistence (broker and results)")
    assert "UNSAFE" in line and "appendonly yes" in line and "loses every queued task" in line
    assert " ok:" in _line(result, "maxmemory-policy (lanes)")


@pytest.mark.slow
def test_redis_status_passes_lanes_apart_from_a_persistent_broker_and_results(private_redis, tmp_path):
    durable = EmbeddedRedis(tmp_path / "durable", port=free_port())   # the embedded default: AOF, every second
    durable.ensure()
    try:
        result = status(private_redis.url, tmp_path, broker_url=durable.url, result_url=durable.url)
    finally:
        durable.stop()
    assert result.returncode == 0, result
    assert result.stdout.count("redis ") == 2, "two servers, each checked once"
    assert "lanes: redis" in result.stdout and "broker, results: redis" in result.stdout
    assert "appendfsync everysec" in _line(result, "persistence (broker and results)")
    assert "UNSAFE" not in result.stdout


def test_redis_status_says_when_redis_does_not_answer(tmp_path):
    result = status(f"redis://127.0.0.1:{free_port()}/0", tmp_path)
    assert result.returncode == 3 and "did not answer" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_lane_on_a_persistent_redis_warns_at_first_use(persistent_redis, caplog):
    client = redis.Redis.from_url(persistent_redis.url, socket_timeout=5)
    try:
        lane = Lane(client, "pool:persist", width=1)
        lane.provision()
        with caplog.at_level(logging.WARNING, logger="lanes.lane"):
            lane.acquire(Priority.INTERACTIVE, 1.0).release()
        messages = " ".join(record.message for record in caplog.records)
        # Only the eviction is unsafe for a lane; its persistence is detected at a restart.
        assert "maxmemory-policy" in messages and "appendonly" not in messages
    finally:
        close_hubs(client)
        client.close()

"""What the lanes' Redis must be: no persistence, no eviction. ``lanes redis
status`` checks it on a private redis-server of the test's own."""

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


def status(url: str, tmp_path) -> subprocess.CompletedProcess:
    env = dict(os.environ, LANES_REDIS_URL=url, LANES_STATE_DIR=str(tmp_path / "state"))
    return subprocess.run([sys.executable, "-m", "lanes.cli", "redis", "status"], env=env,
                          capture_output=True, text=True, timeout=60)


def test_redis_status_names_each_unsafe_setting_and_fails(persistent_redis, tmp_path):
    result = status(persistent_redis.url, tmp_path)
    assert result.returncode == 1, result
    for name in ("maxmemory-policy", "save", "appendonly"):
        line = next(line for line in result.stdout.splitlines() if line.strip().startswith(name))
        assert "UNSAFE" in line, line


def test_redis_status_passes_a_redis_without_persistence_or_eviction(private_redis, tmp_path):
    result = status(private_redis.url, tmp_path)
    assert result.returncode == 0, result
    assert "UNSAFE" not in result.stdout and result.stdout.count(": ok") == 0
    assert sum(" ok:" in line for line in result.stdout.splitlines()) == 3


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
        assert "save is" in messages and "appendonly is" in messages and "maxmemory-policy" in messages
    finally:
        close_hubs(client)
        client.close()

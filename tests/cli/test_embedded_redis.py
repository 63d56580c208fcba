"""Issue 10 point 4: the embedded Redis keeps its address, and only `lanes redis
start` starts it; workers find it again when it comes back."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
import redis

from lanes.embedded import EmbeddedRedis
from lanes.routing.client import LanesClient
from lanes.settings import Settings
from tests.cli.conftest import CHAT, apply, lanes, one_line_error, user_env
from tests.polling import eventually

pytestmark = pytest.mark.timeout(240)


def test_a_restarted_embedded_redis_comes_back_at_the_same_address(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis")
    first = server.ensure()
    try:
        assert server.stop()
        assert not server.is_running()
        assert server.url == first  # the address is the folder's, running or not
        assert server.ensure() == first
    finally:
        server.stop()


@pytest.mark.parametrize(("history", "args"), [
    ("never started", ["submit", "chat", "--payload", json.dumps(CHAT)]),
    ("never started", ["pools"]),
    ("never started", ["worker", "--fleet", "gpu"]),
    ("stopped", ["submit", "chat", "--payload", json.dumps(CHAT), "--wait"]),
    ("stopped", ["events"]),
    ("stopped", ["result", "0c2b4d1e-0000-4000-8000-000000000000"]),
])
@pytest.mark.slow
def test_reading_or_submitting_never_starts_the_embedded_redis(tmp_path, args, history):
    state = tmp_path / "state"
    env = user_env(tmp_path, LANES_STATE_DIR=str(state))
    apply(state, "http://127.0.0.1:9/v1")
    server = EmbeddedRedis(state / "redis")
    if history == "stopped":
        assert lanes("redis", "start", env=env).returncode == 0
        assert lanes("redis", "stop", env=env).stdout.strip() == "stopped"

    done = lanes(*args, env=env)

    assert done.returncode == 3, done.stdout + done.stderr
    error = one_line_error(done)
    assert "embedded Redis" in error and "not running" in error and "lanes redis start" in error
    assert not server.is_running() and server.pid() is None


@pytest.mark.slow
def test_a_worker_finds_the_embedded_redis_again_at_its_address(tmp_path, sim):
    from lanes.presence import WorkerPresence

    state = tmp_path / "state"
    env = user_env(tmp_path, LANES_STATE_DIR=str(state), LANES_LEASE_SECONDS="3")
    apply(state, sim.base_url)
    started = lanes("redis", "start", env=env)
    assert started.returncode == 0, started.stderr
    address = started.stdout.strip()
    worker = subprocess.Popen([sys.executable, "-m", "lanes.cli", "worker", "--fleet", "gpu"], env=env)
    try:
        assert lanes("pools", "provision", env=env).returncode == 0
        client = redis.Redis.from_url(address)
        eventually(lambda: WorkerPresence(client, prefix="lanes:v2").live("gpu"), timeout=60, what="the worker")

        assert lanes("redis", "stop", env=env).stdout.strip() == "stopped"
        restarted = lanes("redis", "start", env=env)
        assert restarted.stdout.strip() == address
        # A fresh server holds no lanes; nobody can hold a slot in it yet.
        assert lanes("pools", "provision", env=env).returncode == 0

        done = lanes("submit", "chat", "--payload", json.dumps(CHAT), "--wait", "--timeout", "120",
                     env=env, timeout=180)
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["state"] == "SUCCESS"
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
        EmbeddedRedis(state / "redis").stop()


def _stop_worker(worker: subprocess.Popen) -> None:
    worker.send_signal(signal.SIGTERM)
    try:
        worker.wait(60)
    except subprocess.TimeoutExpired:
        worker.kill()
        worker.wait(10)


@pytest.mark.timeout(900)
@pytest.mark.slow
def test_background_work_queued_before_a_restart_of_the_embedded_redis_is_all_answered(tmp_path, sim):
    """The reboot of the issue: 30 background tasks queued while no worker runs,
    the embedded Redis stopped and started, then a worker: every one answered
    (the embedded server keeps an append-only file; on bac1c88, 0 of 30)."""
    state = tmp_path / "state"
    env = user_env(tmp_path, LANES_STATE_DIR=str(state), LANES_LEASE_SECONDS="2")
    apply(state, sim.base_url)
    assert lanes("redis", "start", env=env).returncode == 0
    worker = None
    try:
        assert lanes("pools", "provision", env=env).returncode == 0
        ids = []
        for number in range(30):
            payload = {"messages": [{"role": "user", "content": f"note {number}"}]}
            done = lanes("submit", "chat", "--priority", "background", "--payload", json.dumps(payload), env=env)
            assert done.returncode == 0, done.stderr
            ids.append(done.stdout.strip())

        assert lanes("redis", "stop", env=env).stdout.strip() == "stopped"
        assert lanes("redis", "start", env=env).returncode == 0
        worker = subprocess.Popen([sys.executable, "-m", "lanes.cli", "worker", "--fleet", "gpu"], env=env)

        client = LanesClient(Settings(state_dir=state))
        try:
            answered = [(client.wait(task_id, 240) or {}).get("state") for task_id in ids]
        finally:
            client.close()
        assert answered.count("SUCCESS") == 30, answered
    finally:
        if worker is not None:
            _stop_worker(worker)
        EmbeddedRedis(state / "redis").stop()


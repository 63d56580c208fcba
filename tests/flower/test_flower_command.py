"""`lanes flower` refuses to serve Flower without a login unless told so,
refuses malformed logins naming the user (never the password), and lists
every lane queue of the catalog."""

from __future__ import annotations

import re
import signal
import subprocess
import sys

import httpx
import pytest

from lanes.catalog import apply_document, load_routing, open_catalog
from lanes.flower.config import FlowerConfig, lane_queues
from lanes.settings import Settings
from tests.cli.conftest import DOC, lanes, one_line_error, user_env


@pytest.fixture
def env(tmp_path, one_redis_url):
    state = tmp_path / "state"
    engine = open_catalog(Settings(state_dir=state))
    apply_document(engine, {**DOC, "models": [{**m, "base_url": "http://127.0.0.1:9/v1"} for m in DOC["models"]]})
    engine.dispose()
    return user_env(tmp_path, LANES_STATE_DIR=str(state), LANES_REDIS_URL=one_redis_url)


def test_flower_without_logins_is_refused_unless_no_auth_is_explicit(env):
    done = lanes("flower", "--port", "0", env=env, timeout=60)

    assert done.returncode == 2
    assert "LANES_FLOWER_BASIC_AUTH=user:password" in one_line_error(done) and "--no-auth" in done.stderr


def test_a_login_without_a_password_is_refused_naming_the_user_only(env):
    done = lanes("flower", env={**env, "LANES_FLOWER_BASIC_AUTH": "ops:fine-secret,viewer"}, timeout=60)

    assert done.returncode == 2
    line = one_line_error(done)
    assert "'viewer'" in line and "user:password" in line and "fine-secret" not in line


def test_no_auth_serves_flower_without_a_login(env):
    proc = subprocess.Popen([sys.executable, "-m", "lanes.cli", "flower", "--port", "0", "--no-auth"],
                            env=env, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "no login" in line and "5 lane queue(s)" in line, line
        port = re.search(r":(\d+)/", line).group(1)
        assert httpx.get(f"http://127.0.0.1:{port}/healthcheck", timeout=10).text == "OK"
        assert httpx.get(f"http://127.0.0.1:{port}/broker", timeout=10).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0


def test_every_fleets_queues_and_the_memory_queue_are_lane_queues(tmp_path):
    engine = open_catalog(Settings(state_dir=tmp_path))
    apply_document(engine, {**DOC, "models": [{**m, "base_url": "http://127.0.0.1:9/v1"} for m in DOC["models"]]})
    try:
        queues = lane_queues(load_routing(engine))
    finally:
        engine.dispose()

    assert queues == ["lanes.gpu", "lanes.gpu.background", "lanes.idle", "lanes.idle.background", "lanes.memory"]


def test_the_flower_config_never_prints_a_password():
    config = FlowerConfig(port=5555, address="127.0.0.1", logins=["ops:hunter2"])

    assert "hunter2" not in repr(config)
    assert config.tornado_options()["basic_auth"] == ["ops:hunter2"]


@pytest.mark.slow
def test_a_short_or_placeholder_password_is_refused_at_start_naming_the_user_only(env):
    for logins, words in (("ops:change-me", "shorter than 16"), ("ops:change-me-to-a-long-one", "'change-me'")):
        done = lanes("flower", "--port", "0", env={**env, "LANES_FLOWER_BASIC_AUTH": logins}, timeout=60)
        assert done.returncode == 2, done.stderr
        line = one_line_error(done)
        assert "'ops'" in line and words in line and logins.split(":")[1] not in line


@pytest.mark.slow
def test_flower_metrics_ask_for_the_login(env):
    login = "ops:q8Xv2LmT7rN4wKp9"
    proc = subprocess.Popen([sys.executable, "-m", "lanes.cli", "flower", "--port", "0"],
                            env={**env, "LANES_FLOWER_BASIC_AUTH": login}, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        port = re.search(r":(\d+)/", line).group(1)
        base = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{base}/metrics", timeout=10).status_code == 401
        assert httpx.get(f"{base}/metrics", auth=("ops", "wrong-password-1234"), timeout=10).status_code == 401
        served = httpx.get(f"{base}/metrics", auth=tuple(login.split(":")), timeout=10)
        assert served.status_code == 200 and "flower_" in served.text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(15) == 0

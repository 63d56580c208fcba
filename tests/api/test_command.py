"""`lanes api` as an operator runs it: a process of its own, serving on a port."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest

from lanes.catalog import apply_document, open_catalog
from lanes.embedded import free_port
from lanes.settings import Settings
from tests.api.conftest import TOKEN, fresh_document
from tests.polling import eventually

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def env(tmp_path, one_redis_url) -> dict:
    settings = Settings(state_dir=tmp_path / "state", redis_url=one_redis_url,
                        database_url=f"sqlite:///{tmp_path / 'catalog.db'}")
    engine = open_catalog(settings)
    apply_document(engine, fresh_document())
    engine.dispose()
    values = {k: v for k, v in os.environ.items() if not k.startswith("LANES_") or k.startswith("LANES_TEST_")}
    values.update(LANES_STATE_DIR=str(settings.state_dir), LANES_REDIS_URL=one_redis_url,
                  LANES_DATABASE_URL=settings.catalog_url())
    return values


def lanes(env, *args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lanes.cli", *args], env=env, capture_output=True, text=True,
                          timeout=60, **kwargs)


def serve(env, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "lanes.cli", "api", "--port", str(port), "--log-level", "warning"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def up():
        try:
            return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
        except httpx.TransportError:
            assert proc.poll() is None, proc.communicate()
            return False

    eventually(up, timeout=30, interval=0.1, what="lanes api to listen")
    return proc


def stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    _, err = proc.communicate(timeout=20)
    return err


def test_lanes_api_serves_what_the_cli_shows_and_takes_changes_with_the_token(env):
    port = free_port()
    proc = serve(env | {"LANES_API_TOKEN": TOKEN}, port)
    try:
        base = f"http://127.0.0.1:{port}"
        patched = httpx.patch(f"{base}/v1/pools/gpu-a", json={"width": 4},
                              headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert patched.status_code == 200, patched.text
        served = httpx.get(f"{base}/v1/pools", timeout=10).json()["pools"]
        shown = lanes(env, "pools", "--json")
        assert shown.returncode == 0, shown.stderr
        assert json.loads(shown.stdout) == served, "the CLI and the API report through the same function"
        assert {row["pool"]: row["width"] for row in served} == {"gpu-a": 4, "gpu-b": 3}
    finally:
        stop(proc)


def test_lanes_api_without_a_token_warns_and_refuses_changes(env):
    port = free_port()
    proc = serve(env, port)
    try:
        refused = httpx.patch(f"http://127.0.0.1:{port}/v1/pools/gpu-a", json={"width": 4},
                              headers={"Authorization": "Bearer anything"}, timeout=10)
        assert refused.status_code == 403
    finally:
        err = stop(proc)
    assert "LANES_API_TOKEN is not set" in err


def test_lanes_revoke_of_a_bad_id_is_one_line_and_exit_2(env):
    done = lanes(env, "revoke", " x")
    assert done.returncode == 2
    assert done.stderr.strip() == "error: task id ' x' is not a task id; pass the id `lanes submit` printed"


@pytest.mark.slow
def test_lanes_api_refuses_a_short_or_placeholder_token_at_start(env):
    for token, words in (("x", "1 characters long"), ("change-me-to-a-long-random-token", "'change-me'")):
        done = lanes(env | {"LANES_API_TOKEN": token}, "api", "--port", str(free_port()))
        assert done.returncode == 2, done.stderr
        assert "LANES_API_TOKEN" in done.stderr and words in done.stderr and "secrets.token_urlsafe" in done.stderr
        if len(token) > 1:
            assert token not in done.stderr
    weak_submit = lanes(env | {"LANES_API_TOKEN": TOKEN, "LANES_API_SUBMIT_TOKEN": "short"}, "api", "--port", "0")
    assert weak_submit.returncode == 2 and "LANES_API_SUBMIT_TOKEN" in weak_submit.stderr


def test_a_payload_file_over_the_cap_is_refused_while_it_is_read(env, tmp_path):
    big = tmp_path / "big.json"
    with open(big, "wb") as handle:
        handle.write(b'{"messages": "' + b"x" * 5_000_000 + b'"}')
    done = lanes(env | {"LANES_MAX_PAYLOAD_BYTES": "1024"}, "submit", "chat", "--payload", f"@{big}")
    assert done.returncode == 2, done.stderr
    assert "holds more than 69632 bytes" in done.stderr and "LANES_MAX_PAYLOAD_BYTES" in done.stderr

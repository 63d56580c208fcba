"""What a new user meets: the `lanes` command run as a user runs it.

Every test runs the real command in a process of its own, against a real
Redis (the embedded server, or the session's), a real SQLite catalog, the HTTP
simulator and real fleet workers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import redis

from lanes.catalog import apply_document, open_catalog
from lanes.settings import Settings

# This folder's tests use Redis database 6 of the session's embedded server.
DB = 6

CHAT = {"messages": [{"role": "user", "content": "hi"}]}

# One fleet with a worker in most tests ("gpu"), one that never has one ("idle").
DOC = {
    "pools": [{"name": "gpu", "width": 2, "ceiling": 8}, {"name": "idle", "width": 1}],
    "models": [
        {"name": "m", "base_url": "{sim}", "pool": "gpu"},
        {"name": "n", "base_url": "{sim}", "pool": "idle"},
    ],
    "workflows": [
        {"name": "chat", "candidates": ["m"]},
        {"name": "other", "candidates": ["m"]},
        {"name": "parked", "candidates": ["n"]},
    ],
}


def lanes(*args: str, env: dict, cwd: Path | None = None, input: str | None = None,
          timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lanes.cli", *args], env=env, cwd=cwd, input=input,
                          capture_output=True, text=True, timeout=timeout)


def user_env(tmp_path: Path, **variables: str) -> dict[str, str]:
    """The machine's environment without any LANES_* variable, a home of its own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANES_") and k != "XDG_STATE_HOME"}
    env["HOME"] = str(tmp_path / "home")
    env.update(variables)
    return env


def document(sim_base_url: str) -> dict:
    doc = json.loads(json.dumps(DOC))
    for model in doc["models"]:
        model["base_url"] = sim_base_url
    return doc


def apply(state_dir: Path, sim_base_url: str) -> None:
    engine = open_catalog(Settings(state_dir=state_dir))
    try:
        apply_document(engine, document(sim_base_url))
    finally:
        engine.dispose()


def one_line_error(done: subprocess.CompletedProcess) -> str:
    """stderr holds one `error:` line (warnings aside) and no traceback."""
    lines = [line for line in done.stderr.splitlines() if not line.startswith("warning: ")]
    assert "Traceback" not in done.stderr, done.stderr
    assert len(lines) == 1 and lines[0].startswith("error: "), done.stderr
    return lines[0]


def clean_db(embedded_redis) -> str:
    url = embedded_redis.url.rsplit("/", 1)[0] + f"/{DB}"
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    return url


@pytest.fixture
def sim():
    from lanes.sim import SimModel, Simulator

    server = Simulator([SimModel(name="m", capacity=8, service_ms=20.0), SimModel(name="n", capacity=8)],
                       host="127.0.0.1", port=0)
    server.start()
    yield server
    server.stop()

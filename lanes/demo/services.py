"""The demo's background services, each a process of its own: the beat, a memory worker, the HTTP API.

Started, never imported, from here (``lanes`` imports nothing of ``scheduler``
or ``workers``), with the demo's state folder and Redis, logging to the
state folder's ``logs/``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import redis

from lanes.embedded import free_port, port_free
from lanes.namespace import Namespace
from lanes.settings import Settings

API_PORT = 8000  # `lanes api`'s default


def start_beat(settings: Settings, redis_url: str) -> subprocess.Popen:
    """``lanes beat``: at start-up it runs a full memory scan and a lane-config check."""
    return _start(settings, redis_url, "beat", [sys.executable, "-m", "scheduler.main", "--loglevel", "INFO"])


def start_memory_worker(settings: Settings, redis_url: str) -> subprocess.Popen:
    return _start(settings, redis_url, "worker-memory",
                  [sys.executable, "-m", "workers.memory.worker", "--concurrency", "2"])


def api_port() -> tuple[int, int | None]:
    """(the port the API will use, the default it replaced or None)."""
    return (API_PORT, None) if port_free(API_PORT) else (free_port(), API_PORT)


def start_api(settings: Settings, redis_url: str, port: int) -> subprocess.Popen:
    """``lanes api`` on ``port`` (reads only: the demo sets no LANES_API_TOKEN of its own)."""
    return _start(settings, redis_url, "api", [sys.executable, "-m", "lanes.cli", "api", "--port", str(port),
                                               "--log-level", "warning"])


def wait_for_api(url: str, proc: subprocess.Popen, timeout: float = 60.0) -> bool:
    """Whether ``url``/healthz answered before ``timeout`` (False at once if the process ended)."""
    deadline = time.monotonic() + timeout
    with httpx.Client(timeout=2.0) as http:
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if http.get(url + "/healthz").status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
    return False


def api_pools(url: str) -> list[dict] | None:
    """``GET /v1/pools`` of the running API, or None when it did not answer."""
    try:
        answer = httpx.get(url + "/v1/pools", timeout=10.0)
        answer.raise_for_status()
        return answer.json()["pools"]
    except (httpx.HTTPError, KeyError, ValueError):
        return None


def beat_status(settings: Settings, redis_url: str) -> dict | None:
    """Who holds the beat lock and since when (the hash the active beat refreshes), or None."""
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    try:
        active = client.hgetall(Namespace(settings.key_prefix).beat_active)
    finally:
        client.close()
    return active or None


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(40)
    except subprocess.TimeoutExpired:
        proc.kill()


def _start(settings: Settings, redis_url: str, name: str, args: list[str]) -> subprocess.Popen:
    env = os.environ.copy()
    env["LANES_STATE_DIR"] = str(settings.state_dir)
    env["LANES_REDIS_URL"] = redis_url
    logs = settings.state_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    with open(logs / f"{name}.log", "ab") as log:
        return subprocess.Popen(args, env=env, stdout=log, stderr=subprocess.STDOUT)

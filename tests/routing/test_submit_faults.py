"""`submit` reports success exactly when the task is queued, whatever the
broker's connection does: a lost publish reply never makes an idempotency key
send a second task, TLS settings are taken in both spellings or refused before
anything is sent, and a waiter whose task's record is gone is told so.
Real Redis (a fault proxy in front of it, a private TLS server), real CLI."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from lanes.catalog import apply_document, open_catalog
from lanes.errors import RedisUnavailable, ResultLost
from lanes.routing.client import LanesClient
from lanes.settings import Settings
from tests.lane.faultproxy import FaultProxy

pytestmark = pytest.mark.timeout(240)

CHAT = {"messages": [{"role": "user", "content": "hi"}]}
DOC = {
    "pools": [{"name": "gpu", "width": 1}],
    "models": [{"name": "m", "base_url": "http://127.0.0.1:9/v1", "pool": "gpu"}],
    "workflows": [{"name": "chat", "candidates": ["m"]}],
}


def _catalog(state: Path) -> None:
    engine = open_catalog(Settings(state_dir=state))
    try:
        apply_document(engine, DOC)
    finally:
        engine.dispose()


def queued_task_ids(client: redis.Redis) -> list[str]:
    """The task id of every message in the gpu fleet's queues (every priority list)."""
    ids = []
    for key in client.scan_iter(match="lanes.gpu*"):
        if client.type(key) != b"list":
            continue
        for raw in client.lrange(key, 0, -1):
            ids.append(json.loads(raw)["headers"]["id"])
    return ids


def test_a_lost_publish_reply_never_makes_an_idempotency_key_send_a_second_task(one_redis_url, tmp_path):
    state = tmp_path / "state"
    _catalog(state)
    parts = urlsplit(one_redis_url)
    proxy = FaultProxy(parts.hostname, parts.port)
    db = int(parts.path.strip("/") or 0)
    direct = Settings(state_dir=state, redis_url=one_redis_url, idempotency_claim_seconds=1.0)
    # Only the broker's connection goes through the proxy; keys and results are reached directly.
    through_proxy = Settings(state_dir=state, redis_url=one_redis_url, broker_url=proxy.url(db),
                             redis_timeout_seconds=1.0, idempotency_claim_seconds=1.0)
    first = LanesClient(through_proxy)
    second = LanesClient(direct)
    inspect = redis.Redis.from_url(one_redis_url)
    try:
        # Every publish reaches Redis and runs; its reply never comes back.
        proxy.drop_reply_to(b"LPUSH", times=100)
        with pytest.raises(RedisUnavailable) as refused:
            first.submit("chat", CHAT, idempotency_key="order-7")
        message = str(refused.value)
        assert "could not confirm that task" in message and "same idempotency key" in message
        lost_id = message.split("could not confirm that task ", 1)[1].split()[0]
        assert set(queued_task_ids(inspect)) == {lost_id}, "the publish did go through"

        # The repeat after the claim period sends the same task, never a new one.
        time.sleep(1.2)
        again = second.submit("chat", CHAT, idempotency_key="order-7")
        assert again.id == lost_id
        third = second.submit("chat", CHAT, idempotency_key="order-7")
        assert third.id == lost_id
        assert set(queued_task_ids(inspect)) == {lost_id}, "one task id, however many copies"
    finally:
        first.close()
        second.close()
        inspect.close()
        proxy.close()


def test_a_waiter_whose_task_record_is_gone_is_told_so(one_redis_url, tmp_path):
    state = tmp_path / "state"
    _catalog(state)
    client = LanesClient(Settings(state_dir=state, redis_url=one_redis_url))
    admin = redis.Redis.from_url(one_redis_url)
    try:
        queued = client.submit("chat", CHAT)  # no worker: it stays queued
        assert client.wait(queued.id, 0.5) is None, "queued, not lost: --wait only gives up"
        admin.flushdb()  # what a restart of a Redis without persistence does
        with pytest.raises(ResultLost) as lost:
            client.wait(queued.id, 30)
        assert queued.id in str(lost.value) and "lost it" in str(lost.value)
    finally:
        client.close()
        admin.close()


# --- TLS ------------------------------------------------------------------------------


# tls_redis: tests/conftest.py


def _lanes(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lanes.cli", *args], env=env, capture_output=True, text=True,
                          timeout=120)


@pytest.mark.parametrize("spelling", ["CERT_REQUIRED", "required"])
def test_a_rediss_url_in_either_spelling_submits_once_and_says_so(tls_redis, tmp_path, spelling):
    port, ca, client = tls_redis
    state = tmp_path / "state"
    _catalog(state)
    url = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs={spelling}&ssl_ca_certs={ca}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANES_")}
    env.update(LANES_STATE_DIR=str(state), LANES_REDIS_URL=url, HOME=str(tmp_path))

    done = _lanes("submit", "chat", "--payload", json.dumps(CHAT), env=env)

    assert done.returncode == 0, done.stderr
    assert queued_task_ids(client) == [done.stdout.strip()]
    assert "Traceback" not in done.stderr


def test_an_unknown_certificate_requirement_is_refused_before_anything_is_sent(tls_redis, tmp_path):
    port, ca, client = tls_redis
    state = tmp_path / "state"
    _catalog(state)
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANES_")}
    env.update(LANES_STATE_DIR=str(state), HOME=str(tmp_path),
               LANES_REDIS_URL=f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=CERT_MAYBE&ssl_ca_certs={ca}")

    done = _lanes("submit", "chat", "--payload", json.dumps(CHAT), env=env)

    assert done.returncode == 2, done.stderr
    assert "CERT_MAYBE" in done.stderr and "CERT_REQUIRED" in done.stderr and "Traceback" not in done.stderr
    assert queued_task_ids(client) == []

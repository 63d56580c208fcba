"""Issue 10 point 7: idempotency keys bound to their request, a payload size
limit, results that keep no request, payloads from a file or stdin."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import redis

from lanes.sim import SimModel
from tests.cli.conftest import CHAT, DOC, clean_db, lanes, one_line_error
from tests.e2e.harness import deploy

# One test here is the feature's end-to-end path in the fast tier; the rest are slow.
pytestmark = [pytest.mark.timeout(240)]

OTHER = {"messages": [{"role": "user", "content": "something else"}]}


@pytest.fixture(scope="module")
def dep(tmp_path_factory, embedded_redis):
    # One deployment for the module: starting a fleet's worker is the slow part.
    deployment = deploy(tmp_path_factory.mktemp("dep"), clean_db(embedded_redis), json.loads(json.dumps(DOC)),
                        [SimModel(name="m", capacity=8, service_ms=20.0)], ["gpu"])
    yield deployment
    deployment.close()


def submit(dep, *args, env=None, **kwargs):
    return lanes("submit", *args, env=env or dep.env, **kwargs)


@pytest.mark.slow
def test_a_key_returns_its_task_for_the_same_request_and_refuses_another(dep):
    first = submit(dep, "chat", "--payload", json.dumps(CHAT), "--idempotency-key", "order-42")
    again = submit(dep, "chat", "--payload", json.dumps(CHAT, indent=1), "--idempotency-key", "order-42")
    assert first.returncode == again.returncode == 0, first.stderr + again.stderr
    assert first.stdout == again.stdout

    changed = submit(dep, "chat", "--payload", json.dumps(OTHER), "--idempotency-key", "order-42")

    assert changed.returncode == 2
    error = one_line_error(changed)
    assert "idempotency key 'order-42' of workflow 'chat' was used for a different request" in error
    assert first.stdout.strip() in error


@pytest.mark.slow
def test_keys_are_scoped_per_workflow(dep):
    chat = submit(dep, "chat", "--payload", json.dumps(CHAT), "--idempotency-key", "k1")
    other = submit(dep, "other", "--payload", json.dumps(CHAT), "--idempotency-key", "k1")
    assert chat.returncode == other.returncode == 0, chat.stderr + other.stderr
    assert chat.stdout.strip() != other.stdout.strip()
    assert json.loads(lanes("result", other.stdout.strip(), env=dep.env).stdout)["state"] != "FAILURE"


CRASHING_CLIENT = """
import os, sys, uuid
import redis
from lanes.routing.idempotency import IdempotencyKey, request_fingerprint
key = IdempotencyKey(redis.Redis.from_url(sys.argv[1]), prefix="lanes:v2", workflow="chat", key="crash-1",
                     claim_seconds=1.0, ttl_seconds=86400)
task_id = str(uuid.uuid4())
payload = {"messages": [{"role": "user", "content": "hi"}]}
key.claim(task_id, request_fingerprint("chat", payload, "interactive"))
print(task_id, flush=True)
os._exit(1)  # dies after binding the key and before sending the task
"""


@pytest.mark.slow
def test_a_key_bound_by_a_client_that_died_before_sending_is_sent_once_by_the_next_submit(dep):
    crashed = subprocess.run([sys.executable, "-c", CRASHING_CLIENT, dep.redis_url], capture_output=True,
                             text=True, timeout=60)
    never_sent = crashed.stdout.strip()
    assert crashed.returncode == 1 and never_sent, crashed.stderr

    env = {**dep.env, "LANES_IDEMPOTENCY_CLAIM_SECONDS": "1"}
    done = submit(dep, "chat", "--payload", json.dumps(CHAT), "--idempotency-key", "crash-1", "--wait",
                  "--timeout", "60", env=env, timeout=120)

    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    # The next submit sends the task the key was bound to (a copy of it, had the dead
    # client's publish gone through, would be joined with it by the run lease).
    assert report["state"] == "SUCCESS" and report["task_id"] == never_sent
    repeat = submit(dep, "chat", "--payload", json.dumps(CHAT), "--idempotency-key", "crash-1")
    assert repeat.stdout.strip() == report["task_id"]


@pytest.mark.slow
def test_a_payload_over_the_size_limit_is_refused_before_anything_is_sent(dep):
    big = {"messages": [{"role": "user", "content": "x" * 3000}]}
    env = {**dep.env, "LANES_MAX_PAYLOAD_BYTES": "2048"}

    done = submit(dep, "chat", "--payload", json.dumps(big), "--idempotency-key", "big-1", env=env)

    assert done.returncode == 2
    error = one_line_error(done)
    assert "over the limit of 2048 bytes" in error and "LANES_MAX_PAYLOAD_BYTES" in error
    client = redis.Redis.from_url(dep.redis_url)
    assert not list(client.scan_iter(match="*big-1*"))  # not even the key was bound
    assert submit(dep, "chat", "--payload", json.dumps(CHAT), env=env).returncode == 0


@pytest.mark.end_to_end
def test_a_result_keeps_the_answer_but_not_the_request(dep):
    secret = "my-bank-pin-is-4242"
    done = submit(dep, "chat", "--payload", json.dumps({"messages": [{"role": "user", "content": secret}]}),
                  "--wait", "--timeout", "60", timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["state"] == "SUCCESS"

    client = redis.Redis.from_url(dep.redis_url)
    holding = [key for key in client.scan_iter() if secret.encode() in _dump(client, key)]
    assert holding == []


def _dump(client: redis.Redis, key: bytes) -> bytes:
    kind = client.type(key).decode()
    if kind == "string":
        return client.get(key) or b""
    if kind == "hash":
        return b" ".join(k + b"=" + v for k, v in client.hgetall(key).items())
    if kind == "list":
        return b" ".join(client.lrange(key, 0, -1))
    if kind == "set":
        return b" ".join(client.smembers(key))
    if kind == "zset":
        return b" ".join(client.zrange(key, 0, -1))
    if kind == "stream":
        return b" ".join(json.dumps(str(entry)).encode() for entry in client.xrange(key))
    return b""


@pytest.mark.slow
def test_a_payload_is_read_from_a_file_or_from_stdin(dep, tmp_path):
    request = tmp_path / "request.json"
    request.write_text(json.dumps(CHAT))
    from_file = submit(dep, "chat", "--payload", f"@{request}", "--wait", "--timeout", "60", timeout=120)
    from_stdin = submit(dep, "chat", "--payload", "-", "--wait", "--timeout", "60", input=json.dumps(CHAT),
                        timeout=120)
    for done in (from_file, from_stdin):
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["state"] == "SUCCESS"

    missing = submit(dep, "chat", "--payload", f"@{tmp_path / 'nope.json'}")
    assert missing.returncode == 2 and "nope.json" in one_line_error(missing)

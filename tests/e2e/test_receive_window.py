"""A fleet worker killed the instant it receives a task loses nothing, on either pool.

kombu's Redis transport popped a message (BRPOP) and recorded it as
unacknowledged with a second command; a worker SIGKILLed between the two lost
that task for good (the chaos runs and the soak each saw it). Lanes' broker
takes and records in one script (lanes/broker.py). Here a real fleet worker,
under its supervisor, dies in that instant: a ``sitecustomize`` on the
workers' path SIGKILLs the process when kombu builds the delivered message of
the first routed task, before its QoS sees it. The task must still be
answered, once: given back one message lease later by a live worker (the
restarted one, or the fleet's background process). Real Redis, Celery
workers and the simulator.
"""

from __future__ import annotations

import json
import os

import pytest
import redis

from lanes.sim import SimModel
from tests.e2e.harness import deploy
from tests.e2e.test_routing_e2e import CHAT
from tests.polling import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

DOCUMENT = {
    "pools": [{"name": "dialog", "width": 2}],
    "models": [{"name": "primary", "base_url": "{sim}", "pool": "dialog", "timeout_ms": 20000}],
    "workflows": [{"name": "dialog", "priority": "interactive", "candidates": ["primary"]}],
}

KILL_ON_RECEIPT = '''
import os
import signal

from kombu.transport.virtual import base

_build = base.Message.__init__


def _killed_on_receipt(self, payload, channel=None, **kwargs):
    if (payload.get("headers") or {}).get("task") == "lanes.route":
        try:  # once across the restarts: the first process to take a routed task
            os.close(os.open(os.environ["LANES_E2E_KILL_FLAG"], os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            pass
        else:
            os.kill(os.getpid(), signal.SIGKILL)
    _build(self, payload, channel=channel, **kwargs)


base.Message.__init__ = _killed_on_receipt
'''


@pytest.mark.parametrize("pool", ["threads", "gevent"])
def test_a_worker_killed_as_it_receives_a_task_loses_nothing(tmp_path, embedded_redis, pool):
    url = embedded_redis.url.rsplit("/", 1)[0] + "/13"
    redis.Redis.from_url(url).flushdb()
    _killed_on_receipt_answers_once(tmp_path, url, pool)


@pytest.mark.parametrize("pool", ["threads", "gevent"])
@pytest.mark.parametrize("scheme", ["rediss", "sentinel"])
def test_a_worker_killed_as_it_receives_a_task_from_a_tls_or_sentinel_broker_loses_nothing(
        tmp_path, embedded_redis, request, scheme, pool):
    """The same on a broker that ran kombu's own transport before (docs/OPERATING.md)."""
    url = embedded_redis.url.rsplit("/", 1)[0] + "/13"
    redis.Redis.from_url(url).flushdb()
    if scheme == "rediss":
        port, ca, _ = request.getfixturevalue("tls_redis")
        broker = f"rediss://127.0.0.1:{port}/0?ssl_cert_reqs=required&ssl_ca_certs={ca}"
    else:
        broker, _ = request.getfixturevalue("sentinel_redis")
    _killed_on_receipt_answers_once(tmp_path, url, pool, broker_url=broker)


def _killed_on_receipt_answers_once(tmp_path, url: str, pool: str, **settings) -> None:
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(KILL_ON_RECEIPT)
    flag = tmp_path / "killed"
    broker = {"LANES_BROKER_URL": settings["broker_url"]} if "broker_url" in settings else {}
    dep = deploy(
        tmp_path / "state", url, json.loads(json.dumps(DOCUMENT)),
        [SimModel(name="primary", capacity=2, service_ms=50.0)], ["dialog"], lease_seconds=3.0, fleet_pool=pool,
        extra_env={"PYTHONPATH": os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")])),
                   "LANES_E2E_KILL_FLAG": str(flag),
                   # Given back this long after its holder's last refresh.
                   "LANES_MESSAGE_LEASE_SECONDS": "6", **broker},
        **settings,
    )
    try:
        result = dep.client.submit("dialog", CHAT)
        eventually(flag.exists, timeout=120, what="a worker killed as it received the task")
        result.get(timeout=180, propagate=False)
        report = dep.client.result(result.id)
        assert report["state"] == "SUCCESS", report
        assert [call["task_id"] for call in dep.sim.calls()] == [result.id]  # called once
    finally:
        dep.close()

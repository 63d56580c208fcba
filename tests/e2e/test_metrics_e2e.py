"""A fleet worker's /metrics, scraped over HTTP: a real Redis, a supervised
Celery worker (``lanes worker``'s supervisor and its child, in multiprocess
mode), the HTTP simulator. The text is parsed with prometheus_client's parser.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from lanes.catalog.pools import set_pool_width
from lanes.embedded import free_port
from lanes.sim import SimModel
from tests.e2e.harness import deploy
from tests.metrics.names import exposed, used_names

# One test here is the feature's end-to-end path in the fast tier; the rest are slow.
pytestmark = [pytest.mark.timeout(240)]

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}

DOCUMENT = {
    "pools": [{"name": "gpu-x", "width": 2, "ceiling": 6}],
    "models": [{"name": "x", "base_url": "{sim}", "pool": "gpu-x"}],
    "workflows": [{"name": "talk", "priority": "interactive", "candidates": ["x"]}],
}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, embedded_redis):
    url = embedded_redis.url.rsplit("/", 1)[0] + "/4"
    redis.Redis.from_url(url).flushdb()
    port = free_port()
    deployment = deploy(tmp_path_factory.mktemp("metrics"), url, json.loads(json.dumps(DOCUMENT)),
                        [SimModel(name="x", capacity=8, service_ms=30.0)], ["gpu-x"],
                        extra_env={"LANES_METRICS_PORT": str(port)})
    deployment.metrics_url = f"http://127.0.0.1:{port}/metrics"
    yield deployment
    deployment.close()


def scrape(url: str) -> tuple[str, dict[str, dict[tuple, float]]]:
    text = httpx.get(url, timeout=10).text
    samples: dict[str, dict[tuple, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return text, samples


def until(probe, *, timeout: float):
    """``probe()`` once it stops failing (an assertion, or the port not serving yet)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return probe()
        except (AssertionError, httpx.HTTPError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def one(samples, name, **labels) -> float:
    return samples.get(name, {}).get(tuple(sorted(labels.items())), 0.0)


def run(fleet, count: int) -> None:
    results = [fleet.client.submit("talk", CHAT) for _ in range(count)]
    for result in results:
        assert result.get(timeout=60)["model"] == "x"


@pytest.mark.slow
def test_a_fleet_worker_serves_its_counts_and_the_lanes_and_keeps_counting_across_a_restart(fleet):
    fleet.sim.reset()
    run(fleet, 12)
    calls = sum(1 for call in fleet.sim.calls() if call["model"] == "x")
    assert calls == 12

    def counted():
        text, samples = scrape(fleet.metrics_url)
        assert one(samples, "lanes_backend_requests_total", pool="gpu-x", model="x", status_class="2xx") == calls
        return text, samples

    text, samples = until(counted, timeout=10)
    assert one(samples, "lanes_lane_wait_seconds_count", pool="gpu-x", priority="interactive") == calls
    assert one(samples, "lanes_lane_hold_seconds_count", pool="gpu-x") == calls
    assert one(samples, "lanes_first_token_seconds_count", pool="gpu-x", model="x") == calls
    # The lane, read from Redis: the width it admits, the catalog's, nothing held once all is done.
    assert one(samples, "lanes_lane_width", pool="gpu-x") == 2
    assert one(samples, "lanes_lane_configured_width", pool="gpu-x") == 2
    assert one(samples, "lanes_lane_in_flight", pool="gpu-x") == 0
    assert one(samples, "lanes_lane_queued", pool="gpu-x", priority="interactive") == 0
    assert one(samples, "lanes_lane_grants_total", pool="gpu-x") >= calls
    assert one(samples, "lanes_breaker_state", model="x") == 0
    assert one(samples, "lanes_memory_gate_engaged") == 0
    # Every series the dashboard and the alert rules use is offered by a running worker.
    missing = used_names() - exposed(text)
    assert not missing, sorted(missing)

    # A catalog change resizes the fleet: the supervisor replaces its worker
    # child. The port stays, and the old child's counts stay in the sums.
    children = set(fleet.worker_children("gpu-x"))
    set_pool_width(fleet.client.engine, "gpu-x", 3)
    def replaced():
        now = set(fleet.worker_children("gpu-x"))
        assert now and now.isdisjoint(children)

    until(replaced, timeout=120)
    fleet.wait_for_workers(["gpu-x"])
    run(fleet, 5)

    def recounted():
        _, samples = scrape(fleet.metrics_url)
        assert one(samples, "lanes_backend_requests_total", pool="gpu-x", model="x", status_class="2xx") == 17
        assert one(samples, "lanes_lane_width", pool="gpu-x") == 3
        return samples

    samples = until(recounted, timeout=20)
    assert one(samples, "lanes_width_changes_total", pool="gpu-x", controller="configured", direction="up") >= 1


@pytest.mark.end_to_end
def test_a_worker_run_without_its_supervisor_serves_its_own_registry(fleet):
    port = free_port()
    env = {**fleet.env, "LANES_METRICS_PORT": str(port)}
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    child = subprocess.Popen(
        [sys.executable, "-m", "workers.main", "--fleet", "gpu-x", "--foreground", "1",
         "--background", "1", "--hostname", f"standalone-{os.getpid()}@test"], env=env)
    try:
        def scraped():
            return scrape(f"http://127.0.0.1:{port}/metrics")

        text, samples = until(scraped, timeout=60)
        assert one(samples, "lanes_lane_configured_width", pool="gpu-x") >= 2
        assert not used_names() - exposed(text)
    finally:
        child.terminate()
        child.wait(30)

"""The supervisor's exposition: children's values summed from their files
(prometheus-client's multiprocess mode), every family named before any child
wrote, a dead child's live gauges dropped, a port in use refused by number."""

from __future__ import annotations

import socket
import subprocess
import sys

import httpx
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from lanes.catalog import RoutingTable
from lanes.errors import InvalidInput
from lanes.metrics.collector import LaneCollector
from lanes.metrics.exposition import SupervisedExposition, serve
from lanes.settings import Settings

CHILD = """
import os, sys
from lanes.metrics import instruments
m = instruments()
m.backend_requests_total.labels("p", "m", "2xx").inc(int(sys.argv[1]))
m.memory_gate_engaged.set(int(sys.argv[2]))
print(os.getpid())
"""


def samples(url: str) -> dict[tuple, float]:
    text = httpx.get(url, timeout=10).text
    found = {}
    for family in text_string_to_metric_families(text):
        found[(family.name, "family")] = 0.0
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


@pytest.fixture
def exposition(tmp_path):
    empty = RoutingTable(version=0, workflows={}, pools={}, models={})
    gone = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2, socket_timeout=0.2)
    collector = LaneCollector(Settings(state_dir=tmp_path), gone, lambda: empty)
    exposed = SupervisedExposition(0, collector, addr="127.0.0.1")
    yield exposed
    exposed.close()


def child(exposition, count: int, engaged: int) -> int:
    env = {"PATH": "/usr/bin:/bin", **exposition.child_env()}
    out = subprocess.run([sys.executable, "-c", CHILD, str(count), str(engaged)], env=env, check=True,
                         capture_output=True, text=True).stdout
    return int(out)


def test_every_family_is_named_before_any_child_wrote(exposition):
    found = samples(f"http://127.0.0.1:{exposition.port}/metrics")
    for name in ("lanes_backend_requests", "lanes_retries", "lanes_lane_wait_seconds", "lanes_memory_gate_engaged",
                 "lanes_lane_width", "lanes_breaker_state"):
        assert (name, "family") in found, name


@pytest.mark.slow
def test_childrens_counts_are_summed_and_a_dead_childs_gauge_is_dropped(exposition):
    url = f"http://127.0.0.1:{exposition.port}/metrics"
    first = child(exposition, 3, 1)
    child(exposition, 4, 0)
    found = samples(url)
    key = ("lanes_backend_requests_total", (("model", "m"), ("pool", "p"), ("status_class", "2xx")))
    assert found[key] == 7
    assert found[("lanes_memory_gate_engaged", ())] == 1  # livemax over the children
    exposition.child_exited(first)
    found = samples(url)
    assert found[key] == 7  # a replaced child's counts stay in the sums
    assert found[("lanes_memory_gate_engaged", ())] == 0


def test_a_port_in_use_is_refused_with_its_number_and_the_fix():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(InvalidInput, match=rf"port {port} .*LANES_METRICS_PORT"):
            serve(port, addr="127.0.0.1")

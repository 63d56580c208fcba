"""Every path that changes a width reaches the live lane, whichever worker runs (issue 10.1).

Real parts: a supervised fleet worker (restarted by its supervisor when the
catalog changes the fleet's size), the HTTP simulator counting the requests
it holds at once, the CLI as an operator runs it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis

from lanes.sim import SimModel
from tests.e2e.harness import deploy
from tests.polling import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CHAT = {"messages": [{"role": "user", "content": "x"}]}


def document(width: int, controller=None) -> dict:
    return {
        "pools": [{"name": "gpu", "width": width, "ceiling": 8, "controller": controller or {"kind": "off"}}],
        "models": [{"name": "m", "base_url": "{sim}", "pool": "gpu"}],
        "workflows": [{"name": "chat", "candidates": ["m"]}],
    }


@pytest.fixture
def dep(tmp_path, embedded_redis):
    url = embedded_redis.url.rsplit("/", 1)[0] + "/7"
    redis.Redis.from_url(url).flushdb()
    deployment = deploy(tmp_path, url, document(4), [SimModel(name="m", capacity=16, per_token_ms=25.0, tokens=10)], ["gpu"])
    yield deployment
    deployment.close()


def lanes_cli(dep, *args):
    return subprocess.run([sys.executable, "-m", "lanes.cli", *args], env=dep.env, capture_output=True,
                          text=True, timeout=60)


def apply_width(dep, tmp_path, width: int) -> None:
    doc = document(width)
    doc["models"][0]["base_url"] = dep.sim.base_url
    path = tmp_path / f"catalog-{width}.yaml"
    path.write_text(json.dumps(doc))  # JSON is YAML
    done = lanes_cli(dep, "catalog", "apply", str(path))
    assert done.returncode == 0, done.stderr


def peak_concurrency(dep, requests: int = 12) -> int:
    """Send a burst through the workers; the most requests the simulator held at once."""
    dep.sim.reset()
    with ThreadPoolExecutor(requests) as pool:
        results = list(pool.map(lambda _: dep.client.submit("chat", CHAT, deadline=60).get(timeout=90),
                                range(requests)))
    assert all(r["model"] == "m" for r in results)
    return dep.sim.stats()["m"]["max_in_flight"]


def test_a_width_applied_from_a_catalog_file_reaches_the_live_lane_and_the_backend(dep, tmp_path):
    assert peak_concurrency(dep) == 4

    apply_width(dep, tmp_path, 2)
    # The supervisor restarts the worker for the new fleet size; the new
    # worker brings the lane to the catalog's width without any task arriving.
    eventually(lambda: dep.lane("gpu").stats().width == 2, timeout=60, what="lane width 2")
    dep.wait_for_workers(["gpu"])
    assert peak_concurrency(dep) == 2

    apply_width(dep, tmp_path, 4)
    eventually(lambda: dep.lane("gpu").stats().width == 4, timeout=60, what="lane width 4")
    dep.wait_for_workers(["gpu"])
    assert peak_concurrency(dep) == 4


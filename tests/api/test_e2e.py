"""The API over a real socket: uvicorn, a real worker fleet, the HTTP simulator, Redis.

Submit and watch a task, revoke one waiting in its lane, resize a live lane.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest
import redis

from lanes.api import create_app
from lanes.priority import Priority
from lanes.settings import Settings
from lanes.sim import SimModel
from tests.api.conftest import AUTH, CHAT, TOKEN, Served
from tests.e2e.harness import deploy
from tests.polling import eventually

# The fast tier's end-to-end path of the HTTP API: one deployment for the module.
pytestmark = pytest.mark.timeout(180)

DB = 8  # this module's database on the session's embedded Redis

DOCUMENT = {
    "pools": [{"name": "gpu-d", "width": 1, "ceiling": 4}, {"name": "gpu-p", "width": 2, "ceiling": 6}],
    "models": [
        {"name": "d", "base_url": "{sim}", "pool": "gpu-d"},
        {"name": "p", "base_url": "{sim}", "pool": "gpu-p"},
    ],
    "workflows": [
        {"name": "chat", "priority": "interactive", "candidates": ["d"]},
        {"name": "spare", "priority": "background", "candidates": ["p"]},
    ],
}


@pytest.fixture(scope="module")
def stack(tmp_path_factory, embedded_redis):
    url = embedded_redis.url.rsplit("/", 1)[0] + f"/{DB}"
    redis.Redis.from_url(url).flushdb()
    dep = deploy(tmp_path_factory.mktemp("api"), url, copy.deepcopy(DOCUMENT),
                 [SimModel(name="d", capacity=8, service_ms=50.0), SimModel(name="p", capacity=8, service_ms=50.0)],
                 ["gpu-d"])
    served = Served(create_app(Settings(**(dep.settings.model_dump() | {"api_token": TOKEN}))))
    http = httpx.Client(base_url=served.url, timeout=30)
    try:
        yield dep, http
    finally:
        http.close()
        served.stop()
        dep.close()


def watch(http, task_id: str, *, until=("SUCCESS", "FAILURE", "REVOKED"), timeout: float = 60) -> dict:
    """Poll GET /v1/tasks/{id} as a client in any language would."""
    def finished():
        report = http.get(f"/v1/tasks/{task_id}").json()
        done = report["state"] in until and (report["state"] != "SUCCESS" or report["attempts"])
        return report if done else None

    return eventually(finished, timeout=timeout, interval=0.1, what=f"task {task_id} to finish")


def test_work_submitted_over_http_completes_with_its_routing_trace(stack):
    dep, http = stack
    answer = http.post("/v1/tasks", json={"workflow": "chat", "payload": CHAT, "deadline": 30,
                                          "priority": "user_tool"}, headers=AUTH)
    assert answer.status_code == 202, answer.text
    submitted = answer.json()
    assert submitted["fleet"] == "gpu-d" and "warning" not in submitted
    report = watch(http, submitted["task_id"])
    assert report["state"] == "SUCCESS"
    assert report["result"]["model"] == "d"
    steps = [step for attempt in report["attempts"] for step in attempt["steps"]]
    assert [(s["model"], s["action"]) for s in steps] == [("d", "served")]
    assert report == dep.client.result(submitted["task_id"]), "the API reports what `lanes result` does"
    # Workers flush their events every 100 ms.
    waits = eventually(lambda: http.get("/v1/events", params={"kind": "lane_wait", "pool": "gpu-d"}).json()["events"],
                       timeout=10, interval=0.1, what="the lane admission's event")
    assert waits[0]["workflow"] == "chat"


def test_an_idempotency_key_returns_the_first_task(stack):
    _, http = stack
    body = {"workflow": "chat", "payload": CHAT, "idempotency_key": "order-42"}
    first = http.post("/v1/tasks", json=body, headers=AUTH).json()["task_id"]
    again = http.post("/v1/tasks", json=body, headers=AUTH).json()["task_id"]
    assert first == again
    assert watch(http, first)["state"] == "SUCCESS"


def test_a_revoke_over_http_cancels_the_lane_wait_and_leaks_nothing(stack):
    dep, http = stack
    lane = dep.lane("gpu-d")
    hold = lane.acquire(Priority.INTERACTIVE, timeout=5)  # the lane's only slot
    try:
        task_id = http.post("/v1/tasks", json={"workflow": "chat", "payload": CHAT, "deadline": 60},
                            headers=AUTH).json()["task_id"]
        eventually(lambda: lane.stats().queued[Priority.INTERACTIVE] == 1, timeout=20, interval=0.05,
                   what="the task to wait in its lane")
        pool = http.get("/v1/pools/gpu-d").json()
        assert (pool["in_flight"], pool["queued"]["interactive"], pool["utilisation"]) == (1, 1, 1.0)
        revoked = http.delete(f"/v1/tasks/{task_id}", headers=AUTH)
        assert revoked.status_code == 202
        assert revoked.json()["task_id"] == task_id
        assert watch(http, task_id, until=("REVOKED",), timeout=20)["state"] == "REVOKED"
        eventually(lambda: lane.stats().queued[Priority.INTERACTIVE] == 0, timeout=20, interval=0.05,
                   what="the wait to leave the queue")
    finally:
        hold.release()
    stats = lane.stats()
    assert (stats.in_flight, stats.queued_total) == (0, 0)
    assert stats.cancels >= 1
    pool = http.get("/v1/pools/gpu-d").json()
    assert (pool["in_flight"], sum(pool["queued"].values())) == (0, 0)


def test_a_width_patch_over_http_reaches_the_live_lane_at_once(stack):
    dep, http = stack
    lane = dep.lane("gpu-p")
    assert lane.stats().width == 2
    answer = http.patch("/v1/pools/gpu-p", json={"width": 5}, headers=AUTH)
    assert answer.status_code == 200, answer.text
    assert lane.stats().width == 5, "resized through the width authority before the answer"
    assert dep.table().pools["gpu-p"].width == 5
    listed = {row["pool"]: row for row in http.get("/v1/pools").json()["pools"]}
    assert (listed["gpu-p"]["configured_width"], listed["gpu-p"]["width"]) == (5, 5)
    assert listed["gpu-d"]["live_workers"], "the fleet's worker is listed"
    permits = [lane.acquire(Priority.BACKGROUND, timeout=5) for _ in range(5)]
    try:
        assert lane.stats().in_flight == 5, "five slots are really there"
    finally:
        for permit in permits:
            permit.release()
    assert http.patch("/v1/pools/gpu-p", json={"width": 2}, headers=AUTH).json()["pool"]["width"] == 2
    assert lane.stats().width == 2


def test_the_api_docs_curl_example_submits_and_watches_a_task(stack):
    """docs/API.md's block as written, but for this stack's server, token and workflow."""
    _, http = stack
    doc = (Path(__file__).parents[2] / "docs" / "API.md").read_text()
    assert doc.startswith("# The HTTP API\n"), "docs/API.md is the HTTP API's page"
    block = doc.split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if not line.startswith(("export LANES_API_TOKEN", "lanes api"))]
    script = "\n".join(lines).replace("http://127.0.0.1:8000", str(http.base_url).rstrip("/"))
    done = subprocess.run(["bash", "-e", "-c", script.replace('"workflow": "dialog"', '"workflow": "chat"')],
                          env=os.environ | {"LANES_API_TOKEN": TOKEN}, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["state"] == "SUCCESS" and report["result"]["model"] == "d"


def test_concurrent_submits_share_one_client_safely_and_all_complete(stack):
    """Handlers run on uvicorn's thread pool over one LanesClient."""
    from concurrent.futures import ThreadPoolExecutor

    _, http = stack
    url = str(http.base_url).rstrip("/")

    def submit(i: int) -> str:
        with httpx.Client(base_url=url, timeout=30) as own:
            answer = own.post("/v1/tasks", json={"workflow": "chat", "payload": CHAT, "deadline": 60}, headers=AUTH)
            assert answer.status_code == 202, answer.text
            return answer.json()["task_id"]

    with ThreadPoolExecutor(8) as pool:
        ids = list(pool.map(submit, range(16)))
    assert len(set(ids)) == 16
    assert all(watch(http, task_id)["state"] == "SUCCESS" for task_id in ids)

"""Lanes in Flower, seen in a real browser: a fleet's worker, `lanes flower`
with a login, work through the HTTP simulator, and headless Chromium reading
the Broker page, a task's page, the task list and the worker's page."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import httpx
import pytest

from lanes.priority import Priority
from lanes.sim import SimModel
from tests.cli.conftest import DOC
from tests.e2e.harness import deploy
from tests.flower.browser import artifacts_dir, chromium
from tests.polling import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

LOGIN = ("ops", "s3cret-words-9f2Kq7")
CHAT = {"messages": [{"role": "user", "content": "private prompt text"}]}

# DOC: "gpu" (width 2) has a worker; "idle" never does, so its backlog only
# shows because Lanes' Flower lists every lane queue.


def start_flower(env: dict) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "lanes.cli", "flower", "--port", "0"],
        env={**env, "LANES_FLOWER_BASIC_AUTH": ":".join(LOGIN)}, stdout=subprocess.PIPE, text=True,
    )
    line = proc.stdout.readline()
    found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    if not found:
        proc.kill()
        raise AssertionError(f"lanes flower did not start: {line!r}")
    return proc, f"http://127.0.0.1:{found.group(1)}"


def page_text(driver, url: str, *, contains: list[str], timeout: float = 30.0) -> str:
    """The page's text once it shows every string of ``contains`` (reloading meanwhile)."""
    def probe():
        driver.get(url)
        text = driver.find_element("tag name", "body").text
        return text if all(piece in text for piece in contains) else None
    return eventually(probe, timeout=timeout, interval=1.0, what=f"{contains} on {url}")


def full_page_shot(driver, path) -> None:
    """The whole page (its last rows, the Lane ones, included)."""
    driver.set_window_size(1400, driver.execute_script("return document.body.scrollHeight") + 200)
    driver.save_screenshot(str(path))
    driver.set_window_size(1400, 1000)


def test_lanes_show_in_flower_in_a_real_browser(tmp_path, one_redis_url):
    dep = deploy(tmp_path / "state", one_redis_url, json.loads(json.dumps(DOC)),
                 [SimModel(name="m", capacity=8, service_ms=400.0), SimModel(name="n", capacity=8)], ["gpu"])
    flower = driver = None
    shots = artifacts_dir()
    try:
        flower, base = start_flower(dep.env)
        auth = httpx.BasicAuth(*LOGIN)
        assert httpx.get(base + "/broker", timeout=10).status_code == 401  # a login is required
        eventually(lambda: httpx.get(base + "/workers?json=1", auth=auth, timeout=10).status_code == 200,
                   timeout=30, interval=0.5, what="Flower answering")
        # Flower reads events from its start on: once a first task shows, it sees them all.
        first = dep.client.submit("chat", CHAT).id
        eventually(lambda: first in httpx.get(base + "/api/tasks", auth=auth, timeout=10).json(),
                   timeout=60, interval=0.5, what="Flower reading task events")

        # Six interactive requests on a lane of width 2: four of them wait for a slot.
        results = [dep.client.submit("chat", CHAT, priority="interactive", deadline=120) for _ in range(6)]
        parked = [dep.client.submit("parked", CHAT, priority="background").id for _ in range(3)]
        for result in results:
            result.get(timeout=120)
        waits = {r.id: max(step.get("wait_ms") or 0 for run in dep.client.traces.load(r.id) for step in run["steps"])
                 for r in results}
        waited = max(waits, key=waits.get)
        assert waits[waited] > 100  # it queued behind two 400 ms calls

        driver = chromium(tmp_path / "chromium-profile", login=LOGIN)

        broker = page_text(driver, base + "/broker", contains=["lanes.gpu", "lanes.gpu.background", "lanes.idle.background"])
        driver.save_screenshot(str(shots / "broker.png"))
        rows = {cells[0]: cells[1:] for cells in (
            [td.text for td in row.find_elements("tag name", "td")]
            for row in driver.find_elements("css selector", "table tbody tr")) if cells}
        assert rows["lanes.idle.background"][0] == str(len(parked)), broker  # a backlog nobody consumes
        assert rows["lanes.gpu"][0] == "0" and "lanes.memory" in rows

        task = page_text(driver, f"{base}/task/{waited}", contains=["Lane", "admitted to lane gpu", "SUCCESS"])
        # The whole page, its Lane line (the last one) included.
        driver.set_window_size(1400, driver.execute_script("return document.body.scrollHeight") + 200)
        driver.save_screenshot(str(shots / "task.png"))
        driver.set_window_size(1400, 1000)
        shown_wait = re.search(r"admitted to lane gpu after (\d+) ms \(interactive\); model m: served", task)
        assert shown_wait and abs(int(shown_wait.group(1)) - waits[waited]) <= 1, task
        assert "'workflow': 'chat'" in task and "'priority': 'interactive'" in task and "'pool': 'gpu'" in task
        assert "'deadline': '20" in task  # an ISO time, UTC
        assert "private prompt text" not in task  # the request itself never reaches Flower

        listing = page_text(driver, base + "/tasks", contains=[waited[:8], "'workflow': 'chat'"])
        driver.save_screenshot(str(shots / "tasks.png"))
        assert "private prompt text" not in listing

        # The Lanes page: every pool of the catalog, with a worker or not.
        lanes = page_text(driver, base + "/lanes", contains=["gpu", "idle", "no live worker"])
        driver.save_screenshot(str(shots / "lanes.png"))
        cells = {row.get_attribute("id"): [td.text for td in row.find_elements("tag name", "td")]
                 for row in driver.find_elements("css selector", "#lanes-table tbody tr")}
        gpu, idle = cells["lane-gpu"], cells["lane-idle"]
        assert gpu[1] == "2" and gpu[2] == "off" and gpu[3] == "0" and gpu[4] == "0 / 0 / 0", gpu
        assert idle[5] == f"0 / 0 / {len(parked)}", idle  # waiting in the broker, per priority
        assert idle[7] == "no live worker" and gpu[7].strip() not in ("", "-", "no live worker"), lanes
        interactive = re.search(r"interactive: (\d+) / (\d+) \((\d+)\)", gpu[6])
        assert interactive and int(interactive.group(3)) >= len(results), gpu[6]
        assert int(interactive.group(2)) >= int(interactive.group(1)) and int(interactive.group(2)) >= 100
        assert "Lanes" in driver.find_element("css selector", "nav").text

        hostname = next(name for reply in dep.client.celery.control.ping(timeout=2.0) for name in reply)
        worker_page = page_text(driver, f"{base}/worker/{hostname}", contains=["Other"])
        # The fleet sizes its worker from the lane: Flower's pool actions are not offered.
        for action in ("Grow", "Shrink", "Autoscale", "Restart Pool"):
            assert action not in worker_page and action not in driver.page_source, action
        driver.find_element("id", "worker-tab-other").click()
        other = eventually(lambda: (t := driver.find_element("id", "tab-other").text) and "lanes" in t and t,
                           timeout=10, interval=0.2, what="the worker's Other tab")
        driver.save_screenshot(str(shots / "worker.png"))
        assert "'gpu': {'width': 2" in other and "'in_flight': 0" in other and "'controller': 'off'" in other
        assert "interactive 0 / user_tool 0 / background 0" in other

        # A waiter revoked through Lanes shows REVOKED, without its Terminate button.
        dep.sim.configure("m", hang_next=2, hang_s=30.0)
        holders = [dep.client.submit("chat", CHAT, priority="interactive", deadline=100) for _ in range(2)]
        eventually(lambda: dep.lane("gpu").stats().in_flight == 2, timeout=60, interval=0.2, what="two holders")
        waiter = dep.client.submit("chat", CHAT, priority="interactive", deadline=100).id
        eventually(lambda: dep.lane("gpu").stats().queued.get(Priority.INTERACTIVE, 0) == 1, timeout=60,
                   interval=0.2, what="the third request waiting in its lane")
        # The task page tells a task waiting in its lane from one calling its model.
        waiting = page_text(driver, f"{base}/task/{waiter}", contains=["Lane now", "waiting in lane gpu since"])
        full_page_shot(driver, shots / "waiting.png")
        assert "calling model" not in waiting, waiting
        calling = page_text(driver, f"{base}/task/{holders[0].id}", contains=["calling model m (lane gpu) since"])
        full_page_shot(driver, shots / "calling.png")
        assert "waiting in lane" not in calling, calling
        dep.client.revoke(waiter)
        page = page_text(driver, f"{base}/task/{waiter}", contains=["REVOKED"], timeout=60)
        full_page_shot(driver, shots / "revoked.png")
        assert "Terminate" not in page and "Lane now" not in page, page
        del holders
    finally:
        if driver is not None:
            driver.quit()
        if flower is not None:
            flower.terminate()
            flower.wait(15)
        dep.close()

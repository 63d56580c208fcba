"""Fleet restarts, forced stops and renames with real workers, Redis and the simulator.

Each test runs its own deployment on a private Redis server (so nothing here
touches another test's queues); assertions are about states and call counts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import redis

from lanes import Priority
from lanes.catalog import apply_document
from lanes.embedded import EmbeddedRedis
from lanes.sim import SimModel
from tests.e2e.harness import deploy
from tests.polling import eventually
from workers.supervisor import FleetSupervisor

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}


@pytest.fixture(scope="module")
def private_redis(tmp_path_factory):
    server = EmbeddedRedis(tmp_path_factory.mktemp("fleet-redis"))
    url = server.ensure()
    yield url
    server.stop()


@pytest.fixture
def launch(tmp_path, private_redis):
    made = []

    def start(document, sim_models, fleets, **settings):
        redis.Redis.from_url(private_redis).flushdb()
        settings.setdefault("visibility_timeout_seconds", 600)
        dep = deploy(tmp_path / f"d{len(made)}", private_redis, json.loads(json.dumps(document)),
                     sim_models, fleets, **settings)
        made.append(dep)
        return dep

    yield start
    for dep in made:
        dep.close()


def calls_of(dep, task_id: str) -> list[str]:
    return [c["model"] for c in dep.sim.calls() if c["task_id"] == task_id]


def state(dep, task_id: str) -> str:
    return dep.client.celery.AsyncResult(task_id).state


RESTART_DOC = {
    "pools": [{"name": "gpu", "width": 2}],
    "models": [
        {"name": "slow", "base_url": "{sim}", "pool": "gpu", "timeout_ms": 45_000},
        {"name": "quick", "base_url": "{sim}", "pool": "gpu", "timeout_ms": 10_000},
    ],
    "workflows": [
        {"name": "long", "priority": "interactive", "candidates": ["slow"]},
        {"name": "short", "priority": "interactive", "candidates": ["quick"]},
    ],
}


def test_a_restart_lets_a_call_longer_than_30s_finish_while_the_new_worker_already_serves(launch):
    dep = launch(RESTART_DOC, [SimModel(name="slow", capacity=4, service_ms=33_000.0),
                               SimModel(name="quick", capacity=4, service_ms=20.0)], ["gpu"])
    long = dep.client.submit("long", CHAT)
    eventually(lambda: dep.sim.stats()["slow"]["in_flight"] == 1, timeout=30, what="the long call to start")
    old_workers = set(dep.worker_children("gpu"))
    assert len(old_workers) == 2  # a fleet's foreground and background processes

    wider = json.loads(json.dumps(RESTART_DOC))
    wider["pools"][0]["width"] = 3
    for model in wider["models"]:
        model["base_url"] = dep.sim.base_url
    apply_document(dep.client.engine, wider)

    # The new worker starts (and answers) while the old one still finishes its call.
    eventually(lambda: len(dep.worker_children("gpu")) == 4, timeout=60, what="a second worker beside the old")
    short = dep.client.submit("short", CHAT)
    assert short.get(timeout=60)["model"] == "quick"
    assert dep.sim.stats()["slow"]["in_flight"] == 1  # the long call is still running, untouched

    assert long.get(timeout=90)["model"] == "slow"
    assert calls_of(dep, long.id) == ["slow"]  # called once, never cut and called again
    eventually(lambda: not old_workers & set(dep.worker_children("gpu")), timeout=30, what="the old worker to exit")


MIXED_DOC = {
    "pools": [{"name": "gpu", "width": 2}],
    "models": [{"name": "m", "base_url": "{sim}", "pool": "gpu", "timeout_ms": 10_000}],
    "workflows": [
        {"name": "chat", "priority": "interactive", "candidates": ["m"]},
        {"name": "bg", "priority": "background", "candidates": ["m"]},
    ],
}


def children_by_queue(dep, fleet: str) -> dict[str, int]:
    """The fleet's worker processes by the queue set they were started for."""
    found = {}
    for pid in dep.worker_children(fleet):
        try:
            args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except FileNotFoundError:
            continue  # it exited (was reaped) since it was listed
        if args == [b""]:
            continue  # a zombie: dead, not yet reaped
        found["foreground" if b"--foreground" in args else "background"] = pid
    return found


def test_a_fleet_runs_a_process_per_queue_and_restarts_only_the_one_that_died(launch):
    dep = launch(MIXED_DOC, [SimModel(name="m", capacity=4, service_ms=20.0)], ["gpu"])
    first = eventually(lambda: (c := children_by_queue(dep, "gpu")) and len(c) == 2 and c, timeout=30,
                       what="the fleet's two worker processes")
    assert dep.client.submit("bg", CHAT).get(timeout=60)["model"] == "m"

    os.kill(first["background"], signal.SIGKILL)
    # Urgent work is served meanwhile by the untouched foreground process.
    assert dep.client.submit("chat", CHAT).get(timeout=60)["model"] == "m"
    later = eventually(lambda: (c := children_by_queue(dep, "gpu")).get("background") not in (None, first["background"])
                       and c, timeout=60, what="a new background process")
    assert later["foreground"] == first["foreground"]
    assert dep.client.submit("bg", CHAT).get(timeout=60)["model"] == "m"


def test_a_worker_stopped_by_force_hands_its_unacked_message_back_at_once(launch, private_redis):
    dep = launch(RESTART_DOC, [SimModel(name="slow", capacity=4, service_ms=20_000.0),
                               SimModel(name="quick", capacity=4, service_ms=20.0)], ["gpu"])
    dep.stop_worker("gpu")  # a bare worker, so nothing consumes the message once handed back
    worker = subprocess.Popen(
        [sys.executable, "-m", "workers.main", "--fleet", "gpu", "--foreground", "2", "--background", "1"],
        env=dep.env,
    )
    try:
        long = dep.client.submit("long", CHAT)
        eventually(lambda: dep.sim.stats()["slow"]["in_flight"] == 1, timeout=60, what="the call to start")
        supervisor = FleetSupervisor(dep.settings, "gpu", echo=lambda *_: None)
        supervisor._stop_children({"foreground": worker}, 1.0)  # far shorter than the call: the stop is forced
        assert worker.poll() is not None
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
    broker = redis.Redis.from_url(private_redis)
    # Back in its queue now, not after the 600 s visibility timeout.
    assert broker.llen("lanes.gpu") == 1
    assert json.loads(broker.lindex("lanes.gpu", 0))["headers"]["id"] == long.id
    assert broker.hlen("unacked") == 0


# These tests hold a fleet's processes to TAKEN messages a queue
# (fleet_held_messages; on the threads pool a width-1 fleet's own sizing, on
# the gevent pool the bound itself): Celery's own consumer takes that many
# foreground messages, no more (workers/prefetch.py), so the rest stay in the
# queue for any other worker.
TAKEN = 2

RENAME_DOC = {
    "pools": [{"name": "gpu", "width": 1}],
    "models": [{"name": "m", "base_url": "{sim}", "pool": "gpu", "timeout_ms": 10_000}],
    "workflows": [{"name": "w", "priority": "interactive", "candidates": ["m"]}],
}


def test_a_renamed_pool_keeps_its_fleet_and_its_queued_work(launch, private_redis):
    dep = launch(RENAME_DOC, [SimModel(name="m", capacity=8, service_ms=50.0)], ["gpu"], fleet_held_messages=TAKEN)
    lane = dep.lane("gpu")
    hold = lane.acquire("interactive", timeout=10)  # the lane is busy: work queues up
    tasks = [dep.client.submit("w", CHAT) for _ in range(TAKEN + 2)]
    eventually(lambda: lane.stats().queued[Priority.INTERACTIVE] == TAKEN, timeout=30, what="tasks waiting in the lane")
    broker = redis.Redis.from_url(private_redis)
    eventually(lambda: broker.llen("lanes.gpu") == 2, timeout=10, what="two in the fleet's queue")
    time.sleep(1.0)  # room for a worker that takes more than its threads to show it
    assert broker.llen("lanes.gpu") == 2 and broker.hlen("unacked") == TAKEN

    renamed = json.loads(json.dumps(RENAME_DOC))
    renamed["pools"] = [{"name": "gpu-renamed", "previous_names": ["gpu"], "width": 1}]
    renamed["models"][0].update(pool="gpu-renamed", base_url=dep.sim.base_url)
    apply_document(dep.client.engine, renamed)

    # The supervisor follows the pool: a worker on the new name's queues, the old queue drained.
    eventually(lambda: broker.llen("lanes.gpu") == 0 and broker.llen("lanes.gpu.background") == 0
               and lane.stats().queued[Priority.INTERACTIVE] == 0, timeout=60, what="the old name's work to move")
    hold.release()
    for task in tasks:
        assert task.get(timeout=60)["model"] == "m"
        assert calls_of(dep, task.id) == ["m"]
    assert dep.workers["gpu"].poll() is None  # the supervisor is still running
    fresh = dep.client.submit("w", CHAT)
    assert fresh.get(timeout=60)["model"] == "m"


def test_tasks_handed_back_at_shutdown_keep_their_place_at_the_front_of_the_queue(launch, private_redis):
    dep = launch(RENAME_DOC, [SimModel(name="m", capacity=8, service_ms=50.0)], ["gpu"], fleet_held_messages=TAKEN)
    broker = redis.Redis.from_url(private_redis)
    lane = dep.lane("gpu")
    hold = lane.acquire("interactive", timeout=10)
    first = [dep.client.submit("w", CHAT) for _ in range(TAKEN)]
    eventually(lambda: lane.stats().queued[Priority.INTERACTIVE] == TAKEN, timeout=30, what="waits in the lane")
    later = [dep.client.submit("w", CHAT) for _ in range(2)]
    eventually(lambda: broker.llen("lanes.gpu") == 2, timeout=30, what="two tasks queued behind them")

    dep.stop_worker("gpu")  # a warm shutdown gives up the two lane waits
    hold.release()
    # kombu serves a queue from its right end: the handed-back tasks come first.
    serving_order = [json.loads(m)["headers"]["id"] for m in reversed(broker.lrange("lanes.gpu", 0, -1))]
    assert len(serving_order) == TAKEN + 2
    assert set(serving_order[:TAKEN]) == {t.id for t in first}
    assert serving_order[TAKEN:] == [t.id for t in later]
    # Handed back once, after the worker stopped taking work: the stopping
    # worker never took a handed-back task (or a queued one) again.
    assert [[a["outcome"] for a in dep.client.traces.load(t.id)] for t in first] == [["cancelled"]] * TAKEN
    assert [dep.client.traces.load(t.id) for t in later] == [[], []]


def test_a_task_revoked_while_queued_stays_revoked_across_a_fleet_restart(launch):
    dep = launch(RENAME_DOC, [SimModel(name="m", capacity=8, service_ms=50.0)], ["gpu"])
    lane = dep.lane("gpu")
    hold = lane.acquire("interactive", timeout=10)
    waiting = [dep.client.submit("w", CHAT) for _ in range(2)]  # both worker threads wait in the lane
    eventually(lambda: lane.stats().queued[Priority.INTERACTIVE] == 2, timeout=30, what="two waits in the lane")
    # On the threads pool no thread is free to take it. On gevent the worker
    # takes it at once: it waits in the lane when its claim came before the
    # revoke, and that order is made sure of here, so that the revoke must
    # cancel a lane wait whose slot comes free right after (the width grows
    # below, and the two ahead take 50 ms each).
    queued = dep.client.submit("w", CHAT)
    if dep.settings.fleet_pool == "gevent":
        eventually(lambda: lane.stats().queued[Priority.INTERACTIVE] == 3, timeout=30, what="the third in the lane")
    dep.client.revoke(queued.id)

    wider = json.loads(json.dumps(RENAME_DOC))
    wider["pools"][0]["width"] = 2
    wider["models"][0]["base_url"] = dep.sim.base_url
    apply_document(dep.client.engine, wider)  # the fleet restarts: a new worker, then the old one stops
    eventually(lambda: len(dep.worker_children("gpu")) == 4, timeout=60, what="the new worker beside the old")
    hold.release()
    for task in waiting:
        assert task.get(timeout=60)["model"] == "m"
    eventually(lambda: state(dep, queued.id) == "REVOKED", timeout=60, what="the revoked task to be discarded",
               shown=lambda: state(dep, queued.id))
    assert calls_of(dep, queued.id) == []


def test_a_task_revoked_while_no_worker_runs_is_dropped_by_the_worker_started_after(launch):
    # No worker hears the revoke's broadcast: the one started afterwards learns
    # it from the revoke's mark in Redis when it takes the message.
    dep = launch(RENAME_DOC, [SimModel(name="m", capacity=8, service_ms=50.0)], ["gpu"])
    dep.stop_worker("gpu")
    revoked = dep.client.submit("w", CHAT)
    kept = dep.client.submit("w", CHAT)
    report = dep.client.revoke(revoked.id)
    assert report["state"] == "PENDING"  # queued, no worker has seen it

    dep.start_worker("gpu")
    assert kept.get(timeout=60)["model"] == "m"
    eventually(lambda: state(dep, revoked.id) == "REVOKED", timeout=30, what="the revoked task to be discarded",
               shown=lambda: state(dep, revoked.id))
    assert calls_of(dep, revoked.id) == []
    assert dep.client.result(revoked.id)["state"] == "REVOKED"


def test_a_dropped_broker_connection_mid_call_does_not_call_the_backend_again(launch, private_redis):
    dep = launch(RESTART_DOC, [SimModel(name="slow", capacity=4, service_ms=6_000.0),
                               SimModel(name="quick", capacity=4, service_ms=20.0)], ["gpu"])
    long = dep.client.submit("long", CHAT)
    eventually(lambda: dep.sim.stats()["slow"]["in_flight"] == 1, timeout=60, what="the call to start")
    # Every client connection is cut, the workers' broker connection included (as a Redis restart would).
    redis.Redis.from_url(private_redis).client_kill_filter(_type="normal", skipme=True)
    assert long.get(timeout=90)["model"] == "slow"
    time.sleep(8)  # room for a second delivery to show itself
    assert calls_of(dep, long.id) == ["slow"]


BG_DOC = {
    "pools": [{"name": "gpu", "width": 1}],
    "models": [{"name": "m", "base_url": "{sim}", "pool": "gpu", "timeout_ms": 10_000}],
    "workflows": [{"name": "bg", "priority": "background", "candidates": ["m"]}],
}


def test_background_waits_handed_back_by_restarts_all_run_once(launch, private_redis):
    dep = launch(BG_DOC, [SimModel(name="m", capacity=8, service_ms=50.0)], ["gpu"], fleet_held_messages=TAKEN)
    lane = dep.lane("gpu")
    broker = redis.Redis.from_url(private_redis)
    hold = lane.acquire("interactive", timeout=10)
    tasks = [dep.client.submit("bg", CHAT) for _ in range(6)]
    eventually(lambda: lane.stats().queued[Priority.BACKGROUND] == 2, timeout=30, what="background waits in the lane")
    for width in (2, 1, 2):  # each change restarts the fleet: a new worker, then the old one stops
        changed = json.loads(json.dumps(BG_DOC))
        changed["pools"][0]["width"] = width
        changed["models"][0]["base_url"] = dep.sim.base_url
        apply_document(dep.client.engine, changed)
        eventually(lambda: len(dep.worker_children("gpu")) == 4, timeout=60, what="the new worker beside the old")
        eventually(lambda: len(dep.worker_children("gpu")) == 2, timeout=60, what="the old worker to stop")
    hold.release()
    for task in tasks:
        assert task.get(timeout=60)["model"] == "m"
        assert calls_of(dep, task.id) == ["m"]
    # Nothing is left held or queued (a hand-back leaves no spare on Lanes' transport).
    eventually(lambda: broker.hlen("unacked") == 0 and broker.llen("lanes.gpu.background") == 0,
               timeout=120, what="nothing held or queued")
    for task in tasks:
        assert calls_of(dep, task.id) == ["m"]


def test_a_stopping_worker_never_takes_back_what_it_handed_back(launch, private_redis):
    # Width 2: four foreground threads, two of them idle with a BRPOP already
    # waiting on the queue when the two lane waits are handed back.
    doc = json.loads(json.dumps(RENAME_DOC))
    doc["pools"][0]["width"] = 2
    dep = launch(doc, [SimModel(name="m", capacity=8, service_ms=50.0)], ["gpu"])
    broker = redis.Redis.from_url(private_redis)
    lane = dep.lane("gpu")
    holds = [lane.acquire("interactive", timeout=10) for _ in range(2)]
    waiting = [dep.client.submit("w", CHAT) for _ in range(2)]
    eventually(lambda: lane.stats().queued[Priority.INTERACTIVE] == 2, timeout=30, what="two waits in the lane")

    dep.stop_worker("gpu")
    for hold in holds:
        hold.release()
    assert sorted(json.loads(m)["headers"]["id"] for m in broker.lrange("lanes.gpu", 0, -1)) == sorted(
        t.id for t in waiting)
    # Nothing else holds them: what a worker takes is recorded in the same step, so a
    # hand-back leaves no spare record (workers/handback.py).
    assert broker.hvals("unacked") == []
    assert [[a["outcome"] for a in dep.client.traces.load(t.id)] for t in waiting] == [["cancelled"]] * 2


def test_tasks_handed_back_by_a_stopping_worker_survive_its_kill_and_their_takers(launch, private_redis):
    dep = launch(RESTART_DOC, [SimModel(name="slow", capacity=4, service_ms=30_000.0),
                               SimModel(name="quick", capacity=4, service_ms=20.0)], ["gpu"])
    dep.stop_worker("gpu")  # a bare worker, so nothing else consumes the queue
    worker = subprocess.Popen(
        [sys.executable, "-m", "workers.main", "--fleet", "gpu", "--foreground", "4", "--background", "1"],
        env=dep.env,
    )
    broker = redis.Redis.from_url(private_redis)
    lane = dep.lane("gpu")
    try:
        long = dep.client.submit("long", CHAT)  # keeps the warm shutdown waiting for its call
        eventually(lambda: dep.sim.stats()["slow"]["in_flight"] == 1, timeout=60, what="the long call to start")
        hold = lane.acquire("interactive", timeout=10)
        short = [dep.client.submit("short", CHAT) for _ in range(2)]
        # Two waits in the lane; the fourth thread is idle, its BRPOP waiting on the queue.
        eventually(lambda: lane.stats().queued[Priority.INTERACTIVE] == 2, timeout=30, what="two waits in the lane")
        worker.send_signal(signal.SIGTERM)  # warm: the waits are handed back, the long call runs on
        time.sleep(0.3)
        late = dep.client.submit("short", CHAT)  # queued while the worker stops: its BRPOP may still wait
        eventually(lambda: all(dep.client.traces.load(t.id) for t in short), timeout=30, what="both waits given up")
        time.sleep(3.0)
        worker.send_signal(signal.SIGKILL)  # killed before its warm shutdown ended
        worker.wait(30)
        hold.release()
    finally:
        if worker.poll() is None:
            worker.send_signal(signal.SIGKILL)
            worker.wait()
    queued = [json.loads(m)["headers"]["id"] for m in broker.lrange("lanes.gpu", 0, -1)]
    unacked = [json.loads(v)[0]["headers"]["id"] for v in broker.hvals("unacked")]
    # The handed-back tasks and the late one wait in the queue for the next worker (the
    # late one may have reached the worker before it stopped taking work: handed back
    # too); the long call's message waits in kombu's unacked record for its lease.
    assert sorted(queued) == sorted(t.id for t in [*short, late])
    assert unacked == [long.id]

    # The next worker runs them, each once.
    dep.start_worker("gpu")
    dep.wait_for_workers(["gpu"])
    for task in [*short, late]:
        assert task.get(timeout=120)["model"] == "quick"
        assert calls_of(dep, task.id) == ["quick"]

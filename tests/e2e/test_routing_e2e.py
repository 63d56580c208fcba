"""Routed work end to end: a real Redis, Celery workers, the HTTP simulator.

Assertions are about order and outcomes, never durations.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
import redis
import sqlalchemy as sa

from lanes import CapacityWaitTimeout, InvalidInput, Priority
from lanes.namespace import Namespace
from lanes.routing.breaker import Breakers
from lanes.sim import SimModel
from tests.e2e.harness import deploy
from tests.polling import eventually

# Generous: the module fixture deploys six fleets, 100-200 s at load 20-30 on 2 cores.
# The fast tier's end-to-end path of routing: the fleets are paid once, most tests take
# well under a second; those that start workers or CLI processes of their own are slow.
pytestmark = pytest.mark.timeout(600)

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}

DOCUMENT = {
    "pools": [
        {"name": "gpu-a", "width": 2},
        {"name": "gpu-b", "width": 2},
        {"name": "gpu-c", "width": 1},
        {"name": "gpu-d", "width": 1},
        {"name": "gpu-t", "width": 1},
        {"name": "emb", "width": 2},
    ],
    "models": [
        {"name": "a", "base_url": "{sim}", "pool": "gpu-a"},
        {"name": "b", "base_url": "{sim}", "pool": "gpu-b"},
        {"name": "c", "base_url": "{sim}", "pool": "gpu-c"},
        {"name": "d", "base_url": "{sim}", "pool": "gpu-d"},
        {"name": "t", "base_url": "{sim}", "pool": "gpu-t"},
        {"name": "e", "base_url": "{sim}", "pool": "emb", "kind": "embedding"},
        {"name": "hosted", "base_url": "{sim}", "api_key_env": "LANES_TEST_HOSTED_KEY"},
        {"name": "broken", "base_url": "{sim}"},
    ],
    "workflows": [
        {"name": "chat", "priority": "interactive", "reserve_ms": 1000, "candidates": ["a", "b"]},
        {"name": "memory", "priority": "background", "candidates": ["a"]},
        {"name": "wait_fallback", "priority": "interactive", "reserve_ms": 1000, "candidates": ["c", "b"]},
        {"name": "last_waits", "priority": "interactive", "candidates": ["d"]},
        {"name": "failover", "priority": "interactive", "candidates": ["b", "hosted"]},
        {"name": "exhausted", "priority": "interactive", "candidates": ["broken"]},
        {"name": "hosted_only", "priority": "user_tool", "candidates": ["hosted"]},
        {"name": "embed", "priority": "background", "candidates": ["e"]},
        {"name": "term_bg", "priority": "background", "candidates": ["t"]},
    ],
}

SIM_MODELS = [
    SimModel(name="a", capacity=8, service_ms=300.0),
    SimModel(name="b", capacity=8, service_ms=50.0),
    SimModel(name="c", capacity=8, service_ms=50.0),
    SimModel(name="d", capacity=8, service_ms=50.0),
    SimModel(name="t", capacity=8, service_ms=50.0),
    SimModel(name="e", capacity=8, kind="embedding", embedding_ms=20.0),
    SimModel(name="hosted", capacity=64, service_ms=20.0),
    SimModel(name="broken", capacity=64, service_ms=10.0),
]

FLEETS = ["gpu-a", "gpu-b", "gpu-c", "gpu-d", "hosted", "emb"]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory, embedded_redis):
    url = embedded_redis.url.rsplit("/", 1)[0] + "/3"
    redis.Redis.from_url(url).flushdb()
    deployment = deploy(tmp_path_factory.mktemp("e2e"), url, json.loads(json.dumps(DOCUMENT)), SIM_MODELS, FLEETS)
    yield deployment
    deployment.close()


@pytest.fixture
def dep(fleet):
    fleet.sim.reset()
    yield fleet


def served_step(report: dict) -> dict:
    steps = [s for attempt in report["attempts"] for s in attempt["steps"]]
    return next(s for s in steps if s["action"] == "served")


def actions(report: dict) -> list[tuple[str, str]]:
    return [(s["model"], s["action"]) for attempt in report["attempts"] for s in attempt["steps"]]


def run_lease(dep, task_id: str) -> str:
    return Namespace(dep.settings.key_prefix).task_run(task_id)


def finish(dep, result, timeout=60.0) -> dict:
    result.get(timeout=timeout, propagate=False)
    # The trace is saved just after the result; give it a moment to land.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        report = dep.client.result(result.id)
        if report["attempts"] and report["attempts"][-1]["outcome"] != "running":
            return report
        time.sleep(0.05)
    return dep.client.result(result.id)


# --- serving --------------------------------------------------------------------------


def test_a_chat_is_answered_by_its_primary_with_a_routing_trace(dep):
    report = finish(dep, dep.client.submit("chat", CHAT, deadline=30))
    assert report["state"] == "SUCCESS"
    assert report["result"]["model"] == "a"
    assert report["result"]["answer"]["choices"][0]["message"]["content"]
    assert actions(report) == [("a", "served")]
    assert served_step(report)["pool"] == "gpu-a"
    assert served_step(report)["ttft_ms"] is not None
    # Its run lease is left to lapse (a copy delivered now finds the answer, never a free lease).
    lease = redis.Redis.from_url(dep.redis_url).pttl(run_lease(dep, report["task_id"]))
    assert 0 < lease <= (dep.settings.message_lease_seconds + 5) * 1000


def test_embeddings_are_routed_through_their_pool(dep):
    report = finish(dep, dep.client.submit("embed", {"input": ["one", "two"]}))
    assert report["state"] == "SUCCESS"
    assert len(report["result"]["answer"]["data"]) == 2
    assert actions(report) == [("e", "served")]


def test_a_hosted_model_is_called_without_a_lane(dep):
    report = finish(dep, dep.client.submit("hosted_only", CHAT))
    assert report["state"] == "SUCCESS"
    assert served_step(report)["pool"] is None
    assert "wait_ms" not in served_step(report) or served_step(report)["wait_ms"] is None


def test_a_routed_task_reads_started_while_it_waits_or_runs_then_its_answer(dep):
    # The run claim stores STARTED (the route task does not leave it to Celery's tracer).
    results = [dep.client.submit("memory", CHAT) for _ in range(4)]  # width 2, 300 ms calls
    started = eventually(lambda: next((r for r in results if r.state == "STARTED"), None), timeout=20.0,
                         interval=0.02, what="a task to read STARTED")
    assert started.info["hostname"].startswith("gpu-a@") and started.info["pid"] > 0
    reports = [finish(dep, r, 60) for r in results]
    assert [r["state"] for r in reports] == ["SUCCESS"] * 4
    assert all(r.state == "SUCCESS" for r in results)


# --- width and priority ---------------------------------------------------------------


def test_under_saturation_interactive_is_admitted_before_background_and_width_holds(dep):
    background = [dep.client.submit("memory", CHAT) for _ in range(12)]
    eventually(lambda: dep.sim.stats()["a"]["running"] == 2, timeout=20.0, interval=0.05)
    interactive = [dep.client.submit("chat", CHAT, deadline=120) for _ in range(4)]
    bg_reports = [finish(dep, r, 120) for r in background]
    fg_reports = [finish(dep, r, 120) for r in interactive]
    assert all(r["state"] == "SUCCESS" for r in bg_reports + fg_reports)
    assert all(r["result"]["model"] == "a" for r in fg_reports)  # waited; no fallback needed

    fg_admitted = sorted(served_step(r)["admitted_at"] for r in fg_reports)
    bg_admitted = sorted(served_step(r)["admitted_at"] for r in bg_reports)
    # Background work still queued when the interactive requests arrived went after all of them.
    assert all(bg > fg_admitted[-1] for bg in bg_admitted[-4:])
    assert dep.sim.stats()["a"]["max_in_flight"] <= 2


# --- waiting and falling back ---------------------------------------------------------------


def test_a_busy_primary_is_waited_for_while_the_budget_allows(dep):
    lane = dep.lane("gpu-c")
    hold = lane.acquire(Priority.INTERACTIVE, timeout=5)
    result = dep.client.submit("wait_fallback", CHAT, deadline=20)
    eventually(lambda: lane.stats().queued[Priority.INTERACTIVE] == 1, timeout=20.0, interval=0.05)
    hold.release()
    report = finish(dep, result)
    assert report["state"] == "SUCCESS"
    assert actions(report) == [("c", "served")]


def test_a_request_falls_back_when_deadline_minus_reserve_passes(dep):
    lane = dep.lane("gpu-c")
    hold = lane.acquire(Priority.INTERACTIVE, timeout=5)
    try:
        report = finish(dep, dep.client.submit("wait_fallback", CHAT, deadline=4))
    finally:
        hold.release()
    assert report["state"] == "SUCCESS"
    assert actions(report) == [("c", "wait_timeout"), ("b", "served")]


def test_the_last_candidate_waits_up_to_the_deadline(dep):
    lane = dep.lane("gpu-d")
    hold = lane.acquire(Priority.INTERACTIVE, timeout=5)
    release_later = threading.Timer(1.0, hold.release)
    release_later.start()
    report = finish(dep, dep.client.submit("last_waits", CHAT, deadline=20))
    assert report["state"] == "SUCCESS"
    assert actions(report) == [("d", "served")]

    hold = lane.acquire(Priority.INTERACTIVE, timeout=5)
    try:
        report = finish(dep, dep.client.submit("last_waits", CHAT, deadline=2))
    finally:
        hold.release()
    assert report["state"] == "FAILURE"
    assert report["error"]["type"] == CapacityWaitTimeout.__name__
    assert actions(report) == [("d", "wait_timeout")]


def test_a_candidate_whose_forecast_wait_exceeds_the_budget_is_passed_over(dep):
    lane = dep.lane("gpu-c")
    with lane.acquire(Priority.INTERACTIVE, timeout=5):
        time.sleep(1.0)  # gives the lane a measured mean hold
    hold = lane.acquire(Priority.INTERACTIVE, timeout=5)
    errors: list[BaseException] = []
    waiters = [threading.Thread(target=_wait_once, args=(lane, errors), daemon=True) for _ in range(4)]
    for w in waiters:
        w.start()
    try:
        eventually(lambda: lane.stats().queued[Priority.INTERACTIVE] == 4, timeout=20.0, interval=0.05)
        forecast = lane.forecast(Priority.INTERACTIVE)
        assert forecast is not None and forecast > 0
        # A budget (deadline - 1 s reserve) of half the forecast wait.
        report = finish(dep, dep.client.submit("wait_fallback", CHAT, deadline=1.0 + forecast / 2))
    finally:
        hold.release()
        for w in waiters:
            w.join(60)
    assert not errors, f"a waiter of the load failed: {errors!r}"
    assert not any(w.is_alive() for w in waiters), "a waiter of the load never got its slot"
    assert report["state"] == "SUCCESS"
    assert actions(report) == [("c", "bypass"), ("b", "served")]
    bypass = report["attempts"][0]["steps"][0]
    assert bypass["reason"] == "forecast"
    bypasses = dep.client_events(kind="lane_bypass")
    assert any(e.pool == "gpu-c" and e.detail["reason"] == "forecast" for e in bypasses)


def _wait_once(lane, errors: list) -> None:
    """Queue once on the lane and give the slot back; a failure is kept for the test to raise
    (a waiter that died early would have made the forecast with fewer waiters than it says)."""
    try:
        lane.acquire(Priority.INTERACTIVE, timeout=120).release()
    except BaseException as exc:  # noqa: BLE001 - raised by the test, in its own thread
        errors.append(exc)


def test_an_open_breaker_passes_the_candidate_over(dep):
    breakers = Breakers(redis.Redis.from_url(dep.redis_url), prefix=dep.settings.key_prefix)
    for _ in range(breakers.policy.consecutive):
        breakers.record("b", ok=False)
    try:
        report = finish(dep, dep.client.submit("failover", CHAT, deadline=20))
    finally:
        breakers.record("b", ok=True)
    assert actions(report) == [("b", "bypass"), ("hosted", "served")]
    assert report["attempts"][0]["steps"][0]["reason"] == "breaker_open"


def test_a_failing_backend_moves_on_to_the_next_candidate(dep):
    dep.sim.configure("b", fail_next=1, fail_status=503)
    report = finish(dep, dep.client.submit("failover", CHAT, deadline=20))
    assert report["state"] == "SUCCESS"
    assert actions(report) == [("b", "failed"), ("hosted", "served")]
    assert report["attempts"][0]["steps"][0]["status"] == 503
    # The slot taken for the failed call was released.
    assert dep.lane("gpu-b").stats().in_flight == 0


def test_when_every_candidate_fails_the_task_fails_clearly_without_calling_any_again(dep):
    dep.sim.configure("broken", fail_rate=1.0, fail_status=500)
    result = dep.client.submit("exhausted", CHAT, deadline=6)
    report = finish(dep, result, timeout=30)
    assert report["state"] == "FAILURE"
    assert report["error"]["type"] == "CandidatesExhausted"
    # A retry could only call the same failing backends again: a backend is
    # called twice for a task only when its worker died mid-call.
    assert [a["outcome"] for a in report["attempts"]] == ["exhausted"]
    assert [c["model"] for c in dep.sim.calls() if c["task_id"] == result.id] == ["broken"]


def test_a_repeated_submit_with_an_idempotency_key_returns_the_same_task(dep):
    first = dep.client.submit("hosted_only", CHAT, idempotency_key="order-42")
    second = dep.client.submit("hosted_only", CHAT, idempotency_key="order-42")
    assert first.id == second.id
    assert finish(dep, first)["result"] == finish(dep, second)["result"]
    assert dep.sim.stats()["hosted"]["served"] == 1


# --- cancellation ---------------------------------------------------------------------------


def test_a_revoke_cancels_a_lane_wait_and_leaks_nothing(dep):
    lane = dep.lane("gpu-d")
    hold = lane.acquire(Priority.INTERACTIVE, timeout=5)
    try:
        result = dep.client.submit("last_waits", CHAT, deadline=60)
        eventually(lambda: lane.stats().queued[Priority.INTERACTIVE] == 1, timeout=20.0, interval=0.05)
        dep.client.celery.control.revoke(result.id)
        eventually(lambda: dep.client.result(result.id)["state"] == "REVOKED", timeout=20.0, interval=0.05)
        eventually(lambda: lane.stats().queued[Priority.INTERACTIVE] == 0, timeout=20.0, interval=0.05)
    finally:
        hold.release()
    assert lane.stats().in_flight == 0


def test_a_revoke_whose_broadcast_is_lost_still_cancels_the_lane_wait(dep, monkeypatch):
    # The fault: the worker is not listening when the broadcast goes out (its
    # broadcast connection starting or reconnecting). The revokes stream reaches it.
    lane = dep.lane("gpu-d")
    hold = lane.acquire(Priority.INTERACTIVE, timeout=5)
    try:
        result = dep.client.submit("last_waits", CHAT, deadline=60)
        eventually(lambda: lane.stats().queued[Priority.INTERACTIVE] == 1, timeout=20.0, interval=0.05)
        monkeypatch.setattr(dep.client.celery.control, "revoke", lambda *a, **k: None)
        dep.client.revoke(result.id)
        eventually(lambda: dep.client.result(result.id)["state"] == "REVOKED", timeout=20.0, interval=0.05)
        eventually(lambda: lane.stats().queued[Priority.INTERACTIVE] == 0, timeout=20.0, interval=0.05)
    finally:
        hold.release()
    assert lane.stats().in_flight == 0
    assert [c for c in dep.sim.calls() if c["task_id"] == result.id] == []


@pytest.mark.slow
def test_sigterm_hands_a_waiting_task_back_and_a_new_worker_finishes_it(dep):
    lane = dep.lane("gpu-t")
    hold = lane.acquire(Priority.INTERACTIVE, timeout=5)
    dep.start_worker("gpu-t")
    dep.wait_for_workers(["gpu-t"])
    result = dep.client.submit("term_bg", CHAT)
    eventually(lambda: lane.stats().queued[Priority.BACKGROUND] == 1, timeout=20.0, interval=0.05)
    assert dep.stop_worker("gpu-t") == 0
    assert lane.stats().queued[Priority.BACKGROUND] == 0
    # Handed back: its run lease is freed for the next delivery at once.
    assert not redis.Redis.from_url(dep.redis_url).exists(run_lease(dep, result.id))
    assert result.state in ("PENDING", "STARTED", "RECEIVED")
    hold.release()
    dep.start_worker("gpu-t")
    report = finish(dep, result, timeout=60)
    assert report["state"] == "SUCCESS"
    assert actions(report)[-1] == ("t", "served")


# --- bad input --------------------------------------------------------------------------------


def queue_lengths(dep) -> dict:
    client = redis.Redis.from_url(dep.redis_url)
    return {key: client.llen(key) for key in client.scan_iter("lanes.*") if client.type(key) == b"list"}


@pytest.mark.parametrize(
    ("workflow", "payload", "options", "message"),
    [
        ("nope", CHAT, {}, "unknown workflow 'nope'"),
        ("chat", CHAT, {"priority": "urgent"}, "unknown priority 'urgent'"),
        ("chat", CHAT, {"deadline": -5}, "not in the future"),
        ("chat", CHAT, {"deadline": 0}, "not in the future"),
        ("chat", "{not json", {}, "payload is not JSON"),
        ("chat", {"input": "x"}, {}, "needs a non-empty 'messages' list"),
        ("embed", CHAT, {}, "needs an 'input' field"),
        ("chat", CHAT, {"idempotency_key": ""}, "idempotency key"),
    ],
)
def test_bad_input_is_refused_before_anything_is_enqueued(dep, workflow, payload, options, message):
    before = queue_lengths(dep)
    with pytest.raises(InvalidInput, match=message):
        dep.client.submit(workflow, payload, **options)
    assert queue_lengths(dep) == before


def test_a_workflow_with_no_candidates_is_refused(dep):
    engine = dep.client.engine
    with engine.begin() as conn:
        conn.execute(sa.text(
            "INSERT INTO workflows (name, priority, reserve_ms) VALUES ('empty', 'interactive', 0)"
        ))
    try:
        from lanes.catalog.version import bump_version

        bump_version(engine)
        time.sleep(1.1)  # the client re-reads the catalog at most once a second
        with pytest.raises(InvalidInput, match="no candidate"):
            dep.client.submit("empty", CHAT)
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM workflows WHERE name = 'empty'"))


@pytest.mark.slow
def test_the_cli_refuses_bad_input_in_one_line(dep):
    for args, message in [
        (["submit", "chat", "--payload", "{oops"], "payload is not JSON"),
        (["submit", "nope", "--payload", json.dumps(CHAT)], "unknown workflow 'nope'"),
        (["submit", "chat", "--payload", json.dumps(CHAT), "--priority", "soon"], "unknown priority"),
        (["submit", "chat", "--payload", json.dumps(CHAT), "--deadline", "-1"], "not in the future"),
    ]:
        proc = subprocess.run([sys.executable, "-m", "lanes.cli", *args], env=dep.env, capture_output=True, text=True)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith("error: ") and message in proc.stderr
        assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_the_cli_submits_waits_and_shows_the_trace(dep):
    proc = subprocess.run(
        [sys.executable, "-m", "lanes.cli", "submit", "chat", "--payload", json.dumps(CHAT), "--deadline", "30",
         "--wait"],
        env=dep.env, capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["state"] == "SUCCESS" and report["attempts"][0]["served_by"] == "a"
    events = subprocess.run(
        [sys.executable, "-m", "lanes.cli", "events", "--json", "--limit", "500"],
        env=dep.env, capture_output=True, text=True, timeout=30,
    )
    assert events.returncode == 0, events.stderr
    kinds = {e["kind"] for e in json.loads(events.stdout)}
    assert "lane_wait" in kinds

"""Memory runs end to end: real Redis, a real memory worker process, the HTTP
simulator, the memory_extraction workflow's lane at background priority.

Assertions are about order and outcomes, never durations.
"""

from __future__ import annotations

import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from lanes import Priority
from lanes.memory import add_messages, enqueue_runs, ensure_memory_schema, list_runs, notes_of
from lanes.memory.dispatch import dispatch_runs, enqueue_and_dispatch
from lanes.memory.lifecycle import retry_failed
from lanes.memory.tables import runs_t
from lanes.routing.trace import TraceStore
from lanes.sim import SimModel
from tests.e2e.harness import deploy
from tests.polling import eventually

# One test here is the feature's end-to-end path in the fast tier; the rest are slow.
pytestmark = [pytest.mark.timeout(240)]

DOCUMENT = {
    "pools": [{"name": "utility", "width": 1}],
    "models": [{"name": "utility-14b", "base_url": "{sim}", "pool": "utility"}],
    "workflows": [
        {"name": "memory_extraction", "priority": "background", "candidates": ["utility-14b"]},
        {"name": "chat", "priority": "interactive", "candidates": ["utility-14b"]},
    ],
}
NOW = datetime(2026, 5, 10, 10, 2, tzinfo=timezone.utc)


def history(engine, chats: int) -> None:
    rows = []
    for chat in range(chats):
        for minute, role, text in ((5, "user", f"my sister {chat} lives in Porto"),
                                   (6, "assistant", "Nice, do you visit often?"),
                                   (7, "user", f"every summer, chat {chat}")):
            rows.append({"chat_id": f"chat-{chat}", "at": NOW - timedelta(hours=1) + timedelta(minutes=minute - 2),
                         "role": role, "text": text})
    add_messages(engine, rows)


def start_memory_worker(deployment, concurrency: int, **env) -> subprocess.Popen:
    full_env = {**deployment.env, **{f"LANES_{k.upper()}": str(v) for k, v in env.items()}}
    return subprocess.Popen([sys.executable, "-m", "workers.memory.worker", "--concurrency", str(concurrency)],
                            env=full_env)


@pytest.fixture
def memory_deployment(tmp_path, one_redis_url):
    sim = [SimModel(name="utility-14b", capacity=1, service_ms=30.0)]
    deployment = deploy(tmp_path / "state", one_redis_url, {**DOCUMENT, "models": [dict(m) for m in DOCUMENT["models"]]},
                        sim, ["utility"])
    ensure_memory_schema(deployment.client.engine)
    workers = []
    yield deployment, workers
    for proc in workers:
        proc.terminate()
    for proc in workers:
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    deployment.close()


def statuses(engine) -> dict[str, str]:
    return {r.chat_id: r.status for r in list_runs(engine, limit=1000)}


@pytest.mark.end_to_end
def test_memory_runs_wait_behind_interactive_work_then_store_their_notes_once(memory_deployment):
    deployment, workers = memory_deployment
    engine, settings = deployment.client.engine, deployment.settings
    history(engine, 3)
    # The lane's one slot is taken, so every admission below has to queue.
    lane = deployment.lane("utility")
    blocker = lane.acquire(Priority.INTERACTIVE, timeout=5)
    workers.append(start_memory_worker(deployment, 3))
    result, dispatched = enqueue_and_dispatch(engine, deployment.client.celery, settings,
                                              client=deployment.client.redis, now=NOW, full=False)
    task_ids = dispatched.sent
    assert len(result.created) == 3
    eventually(lambda: lane.stats().queued[Priority.BACKGROUND] == 3, timeout=60, what="3 memory runs in the lane")
    interactive = deployment.client.submit("chat", {"messages": [{"role": "user", "content": "hi"}]})
    eventually(lambda: lane.stats().queued[Priority.INTERACTIVE] == 1, timeout=60, what="the interactive request queued")
    blocker.release()

    chat_trace = interactive.get(timeout=60)["trace"]
    eventually(lambda: set(statuses(engine).values()) == {"done"}, timeout=60, what="every run done")
    traces = TraceStore(deployment.client.redis, prefix=settings.key_prefix, ttl_seconds=60)
    memory_admitted = [traces.load(task_id)[-1]["steps"][-1]["admitted_at"] for task_id in task_ids]
    chat_admitted = chat_trace["steps"][-1]["admitted_at"]
    assert all(chat_admitted < at for at in memory_admitted)
    assert {step["priority"] for step in (traces.load(t)[-1] for t in task_ids)} == {"background"}

    notes = notes_of(engine, "chat-1")
    assert [n["text"] for n in notes] == ["The user said: my sister 1 lives in Porto", "The user said: every summer, chat 1"]
    # A rerun of the same hour replaces its notes rather than adding to them.
    run = next(r for r in list_runs(engine) if r.chat_id == "chat-1")
    with engine.begin() as conn:
        conn.execute(runs_t.update().where(runs_t.c.id == run.id).values(status="queued"))
    dispatch_runs(deployment.client.celery, [run.id])
    eventually(lambda: statuses(engine)["chat-1"] == "done" and list_runs(engine, chat_id="chat-1")[0].attempts == 2,
               timeout=60, what="the rerun done")
    assert [n["text"] for n in notes_of(engine, "chat-1")] == [n["text"] for n in notes]
    # A second tick at the same time creates no run twice.
    assert enqueue_runs(engine, now=NOW, full=True, retention_days=7, daily_cap=100).created == []


@pytest.mark.slow
def test_a_failing_run_is_retried_with_backoff_then_failed_with_its_error(memory_deployment):
    deployment, workers = memory_deployment
    engine, settings = deployment.client.engine, deployment.settings
    history(engine, 1)
    deployment.sim.configure("utility-14b", down=True)
    workers.append(start_memory_worker(deployment, 1, memory_retry_seconds=0.2, memory_max_attempts=3))
    enqueue_and_dispatch(engine, deployment.client.celery, settings, client=deployment.client.redis, now=NOW,
                         full=False)
    eventually(lambda: statuses(engine) == {"chat-0": "failed"}, timeout=90, what="the run failed")
    run = list_runs(engine)[0]
    assert run.attempts == 3
    assert "503" in run.error or "utility-14b" in run.error
    assert notes_of(engine, "chat-0") == []
    # The backend is back: `lanes memory retry`'s step queues the failed hour again.
    deployment.sim.configure("utility-14b", down=False)
    assert [r.id for r in retry_failed(engine, now=NOW)] == [run.id]
    dispatch_runs(deployment.client.celery, [run.id])
    eventually(lambda: statuses(engine) == {"chat-0": "done"}, timeout=60, what="the rerun done")
    assert len(notes_of(engine, "chat-0")) == 2


@pytest.mark.slow
def test_three_deliveries_of_one_run_at_once_call_the_backend_once(memory_deployment):
    # Copies of one run's message (a re-send, a redelivery) reach three worker threads together.
    deployment, workers = memory_deployment
    engine, settings = deployment.client.engine, deployment.settings
    history(engine, 1)
    deployment.sim.configure("utility-14b", service_ms=1500.0)  # long enough for the copies to overlap
    result = enqueue_runs(engine, now=NOW, full=False, retention_days=7, daily_cap=100)
    run_id = result.created[0].id
    before = len(deployment.sim.calls())
    dispatch_runs(deployment.client.celery, [run_id, run_id, run_id])
    workers.append(start_memory_worker(deployment, 3))
    eventually(lambda: statuses(engine) == {"chat-0": "done"}, timeout=90, what="the run done")
    run = list_runs(engine)[0]
    assert run.attempts == 1
    assert len(deployment.sim.calls()) - before == 1
    assert len(notes_of(engine, "chat-0")) == 2

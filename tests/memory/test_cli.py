"""``lanes history add`` and ``lanes memory enqueue/runs`` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lanes.catalog import apply_document, load_routing, make_engine
from lanes.memory import ensure_memory_schema
from lanes.settings import Settings
from workers.memory.fleet import plan_memory_fleet


@pytest.fixture
def lanes_cli(db_url, tmp_path, one_redis_url):
    env = {"LANES_DATABASE_URL": db_url, "LANES_STATE_DIR": str(tmp_path / "state"),
           "LANES_REDIS_URL": one_redis_url, "PATH": "/usr/bin:/bin"}

    def run(*args, stdin: str | None = None):
        return subprocess.run([sys.executable, "-m", "lanes.cli", *args], env=env, input=stdin,
                              capture_output=True, text=True, timeout=60)

    return run


def messages_in(db_url) -> int:
    engine = make_engine(db_url)
    ensure_memory_schema(engine)
    try:
        with engine.connect() as conn:
            return conn.exec_driver_sql("SELECT count(*) FROM chat_messages").scalar_one()
    finally:
        engine.dispose()


def test_a_file_with_bad_lines_is_refused_by_line_number_and_nothing_is_written(lanes_cli, db_url, tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text(
        '{"chat_id": "a", "at": "2026-05-10T09:05:00Z", "role": "user", "text": "hi"}\n'
        "\n"
        '{"chat_id": "a", "at": "2026-05-10T09:06:00", "role": "user", "text": "no zone"}\n'
        "not json\n"
        '{"chat_id": "a", "at": "2026-05-10T09:07:00Z", "role": "robot", "text": "x"}\n'
    )
    result = lanes_cli("history", "add", "--file", str(path))
    assert result.returncode == 2
    assert "3 bad lines" in result.stderr and "nothing was written" in result.stderr
    assert "line 3: time '2026-05-10T09:06:00' has no time zone" in result.stderr
    assert "line 4: not JSON" in result.stderr and "line 5: role 'robot'" in result.stderr
    assert "Traceback" not in result.stderr
    assert messages_in(db_url) == 0


@pytest.mark.slow
def test_history_then_enqueue_then_runs_by_hand(lanes_cli, db_url, tmp_path):
    lines = [json.dumps({"chat_id": c, "at": f"2026-05-10T0{h}:15:00Z", "role": "user", "text": "hello"})
             for c in ("a", "b") for h in (7, 8, 9)]
    added = lanes_cli("history", "add", "--file", "-", stdin="\n".join(lines) + "\n")
    assert added.returncode == 0 and "added 6 messages in 2 chats" in added.stdout
    one = lanes_cli("history", "add", "--chat", "c", "--at", "2026-05-10T09:30:00+00:00", "--text", "hey")
    assert one.returncode == 0
    enqueued = lanes_cli("memory", "enqueue", "--now", "2026-05-10T10:02:00Z", "--json")
    assert enqueued.returncode == 0, enqueued.stderr
    assert json.loads(enqueued.stdout)["created"] == 5  # 08:00 and 09:00 for a and b, 09:00 for c
    full = json.loads(lanes_cli("memory", "enqueue", "--now", "2026-05-10T10:02:00Z", "--full", "--json").stdout)
    assert full["created"] == 2  # the 07:00 hours
    listed = json.loads(lanes_cli("memory", "runs", "--status", "queued", "--json").stdout)
    assert len(listed["runs"]) == 7 and listed["counts"]["queued"] == 7
    assert listed["days"] == [{"day": "2026-05-10", "runs_created": 7, "skipped_by_cap": 0, "expired_by_retention": 0}]
    bad = lanes_cli("memory", "enqueue", "--now", "2026-05-10 10:02")
    assert bad.returncode == 2 and "has no time zone" in bad.stderr


def test_the_memory_fleet_is_the_primarys_width_times_workers_per_lane_within_floor_and_cap(sqlite_url, tmp_path):
    engine = make_engine(sqlite_url)
    from lanes.catalog.migrate import ensure_schema

    ensure_schema(engine)
    apply_document(engine, {
        "pools": [{"name": "gpu2", "width": 6, "ceiling": 64}],
        "models": [{"name": "u", "base_url": "http://x/v1", "pool": "gpu2"}],
        "workflows": [{"name": "memory_extraction", "priority": "background", "candidates": ["u"]}],
    })
    table = load_routing(engine)
    base = dict(state_dir=tmp_path)
    assert plan_memory_fleet(table, Settings(**base)).concurrency == 12
    assert plan_memory_fleet(table, Settings(**base, memory_workers_per_lane=8)).concurrency == 32
    assert plan_memory_fleet(table, Settings(**base, memory_workers_floor=20)).concurrency == 20
    engine.dispose()


def test_importing_the_same_history_file_twice_stores_each_message_once(lanes_cli, db_url, tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text("".join(json.dumps({"chat_id": "a", "at": f"2026-05-10T09:1{m}:00Z", "role": "user",
                                        "text": f"message {m}"}) + "\n" for m in range(3)))
    first = lanes_cli("history", "add", "--file", str(path))
    assert first.returncode == 0 and "added 3 messages in 1 chat" in first.stdout
    again = lanes_cli("history", "add", "--file", str(path), "--json")
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout) == {"added": 0, "already": 3, "chats": 1}
    assert messages_in(db_url) == 3


def test_a_message_dated_in_the_future_is_refused_by_line_and_nothing_is_written(lanes_cli, db_url, tmp_path):
    path = tmp_path / "history.jsonl"
    path.write_text(
        '{"chat_id": "a", "at": "2026-05-10T09:05:00Z", "role": "user", "text": "hi"}\n'
        '{"chat_id": "a", "at": "2099-01-01T00:00:00Z", "role": "user", "text": "from the future"}\n'
    )
    result = lanes_cli("history", "add", "--file", str(path))
    assert result.returncode == 2, result.stdout
    assert "line 2: time 2099-01-01T00:00:00+00:00 is in the future" in result.stderr
    assert "Traceback" not in result.stderr
    assert messages_in(db_url) == 0


def test_enqueue_refuses_a_now_in_the_future(lanes_cli):
    result = lanes_cli("memory", "enqueue", "--now", "2099-05-10T10:02:00Z")
    assert result.returncode == 2
    assert "--now 2099-05-10T10:02:00Z is in the future" in result.stderr and "completed hours" in result.stderr


def test_lanes_memory_runs_refuses_a_mistyped_sqlite_path_instead_of_creating_a_catalog(tmp_path):
    typo = tmp_path / "catalgo.db"
    env = {"LANES_DATABASE_URL": f"sqlite:///{typo}", "LANES_STATE_DIR": str(tmp_path / "state"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run([sys.executable, "-m", "lanes.cli", "memory", "runs"], env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 2, result.stdout
    assert str(typo) in result.stderr and "Traceback" not in result.stderr
    assert not typo.exists()


@pytest.mark.slow
def test_lanes_memory_retry_queues_failed_runs_again_and_sends_them(lanes_cli, db_url, one_redis_url):
    from lanes.memory import enqueue_runs, list_runs
    from lanes.memory.lifecycle import claim_run, fail_run
    from tests.memory.conftest import say, utc

    engine = make_engine(db_url)
    ensure_memory_schema(engine)
    try:
        say(engine, "a", "2026-05-10T09:10")
        say(engine, "b", "2026-05-10T09:20")
        now = utc("2026-05-10T10:02")
        for run in enqueue_runs(engine, now=now, full=False, retention_days=7, daily_cap=100).created:
            claimed = claim_run(engine, run.id, now=now, lease_seconds=60)
            fail_run(engine, run.id, "BackendError: 503", claim=claimed.claim, now=now)
        listed = lanes_cli("memory", "runs", "--status", "failed")
        assert "lanes memory retry" in listed.stdout
        ids = sorted(r.id for r in list_runs(engine))
        bad = lanes_cli("memory", "retry", "--run", "99999")
        assert bad.returncode == 2 and "no memory run 99999" in bad.stderr
        one = lanes_cli("memory", "retry", "--run", str(ids[0]), "--json")
        assert one.returncode == 0, one.stderr
        assert json.loads(one.stdout) == {"queued": [ids[0]], "sent": 1}
        again = lanes_cli("memory", "retry", "--run", str(ids[0]))
        assert again.returncode == 2 and f"run {ids[0]} is queued" in again.stderr
        rest = lanes_cli("memory", "retry")
        assert rest.returncode == 0 and "1 failed run queued again, 1 sent" in rest.stdout
        assert {(r.status, r.attempts) for r in list_runs(engine)} == {("queued", 0)}
    finally:
        engine.dispose()


def test_the_failed_runs_alert_points_at_lanes_memory_retry():
    from pathlib import Path

    rules = (Path(__file__).resolve().parents[2] / "deploy" / "prometheus" / "rules" / "lanes.yml").read_text()
    alert = rules[rules.index("LanesMemoryRunsFailing"):]
    alert = alert[:alert.index("- alert:")] if "- alert:" in alert else alert
    assert "lanes memory runs --status failed" in alert and "lanes memory retry" in alert

"""``lanes history add`` and ``lanes memory enqueue/runs`` as a user runs them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lanes.catalog import apply_document, load_routing, make_engine
from lanes.memory import ensure_memory_schema
from lanes.settings import Settings
from workers.memory_fleet import plan_memory_fleet


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
    assert listed["days"] == [{"day": "2026-05-10", "runs_created": 7, "skipped_by_cap": 0}]
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

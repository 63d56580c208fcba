"""Two processes on one catalog: applies run one after the other, and a read
sees one committed state, on SQLite and on PostgreSQL.

Each test pauses one side at a chosen statement (a SQLAlchemy event in this
process) or watches the other side's statements (printed by the child before
it runs them), so the interleaving is the same every run.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from lanes.catalog import apply_document, load_routing, make_engine

ROOT = Path(__file__).resolve().parents[2]

# The child: apply one document, printing each statement before it runs and
# "COMMIT" before committing; then the changes it reported.
CHILD = """
import json, sys
import sqlalchemy as sa
from lanes.catalog import apply_document, make_engine

engine = make_engine(sys.argv[1])

@sa.event.listens_for(engine, "before_cursor_execute")
def statement(conn, cursor, text, parameters, context, executemany):
    print("SQL " + " ".join(text.split())[:120], flush=True)

@sa.event.listens_for(engine, "commit")
def commit(conn):
    print("COMMIT", flush=True)

with open(sys.argv[2]) as file:
    changes = apply_document(engine, json.load(file))
print("RESULT " + json.dumps(changes.lines()), flush=True)
"""


def pools(*specs: tuple[str, int]) -> dict:
    return {"pools": [{"name": name, "width": width, "ceiling": 8} for name, width in specs]}


def start_child(db_url: str, document: dict, tmp_path: Path) -> subprocess.Popen:
    path = tmp_path / f"doc-{len(list(tmp_path.glob('doc-*')))}.json"
    path.write_text(json.dumps(document))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, db_url, str(path)],
        cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def read_until(child: subprocess.Popen, wanted) -> str:
    """The child's first output line for which ``wanted(line)`` holds."""
    for line in child.stdout:
        if wanted(line.strip()):
            return line.strip()
    raise AssertionError(f"the child ended first: {child.wait()} {child.stderr.read()}")


def result_of(child: subprocess.Popen) -> list[str]:
    line = read_until(child, lambda text: text.startswith("RESULT "))
    assert child.wait(timeout=120) == 0, child.stderr.read()
    return json.loads(line[len("RESULT "):])


class HeldWriter:
    """Another writer holding the catalog's write lock, written without Lanes
    code: SQLite's BEGIN IMMEDIATE, PostgreSQL's lock on the version row."""

    def __init__(self, db_url: str) -> None:
        self.sqlite = db_url.startswith("sqlite")
        if self.sqlite:
            self.conn = sqlite3.connect(db_url[len("sqlite:///"):], isolation_level=None)
            self.conn.execute("BEGIN IMMEDIATE")
        else:
            self.engine = sa.create_engine(db_url)
            self.conn = self.engine.connect()
            self.conn.begin()
            self.conn.execute(sa.text("SELECT version FROM catalog_version WHERE id = 1 FOR UPDATE"))

    def execute(self, sql: str) -> None:
        if self.sqlite:
            self.conn.execute(sql)
        else:
            self.conn.execute(sa.text(sql))

    def commit(self) -> None:
        self.execute("UPDATE catalog_version SET version = version + 1 WHERE id = 1")
        self.conn.commit()
        self.conn.close()
        if not self.sqlite:
            self.engine.dispose()

    def blocks(self, line: str) -> bool:
        """Is this (printed) child statement one that waits for our lock?"""
        if not line.startswith("SQL "):
            return False
        text = line[4:].upper()
        if self.sqlite:
            return text.startswith(("BEGIN IMMEDIATE", "INSERT", "UPDATE", "DELETE"))
        return "FOR UPDATE" in text or text.startswith(("INSERT", "UPDATE", "DELETE"))


def test_an_apply_plans_from_what_a_concurrent_prune_left(engine, db_url, tmp_path):
    # Given p1 and p2, and another writer that has removed p2 but not committed yet
    apply_document(engine, pools(("p1", 1), ("p2", 1)))
    other = HeldWriter(db_url)
    other.execute("DELETE FROM pools WHERE name = 'p2'")

    # When an apply that widens p2 starts and reaches the lock, then the other commits
    child = start_child(db_url, pools(("p1", 1), ("p2", 3)), tmp_path)
    read_until(child, other.blocks)
    other.commit()

    # Then the apply planned from the committed state: p2 is created again, at 3
    assert result_of(child) == ["+ pool p2"]
    table = load_routing(engine)
    assert {name: pool.width for name, pool in table.pools.items()} == {"p1": 1, "p2": 3}


def test_two_applies_of_the_same_new_pools_make_one_change_and_one_no_op(engine, db_url, tmp_path):
    # Given another writer inserting pool p9 under the lock
    other = HeldWriter(db_url)
    other.execute(
        "INSERT INTO pools (name, width, floor, ceiling, controller_kind, controller_params, enabled, previous_names)"
        " VALUES ('p9', 2, 1, 8, 'off', '{}', true, '[]')"
    )

    # When an apply of the same pool starts meanwhile
    child = start_child(db_url, pools(("p9", 2)), tmp_path)
    read_until(child, other.blocks)
    other.commit()

    # Then it finds the pool already there: no change, no unique-constraint failure
    assert result_of(child) == []
    assert list(load_routing(engine).pools) == ["p9"]


@pytest.mark.slow  # processes racing: the slow tier
def test_a_routing_table_is_read_from_one_committed_state(engine, db_url, tmp_path):
    # Given m1 served by pool p1
    before = {
        "pools": [{"name": "p1", "width": 1}],
        "models": [{"name": "m1", "base_url": "http://gpu:8000/v1", "pool": "p1", "service": "s"}],
        "workflows": [{"name": "w", "candidates": ["m1"]}],
        "services": [{"name": "s", "limit": 1}],
    }
    apply_document(engine, before)
    after = json.loads(json.dumps(before))
    after["pools"] = [{"name": "p3", "width": 2}]
    after["models"][0]["pool"] = "p3"

    reader = make_engine(db_url)
    children: list[subprocess.Popen] = []

    @sa.event.listens_for(reader, "before_cursor_execute")
    def between_pools_and_models(conn, cursor, statement, parameters, context, executemany):
        # When, after the reader has read the pools, a writer moves m1 to a
        # new pool p3 and commits (or waits to: SQLite keeps the reader's snapshot
        # by making the writer's commit wait for it)
        if children or "FROM models" not in statement:
            return
        child = start_child(db_url, after, tmp_path)
        children.append(child)
        read_until(child, lambda line: line == "COMMIT")
        try:
            child.wait(timeout=3)
        except subprocess.TimeoutExpired:
            pass  # the commit waits for this read to end

    try:
        table = load_routing(reader)
    finally:
        reader.dispose()

    # Then the table is the state before the move, whole: m1 still has its pool
    assert children, "the reader never read the models"
    assert table.models["m1"].pool is not None and table.models["m1"].pool.name == "p1"
    assert table.workflows["w"].fleet == "p1" and "p3" not in table.pools
    assert result_of(children[0]) == ["+ pool p3", "~ model m1: pool 'p1' -> 'p3'"]
    assert load_routing(engine).models["m1"].pool.name == "p3"


@pytest.mark.slow
def test_concurrent_applies_of_one_file_never_fail(engine, db_url, tmp_path):
    document = pools(*[(f"pool-{n:03d}", 1 + n % 4) for n in range(100)])
    for _ in range(2):
        children = [start_child(db_url, document, tmp_path) for _ in range(2)]
        results = [result_of(child) for child in children]
        # one apply creates every pool, the other finds nothing to do
        assert sorted(len(lines) for lines in results) == [0, 100]
        with engine.begin() as conn:
            conn.execute(sa.text("DELETE FROM pools"))


def test_an_apply_killed_mid_write_leaves_the_catalog_as_it_was(engine, db_url, tmp_path):
    # Given a catalog, and an apply of many new pools killed after its first insert
    apply_document(engine, pools(("p1", 1)))
    before = load_routing(engine)
    child = start_child(db_url, pools(("p1", 2), *[(f"new-{n}", 1) for n in range(50)]), tmp_path)
    read_until(child, lambda line: line.startswith("SQL INSERT"))
    child.kill()
    child.wait(timeout=60)

    # Then nothing of it is visible, and the next apply goes through
    after = load_routing(engine)
    assert after.stamp == before.stamp and {n: p.width for n, p in after.pools.items()} == {"p1": 1}
    assert apply_document(engine, pools(("p1", 3))).lines() == ["~ pool p1: width 1 -> 3"]

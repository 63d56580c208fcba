"""``lanes db`` and ``lanes catalog`` through click's runner and as a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from lanes.cli import main
from tests.catalog.conftest import EXAMPLE


@pytest.fixture
def lanes(isolated_env, db_url, monkeypatch):
    """Run ``lanes ...`` in-process against a clean catalog on each database."""
    monkeypatch.setenv("LANES_DATABASE_URL", db_url)
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(main, list(args), catch_exceptions=False)

    return run


def test_apply_show_export_and_reapply(lanes, tmp_path):
    applied = lanes("catalog", "apply", str(EXAMPLE))
    assert applied.exit_code == 0, applied.output
    assert "+ pool aifarm-gpu0-dialog" in applied.output and "catalog version 1" in applied.output

    shown = json.loads(lanes("catalog", "show", "--json").stdout)
    assert shown["version"] == 1
    dialog = next(w for w in shown["workflows"] if w["name"] == "dialog")
    assert dialog["candidates"] == ["dialog-27b", "utility-14b", "hosted-fallback"]
    assert "aifarm-gpu1-media" in lanes("catalog", "show").stdout

    exported = tmp_path / "catalog.yaml"
    assert lanes("catalog", "export", "--format", "yaml", "-o", str(exported)).exit_code == 0
    again = lanes("catalog", "apply", str(exported))
    assert again.exit_code == 0 and "no changes; catalog version 1" in again.output


def test_dry_run_and_json_output(lanes, tmp_path):
    lanes("catalog", "apply", str(EXAMPLE))
    changed = tmp_path / "wider.toml"
    changed.write_text(EXAMPLE.read_text().replace("width = 8\n", "width = 10\n"))

    result = lanes("catalog", "apply", str(changed), "--dry-run", "--json")

    assert result.exit_code == 0
    plan = json.loads(result.stdout)
    assert plan["dry_run"] and plan["version"] == 1
    assert plan["changes"] == [
        {"action": "update", "kind": "pool", "name": "aifarm-embedder", "fields": {"width": {"old": 8, "new": 10}}}
    ]


def test_a_bad_file_is_exit_2_with_each_problem_and_no_traceback(lanes, tmp_path):
    lanes("catalog", "apply", str(EXAMPLE))
    bad = tmp_path / "bad.toml"
    bad.write_text(EXAMPLE.read_text().replace('priority = "background"', 'priority = "someday"', 1))

    result = lanes("catalog", "apply", str(bad))

    assert result.exit_code == 2
    assert "workflows[7].priority: 'someday' is not a priority" in result.stderr
    assert "Traceback" not in result.output
    assert json.loads(lanes("catalog", "show", "--json").stdout)["version"] == 1


def test_db_upgrade_current_and_downgrade(lanes):
    assert lanes("db", "upgrade").exit_code == 0
    current = json.loads(lanes("db", "current", "--json").stdout)
    assert [(b["branch"], b["revision"]) for b in current["branches"]] == [
        ("schema", "catalog_0005"), ("fleet", None), ("memory", None)
    ]

    upgraded = lanes("db", "upgrade", "fleet@head")
    assert "Running upgrade fleet_0002 -> fleet_0003" in upgraded.output
    assert "fleet: fleet_0004 (at head)" in upgraded.output

    downgraded = lanes("db", "downgrade", "fleet@base")
    assert downgraded.exit_code == 0 and "fleet: - (opt-in" in downgraded.output
    assert lanes("db", "upgrade", "no_such_revision").exit_code == 2
    assert "catalog_0001" in lanes("db", "history").stdout


def test_an_unreachable_database_is_exit_3_in_one_line(isolated_env, monkeypatch):
    monkeypatch.setenv("LANES_DATABASE_URL", "postgresql+psycopg://nobody@127.0.0.1:1/none")
    result = CliRunner().invoke(main, ["catalog", "show"])
    assert result.exit_code == 3
    assert result.stderr.startswith("error: catalog database postgresql+psycopg://nobody@127.0.0.1:1/none")
    assert "did not answer" in result.stderr and len(result.stderr.splitlines()) == 1
    assert "Traceback" not in result.output


def test_db_current_on_a_fresh_machine_creates_nothing(isolated_env):
    result = CliRunner().invoke(main, ["db", "current"])
    assert result.exit_code == 0 and "no catalog yet" in result.output
    assert not (isolated_env / "catalog.db").exists()


@pytest.mark.slow  # a few seconds of waiting; the fast tier keeps to its 8 minutes
def test_the_lanes_command_as_a_real_process(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("LANES_") or k.startswith("LANES_TEST_")}
    env["LANES_STATE_DIR"] = str(tmp_path / "state")
    command = [sys.executable, "-c", "import sys; from lanes.cli import main; sys.exit(main())"]

    def run(*args):
        return subprocess.run([*command, *args], env=env, capture_output=True, text=True, timeout=60)

    applied = run("catalog", "apply", str(EXAMPLE))
    assert applied.returncode == 0, applied.stderr
    assert (tmp_path / "state" / "catalog.db").exists()

    shown = run("catalog", "show", "--json")
    assert len(json.loads(shown.stdout)["pools"]) == 5

    bad = tmp_path / "bad.yaml"
    bad.write_text("pools:\n  - name: x\n    width: 0\n")
    refused = run("catalog", "apply", str(bad))
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        "error: 1 problem in the catalog; nothing was written",
        "  pools[0].width: 0 is not a width >= 1",
    ]

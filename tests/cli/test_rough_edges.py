"""Issue 10 point 8: the rough edges a new user meets first."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from lanes.embedded import EmbeddedRedis
from tests.cli.conftest import clean_db, lanes, one_line_error, user_env

pytestmark = pytest.mark.timeout(180)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "aifarm.toml"


def _unwritable(tmp_path: Path) -> tuple[Path, list[str]]:
    """A state folder nobody may write, and the command prefix that makes it so.

    root writes anywhere, so for root the folder is a read-only bind mount in a
    mount namespace of the command's own.
    """
    folder = tmp_path / "locked"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o500)
        return folder, []
    mount = f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder} && exec \"$@\""
    return folder, ["unshare", "--mount", "sh", "-c", mount, "sh"]


def _case(tmp_path: Path, case: str) -> tuple[list[str], dict, int, str]:
    state = tmp_path / "state"
    env = user_env(tmp_path, LANES_STATE_DIR=str(state))
    if case == "state folder is a file":
        state.write_text("not a folder")
        return ["catalog", "show"], env, 2, f"state folder {state} is a file"
    if case == "unwritable state folder":
        folder, prefix = _unwritable(tmp_path)
        env["LANES_STATE_DIR"] = str(folder)
        return [*prefix, "catalog", "show"], env, 2, f"state folder {folder} is not writable"
    if case == "mysql URL":
        env["LANES_DATABASE_URL"] = "mysql://lanes:secret@db/lanes"
        return ["catalog", "show"], env, 2, "LANES_DATABASE_URL: 'mysql://lanes:***@db/lanes' is not a supported"
    if case == "Redis URL without a scheme":
        env["LANES_REDIS_URL"] = "127.0.0.1:6379"
        return ["pools"], env, 2, "LANES_REDIS_URL: '127.0.0.1:6379' is not a Redis URL; write it as redis://"
    if case == "empty task id":
        return ["result", ""], env, 2, "task id '' is not a task id"
    if case == "unwritable export path":
        # A catalog to export (a state folder without one is refused before the path is tried).
        subprocess.run([sys.executable, "-m", "lanes.cli", "db", "upgrade"], env=env, check=True,
                       capture_output=True, timeout=120)
        return ["catalog", "export", "-o", str(tmp_path / "no-such-folder" / "fleet.toml")], env, 2, \
            f"cannot use {tmp_path / 'no-such-folder' / 'fleet.toml'}: No such file or directory"
    raise AssertionError(case)


CASES = ["state folder is a file", "unwritable state folder", "mysql URL", "Redis URL without a scheme",
         "empty task id", "unwritable export path"]


@pytest.mark.parametrize("case", CASES)
def test_what_ended_in_a_traceback_is_one_line_and_an_exit_code(tmp_path, case):
    args, env, code, message = _case(tmp_path, case)
    if args[0] == "unshare":
        split = args.index("sh", 4) + 1
        command = [*args[:split], sys.executable, "-m", "lanes.cli", *args[split:]]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    else:
        done = lanes(*args, env=env)

    assert done.returncode == code, done.stdout + done.stderr
    assert message in one_line_error(done)
    assert "secret" not in done.stderr


def test_pools_fits_80_columns_and_never_cuts_a_pool_name(tmp_path, embedded_redis):
    env = user_env(tmp_path, LANES_STATE_DIR=str(tmp_path / "state"), LANES_REDIS_URL=clean_db(embedded_redis),
                   COLUMNS="80")
    assert lanes("catalog", "apply", str(EXAMPLE), env=env).returncode == 0

    done = lanes("pools", env=env)

    assert done.returncode == 0, done.stderr
    for name in ("aifarm-gpu0-dialog", "aifarm-gpu2-utility", "aifarm-gpu1-media", "aifarm-gpu1-privacy",
                 "aifarm-embedder"):
        assert name in done.stdout
    assert max(len(line) for line in done.stdout.splitlines()) <= 80


def test_help_lists_every_command_without_importing_any():
    code = (
        "import sys\n"
        "from lanes.cli import main\n"
        "try:\n"
        "    main(['--help'], prog_name='lanes')\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = ('redis', 'celery', 'pydantic', 'sqlalchemy', 'rich', 'httpx')\n"
        "print(sorted(m for m in sys.modules if m.startswith('lanes.cli.') or m.split('.')[0] in heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    listing, loaded = done.stdout.rsplit("\n", 2)[0], done.stdout.strip().splitlines()[-1]
    for command in ("catalog", "db", "demo", "events", "pools", "redis", "result", "sim", "submit", "worker"):
        assert f"  {command} " in listing
    assert loaded == "[]"


def _no_lanes_folder_above(folder: Path) -> None:
    found = [p for p in (folder, *folder.parents) if (p / ".lanes").is_dir()]
    assert not found, f"a .lanes folder above the test's folder would be found: {found}"


@pytest.mark.slow
def test_the_nearest_lanes_folder_upward_is_the_state_folder(tmp_path):
    _no_lanes_folder_above(tmp_path)
    project = tmp_path / "project"
    (project / ".lanes").mkdir(parents=True)
    deeper = project / "src" / "deeper"
    deeper.mkdir(parents=True)
    env = user_env(tmp_path)

    applied = lanes("catalog", "apply", str(EXAMPLE), env=env, cwd=deeper)
    assert applied.returncode == 0, applied.stderr
    assert (project / ".lanes" / "catalog.db").exists()
    assert not (deeper / ".lanes").exists() and not (project / "src" / ".lanes").exists()

    assert lanes("redis", "start", env=env, cwd=deeper).returncode == 0
    try:
        status = lanes("redis", "status", env=env, cwd=deeper)
        assert status.returncode == 0, status.stderr
        assert f"state folder: {project / '.lanes'} (the nearest .lanes folder from {deeper})" in status.stdout
    finally:
        EmbeddedRedis(project / ".lanes" / "redis").stop()


def test_without_a_lanes_folder_the_users_state_folder_is_used(tmp_path):
    _no_lanes_folder_above(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = user_env(tmp_path)

    applied = lanes("catalog", "apply", str(EXAMPLE), env=env, cwd=elsewhere)

    assert applied.returncode == 0, applied.stderr
    assert (tmp_path / "home" / ".local" / "state" / "lanes" / "catalog.db").exists()
    assert not (elsewhere / ".lanes").exists()


def test_a_misspelt_lanes_variable_gets_a_warning(tmp_path):
    env = user_env(tmp_path, LANES_STATE_DIR=str(tmp_path / "state"), LANES_REDIS_ULR="redis://127.0.0.1:1/0")

    done = lanes("catalog", "show", env=env)

    assert ("warning: unknown environment variable LANES_REDIS_ULR is ignored; did you mean LANES_REDIS_URL?"
            in done.stderr.splitlines())


def test_the_demo_progress_counts_answers_not_submissions(tmp_path, embedded_redis, make_settings):
    from lanes.catalog import apply_document, open_catalog, read_document
    from lanes.demo.run import run_workload
    from lanes.routing.client import LanesClient

    settings = make_settings()
    engine = open_catalog(settings)
    apply_document(engine, read_document(EXAMPLE))
    engine.dispose()
    client = LanesClient(settings, redis_url=clean_db(embedded_redis))
    console = Console(record=True, width=120, force_terminal=False)
    try:
        # No worker runs: every request is sent and none is answered.
        submitted = run_workload(client, 40, seed=7, console=console, timeout=0.5)
    finally:
        client.close()

    shown = console.export_text()
    assert submitted and not any(s.done for s in submitted)
    for priority in {s.priority for s in submitted}:
        count = sum(1 for s in submitted if s.priority is priority)
        assert re.search(rf"^{priority.label} .* 0/{count} +answered · {count} sent ", shown, re.M), shown

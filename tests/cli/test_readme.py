"""The README's five-minute tour, run exactly as written, so the README
cannot drift from the product: each line of its shell block is one step of a
bash session (real embedded Redis, `lanes sim`, a real fleet worker)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lanes.embedded import EmbeddedRedis
from tests.cli.conftest import user_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]


def tour_block() -> list[str]:
    """The lines of the first ```sh block under "## A five-minute tour"."""
    text = (ROOT / "README.md").read_text()
    assert "\n## A five-minute tour\n" in text, "README has no '## A five-minute tour' section"
    section = text.split("\n## A five-minute tour\n", 1)[1]
    block = re.search(r"```sh\n(.*?)\n```", section, re.S)
    assert block, "README's five-minute tour has no sh block"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.lstrip().startswith("#")]


def session_script(lines: list[str], work: Path) -> str:
    """A bash script running each line verbatim, keeping each step's output and exit code."""
    out = ["set -u", f"cd {work}"]
    for number, line in enumerate(lines):
        if re.search(r"&\s*(#.*)?$", line):
            out += [line, f"echo $! >> {work}/background.pids"]
        else:
            # A group, not a subshell: `id=$(...)` stays set for the next steps.
            out += ["{ " + line, f"}} > {work}/step{number}.out 2> {work}/step{number}.err",
                    f"echo $? > {work}/step{number}.rc"]
    return "\n".join(out) + "\n"


def isolated_network(command: list[str]) -> list[str]:
    """Run in a network namespace of its own when possible: the README's simulator
    port (:8700) is then this test's alone, whatever else the machine runs."""
    if os.geteuid() == 0 and shutil.which("unshare") and shutil.which("ip"):
        return ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *command]
    return command


# Run after the README's `lanes result "$id"` (which may well say PENDING: the
# task can still be queued), until the same id reads SUCCESS: Celery also says
# PENDING for an id it never saw, so only a later SUCCESS shows the id was real.
CONFIRM = ('for n in $(seq 120); do lanes result "$id" > confirm.json && python -c "import json, sys; '
           'sys.exit(json.load(open(\'confirm.json\'))[\'state\'] != \'SUCCESS\')" && break; sleep 0.5; done; '
           'cat confirm.json')


def test_the_readmes_five_minute_tour_runs_as_written(tmp_path):
    lines = tour_block()
    shown_at = next(n for n, line in enumerate(lines) if line.startswith('lanes result "$id"'))
    lines.insert(shown_at + 1, CONFIRM)
    work = tmp_path / "work"
    (work / "examples").mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "aifarm.toml", work / "examples" / "aifarm.toml")
    env = user_env(tmp_path, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    script = tmp_path / "session.sh"
    script.write_text(session_script(lines, work))

    try:
        # Files, not pipes: the background steps keep their output open after the session ends.
        with open(tmp_path / "session.log", "wb") as log:
            session = subprocess.run(isolated_network(["bash", str(script)]), env=env, stdout=log,
                                     stderr=subprocess.STDOUT, timeout=540)
        assert session.returncode == 0, (tmp_path / "session.log").read_text()
        steps = []
        for number, line in enumerate(lines):
            rc = work / f"step{number}.rc"
            if rc.exists():
                steps.append((line, int(rc.read_text()), (work / f"step{number}.out").read_text(),
                              (work / f"step{number}.err").read_text()))
    finally:
        for pid in (work / "background.pids").read_text().split() if (work / "background.pids").exists() else []:
            try:
                os.kill(int(pid), signal.SIGTERM)
            except ProcessLookupError:
                pass
        EmbeddedRedis(work / ".lanes" / "redis").stop()

    for line, code, stdout, stderr in steps:
        assert code == 0, f"{line!r} exited {code}: {stdout}{stderr}"
        assert "Traceback" not in stderr, f"{line!r}: {stderr}"
    by_command = {line.split("#")[0].strip(): (stdout, stderr) for line, _, stdout, stderr in steps}
    waited = next(out for cmd, (out, _) in by_command.items() if cmd.endswith("--wait"))
    assert json.loads(waited)["state"] == "SUCCESS"
    shown = json.loads(by_command['lanes result "$id"'][0])
    assert shown["task_id"] and shown["state"] in ("PENDING", "STARTED", "SUCCESS")
    confirmed = json.loads(by_command[CONFIRM][0])
    assert confirmed["task_id"] == shown["task_id"] and confirmed["state"] == "SUCCESS", confirmed
    assert "aifarm-gpu0-dialog" in by_command["lanes pools"][0]
    assert by_command["lanes redis stop"][0].strip() == "stopped"

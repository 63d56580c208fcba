"""docs/SIMULATOR.md's "Running it" shell blocks, run as written against a real
``lanes sim`` process: its start line (on a free port, kept alive when an engine
dies, so the block's ``down`` and revival run in order whatever the machine's
speed) and every ``curl`` line, each of which must get a 2xx answer."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from pathlib import Path

from .conftest import free_port
from .test_cli import start_process, stop_process

DOC = Path(__file__).resolve().parents[2] / "docs" / "SIMULATOR.md"


def running_it_blocks() -> list[list[str]]:
    """The lines of each ```sh block of the "## Running it" section."""
    text = DOC.read_text()
    assert "\n## Running it\n" in text, "docs/SIMULATOR.md has no '## Running it' section"
    section = text.split("\n## Running it\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```sh\n(.*?)\n```", section, re.S)
    assert len(blocks) == 2, "the section's two blocks: start and look, then change a model"
    return [[line for line in block.splitlines() if line.strip()] for block in blocks]


def test_the_simulator_docs_commands_run_as_written(tmp_path):
    start, change = running_it_blocks()
    first, looks = start[0], start[1:]
    args = shlex.split(first, comments=True)
    assert args[:2] == ["lanes", "sim"] and args[-1] == "&", first
    port = free_port()
    process, _ = start_process(*args[2:-1], "--port", str(port), "--keep-alive-on-engine-death")
    try:
        results = []
        for line in [*looks, *change]:
            assert line.startswith("curl "), line
            # -f: an HTTP error is a failed step, not a printed error body.
            script = "set -o pipefail; " + line.replace("localhost:8700", f"localhost:{port}").replace(
                "curl ", "curl -f ", 1)
            done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
            results.append((line, done))
    finally:
        stop_process(process)
    for line, done in results:
        assert done.returncode == 0, f"{line!r} exited {done.returncode}: {done.stdout}{done.stderr}"
    stats = json.loads(results[0][1].stdout)
    assert "chat" in json.dumps(stats), stats
    assert "num_requests" in results[1][1].stdout

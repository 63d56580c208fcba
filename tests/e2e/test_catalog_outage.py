"""PostgreSQL away for a while (issue 33): routing goes on from the last catalog
read, a catalog change during the outage is refused whole, and everything
resumes when the database is back.

A private PostgreSQL of the test's own (Debian's binaries, a cluster under the
test's temporary folder, run as the ``postgres`` user on a free port): the
machine's shared server at 5432 is never touched.
"""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from lanes.embedded import EmbeddedRedis, free_port
from lanes.sim import SimModel
from tests.conftest import missing_service
from tests.e2e.harness import deploy

pytestmark = [pytest.mark.slow, pytest.mark.timeout(480)]

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
DOC = {
    "pools": [{"name": "gpu", "width": 2}],
    "models": [{"name": "m", "base_url": "{sim}", "pool": "gpu"}],
    "workflows": [{"name": "w", "priority": "interactive", "candidates": ["m"]}],
}


class PrivatePostgres:
    """A throwaway PostgreSQL cluster in ``folder``, owned by the postgres user."""

    def __init__(self, folder: Path) -> None:
        found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
        if not found or shutil.which("runuser") is None:
            missing_service("a private PostgreSQL needs Debian's postgresql binaries and runuser")
        self.bin = Path(found[-1]).parent
        self.folder = folder
        self.data = folder / "data"
        self.port = free_port()
        folder.mkdir(parents=True)
        subprocess.run(["chown", "postgres", str(folder), str(folder.parent)], check=True)
        self._as_postgres(str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres")

    def _as_postgres(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(["runuser", "-u", "postgres", "--", *args], check=True, capture_output=True,
                              text=True, timeout=120)

    @property
    def url(self) -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def start(self) -> None:
        self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-l", str(self.folder / "log"),
                          "-o", f"-p {self.port} -k {self.folder} -c listen_addresses=127.0.0.1", "start")

    def stop(self) -> None:
        self._as_postgres(str(self.bin / "pg_ctl"), "-D", str(self.data), "-w", "-m", "fast", "stop")


@pytest.fixture
def postgres():
    # Under /tmp, not pytest's folder: the postgres user cannot enter root's private one.
    folder = Path(tempfile.mkdtemp(prefix="lanes-pg-"))
    server = PrivatePostgres(folder / "cluster")
    server.start()
    yield server
    try:
        server.stop()
    except subprocess.CalledProcessError:
        pass  # already stopped
    shutil.rmtree(folder, ignore_errors=True)


def test_routing_goes_on_from_the_last_catalog_read_while_postgres_is_away(tmp_path, postgres):
    redis_server = EmbeddedRedis(tmp_path / "redis")
    url = redis_server.ensure()
    dep = deploy(tmp_path / "state", url, json.loads(json.dumps(DOC)),
                 [SimModel(name="m", capacity=8, service_ms=20.0)], ["gpu"],
                 lease_seconds=2.0, database_url=postgres.url)
    try:
        before = [dep.client.submit("w", CHAT, deadline=120) for _ in range(3)]
        assert [dep.client.wait(t.id, 120)["state"] for t in before] == ["SUCCESS"] * 3

        postgres.stop()
        time.sleep(2.0)  # past every process's catalog check interval
        during = [dep.client.submit("w", CHAT, deadline=120) for _ in range(3)]
        assert [dep.client.wait(t.id, 120)["state"] for t in during] == ["SUCCESS"] * 3

        # A catalog change while the database is away is refused whole (exit 3), nothing half-written.
        changed = json.loads(json.dumps(DOC))
        changed["pools"][0]["width"] = 3
        changed["models"][0]["base_url"] = dep.sim.base_url
        document = tmp_path / "wider.yaml"  # JSON is YAML
        document.write_text(json.dumps(changed))
        applied = subprocess.run([sys.executable, "-m", "lanes.cli", "catalog", "apply", str(document)],
                                 env=dep.env, capture_output=True, text=True, timeout=120)
        assert applied.returncode == 3, applied.stdout + applied.stderr
        assert "Traceback" not in applied.stderr

        postgres.start()
        after = [dep.client.submit("w", CHAT, deadline=120) for _ in range(3)]
        assert [dep.client.wait(t.id, 120)["state"] for t in after] == ["SUCCESS"] * 3
        # Back: the catalog reads the same (width 2: the refused change left nothing).
        assert dep.client.catalog.table(recheck=True).pools["gpu"].width == 2
    finally:
        dep.close()
        redis_server.stop()

"""The compose stack as Debian's docker-compose reads it, and each of its
Lanes services started natively with its compose environment.

No Docker engine runs here. `docker-compose config` (Debian's package,
which .ci/run installs) validates the file and resolves it; then each Lanes
service's resolved command runs as a process of this host with its resolved
environment, only the service addresses swapped for this host's (Redis,
the catalog database, the simulator, free ports), and its own healthcheck
command must pass.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from lanes.embedded import free_port
from tests.conftest import missing_service
from tests.polling import eventually

ROOT = Path(__file__).resolve().parents[2]
ONE_SHOTS = ("migrate",)
NATIVE = ("sim", "api", "worker-dialog", "worker-utility", "worker-media", "worker-embedder", "worker-privacy",
          "worker-memory", "beat", "flower")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]


def compose_tool() -> list[str]:
    found = shutil.which("docker-compose")
    if found is None:
        missing_service("docker-compose is not installed (Debian package docker-compose; .ci/run installs it)")
    return [found]


def strong_env(tmp_path) -> Path:
    path = tmp_path / ".env"
    path.write_text(
        f"LANES_API_TOKEN={secrets.token_urlsafe(24)}\n"
        f"LANES_FLOWER_BASIC_AUTH=ops:{secrets.token_urlsafe(18)}\n"
        f"GRAFANA_ADMIN_PASSWORD={secrets.token_urlsafe(18)}\n"
        f"POSTGRES_PASSWORD={secrets.token_hex(16)}\n"
    )
    return path


def resolved(env_file: Path, extra: dict | None = None) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith(("LANES_", "POSTGRES_", "GRAFANA_"))} | (extra or {})
    return subprocess.run([*compose_tool(), "--project-directory", str(ROOT), "--file", str(ROOT / "docker-compose.yml"),
                           "--env-file", str(env_file), "config"],
                          capture_output=True, text=True, timeout=120, env=environ)


def test_debians_compose_accepts_the_file_and_binds_ports_to_loopback(tmp_path):
    done = resolved(strong_env(tmp_path))
    assert done.returncode == 0, done.stderr
    services = yaml.safe_load(done.stdout)["services"]
    published = [port for s in services.values() for port in s.get("ports", [])]
    assert len(published) == 4 and all(str(p).startswith("127.0.0.1:") for p in published), published
    wide = resolved(strong_env(tmp_path), {"LANES_PUBLISH_ADDRESS": "0.0.0.0"})
    assert all(str(p).startswith("0.0.0.0:") for s in yaml.safe_load(wide.stdout)["services"].values()
               for p in s.get("ports", []))


def test_compose_refuses_to_resolve_without_the_secrets(tmp_path):
    empty = tmp_path / "empty.env"
    empty.write_text("")
    done = resolved(empty)
    assert done.returncode != 0
    assert re.search(r"(LANES_API_TOKEN|POSTGRES_PASSWORD|LANES_FLOWER_BASIC_AUTH|GRAFANA_ADMIN_PASSWORD)", done.stderr)


def test_the_example_envs_placeholders_are_refused_by_lanes_at_start(tmp_path):
    values = dict(line.split("=", 1) for line in (ROOT / "deploy" / "env.example").read_text().splitlines()
                  if line and not line.startswith("#"))
    base = {k: v for k, v in os.environ.items() if not k.startswith("LANES_") or k.startswith("LANES_TEST_")}
    base |= {"LANES_STATE_DIR": str(tmp_path / "state"), "LANES_REDIS_URL": "redis://127.0.0.1:1/0"}
    api = subprocess.run([sys.executable, "-m", "lanes.cli", "api", "--port", "0"], capture_output=True, text=True,
                         timeout=60, env=base | {"LANES_API_TOKEN": values["LANES_API_TOKEN"]})
    assert api.returncode == 2 and "'change-me'" in api.stderr, api.stderr
    flower = subprocess.run([sys.executable, "-m", "lanes.cli", "flower", "--port", "0"], capture_output=True,
                            text=True, timeout=60,
                            env=base | {"LANES_FLOWER_BASIC_AUTH": values["LANES_FLOWER_BASIC_AUTH"]})
    assert flower.returncode == 2 and "user 'admin'" in flower.stderr, flower.stderr


class Native:
    """The resolved stack, rewritten to run on this host."""

    def __init__(self, services: dict, tmp_path: Path, redis_url: str) -> None:
        self.services = services
        self.tmp = tmp_path
        self.ports = {8700: free_port(), 8080: free_port(), 5555: free_port()}
        for name in NATIVE:
            port = services[name].get("environment", {}).get("LANES_METRICS_PORT")
            if port:
                self.ports[int(port)] = free_port()
        self.redis_url = redis_url
        self.database_url = f"sqlite:///{tmp_path / 'catalog.db'}"
        catalog = (ROOT / "deploy" / "catalog.toml").read_text()
        self.catalog = tmp_path / "catalog.toml"
        self.catalog.write_text(catalog.replace("http://sim:8700/", f"http://127.0.0.1:{self.ports[8700]}/"))
        self.procs: dict[str, subprocess.Popen] = {}

    def swap(self, text: str) -> str:
        text = text.replace("/app/deploy/catalog.toml", str(self.catalog)).replace("0.0.0.0", "127.0.0.1")
        for inside, outside in self.ports.items():
            text = re.sub(rf"(?<![0-9]){inside}(?![0-9])", str(outside), text)
        return text

    def environment(self, name: str) -> dict:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LANES_") or k.startswith("LANES_TEST_")}
        for key, value in self.services[name].get("environment", {}).items():
            value = "" if value is None else str(value)
            if key == "LANES_REDIS_URL":
                assert value == "redis://redis:6379/0"
                value = self.redis_url
            elif key == "LANES_DATABASE_URL":
                assert "@postgres:5432/lanes" in value
                value = self.database_url
            elif key == "LANES_STATE_DIR":
                value = str(self.tmp / "state")
            else:
                value = self.swap(value)
            if value:
                env[key] = value
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        return env

    def command(self, name: str) -> list[str]:
        # "$$" is compose's escape for a "$" the container's shell sees.
        return [self.swap(str(word)).replace("$$", "$") for word in self.services[name]["command"]]

    def run_once(self, name: str) -> subprocess.CompletedProcess:
        return subprocess.run(self.command(name), env=self.environment(name), capture_output=True, text=True,
                              timeout=180)

    def start(self, name: str) -> None:
        log = open(self.tmp / f"{name}.log", "w")
        self.procs[name] = subprocess.Popen(self.command(name), env=self.environment(name), stdout=log,
                                            stderr=subprocess.STDOUT, start_new_session=True)

    def healthy(self, name: str) -> bool:
        test = self.services[name]["healthcheck"]["test"]
        assert test[0] == "CMD"
        command = [self.swap(word) for word in test[1:]]
        if command[0] == "python":
            command[0] = sys.executable
        proc = self.procs[name]
        assert proc.poll() is None, f"{name} exited {proc.returncode}: {self.log(name)}"
        return subprocess.run(command, capture_output=True, timeout=30).returncode == 0

    def log(self, name: str) -> str:
        return (self.tmp / f"{name}.log").read_text()[-3000:]

    def stop(self) -> dict[str, int | None]:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        codes = {}
        deadline = time.monotonic() + 60
        for name, proc in self.procs.items():
            try:
                codes[name] = proc.wait(max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                codes[name] = None
        return codes


def test_each_service_starts_natively_with_its_compose_environment_and_passes_its_healthcheck(
        tmp_path, one_redis_url):
    done = resolved(strong_env(tmp_path))
    assert done.returncode == 0, done.stderr
    stack = Native(yaml.safe_load(done.stdout)["services"], tmp_path, one_redis_url)

    first = stack.run_once("migrate")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "applied" in first.stdout
    # A change made after the first start...
    changed = subprocess.run([sys.executable, "-m", "lanes.cli", "pools", "set-width", "aifarm-gpu2-utility", "3"],
                             env=stack.environment("migrate"), capture_output=True, text=True, timeout=60)
    assert changed.returncode == 0, changed.stderr
    # ...survives the next `up`, whose migrate leaves a catalog it finds alone.
    again = stack.run_once("migrate")
    assert again.returncode == 0 and "--if-empty leaves it as it is" in again.stdout, again.stdout + again.stderr
    shown = subprocess.run([sys.executable, "-m", "lanes.cli", "pools", "--json"], env=stack.environment("migrate"),
                           capture_output=True, text=True, timeout=60)
    widths = {row["pool"]: row["configured_width"] for row in yaml.safe_load(shown.stdout)}
    assert widths["aifarm-gpu2-utility"] == 3

    try:
        for name in NATIVE:
            stack.start(name)
        for name in NATIVE:
            eventually(lambda: stack.healthy(name), timeout=180, interval=1.0, what=f"{name}'s healthcheck")
    finally:
        codes = stack.stop()
    assert all(code is not None for code in codes.values()), codes


def test_the_stack_stops_at_migrate_on_the_example_files_placeholders(tmp_path, one_redis_url):
    done = resolved(ROOT / "deploy" / "env.example")
    assert done.returncode == 0, done.stderr  # compose takes them: only Lanes can tell a placeholder
    services = yaml.safe_load(done.stdout)["services"]
    assert services["grafana"]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    stack = Native(services, tmp_path, one_redis_url)
    refused = stack.run_once("migrate")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    for name in ("LANES_API_TOKEN", "LANES_FLOWER_BASIC_AUTH", "POSTGRES_PASSWORD", "GRAFANA_ADMIN_PASSWORD"):
        assert name in refused.stderr, name
    assert "change-me-to" not in refused.stderr
    assert not (tmp_path / "catalog.db").exists(), "nothing was migrated"

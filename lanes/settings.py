"""Typed settings, read from ``LANES_*`` environment variables only when asked.

Nothing here runs at import: call :func:`load_settings` (or build
:class:`Settings` by keyword) where a process starts.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Mapping
from urllib.parse import urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


def mask_url(url: str | None) -> str | None:
    """Return ``url`` with any password replaced by ``***``."""
    if not url:
        return url
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


STATE_FOLDER_NAME = ".lanes"

# LANES_* variables read outside Settings: the embedded server's binary, the
# venv of dev.py, the CLI's traceback switch. LANES_TEST_* and LANES_BENCH_*
# belong to the tests and benchmarks.
OTHER_VARIABLES = frozenset({"LANES_REDIS_SERVER", "LANES_VENV", "LANES_TRACEBACK"})
OTHER_PREFIXES = ("LANES_TEST_", "LANES_BENCH_")

REDIS_SCHEMES = ("redis", "rediss", "unix")
DATABASE_BACKENDS = ("sqlite", "postgresql")


def find_state_dir(start: Path | None = None, environ: Mapping[str, str] | None = None) -> tuple[Path, str]:
    """The state folder to use when ``LANES_STATE_DIR`` is unset, and why.

    The nearest ``.lanes`` folder from ``start`` upward, as git finds ``.git``
    (so every folder of a project shares one catalog and one Redis), else the
    user's own state folder (``$XDG_STATE_HOME/lanes``, by default
    ``~/.local/state/lanes``). Never a new ``.lanes`` in whatever folder a
    command happens to run in.
    """
    environ = os.environ if environ is None else environ
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        candidate = folder / STATE_FOLDER_NAME
        if candidate.is_dir():
            return candidate, f"the nearest {STATE_FOLDER_NAME} folder from {here}"
    base = environ.get("XDG_STATE_HOME") or str(Path(environ.get("HOME") or Path.home()) / ".local" / "state")
    return Path(base) / "lanes", f"the user's state folder (no {STATE_FOLDER_NAME} folder in {here} or above it)"


def default_state_dir() -> Path:
    return find_state_dir()[0]


def describe_state_dir(settings: "Settings", environ: Mapping[str, str] | None = None) -> str:
    """Which state folder ``settings`` use, and where that choice came from."""
    environ = os.environ if environ is None else environ
    if environ.get("LANES_STATE_DIR"):
        return f"{settings.state_dir} (from LANES_STATE_DIR)"
    found, why = find_state_dir(environ=environ)
    if found == settings.state_dir:
        return f"{settings.state_dir} ({why})"
    return str(settings.state_dir)


def unknown_variables(environ: Mapping[str, str] | None = None) -> list[str]:
    """One warning per ``LANES_*`` variable no part of Lanes reads (a typo, mostly)."""
    environ = os.environ if environ is None else environ
    known = {f"LANES_{name.upper()}" for name in Settings.model_fields} | OTHER_VARIABLES
    warnings = []
    for name in sorted(environ):
        if not name.startswith("LANES_") or name in known or name.startswith(OTHER_PREFIXES):
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.75)
        hint = f"; did you mean {close[0]}?" if close else "; no setting has that name"
        warnings.append(f"unknown environment variable {name} is ignored{hint}")
    return warnings


class Settings(BaseSettings):
    """Everything a Lanes process needs to know about its surroundings.

    Redis and database URLs are optional: without them Lanes runs an embedded
    Redis server and a SQLite catalog under ``state_dir``.
    """

    model_config = SettingsConfigDict(env_prefix="LANES_", frozen=True, extra="forbid")

    redis_url: str | None = Field(default=None, description="Redis for lanes, broker and results")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL of the catalog")
    api_token: SecretStr | None = Field(default=None, description="bearer token of the admin API")
    flower_basic_auth: SecretStr | None = Field(
        default=None, description="`lanes flower`'s logins: user:password, several separated by commas",
    )
    state_dir: Path = Field(default_factory=default_state_dir)
    key_prefix: str = Field(default="lanes:v2", description="prefix of every Redis key Lanes writes")

    lease_seconds: float = Field(default=30.0, gt=0)
    renew_seconds: float | None = Field(default=None, gt=0, description="default: a third of the lease")
    redis_timeout_seconds: float = Field(default=5.0, gt=0)

    result_ttl_seconds: int = Field(default=86_400, ge=60)
    idempotency_ttl_seconds: int = Field(default=86_400, ge=60)
    admission_cap_seconds: float = Field(default=300.0, gt=0)
    visibility_timeout_seconds: int = Field(default=7_200, ge=60)
    workers_per_lane: int = Field(default=2, ge=1)
    fleet_min_workers: int = Field(default=2, ge=2)
    fleet_max_workers: int = Field(default=64, ge=2)
    events_max: int = Field(default=100_000, ge=100)
    events_enabled: bool = True
    # The worker memory gate (workers/memgate.py): stop taking tasks at this
    # fraction of the worker's cgroup memory limit, resume below the low mark.
    # Unset: no gate, and controllers that could raise a width above the
    # configured one fail closed (the pool runs at its configured width).
    memory_gate_high: float | None = Field(default=None, gt=0, le=1)
    memory_gate_low: float | None = Field(default=None, gt=0, le=1)

    # Memory runs and the beat (see README "Memory runs").
    memory_retention_days: int = Field(default=7, ge=1, le=366, description="days of history the full scan covers")
    memory_daily_cap: int = Field(default=5_000, ge=0, description="memory runs created per UTC day at most")
    memory_max_attempts: int = Field(default=4, ge=1, description="tries of one memory run before it is failed")
    memory_retry_seconds: float = Field(default=30.0, gt=0, description="first retry delay; doubles per attempt")
    memory_workers_per_lane: int = Field(default=2, ge=1)
    memory_workers_floor: int = Field(default=1, ge=1)
    memory_workers_cap: int = Field(default=32, ge=1)
    farm_limits_url: str | None = Field(default=None, description="JSON of the farm's per-service limits")
    lane_check_seconds: float = Field(default=300.0, gt=0, description="period of the lane-config check")
    beat_lock_seconds: float = Field(default=60.0, ge=5, description="a dead beat's lock lapses after this")
    # Prometheus exposition of a fleet worker (``lanes worker``): /metrics on
    # this port; 0 serves nothing (the default, so tests and laptops open no port).
    metrics_port: int = Field(default=0, ge=0, le=65_535, description="port of a worker's /metrics; 0 = off")
    max_payload_bytes: int = Field(default=1_048_576, ge=1_024, description="largest request payload, as JSON")
    idempotency_claim_seconds: float = Field(
        default=10.0, gt=0, description="how long an idempotency key stays bound to a task not yet sent"
    )

    def __init__(self, **values) -> None:
        # Keyword-only: a positional argument would land in pydantic-settings'
        # own private parameters and be silently misread.
        super().__init__(**values)

    @field_validator("redis_url")
    @classmethod
    def _redis_url_has_a_scheme(cls, value: str | None) -> str | None:
        if value is None:
            return None
        scheme = urlsplit(value).scheme if "://" in value else ""
        if scheme not in REDIS_SCHEMES:
            raise ValueError(
                f"{mask_url(value)!r} is not a Redis URL; write it as redis://HOST:PORT/DB "
                f"(schemes: {', '.join(s + '://' for s in REDIS_SCHEMES)})"
            )
        return value

    @field_validator("database_url")
    @classmethod
    def _database_is_supported(cls, value: str | None) -> str | None:
        if value is None:
            return None
        scheme = urlsplit(value).scheme if "://" in value else ""
        backend = scheme.split("+", 1)[0]
        if backend not in DATABASE_BACKENDS:
            raise ValueError(
                f"{mask_url(value)!r} is not a supported catalog database; use sqlite:///PATH "
                "or postgresql+psycopg://USER@HOST/DB"
            )
        return value

    @field_validator("key_prefix")
    @classmethod
    def _prefix_has_no_braces(cls, value: str) -> str:
        if "{" in value or "}" in value or not value:
            raise ValueError(f"key prefix {value!r} must be non-empty and hold no braces")
        return value

    @field_validator("flower_basic_auth")
    @classmethod
    def _logins_are_user_password(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None:
            return None
        for login in value.get_secret_value().split(","):
            user, sep, password = login.strip().partition(":")
            if not sep or not user or not password:
                # Name the user, never the password.
                raise ValueError(
                    f"LANES_FLOWER_BASIC_AUTH entry for user {user or '(empty)'!r} is not user:password; "
                    "give user:password (several separated by commas)"
                )
        return value

    @model_validator(mode="after")
    def _renew_inside_lease(self) -> "Settings":
        if self.renew_seconds is not None and self.renew_seconds >= self.lease_seconds:
            raise ValueError(
                f"renew_seconds {self.renew_seconds} must be shorter than lease_seconds {self.lease_seconds}"
            )
        if self.memory_workers_cap < self.memory_workers_floor:
            raise ValueError(
                f"memory_workers_cap {self.memory_workers_cap} is below memory_workers_floor {self.memory_workers_floor}"
            )
        if self.fleet_max_workers < self.fleet_min_workers:
            raise ValueError(
                f"fleet_max_workers {self.fleet_max_workers} is below fleet_min_workers {self.fleet_min_workers}"
            )
        return self

    @property
    def renew_interval(self) -> float:
        return self.renew_seconds if self.renew_seconds is not None else self.lease_seconds / 3

    @property
    def background_wait_cap(self) -> float:
        """How long a deadline-less lane wait may last before its task is requeued.

        Below Celery's visibility timeout, so a waiting task is never redelivered.
        """
        return max(1.0, self.visibility_timeout_seconds - max(30.0, self.visibility_timeout_seconds * 0.1))

    @property
    def sqlite_path(self) -> Path:
        return self.state_dir / "catalog.db"

    def catalog_url(self) -> str:
        """The configured database URL, or the embedded SQLite file."""
        return self.database_url or f"sqlite:///{self.sqlite_path}"

    def __repr_args__(self):
        for name, value in super().__repr_args__():
            if name in ("redis_url", "database_url"):
                value = mask_url(value)
            yield name, value


def load_settings(**overrides) -> Settings:
    """Read the environment now; keyword overrides win over it."""
    return Settings(**overrides)

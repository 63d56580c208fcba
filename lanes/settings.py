"""Typed settings, read from ``LANES_*`` environment variables only when asked.

Nothing here runs at import: call :func:`load_settings` (or build
:class:`Settings` by keyword) where a process starts.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Literal, Mapping
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


from lanes.urls import mask_url  # noqa: F401  (also imported from here by its callers)


STATE_FOLDER_NAME = ".lanes"

# LANES_* variables read outside Settings: the embedded server's binary, the
# venv of dev.py, the CLI's traceback switch. LANES_TEST_* and LANES_BENCH_*
# belong to the tests and benchmarks.
OTHER_VARIABLES = frozenset({"LANES_REDIS_SERVER", "LANES_VENV", "LANES_TRACEBACK"})
OTHER_PREFIXES = ("LANES_TEST_", "LANES_BENCH_")

REDIS_SCHEMES = ("redis", "rediss", "unix")

# ``ssl_cert_reqs`` of a rediss:// URL in either spelling: redis-py's
# (required) or Python's ssl constant that Celery's own error suggests
# (CERT_REQUIRED). Normalised to redis-py's, which Celery and kombu read too.
CERT_REQS = {"required": "required", "cert_required": "required", "optional": "optional",
             "cert_optional": "optional", "none": "none", "cert_none": "none"}


def normalise_tls(url: str) -> str:
    """``url`` with its ``ssl_cert_reqs`` in the one spelling every client reads.

    A rediss:// URL without one verifies the server's certificate (required),
    Celery's result store refuses the URL otherwise; an unknown value is
    refused here, before anything is published.
    """
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    seen = False
    out = []
    for name, value in pairs:
        if name == "ssl_cert_reqs":
            seen = True
            canonical = CERT_REQS.get(value.strip().lower())
            if canonical is None:
                raise ValueError(
                    f"ssl_cert_reqs={value!r} in {mask_url(url)!r} is not a certificate requirement; "
                    "use required (CERT_REQUIRED), optional (CERT_OPTIONAL) or none (CERT_NONE)"
                )
            value = canonical
        out.append((name, value))
    if parts.scheme == "rediss" and not seen:
        out.append(("ssl_cert_reqs", "required"))
    if out == pairs:  # nothing to change: the URL as written (urlunsplit would drop unix:///'s empty host)
        return url
    return urlunsplit(parts._replace(query=urlencode(out, safe="/")))
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

    redis_url: str | None = Field(default=None, description="Redis of the lanes (and of broker and results by default)")
    # The broker and the result store may live on a Redis of their own (a
    # persistent one, while the lanes' runs without persistence); unset, they
    # share the lanes' Redis (docs/DEPLOYMENT.md, "Durable queue and results").
    broker_url: str | None = Field(
        default=None, description="Redis of the Celery broker (or sentinel://...?master_name=NAME); default: redis_url",
    )
    result_url: str | None = Field(default=None, description="Redis of the task results; default: redis_url")
    database_url: str | None = Field(default=None, description="SQLAlchemy URL of the catalog")
    api_token: SecretStr | None = Field(default=None, description="bearer token of the API's admin scope (all of it)")
    api_submit_token: SecretStr | None = Field(
        default=None, description="bearer token of the API's submit scope: tasks and history, not the fleet",
    )
    api_max_body_bytes: int | None = Field(
        default=None, ge=1_024, description="largest request body the API reads; default: max_payload_bytes + 64 KiB",
    )
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
    capacity_requeues: int = Field(default=3, ge=0, le=100,
                                   description="requeues of a task whose last candidate's wait timed out")
    capacity_requeue_seconds: float = Field(default=5.0, gt=0, le=3600,
                                            description="first backoff of a capacity requeue; doubles per requeue")
    # Outages (workers/outage.py): a task whose Redis went away mid-walk waits
    # this long for it (within its deadline); background work whose candidates
    # all failed retryably is retried with backoff within its deadline or the horizon.
    redis_outage_seconds: float = Field(default=300.0, ge=0, le=86_400,
                                        description="how long a task waits for its Redis to come back")
    background_retry_seconds: float = Field(default=2.0, gt=0, le=3600,
                                            description="first backoff of a background outage retry; doubles")
    background_retry_cap_seconds: float = Field(default=120.0, gt=0, le=86_400,
                                                description="longest backoff between background outage retries")
    background_retry_horizon_seconds: float = Field(
        default=21_600.0, ge=0, le=30 * 86_400,
        description="how long after its submit a background task without a deadline is still retried")
    visibility_timeout_seconds: int = Field(default=7_200, ge=60)
    # How many messages one fleet worker process takes from each of its
    # queues at most: each is a lane waiter (or a call) on a green thread of
    # its own, so all waiting work is in the lane, where priority, shares and
    # deadlines apply. Past it, the broker keeps the rest in priority order.
    # About 30 KB of memory each (docs/BENCHMARKS_JOURNAL.md); the memory gate still
    # stops taking work at its high mark.
    fleet_held_messages: int = Field(default=2_000, ge=1, le=100_000,
                                     description="messages a fleet worker process holds per queue (1-100000)")
    # threads (the default): Celery's threads pool, a thread per held message,
    # width x 2 threads a queue within 2..64. gevent: a green thread per held
    # message, up to fleet_held_messages, so every waiting request is a lane
    # waiter (docs/SCHEDULING.md, "Fleet workers"; not yet the default: see its known gaps).
    fleet_pool: Literal["gevent", "threads"] = Field(default="threads", description="fleet workers' pool")
    # A worker refreshes the broker's record of the messages it holds every
    # third of this; a worker that dies (SIGKILL, OOM, host lost) stops, and
    # its messages go back to their queue this long after its last refresh.
    message_lease_seconds: float = Field(default=90.0, ge=3, le=86_400,
                                         description="a dead worker's messages return after this (3-86400 s)")
    events_max: int = Field(default=100_000, ge=100)
    events_enabled: bool = True
    # The worker memory gate (workers/memgate.py): stop taking tasks at this
    # fraction of the worker's cgroup memory limit, resume below the low mark.
    # Unset: no gate, and controllers that could raise a width above the
    # configured one fail closed (the pool runs at its configured width).
    memory_gate_high: float | None = Field(default=None, gt=0, le=1)
    memory_gate_low: float | None = Field(default=None, gt=0, le=1)
    # The cgroup folder the gate reads (memory.current/memory.max, or v1's
    # memory/ files). Default: this process's own, /sys/fs/cgroup. Set it to
    # read a container's cgroup mounted elsewhere.
    memory_gate_cgroup: Path | None = Field(default=None, description="cgroup folder the memory gate reads")

    # Memory runs and the beat (see docs/MEMORY_RUNS.md).
    memory_retention_days: int = Field(default=7, ge=1, le=366, description="days of history the full scan covers")
    memory_daily_cap: int = Field(default=5_000, ge=0, description="memory runs created per UTC day at most")
    memory_max_attempts: int = Field(default=4, ge=1, description="tries of one memory run before it is failed")
    memory_retry_seconds: float = Field(default=30.0, gt=0, description="first retry delay; doubles per attempt")
    memory_lease_seconds: float = Field(default=120.0, ge=1, description="a memory run's claim lapses after this "
                                        "unless its worker renews it (every third of it)")
    memory_workers_per_lane: int = Field(default=2, ge=1)
    memory_workers_floor: int = Field(default=1, ge=1)
    memory_workers_cap: int = Field(default=32, ge=1)
    farm_limits_url: str | None = Field(default=None, description="JSON of the farm's per-service limits")
    lane_check_seconds: float = Field(default=300.0, gt=0, description="period of the lane-config check")
    beat_lock_seconds: float = Field(default=60.0, ge=5, description="a dead beat's lock lapses after this")
    # Prometheus exposition of a fleet worker (``lanes worker``): /metrics on
    # this port; 0 serves nothing (the default, so tests and laptops open no port).
    metrics_port: int = Field(default=0, ge=0, le=65_535, description="port of a worker's /metrics; 0 = off")
    # Where that port listens: this host only unless told (a container sets
    # 0.0.0.0 so Prometheus in another container can scrape it).
    metrics_host: str = Field(default="127.0.0.1", min_length=1, description="address of a worker's /metrics")
    max_payload_bytes: int = Field(default=1_048_576, ge=1_024, description="largest request payload, as JSON")
    idempotency_claim_seconds: float = Field(
        default=10.0, gt=0, description="how long an idempotency key stays bound to a task not yet sent"
    )

    def __init__(self, **values) -> None:
        # Keyword-only: a positional argument would land in pydantic-settings'
        # own private parameters and be silently misread.
        super().__init__(**values)

    @field_validator("redis_url", "broker_url", "result_url")
    @classmethod
    def _redis_url_has_a_scheme(cls, value: str | None, info) -> str | None:
        if value is None:
            return None
        scheme = urlsplit(value).scheme if "://" in value else ""
        # Only the broker may sit behind Sentinel: kombu's Sentinel transport
        # reads the URL; the lanes and the results are reached with redis-py's URLs.
        if scheme == "sentinel" and info.field_name == "broker_url":
            from lanes.sentinel import parse

            parse(value)  # a missing master_name or a bad address is refused here, before anything runs
            return value
        if scheme not in REDIS_SCHEMES:
            broker = " (LANES_BROKER_URL also takes sentinel://)" if info.field_name == "broker_url" else ""
            raise ValueError(
                f"{mask_url(value)!r} is not a Redis URL; write it as redis://HOST:PORT/DB "
                f"(schemes: {', '.join(s + '://' for s in REDIS_SCHEMES)}){broker}"
            )
        return normalise_tls(value)

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
        broker = self.broker_url or self.redis_url
        if broker is not None and broker[:7].lower() == "unix://":
            # kombu's Redis transport connects over TCP (or TLS); a unix:// URL
            # would be read as a transport of that name when the worker starts.
            which = "LANES_BROKER_URL" if self.broker_url else "LANES_REDIS_URL (the broker's by default)"
            raise ValueError(
                f"{which} {mask_url(broker)!r} is a Unix socket, which the Celery broker cannot use; "
                f"set LANES_BROKER_URL to the same Redis over TCP (redis://HOST:PORT/DB) "
                f"(the lanes and the results may stay on unix://)"
            )
        if self.memory_workers_cap < self.memory_workers_floor:
            raise ValueError(
                f"memory_workers_cap {self.memory_workers_cap} is below memory_workers_floor {self.memory_workers_floor}"
            )
        return self

    @property
    def api_body_limit(self) -> int:
        """The largest request body the API reads (a payload at its limit, plus room for the rest)."""
        return self.api_max_body_bytes or self.max_payload_bytes + 65_536

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
            if name in ("redis_url", "broker_url", "result_url", "database_url"):
                value = mask_url(value)
            yield name, value


def broker_url_of(settings: "Settings", lanes_url: str) -> str:
    """The broker's Redis: ``LANES_BROKER_URL``, else the lanes' Redis."""
    return settings.broker_url or lanes_url


def result_url_of(settings: "Settings", lanes_url: str) -> str:
    """The result store's Redis: ``LANES_RESULT_URL``, else the lanes' Redis."""
    return settings.result_url or lanes_url


def load_settings(**overrides) -> Settings:
    """Read the environment now; keyword overrides win over it."""
    return Settings(**overrides)


# A secret a server starts with must be at least this long and none of the
# words an example file ships with (``deploy/env.example``'s "change-me").
MIN_SECRET_LENGTH = 16
PLACEHOLDER_WORDS = ("change-me", "changeme", "change_me", "replace-me", "replaceme", "placeholder", "example",
                     "password", "secret", "xxxx")


def weak_secret(value: str) -> str | None:
    """Why ``value`` is no secret to serve with (never quoting it), or None."""
    if len(value) < MIN_SECRET_LENGTH:
        return f"is {len(value)} characters long, shorter than {MIN_SECRET_LENGTH}"
    lowered = value.lower()
    word = next((w for w in PLACEHOLDER_WORDS if w in lowered), None)
    if word is not None:
        return f"holds the placeholder word {word!r}"
    if len(set(value)) < 4:
        return "repeats too few characters"
    return None


def secret_problems(settings: Settings, *, names: tuple[str, ...]) -> list[str]:
    """One line per weak secret among the settings ``names`` (LANES_API_TOKEN...).

    A Flower login's password is judged alone, and named by its user.
    """
    problems = []
    for name in names:
        secret = getattr(settings, name)
        if secret is None:
            continue
        variable = f"LANES_{name.upper()}"
        if name == "flower_basic_auth":
            for login in secret.get_secret_value().split(","):
                user, _, password = login.strip().partition(":")
                why = weak_secret(password)
                if why:
                    problems.append(f"{variable}: the password of user {user!r} {why}")
            continue
        why = weak_secret(secret.get_secret_value())
        if why:
            problems.append(f"{variable} {why}")
    if problems:
        problems.append("generate one with: python3 -c 'import secrets; print(secrets.token_urlsafe(24))'")
    return problems

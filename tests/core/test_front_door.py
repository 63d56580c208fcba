"""The public names, settings and embedded Redis: what every user meets first."""

import subprocess
import sys

import pytest
import redis

import lanes
from lanes.embedded import EmbeddedRedis
from lanes.errors import LanesError
from lanes.settings import Settings, mask_url


def test_every_public_name_is_exported_and_importable():
    for name in lanes.__all__:
        assert getattr(lanes, name) is not None, name
    assert sorted(lanes.__all__) == sorted(set(lanes.__all__))


def test_every_error_has_the_one_root():
    import lanes.errors as errors

    for name in errors.__all__:
        assert issubclass(getattr(errors, name), LanesError)


def test_importing_lanes_reads_no_environment_and_connects_nowhere():
    code = (
        "import os, socket, sys\n"
        "def refuse(*a, **k): raise AssertionError('connected at import')\n"
        "socket.socket.connect = refuse\n"
        "os.environ['LANES_REDIS_URL'] = 'not a url'\n"
        "import lanes, lanes.lane, lanes.catalog, lanes.routing.walker, lanes.cli\n"
        "assert 'lanes.routing.client' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_settings_never_show_a_password_or_token():
    s = Settings(redis_url="redis://:hunter2@h:6379/0", database_url="postgresql+psycopg://u:pw@db/x",
                 api_token="tok-123")
    text = repr(s) + str(s)
    assert "hunter2" not in text and "pw@" not in text and "tok-123" not in text
    assert "redis://:***@h:6379/0" in text


def test_settings_are_keyword_only_and_validated(tmp_path):
    with pytest.raises(TypeError):
        Settings("redis://x")  # noqa
    with pytest.raises(ValueError, match="renew_seconds"):
        Settings(state_dir=tmp_path, lease_seconds=1, renew_seconds=2)
    with pytest.raises(ValueError, match="braces"):
        Settings(state_dir=tmp_path, key_prefix="a{b}")


def test_settings_come_from_lanes_variables(monkeypatch, tmp_path):
    monkeypatch.setenv("LANES_LEASE_SECONDS", "12.5")
    monkeypatch.setenv("LANES_STATE_DIR", str(tmp_path))
    s = lanes.load_settings()
    assert s.lease_seconds == 12.5 and s.state_dir == tmp_path
    assert s.catalog_url() == f"sqlite:///{tmp_path / 'catalog.db'}"
    assert s.renew_interval == pytest.approx(12.5 / 3)


def test_mask_url_leaves_urls_without_passwords_alone():
    assert mask_url("redis://h:1/0") == "redis://h:1/0"
    assert mask_url(None) is None


def test_the_embedded_redis_starts_attaches_and_stops(tmp_path):
    server = EmbeddedRedis(tmp_path / "r")
    url = server.ensure()
    try:
        client = redis.Redis.from_url(url)
        assert client.ping()
        assert client.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert EmbeddedRedis(tmp_path / "r").ensure() == url  # a second process attaches
    finally:
        assert server.stop()
    assert not server.is_running()
    assert server.stop() is False


def test_the_redis_commands_of_the_cli(tmp_path):
    env = {"LANES_STATE_DIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    run = lambda *args: subprocess.run([sys.executable, "-m", "lanes.cli", "redis", *args], env=env,
                                       capture_output=True, text=True, timeout=60)
    started = run("start")
    assert started.returncode == 0 and started.stdout.startswith("redis://127.0.0.1:")
    status = run("status")
    assert status.returncode == 0 and "redis 6.2" in status.stdout
    assert run("stop").stdout.strip() == "stopped"
    assert run("stop").stdout.strip() == "not running"


def test_processes_starting_the_embedded_redis_at_once_share_one_server(tmp_path):
    code = "import sys; from lanes.embedded import EmbeddedRedis; print(EmbeddedRedis(sys.argv[1]).ensure())"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "r")], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    urls = {p.communicate(timeout=60)[0].strip() for p in procs}
    try:
        assert len(urls) == 1
    finally:
        EmbeddedRedis(tmp_path / "r").stop()

"""What a process shows and where it listens: URLs masked in every form,
/metrics on this host only unless told."""

from __future__ import annotations

import socket

import pytest
from prometheus_client import CollectorRegistry

from lanes.metrics.exposition import serve
from lanes.settings import Settings, mask_url


@pytest.mark.parametrize("url, hidden, kept", [
    ("redis://user:hunter2@h:6379/0", "hunter2", "redis://user:***@h:6379/0"),
    ("redis://:hunter2@h:6379/0", "hunter2", "redis://:***@h:6379/0"),
    ("redis://h:6379/0?password=hunter2", "hunter2", "redis://h:6379/0?password=***"),
    ("postgresql+psycopg://u@db/x?sslmode=require&PASSWORD=hunter2", "hunter2",
     "postgresql+psycopg://u@db/x?sslmode=require&PASSWORD=***"),
    ("rediss://u:hunter2@[::1]:6380/1?token=abc", "hunter2", "rediss://u:***@[::1]:6380/1?token=***"),
    ("redis://u:hunter2@h:notaport/0?password=hunter3", "hunter", "redis://u:***@h:notaport/0?password=***"),
])
def test_a_url_is_masked_in_every_form(url, hidden, kept):
    masked = mask_url(url)
    assert hidden not in masked and masked == kept


def test_a_url_without_secrets_is_left_alone():
    assert mask_url("redis://h:6379/0?db=2") == "redis://h:6379/0?db=2"
    assert mask_url(None) is None


def test_worker_and_beat_metrics_listen_on_this_host_only_unless_told(tmp_path):
    settings = Settings(state_dir=tmp_path)
    assert settings.metrics_host == "127.0.0.1"
    server = serve(0, CollectorRegistry(), addr=settings.metrics_host)
    try:
        assert server.server_address[0] == "127.0.0.1"
        with socket.create_connection(("127.0.0.1", server.server_port), timeout=5):
            pass
    finally:
        server.shutdown()
        server.server_close()
    wide = Settings(state_dir=tmp_path, metrics_host="0.0.0.0")
    server = serve(0, CollectorRegistry(), addr=wide.metrics_host)
    try:
        assert server.server_address[0] == "0.0.0.0"
    finally:
        server.shutdown()
        server.server_close()

"""Health, readiness, metrics, the OpenAPI document, events and history."""

from __future__ import annotations

import json
import time

import sqlalchemy as sa
from prometheus_client.parser import text_string_to_metric_families

from lanes.embedded import free_port
from lanes.namespace import Namespace
from lanes.routing.events import EventLog
from tests.api.conftest import AUTH


def test_ready_when_redis_and_the_catalog_answer_with_the_lane_config_detail(api):
    client = api.app.state.client
    ready = api.get("/readyz")
    assert ready.status_code == 200
    checks = ready.json()["checks"]
    assert checks["redis"] == {"ok": True} and checks["database"] == {"ok": True, "catalog_version": 1}
    assert checks["lane_config"]["fails_readiness"] is False
    # A lane-config mismatch is reported and readiness stays green.
    client.redis.set(Namespace(client.settings.key_prefix).lane_config, json.dumps(
        {"ok": False, "checked_at": time.time(), "catalog_version": 1,
         "mismatches": [{"message": "pool gpu-a is wider than its services"}]}))
    again = api.get("/readyz")
    assert again.status_code == 200
    assert again.json()["checks"]["lane_config"]["mismatches"] == ["pool gpu-a is wider than its services"]
    assert api.get("/healthz").json() == {"status": "ok"}


def test_not_ready_while_redis_is_down_and_alive_all_the_same(make_api):
    api = make_api(redis_url=f"redis://127.0.0.1:{free_port()}/0", redis_timeout_seconds=1.0)
    answer = api.get("/readyz")
    assert answer.status_code == 503
    body = answer.json()
    assert body["ready"] is False
    assert body["checks"]["redis"]["ok"] is False and "did not answer" in body["checks"]["redis"]["error"]
    assert body["checks"]["database"]["ok"] is True
    assert body["checks"]["lane_config"]["fails_readiness"] is False
    assert api.get("/healthz").status_code == 200
    pools = api.get("/v1/pools")
    assert pools.status_code == 503 and pools.json()["error"] == "service_unavailable"


def test_not_ready_when_the_catalog_has_no_schema(make_api, tmp_path):
    api = make_api()
    engine = sa.create_engine(api.app.state.client.settings.catalog_url())
    with engine.begin() as conn:
        for table in sa.inspect(conn).get_table_names():
            conn.execute(sa.text(f'DROP TABLE "{table}"'))
    engine.dispose()
    answer = api.get("/readyz")
    assert answer.status_code == 503
    assert answer.json()["checks"]["database"]["ok"] is False
    assert answer.json()["checks"]["redis"] == {"ok": True}


def test_metrics_are_prometheus_text(api):
    answer = api.get("/metrics")
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain")
    names = {family.name for family in text_string_to_metric_families(answer.text)}
    assert "python_info" in names


def test_the_openapi_document_lists_every_endpoint_and_the_bearer_scheme(api):
    document = api.get("/openapi.json").json()
    assert document["info"]["title"] == "Lanes"
    assert {"/v1/tasks", "/v1/tasks/{task_id}", "/v1/pools", "/v1/pools/{name}", "/v1/workflows/{name}",
            "/v1/events", "/v1/history", "/healthz", "/readyz", "/metrics"} <= set(document["paths"])
    assert set(document["paths"]["/v1/tasks/{task_id}"]) == {"get", "delete"}
    assert document["paths"]["/v1/pools/{name}"]["patch"]["security"] == [{"HTTPBearer": []}]
    assert "security" not in document["paths"]["/v1/pools"]["get"]
    assert api.get("/docs").status_code == 200


def test_events_filter_by_kind_pool_and_age(api):
    client = api.app.state.client
    log = EventLog(client.redis, prefix=client.settings.key_prefix)
    log.record("lane_wait", pool="gpu-a", workflow="chat", wait_ms=12.0)
    log.record("lane_bypass", pool="gpu-b", workflow="chat", reason="breaker_open")
    log.flush()
    log.close()
    everything = api.get("/v1/events").json()["events"]
    assert [e["kind"] for e in everything] == ["lane_bypass", "lane_wait"]
    waits = api.get("/v1/events", params={"kind": "lane_wait", "pool": "gpu-a", "since": 60}).json()["events"]
    assert len(waits) == 1 and waits[0]["wait_ms"] == 12.0
    assert api.get("/v1/events", params={"pool": "gpu-z"}).json()["events"] == []
    bad = api.get("/v1/events", params={"since": -1})
    assert bad.status_code == 422 and bad.json()["message"] == "query since: '-1': Input should be greater than 0"


def test_history_is_stored_whole_or_not_at_all(api):
    message = {"chat_id": "c-1", "at": "2026-03-01T10:15:00Z", "role": "user", "text": "hello"}
    added = api.post("/v1/history", json={"messages": [message, message | {"chat_id": "c-2"}]}, headers=AUTH)
    assert added.status_code == 201, added.text
    assert added.json() == {"added": 2, "already": 0, "chats": 2}
    # The same messages again: stored once.
    again = api.post("/v1/history", json={"messages": [message]}, headers=AUTH)
    assert again.status_code == 201 and again.json() == {"added": 0, "already": 1, "chats": 1}
    # Every bad message is named, as `lanes history add` names every bad line.
    refused = api.post("/v1/history", json={"messages": [
        message | {"chat_id": "c-3"}, message | {"role": "robot"}, message | {"at": "2099-01-01T00:00:00Z"},
    ]}, headers=AUTH)
    assert refused.status_code == 400
    text = refused.json()["message"]
    assert text.startswith("2 bad messages in the request; nothing was written")
    assert "messages[1]: role 'robot' is not one of" in text
    assert "messages[2]: time 2099-01-01T00:00:00+00:00 is in the future" in text
    assert "messages[0]" not in text
    engine = sa.create_engine(api.app.state.client.settings.catalog_url())
    with engine.connect() as conn:
        stored = conn.execute(sa.text("SELECT count(*) FROM chat_messages")).scalar_one()
    engine.dispose()
    assert stored == 2, "the refused batch wrote nothing"


def test_the_lane_collector_is_installed_through_lanes_metrics_when_it_exists(monkeypatch, make_settings):
    import importlib.util
    import sys
    import types

    from lanes.api.app import install_metrics

    settings = make_settings()
    if importlib.util.find_spec("lanes.metrics") is None:
        assert install_metrics(settings) is False, "no lanes.metrics yet: nothing to install"
    installed = []
    module = types.ModuleType("lanes.metrics")
    module.install = installed.append
    monkeypatch.setitem(sys.modules, "lanes.metrics", module)
    assert install_metrics(settings) is True
    assert installed == [settings]

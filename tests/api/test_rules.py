"""Who may change what, and how every refusal reads."""

from __future__ import annotations

import redis

from tests.api.conftest import AUTH, CHAT, TOKEN


def queued_messages(api) -> int:
    client = redis.Redis.from_url(api.app.state.client.settings.redis_url)
    return sum(client.llen(key) for key in client.scan_iter("lanes.*") if client.type(key) == b"list")


def test_reads_need_no_token_but_every_change_does(api):
    assert api.get("/v1/pools").status_code == 200
    for method, path, body in [
        ("POST", "/v1/tasks", {"workflow": "chat", "payload": CHAT}),
        ("DELETE", "/v1/tasks/some-task", None),
        ("PATCH", "/v1/pools/gpu-a", {"width": 3}),
        ("PATCH", "/v1/workflows/chat", {"reserve_ms": 100}),
        ("POST", "/v1/history", {"messages": []}),
    ]:
        missing = api.request(method, path, json=body)
        assert missing.status_code == 401, (method, path)
        assert missing.headers["www-authenticate"] == "Bearer"
        assert missing.json()["error"] == "unauthorized"
        wrong = api.request(method, path, json=body, headers={"Authorization": "Bearer " + TOKEN[:-1] + "x"})
        assert wrong.status_code == 401
        assert "does not match" in wrong.json()["message"]
    assert api.get("/v1/pools/gpu-a").json()["configured_width"] == 2, "a refused PATCH changed nothing"
    assert queued_messages(api) == 0


def test_with_no_token_configured_every_change_is_refused_not_open(make_api):
    api = make_api(api_token=None)
    answer = api.post("/v1/tasks", json={"workflow": "chat", "payload": CHAT}, headers=AUTH)
    assert answer.status_code == 403
    assert "LANES_API_TOKEN" in answer.json()["message"]
    assert api.patch("/v1/pools/gpu-a", json={"width": 3}, headers={"Authorization": "Bearer "}).status_code == 403
    assert queued_messages(api) == 0
    assert api.get("/v1/pools/gpu-a").status_code == 200


def test_a_refused_submit_names_the_bad_value_and_enqueues_nothing(api):
    cases = [
        ({"workflow": "dialgo", "payload": CHAT}, 400, "unknown workflow 'dialgo' (known: chat, embed)"),
        ({"workflow": "chat", "payload": CHAT, "priority": "urgent"}, 400, "'urgent'"),
        ({"workflow": "chat", "payload": [1, 2]}, 400, "payload must be a JSON object, got list"),
        ({"workflow": "chat", "payload": {"prompt": "hi"}}, 400, "needs a non-empty 'messages' list"),
        ({"workflow": "embed", "payload": CHAT}, 400, "needs an 'input' field"),
        ({"workflow": "chat", "payload": CHAT, "deadline": -5}, 400, "deadline -5"),
        ({"workflow": "chat", "payload": CHAT, "deadline": "tomorrow"}, 400, "deadline 'tomorrow'"),
        ({"workflow": "chat", "payload": CHAT, "deadline": "2020-01-01T00:00:00Z"}, 400, "is in the past"),
        ({"workflow": "chat", "payload": CHAT, "deadline": "2099-01-01T00:00:00"}, 400, "has no time zone"),
        ({"payload": CHAT}, 422, "workflow: missing (required)"),
        ({"workflow": 7, "payload": CHAT}, 422, "workflow: 7 is not a string"),
        ({"workflow": "chat", "payload": CHAT, "prio": "background"}, 422, "prio: unknown key"),
    ]
    for body, status, words in cases:
        answer = api.post("/v1/tasks", json=body, headers=AUTH)
        assert answer.status_code == status, (body, answer.text)
        shape = answer.json()
        assert set(shape) <= {"error", "message", "problems"} and shape["error"] in ("invalid_input", "invalid_request")
        assert words in shape["message"], (body, shape)
    assert api.post("/v1/tasks", content=b"{not json", headers=AUTH | {"content-type": "application/json"}).status_code == 422
    assert queued_messages(api) == 0


def test_a_bad_task_id_and_an_unknown_path_answer_in_the_same_shape(api):
    answer = api.get("/v1/tasks/%20padded%20")
    assert answer.status_code == 400
    assert answer.json()["message"].startswith("task id ' padded ' is not a task id")
    missing = api.get("/v1/nothing-here")
    assert missing.status_code == 404 and missing.json()["error"] == "not_found"


def test_an_unknown_task_is_pending_with_a_note(api):
    report = api.get("/v1/tasks/never-submitted").json()
    assert report["state"] == "PENDING"
    assert "unknown task id" in report["note"]

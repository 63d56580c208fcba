"""The API refuses before it reads, by scope, and in one shape (issue 36).

The body tests talk to uvicorn over a raw socket: a refusal that arrives
while most of the declared body is still unsent proves the body was not read.
"""

from __future__ import annotations

import json
import socket
import threading

import httpx
import pytest

from lanes.embedded import free_port
from lanes.ops.pools import SCRAPE_HIDDEN, public_row
from tests.api.conftest import AUTH, CHAT, TOKEN, Served

SUBMIT_TOKEN = "submit-only-token-0123456789"
SUBMIT_AUTH = {"Authorization": f"Bearer {SUBMIT_TOKEN}"}


@pytest.fixture
def served(make_api):
    api = make_api(api_submit_token=SUBMIT_TOKEN, max_payload_bytes=4_096, api_max_body_bytes=8_192)
    server = Served(api.app)
    yield server
    server.stop()


def raw_request(port: int, head: str, body_part: bytes = b"") -> tuple[int, dict]:
    """Send ``head`` and the start of a body, then read the answer without sending the rest."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(head.encode() + b"\r\n" + body_part)
        received = b""
        while b"\r\n\r\n" not in received or len(received.split(b"\r\n\r\n", 1)[1]) < _length(received):
            chunk = sock.recv(65536)
            if not chunk:
                break
            received += chunk
    status_line, rest = received.split(b"\r\n", 1)
    body = received.split(b"\r\n\r\n", 1)[1]
    return int(status_line.split()[1]), json.loads(body)


def _length(received: bytes) -> int:
    for line in received.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def post_head(path: str, length: int, token: str | None = None, *, chunked: bool = False) -> str:
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json"]
    lines.append("Transfer-Encoding: chunked" if chunked else f"Content-Length: {length}")
    if token:
        lines.append(f"Authorization: Bearer {token}")
    return "\r\n".join(lines) + "\r\n"


def test_an_anonymous_upload_is_refused_before_its_body_is_read(served):
    # 100 MB declared, 10 bytes sent: the answer comes anyway.
    status, body = raw_request(served.port, post_head("/v1/tasks", 100_000_000), b'{"workflow"')
    assert status == 413 and body["error"] == "too_large"
    assert "100000000 bytes" in body["message"] and "LANES_API_MAX_BODY_BYTES" in body["message"]
    # Within the limit but without a token: 401 before the body is read.
    status, body = raw_request(served.port, post_head("/v1/tasks", 5_000), b'{"workflow"')
    assert status == 401 and body["error"] == "unauthorized"
    # The submit token on an admin endpoint: 403, also before reading.
    head = post_head("/v1/pools/gpu-a", 5_000, SUBMIT_TOKEN).replace("POST", "PATCH", 1)
    status, body = raw_request(served.port, head, b'{"wid')
    assert status == 403 and "LANES_API_TOKEN" in body["message"]


def test_a_chunked_body_is_counted_while_it_is_read_and_stopped_at_the_limit(served):
    chunk = b"x" * 1_000
    framed = b"".join(f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n" for _ in range(12))  # 12 kB > 8 kB
    status, body = raw_request(served.port, post_head("/v1/tasks", 0, TOKEN, chunked=True), framed)
    assert status == 413 and "more than 8192 bytes" in body["message"]


def test_the_submit_scope_submits_and_revokes_but_never_administers(served):
    with httpx.Client(base_url=served.url, timeout=20) as http:
        submitted = http.post("/v1/tasks", json={"workflow": "chat", "payload": CHAT}, headers=SUBMIT_AUTH)
        assert submitted.status_code == 202, submitted.text
        task_id = submitted.json()["task_id"]
        assert http.delete(f"/v1/tasks/{task_id}", headers=SUBMIT_AUTH).status_code == 202
        refused = http.patch("/v1/pools/gpu-a", json={"width": 5}, headers=SUBMIT_AUTH)
        assert refused.status_code == 403 and refused.json()["error"] == "forbidden"
        assert http.patch("/v1/workflows/chat", json={"reserve_ms": 10}, headers=SUBMIT_AUTH).status_code == 403
        assert http.get("/v1/pools/gpu-a").json()["configured_width"] == 2
        assert http.patch("/v1/pools/gpu-a", json={"width": 5}, headers=AUTH).status_code == 200
        assert http.post("/v1/tasks", json={"workflow": "chat", "payload": CHAT}, headers=AUTH).status_code == 202


def test_without_a_submit_token_the_submit_token_opens_nothing(make_api):
    api = make_api(api_token=None, api_submit_token=SUBMIT_TOKEN)
    assert api.post("/v1/tasks", json={"workflow": "chat", "payload": CHAT}, headers=SUBMIT_AUTH).status_code == 202
    refused = api.patch("/v1/pools/gpu-a", json={"width": 3}, headers=SUBMIT_AUTH)
    assert refused.status_code == 403 and "no token configured for the admin scope" in refused.json()["message"]


@pytest.mark.parametrize("deadline", [1e20, 1e300, 8 * 86_400, "9999-01-01T00:00:00Z"])
def test_a_deadline_past_a_week_is_400_naming_it(api, deadline):
    answer = api.post("/v1/tasks", json={"workflow": "chat", "payload": CHAT, "deadline": deadline}, headers=AUTH)
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "invalid_input"
    assert "a week" in answer.json()["message"] and "deadline" in answer.json()["message"]


def test_a_lone_surrogate_is_400_naming_where_it_is(api):
    body = '{"workflow": "chat", "payload": {"messages": [{"role": "user", "content": "hi \\ud800"}]}}'
    answer = api.post("/v1/tasks", content=body.encode(), headers=AUTH | {"content-type": "application/json"})
    assert answer.status_code == 400, answer.text
    assert answer.json()["error"] == "invalid_input"
    assert "payload.messages[0].content" in answer.json()["message"] and "surrogate" in answer.json()["message"]
    paired = body.replace("\\ud800", "\\ud83d\\ude00")  # a pair is an emoji, and fine
    assert api.post("/v1/tasks", content=paired.encode(),
                    headers=AUTH | {"content-type": "application/json"}).status_code == 202
    not_utf8 = api.post("/v1/tasks", content=b'{"workflow": "\xff"}', headers=AUTH | {"content-type": "application/json"})
    assert not_utf8.status_code == 400 and "not UTF-8" in not_utf8.json()["message"]


def test_revoking_an_unknown_id_is_404_and_stores_nothing(api):
    answer = api.delete("/v1/tasks/never-submitted", headers=AUTH)
    assert answer.status_code == 404 and answer.json()["error"] == "not_found"
    assert "never-submitted" in answer.json()["message"]
    assert api.get("/v1/tasks/never-submitted").json()["state"] == "PENDING", "no REVOKED was stored"


def test_concurrent_patches_answer_200_or_409_never_500(make_api):
    api = make_api()
    server = Served(api.app)
    statuses: list[int] = []
    try:
        def patcher(offset: int) -> None:
            with httpx.Client(base_url=server.url, timeout=30) as http:
                for i in range(6):
                    answer = http.patch("/v1/workflows/chat", json={"reserve_ms": 100 + offset * 10 + i},
                                        headers=AUTH)
                    statuses.append(answer.status_code)
                    if answer.status_code != 200:
                        assert answer.json()["error"] == "conflict", answer.text

        threads = [threading.Thread(target=patcher, args=(n,)) for n in range(6)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
    finally:
        server.stop()
    assert len(statuses) == 36 and set(statuses) <= {200, 409}, statuses


def test_readyz_not_ready_is_the_error_shape_and_shows_no_host_user_or_db(make_api):
    port = free_port()
    api = make_api(redis_url=f"redis://opsuser:hunter2@127.0.0.1:{port}/7", redis_timeout_seconds=1.0)
    answer = api.get("/readyz")
    assert answer.status_code == 503
    body = answer.json()
    assert body["error"] == "not_ready" and "Redis did not answer" in body["message"]
    text = answer.text
    for secret in ("opsuser", "hunter2", str(port), "127.0.0.1", "/7"):
        assert secret not in text, secret


def test_docs_are_served_offline_from_a_package(api):
    page = api.get("/docs")
    assert page.status_code == 200
    assert "cdn" not in page.text and "https://" not in page.text.split("<body>")[1]
    for asset in ("/docs/assets/swagger-ui-bundle.js", "/docs/assets/swagger-ui.css"):
        assert asset in page.text
        served = api.get(asset)
        assert served.status_code == 200 and len(served.content) > 10_000, asset


def test_a_reader_without_the_admin_token_never_sees_scrape_urls_or_what_they_answered():
    row = {"pool": "gpu-a", "control": {
        "reason": "scrape failed: http://10.0.0.5:8500/internal: text 'root:x:0:0' is not Prometheus",
        "proposals": {"vllm": {"width": 2, "reason": "scrape failed: http://10.0.0.5:8500/internal: root:x"}},
        "scrape": {"urls": ["http://10.0.0.5:8500/internal"], "metrics_ok": False,
                   "error": "http://10.0.0.5:8500/internal: root:x:0:0"},
        "signals": {"running": 3}}}
    shown = json.dumps(public_row(row))
    assert "10.0.0.5" not in shown and "root:x" not in shown
    assert public_row(row)["control"]["scrape"]["error"] == SCRAPE_HIDDEN
    assert public_row(row)["control"]["signals"] == {"running": 3}
    assert public_row({"pool": "gpu-b", "control": None}) == {"pool": "gpu-b", "control": None}


def test_the_pool_read_by_admin_and_anonymous_differs_only_in_scrape_details(api):
    anonymous = api.get("/v1/pools/gpu-b").json()
    admin = api.get("/v1/pools/gpu-b", headers=AUTH).json()
    assert public_row(admin) == anonymous


@pytest.mark.parametrize("url", ["file:///etc/passwd", "gopher://127.0.0.1:6379/_INFO", "redis://127.0.0.1:6379",
                                 "http://user:pw@10.0.0.5/metrics", "ftp://10.0.0.5/metrics"])
def test_a_metrics_url_must_be_plain_http_or_https(api, url):
    answer = api.patch("/v1/pools/gpu-b", json={"metrics_url": url}, headers=AUTH)
    assert answer.status_code == 400, answer.text
    assert "metrics_url" in answer.json()["message"]
    assert api.get("/v1/pools/gpu-b", headers=AUTH).status_code == 200
    accepted = api.patch("/v1/pools/gpu-b", json={"metrics_url": "https://10.0.0.5:8000/metrics"}, headers=AUTH)
    assert accepted.status_code == 200, accepted.text

"""Hostile input (docs/HOSTILE_INPUT.md): every case of the list, each with its
clear error or safe default. The list in the docs and the cases here are one
table: a test checks that every documented case id is tested here.

Real parts: a SQLite catalog, the session's embedded Redis, raw TCP backends
answering what a broken server answers, the `lanes` command in a process.
"""

from __future__ import annotations

import json
import math
import re
import socket
import subprocess
import sys
import threading
from datetime import datetime
from pathlib import Path

import pytest

from lanes.catalog import apply_document, open_catalog
from lanes.catalog.routing import ModelInfo
from lanes.control.scrape import parse, scrape
from lanes.embedded import free_port
from lanes.errors import BackendError, CatalogInvalid, InvalidInput, LanesError
from lanes.routing.backend import BackendClient
from lanes.routing.client import LanesClient
from lanes.settings import Settings

DOCS = Path(__file__).parents[2] / "docs" / "HOSTILE_INPUT.md"
CHAT = {"messages": [{"role": "user", "content": "hi"}]}
DOC = {
    "pools": [{"name": "gpu", "width": 2}],
    "models": [{"name": "m", "base_url": "http://127.0.0.1:9/v1", "pool": "gpu"},
               {"name": "e", "base_url": "http://127.0.0.1:9/v1", "pool": "gpu", "kind": "embedding"}],
    "workflows": [{"name": "chat", "candidates": ["m"]}, {"name": "embed", "candidates": ["e"]}],
}


@pytest.fixture
def client(tmp_path, one_redis_url):
    settings = Settings(state_dir=tmp_path / "state", redis_url=one_redis_url, max_payload_bytes=2048)
    engine = open_catalog(settings)
    apply_document(engine, json.loads(json.dumps(DOC)))
    engine.dispose()
    lanes_client = LanesClient(settings)
    yield lanes_client
    lanes_client.close()


# --- submit (Python) ------------------------------------------------------------------------

SUBMIT = {
    "S1": (dict(workflow="dialgo", payload=CHAT), "unknown workflow 'dialgo' (known: chat, embed)"),
    "S2": (dict(workflow="chat", payload="{not json"), "payload is not JSON"),
    "S3": (dict(workflow="chat", payload=[1, 2]), "payload must be a JSON object, got list"),
    "S4": (dict(workflow="chat", payload={"prompt": "hi"}), "needs a non-empty 'messages' list"),
    "S5": (dict(workflow="chat", payload={"messages": []}), "needs a non-empty 'messages' list"),
    "S6": (dict(workflow="embed", payload={"text": "x"}), "the payload needs an 'input' field"),
    "S7": (dict(workflow="chat", payload={"messages": [{"content": {1, 2}}]}), "payload cannot be sent as JSON"),
    "S8": (dict(workflow="chat", payload={"messages": [{"content": "x" * 3000}]}), "over the limit of 2048 bytes"),
    "S9": (dict(workflow="chat", payload=CHAT, deadline=-5), "is not in the future"),
    "S10": (dict(workflow="chat", payload=CHAT, deadline=0), "is not in the future"),
    "S11": (dict(workflow="chat", payload=CHAT, deadline=math.nan), "is not a number of seconds"),
    "S12": (dict(workflow="chat", payload=CHAT, deadline=math.inf), "is not a number of seconds"),
    "S13": (dict(workflow="chat", payload=CHAT, deadline=True), "is not a number of seconds"),
    "S14": (dict(workflow="chat", payload=CHAT, deadline="60"), "is not a number of seconds"),
    "S15": (dict(workflow="chat", payload=CHAT, deadline=datetime(2030, 1, 1)), "has no time zone"),
    "S16": (dict(workflow="chat", payload=CHAT, priority="urgent"), "urgent"),
    "S17": (dict(workflow="chat", payload=CHAT, idempotency_key=""), "idempotency key"),
    "S18": (dict(workflow="chat", payload=CHAT, idempotency_key="k" * 201), "idempotency key"),
    "S19": (dict(workflow="chat", payload=CHAT, idempotency_key=42), "idempotency key"),
}


@pytest.mark.parametrize("case", sorted(SUBMIT))
def test_submit_refuses_hostile_input_before_anything_is_sent(client, case):
    arguments, message = SUBMIT[case]
    arguments = dict(arguments)
    with pytest.raises(InvalidInput) as refused:
        client.submit(arguments.pop("workflow"), arguments.pop("payload"), **arguments)
    assert message in str(refused.value)
    assert not [key for key in client.redis.scan_iter() if not key.startswith(b"lanes:v2:server")], \
        "nothing written for a refused submit"


RESULT_IDS = {"R1": "", "R2": "  padded  ", "R3": "x" * 256, "R4": None}


@pytest.mark.parametrize("case", sorted(RESULT_IDS))
def test_a_hostile_task_id_is_refused_by_name(client, case):
    with pytest.raises(InvalidInput) as refused:
        client.result(RESULT_IDS[case])
    assert "is not a task id" in str(refused.value)


# --- settings -------------------------------------------------------------------------------

SETTINGS = {
    "E1": (dict(redis_url="http://127.0.0.1:6379"), "is not a Redis URL"),
    "E2": (dict(broker_url="ftp://queue"), "is not a Redis URL"),
    "E3": (dict(redis_url="rediss://h:6380/0?ssl_cert_reqs=CERT_MAYBE"), "use required (CERT_REQUIRED)"),
    "E4": (dict(database_url="mysql://db/lanes"), "is not a supported catalog database"),
    "E5": (dict(lease_seconds=-1), "greater than 0"),
    "E6": (dict(lease_seconds=3, renew_seconds=5), "must be shorter than lease_seconds"),
    "E7": (dict(key_prefix="lanes:{x}"), "must be non-empty and hold no braces"),
    "E8": (dict(flower_basic_auth="ops"), "is not user:password"),
    "E9": (dict(fleet_held_messages=0), "fleet_held_messages"),
    "E10": (dict(background_retry_seconds=0), "greater than 0"),
    "E12": (dict(broker_url="sentinel://s1:26379/0;sentinel://s2:26379/0"), "needs exactly one ?master_name=NAME"),
    "E13": (dict(redis_url="sentinel://s1:26379/0?master_name=m"), "is not a Redis URL"),
    "E14": (dict(broker_url="sentinel://s1:26379/0;redis://s2:6379/0?master_name=m"), "starts with sentinel://"),
    "E15": (dict(broker_url="sentinel://s1/0?master_name=m&ssl_cert_reqs=required"), "use a rediss:// broker URL"),
    "E16": (dict(redis_url="unix:///run/redis.sock"), "is a Unix socket, which the Celery broker cannot use"),
    "E17": (dict(redis_url="redis://h:6379/0", broker_url="unix:///run/redis.sock?db=2"),
            "LANES_BROKER_URL 'unix:///run/redis.sock?db=2' is a Unix socket"),
}


@pytest.mark.parametrize("case", sorted(SETTINGS))
def test_hostile_settings_are_refused_with_the_value_named(tmp_path, case):
    values, message = SETTINGS[case]
    with pytest.raises(ValueError) as refused:
        Settings(state_dir=tmp_path, **values)
    assert message in str(refused.value)


def test_a_password_in_a_refused_url_never_reaches_the_terminal(tmp_path):
    """E11: the refusal names the URL with its password masked."""
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANES_STATE_DIR": str(tmp_path / "state"),
           "LANES_REDIS_URL": "rediss://u:hunter2@h/0?ssl_cert_reqs=sometimes"}
    done = subprocess.run([sys.executable, "-m", "lanes.cli", "pools"], env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2, done.stderr
    assert "sometimes" in done.stderr and "hunter2" not in done.stderr and "***" in done.stderr


# --- catalog files --------------------------------------------------------------------------

def _doc(change) -> dict:
    doc = json.loads(json.dumps(DOC))
    change(doc)
    return doc


CATALOG = {
    "C1": (lambda d: d["pools"][0].update(width=0), "pools[0].width: 0 is not a width >= 1"),
    "C2": (lambda d: d["pools"][0].update(width="two"), "pools[0].width: 'two' is not an integer"),
    "C3": (lambda d: d["workflows"][0].update(candidates=["nope"]), "'nope' is not a model in this file"),
    "C4": (lambda d: d["pools"].append({"name": "gpu", "width": 1}), "is already the name of pools[0]"),
    "C5": (lambda d: d["models"][0].update(base_url="ftp://x"), "is not an http(s) URL with a host"),
    "C6": (lambda d: d["pools"][0].update(widht=3), "pools[0].widht: unknown key"),
    "C7": (lambda d: d["models"][0].update(pool="nopool"), "'nopool' is not a pool in this file"),
    "C8": (lambda d: d["workflows"][0].update(candidates=[]), "is empty; a workflow needs at least one model"),
    "C9": (lambda d: d["workflows"][0].update(priority="urgent"), "'urgent' is not a priority"),
    "C10": (lambda d: d["models"][0].update(timeout_ms=-5), "-5 is not a timeout_ms"),
    "C11": (lambda d: d.update(pools={"gpu": 2}), "pools: {'gpu': 2} is not a list"),
}


@pytest.mark.parametrize("case", sorted(CATALOG))
def test_a_hostile_catalog_document_is_refused_whole(tmp_path, case):
    change, message = CATALOG[case]
    engine = open_catalog(Settings(state_dir=tmp_path))
    try:
        with pytest.raises(CatalogInvalid) as refused:
            apply_document(engine, _doc(change))
        assert message in str(refused.value) and "nothing was written" in str(refused.value)
        with pytest.raises(LanesError):
            LanesClient(Settings(state_dir=tmp_path)).catalog.workflow("chat")  # nothing half-written
    finally:
        engine.dispose()


# --- the CLI --------------------------------------------------------------------------------

CLI = {
    "L1": (["submit", "chat", "--payload", "@"], 2, "names no file"),
    "L2": (["submit", "chat", "--payload", "@/nonexistent/request.json"], 2, "cannot read"),
    "L3": (["submit", "chat", "--payload", "{}", "--deadline", "soon"], 2, "soon"),
    "L4": (["submit", "nosuch", "--payload", json.dumps(CHAT)], 2, "unknown workflow 'nosuch'"),
    "L5": (["catalog", "apply", "catalog.json"], 2, "unknown file type '.json'"),
}


@pytest.mark.parametrize("case", sorted(CLI))
def test_the_cli_refuses_hostile_input_in_one_line(tmp_path, one_redis_url, case):
    args, code, message = CLI[case]
    state = tmp_path / "state"
    engine = open_catalog(Settings(state_dir=state))
    apply_document(engine, json.loads(json.dumps(DOC)))
    engine.dispose()
    (tmp_path / "catalog.json").write_text("{}")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "LANES_STATE_DIR": str(state),
           "LANES_REDIS_URL": one_redis_url}
    done = subprocess.run([sys.executable, "-m", "lanes.cli", *args], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == code, done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr


# --- backend answers ------------------------------------------------------------------------

class OneAnswer:
    """A TCP server answering every request with ``raw`` bytes (None: closes at once)."""

    def __init__(self, raw: bytes | None) -> None:
        self.raw = raw
        self.port = free_port()
        self._listener = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with conn:
                if self.raw is not None:
                    conn.settimeout(5)
                    try:
                        conn.recv(65536)
                        conn.sendall(self.raw)
                    except OSError:
                        pass

    def close(self) -> None:
        self._listener.close()


def _http(status: str, body: bytes, content_type: str = "application/json") -> bytes:
    return (f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n").encode() + body


BACKEND = {
    "B1": (_http("200 OK", b"{not json"), "chat"),
    "B2": (_http("200 OK", b""), "chat"),
    "B3": (_http("200 OK", b"[1, 2, 3]"), "chat"),
    "B4": (None, "chat"),
    "B5": (_http("529 Overloaded", b'{"error": "busy"}'), "chat"),
    "B6": (_http("502 Bad Gateway", b"<html>bad gateway</html>", "text/html"), "chat"),
    "B7": (_http("200 OK", b"data: {broken\n\ndata: [DONE]\n\n", "text/event-stream"), "chat"),
    "B8": (_http("200 OK", b'{"data": "not a list"}'), "embedding"),
}


@pytest.mark.parametrize("case", sorted(BACKEND))
def test_a_hostile_backend_answer_is_a_backend_error_never_a_crash(case):
    raw, kind = BACKEND[case]
    server = OneAnswer(raw)
    backend = BackendClient()
    model = ModelInfo(name="m", base_url=f"http://127.0.0.1:{server.port}/v1", kind=kind, pool=None,
                      service=None, timeout_seconds=5.0, api_key_env=None)
    payload = {"input": "x"} if kind == "embedding" else dict(CHAT, stream=True)
    try:
        with pytest.raises(BackendError) as failed:
            backend.call(model, payload, timeout=5.0)
        assert "m" in str(failed.value)
    finally:
        backend.close()
        server.close()


# --- /metrics scrapes -----------------------------------------------------------------------

SCRAPES = {
    "M1": "this is not prometheus {{{",
    "M2": "",
    "M3": "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"other\"} 3\n",
    "M4": "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{model_name=\"m\"} NaNx\n",
}


@pytest.mark.parametrize("case", sorted(SCRAPES))
def test_a_hostile_metrics_page_never_reads_as_gauges(case):
    with pytest.raises(ValueError):
        parse(SCRAPES[case], {"m"})


def test_a_metrics_endpoint_that_closes_or_answers_500_is_a_failed_scrape():
    """M5."""
    for raw in (None, _http("500 Internal Server Error", b"boom", "text/plain")):
        server = OneAnswer(raw)
        try:
            gauges = scrape([f"http://127.0.0.1:{server.port}/metrics"], {"m"}, timeout=2.0)
        finally:
            server.close()
        assert gauges.ok is False and gauges.error


# --- the list in the docs is this file's ----------------------------------------------------

def test_every_documented_case_is_tested_here():
    documented = set(re.findall(r"^\| ([A-Z]\d+) \|", DOCS.read_text(), re.M))
    tested = {*SUBMIT, *RESULT_IDS, *SETTINGS, *CATALOG, *CLI, *BACKEND, *SCRAPES, "E11", "M5"}
    assert len(documented) >= 40
    assert documented == tested, (documented - tested, tested - documented)

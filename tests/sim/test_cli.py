"""``lanes sim`` as a real process, and its answers to bad input."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import httpx
import pytest
from click.testing import CliRunner

from lanes.cli import main

from .conftest import chat_body, free_port

LANES = [sys.executable, "-c", "from lanes.cli import main; main()"]


def start_process(*args: str) -> tuple[subprocess.Popen, list[str]]:
    """Run ``lanes sim ARGS``; return once it prints where it listens."""
    process = subprocess.Popen([*LANES, "sim", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = [process.stdout.readline()]
    if "listening on" not in lines[0]:
        process.kill()
        raise AssertionError(f"lanes sim did not start: {lines[0]!r} {process.stderr.read()!r}")
    return process, lines


def stop_process(process: subprocess.Popen) -> str:
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=15)
    # read() (not communicate()) keeps what start_process's readline buffered
    out, err = process.stdout.read(), process.stderr.read()
    assert process.returncode == 0, err
    assert "Traceback" not in err
    return out


@pytest.mark.parametrize("suffix", ["toml", "yaml"])
def test_a_catalog_file_is_served_on_its_ports_with_pool_widths(tmp_path, suffix):
    chat_port, embed_port = free_port(), free_port()
    catalog = {
        "toml": f"""
            [[pools]]
            name = "gpu0"
            width = 3

            [[pools]]
            name = "embedder"
            width = 5

            [[models]]
            name = "qwen3:8b"
            base_url = "http://127.0.0.1:{chat_port}/v1"
            kind = "chat"
            pool = "gpu0"

            [[models]]
            name = "bge-m3"
            base_url = "http://localhost:{embed_port}/v1"
            kind = "embedding"
            pool = "embedder"

            [[models]]
            name = "small"
            base_url = "http://127.0.0.1:{chat_port}/v1"

            [[models]]
            name = "hosted"
            base_url = "https://api.example.com/v1"
            kind = "chat"
        """,
        "yaml": f"""
            pools:
              - {{name: gpu0, width: 3}}
              - {{name: embedder, width: 5}}
            models:
              - {{name: "qwen3:8b", base_url: "http://127.0.0.1:{chat_port}/v1", kind: chat, pool: gpu0}}
              - {{name: bge-m3, base_url: "http://localhost:{embed_port}/v1", kind: embedding, pool: embedder}}
              - {{name: small, base_url: "http://127.0.0.1:{chat_port}/v1"}}
              - {{name: hosted, base_url: "https://api.example.com/v1", kind: chat}}
        """,
    }[suffix]
    path = tmp_path / f"catalog.{suffix}"
    path.write_text(textwrap.dedent(catalog))

    process, _ = start_process("--catalog", str(path), "--service-ms", "0")
    try:
        chat_url, embed_url = f"http://127.0.0.1:{chat_port}", f"http://127.0.0.1:{embed_port}"
        assert httpx.post(chat_url + "/v1/chat/completions", json=chat_body("qwen3:8b")).status_code == 200
        assert httpx.post(chat_url + "/v1/chat/completions", json=chat_body("small")).status_code == 200
        assert httpx.post(embed_url + "/v1/embeddings", json={"model": "bge-m3", "input": "x"}).status_code == 200
        # each port serves its own models only
        assert httpx.post(embed_url + "/v1/chat/completions", json=chat_body("qwen3:8b")).status_code == 404
        stats = httpx.get(chat_url + "/admin/stats").json()
        assert set(stats) == {"qwen3:8b", "bge-m3", "small"}
        assert (stats["qwen3:8b"]["capacity"], stats["bge-m3"]["capacity"], stats["small"]["capacity"]) == (3, 5, 16)
        assert stats["qwen3:8b"]["served"] == 1
    finally:
        out = stop_process(process)
    assert "skipped, not on this machine: hosted" in out
    assert "stopped" in out


def test_model_specs_are_served_on_the_main_port():
    port = free_port()
    process, lines = start_process("--port", str(port), "--model", "a:2:0", "--model", "b:1", "--embedding-model", "e:4")
    try:
        assert f"http://127.0.0.1:{port}" in lines[0]
        stats = httpx.get(f"http://127.0.0.1:{port}/admin/stats").json()
        assert {n: s["capacity"] for n, s in stats.items()} == {"a": 2, "b": 1, "e": 4}
        assert stats["e"]["kind"] == "embedding"
        assert httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json=chat_body("a")).status_code == 200
    finally:
        stop_process(process)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--model", "nocapacity"], "bad model spec 'nocapacity'"),
        (["--model", "m:four"], "bad model spec 'm:four'"),
        (["--model", ":4"], "the name is empty"),
        (["--model", "m:-1"], "capacity -1"),
        (["--catalog", "/nonexistent/catalog.toml"], "does not exist"),
        ([], "nothing to simulate"),
        (["--model", "m:1", "--reject-status", "200"], "reject_status 200"),
        (["--model", "m:1", "--replicas", "0"], "replicas 0"),
        (["--model", "m:1", "--kv-blocks", "0"], "kv_blocks 0"),
        (["--model", "m:1", "--max-num-queued-reqs", "-1"], "max_num_queued_reqs -1"),
        (["--model", "m:1", "--max-num-queued-reqs", "4", "--metrics-flavor", "legacy"],
         "need metrics_flavor 'current'"),
        (["--model", "m:1", "--gateway-kv-threshold", "2"], "gateway_kv_threshold 2.0"),
        (["--model", "m:1", "--exit-after-death-s", "-1"], "exit_after_death_s -1.0"),
        (["--model", "m:1", "--max-model-len", "0"], "max_model_len 0"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = CliRunner().invoke(main, ["sim", *args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.stderr
    assert "Traceback" not in result.output


def test_a_malformed_catalog_names_the_file_and_problem(tmp_path):
    broken = tmp_path / "broken.toml"
    broken.write_text("[[pools]]\nname = 'p'\nwidth = 0\n")
    result = CliRunner().invoke(main, ["sim", "--catalog", str(broken)])
    assert result.exit_code == 2
    assert "pools[0].width: 0 is not a width >= 1" in result.stderr
    broken.write_text("[[pools]\n")
    result = CliRunner().invoke(main, ["sim", "--catalog", str(broken)])
    assert result.exit_code == 2 and "is not valid TOML" in result.stderr


def test_a_port_in_use_is_a_one_line_failure():
    with __import__("socket").socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        result = CliRunner().invoke(main, ["sim", "--port", str(busy.getsockname()[1]), "--model", "m:1"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: cannot listen on 127.0.0.1:") and len(result.stderr.splitlines()) == 1


def test_help_shows_how_to_change_a_model_at_runtime():
    result = CliRunner().invoke(main, ["sim", "--help"])
    assert result.exit_code == 0
    for knob in ('{"fail_next": 3}', '"hang_next": 1', '{"down": true}', '{"capacity": 8}', '{"error_next": 1}',
                 "curl -X POST localhost:8700/admin/models/chat-small"):
        assert knob in result.output


def test_the_help_examples_work_against_a_running_simulator():
    port = free_port()
    process, _ = start_process("--port", str(port), "--model", "chat-small:1:0", "--replicas", "2", "--data-parallel",
                               "--metrics-flavor", "0.9.2-0.11", "--metrics-lag-s", "0",
                               "--keep-alive-on-engine-death")
    admin = f"http://127.0.0.1:{port}/admin/models/chat-small"
    try:
        # as curl sends it: form content type, JSON body
        headers = {"content-type": "application/x-www-form-urlencoded"}
        assert httpx.post(admin, content=b'{"down": true}', headers=headers).status_code == 200
        assert httpx.get(f"http://127.0.0.1:{port}/health").status_code == 503
        assert httpx.post(admin, content=b'{"down": false, "capacity": 8}', headers=headers).json()["capacity"] == 8
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        assert 'engine="1"' in metrics and "vllm:gpu_cache_usage_perc" in metrics
    finally:
        stop_process(process)

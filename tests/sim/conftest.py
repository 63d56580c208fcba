"""Simulators on real sockets, and helpers to drive them with httpx."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from lanes.sim import SimModel, Simulator
from tests.polling import aeventually, eventually  # noqa: F401  (the sim tests import them from here)


@pytest.fixture
def start_sim():
    """Start a simulator for the test; every one started is stopped after it."""
    started: list[Simulator] = []

    def start(*models: SimModel, **options: Any) -> Simulator:
        sim = Simulator(list(models), **options).start()
        started.append(sim)
        return sim

    yield start
    for sim in started:
        sim.stop()


def chat_body(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello there"}], **extra}


def async_client(sim: Simulator, **options: Any) -> httpx.AsyncClient:
    limits = httpx.Limits(max_connections=500, max_keepalive_connections=500)
    return httpx.AsyncClient(base_url=sim.base_url, limits=limits, timeout=options.pop("timeout", 30.0), **options)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def raw_post(port: int, path: str, body: dict[str, Any]) -> tuple[int, bytes]:
    """One POST on its own connection, with no client library in between:
    for load where httpx's own pool, not the simulator, would be measured."""
    import json

    payload = json.dumps(body).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode() + payload
        )
        head = await reader.readuntil(b"\r\n\r\n")
        status = int(head.split(b" ", 2)[1])
        return status, await reader.read()
    finally:
        writer.close()


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of one /metrics answer as (name, sorted labels) -> value."""
    text = httpx.get(url).text
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(samples, name: str, **labels) -> float:
    labels = {"engine": "0", **labels}
    return samples[(name, tuple(sorted(labels.items())))]

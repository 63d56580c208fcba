"""Reading vLLM's gauges from the real simulator over HTTP."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from lanes.catalog.routing import ModelInfo, PoolInfo, RoutingTable
from lanes.control.scrape import Scraper, metrics_url, scrape, targets
from lanes.sim import SimModel, Simulator
from tests.polling import eventually


def pool(metrics=None) -> PoolInfo:
    return PoolInfo(id=1, name="gpu", width=4, floor=1, ceiling=16, controller={"kind": "vllm"},
                    metrics_url=metrics, enabled=True, previous_names=(), controllers={"vllm": {}})


def table(p: PoolInfo, urls: dict[str, str]) -> RoutingTable:
    models = {name: ModelInfo(name, url, "chat", p, None, 60.0, None) for name, url in urls.items()}
    models["hosted"] = ModelInfo("hosted", "http://127.0.0.1:1/v1", "chat", None, None, 60.0, None)
    return RoutingTable(1, {}, {p.name: p}, models)


def test_the_metrics_url_is_the_base_url_without_v1_plus_metrics():
    assert metrics_url("http://vllm-embed.arpa/v1") == "http://vllm-embed.arpa/metrics"
    assert metrics_url("http://h:8000/v1/") == "http://h:8000/metrics"
    assert metrics_url("http://h:8000") == "http://h:8000/metrics"


@pytest.fixture
def replicas():
    first = Simulator([SimModel(name="m1", capacity=2, per_token_ms=500.0, tokens=10),
                       SimModel(name="elsewhere", capacity=8, per_token_ms=500.0, tokens=10)]).start()
    second = Simulator([SimModel(name="m2", capacity=1, per_token_ms=500.0, tokens=10)]).start()
    yield first, second
    first.stop()
    second.stop()


@pytest.mark.slow
def test_the_pools_models_are_selected_by_name_and_summed_across_backends(replicas):
    first, second = replicas
    p = pool()
    urls, models = targets(p, table(p, {"m1": first.base_url, "m2": second.base_url}))
    assert models == {"m1", "m2"} and len(urls) == 2

    def call(model, base):
        httpx.post(base + "/chat/completions", json={"model": model, "messages": [{"role": "user", "content": "x"}]},
                   timeout=30)

    with ThreadPoolExecutor(8) as pool_:
        for _ in range(3):
            pool_.submit(call, "m1", first.base_url)
        for _ in range(2):
            pool_.submit(call, "m2", second.base_url)
        for _ in range(3):
            pool_.submit(call, "elsewhere", first.base_url)  # another model on the same server: not ours
        gauges = eventually(lambda: (g := scrape(urls, models, timeout=2)).running == 3 and g.waiting == 2 and g,
                            timeout=10, what="3 running and 2 waiting")
        # KV usage is used/total blocks (a few short prompts use little of it), the
        # highest of the pool's backends.
        assert gauges.ok and gauges.waiting_capacity == 2 and 0 < gauges.kv_usage < 1
        first.stop()
        second.stop()


def test_a_backend_that_does_not_answer_or_answers_garbage_is_a_failed_scrape(replicas):
    first, _ = replicas
    down = scrape(["http://127.0.0.1:1/metrics"], {"m1"}, timeout=1)
    assert not down.ok and "127.0.0.1:1" in down.error
    garbage = scrape([first.url + "/v1/models"], {"m1"}, timeout=1)
    assert not garbage.ok
    unknown = scrape([first.url + "/metrics"], {"not-served-here"}, timeout=1)
    assert not unknown.ok and "no vllm:num_requests_running sample" in unknown.error


def test_an_older_vllm_without_the_capacity_gauge_gives_none_for_it():
    sim = Simulator([SimModel(name="old", capacity=2, metrics_flavor="legacy")]).start()
    try:
        gauges = scrape([sim.url + "/metrics"], {"old"}, timeout=2)
        assert gauges.ok and gauges.waiting_capacity is None and gauges.kv_usage == 0.0
    finally:
        sim.stop()


def test_scrapes_are_throttled_and_a_stale_good_scrape_counts_as_failed(replicas):
    first, _ = replicas
    p = pool(metrics=first.url + "/metrics")
    t = table(p, {"m1": first.base_url})
    scraper = Scraper()
    try:
        assert scraper.read(p, t, 100.0, every=12, timeout=2, stale=30).ok
        assert scraper.read(p, t, 105.0, every=12, timeout=2, stale=30) is None  # throttled: no new reading
        first.stop()
        failed = scraper.read(p, t, 112.0, every=12, timeout=1, stale=30)
        assert not failed.ok
        # The last good reading (at 100) is now older than stale: failed, even between scrapes.
        stale = scraper.read(p, t, 131.0, every=40, timeout=1, stale=30)
        assert stale is not None and not stale.ok and "old" in stale.error
        assert scraper.snapshot()["metrics_ok"] is False
    finally:
        scraper.close()

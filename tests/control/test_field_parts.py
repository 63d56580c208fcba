"""The parts behind controllers in the field, each against real services:

- the replica picker's scripts on a real Redis (least in flight, down marks, lapsed calls);
- per-endpoint scrapes of real simulators, one of them dead;
- quantiles from the simulator's real latency histograms, and the latency law;
- the utilisation law bounded by the running cap it observes;
- a pool's endpoints through the catalog, and through catalog_0004 down and up again.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import redis
import sqlalchemy as sa

from lanes.catalog import apply_document, load_routing, make_engine, migrate
from lanes.catalog.controllers import normalise, problems
from lanes.catalog.routing import ModelInfo, PoolInfo, RoutingTable
from lanes.control import histograms
from lanes.control.laws import Bounds, Gauges, Signals, compose, latency_law, utilisation_law
from lanes.control.replicas import Replicas
from lanes.control.scrape import Scraper, metrics_url
from lanes.namespace import Namespace
from lanes.sim import SimModel, Simulator
from tests.polling import eventually

WIDE = Bounds(1, 100_000)


# --- the replica picker --------------------------------------------------------------


def test_calls_go_to_the_replica_with_the_least_in_flight_and_a_down_one_gets_none(one_redis_url):
    replicas = Replicas(redis.Redis.from_url(one_redis_url), Namespace("t"))
    endpoints = ("http://a/v1", "http://b/v1", "http://c/v1")
    calls = [replicas.pick(1, endpoints, call_seconds=60) for _ in range(6)]
    assert replicas.in_flight(1) == {"http://a/v1": 2, "http://b/v1": 2, "http://c/v1": 2}
    replicas.release(calls[0])
    assert not replicas.release(calls[0])  # a second release counts nothing
    assert replicas.pick(1, endpoints, call_seconds=60).endpoint == calls[0].endpoint
    replicas.mark_down(1, "http://b/v1", 30)
    assert {replicas.pick(1, endpoints, call_seconds=60).endpoint for _ in range(4)} == {"http://a/v1", "http://c/v1"}
    assert "http://b/v1" in replicas.down(1)
    replicas.mark_up(1, "http://b/v1")
    assert replicas.pick(1, endpoints, call_seconds=60).endpoint == "http://b/v1"  # back, and the least busy
    # Every replica down: calls still go out (to all of them) rather than being refused.
    for e in endpoints:
        replicas.mark_down(1, e, 30)
    assert replicas.pick(1, endpoints, call_seconds=60).endpoint in endpoints


def test_equal_counts_are_broken_by_the_scraped_load_and_a_lapsed_call_stops_counting(one_redis_url):
    client = redis.Redis.from_url(one_redis_url)
    replicas = Replicas(client, Namespace("t"))
    endpoints = ("http://a/v1", "http://b/v1")
    replicas.record_load(2, {"http://a/v1": 9.0, "http://b/v1": 1.0})
    assert replicas.pick(2, endpoints, call_seconds=60).endpoint == "http://b/v1"
    # A worker that died mid-call: its call's lease lapses and the next pick reaps it.
    counts, calls, _, _ = Namespace("t").replicas(2)
    client.zadd(calls, {"http://b/v1\nlost": 0})
    client.hincrby(counts, "http://b/v1", 1)
    replicas.pick(2, endpoints, call_seconds=60)
    assert client.zscore(calls, "http://b/v1\nlost") is None


# --- per-endpoint scrapes -------------------------------------------------------------


def _pool(endpoints) -> PoolInfo:
    return PoolInfo(id=1, name="gpu", width=8, floor=1, ceiling=16, controller={"kind": "vllm"}, metrics_url=None,
                    enabled=True, previous_names=(), controllers={"vllm": {}}, endpoints=tuple(endpoints))


@pytest.mark.slow
def test_each_endpoint_is_scraped_apart_and_a_dead_one_is_left_out_with_its_share_held():
    first = Simulator([SimModel(name="m", capacity=2, tokens=100, per_token_ms=50.0)]).start()
    second = Simulator([SimModel(name="m", capacity=2, tokens=100, per_token_ms=50.0)]).start()
    pool = _pool([first.base_url, second.base_url])
    table = RoutingTable(1, {}, {"gpu": pool}, {"m": ModelInfo("m", first.base_url, "chat", pool, None, 60.0, None)})
    scraper = Scraper()
    try:
        with ThreadPoolExecutor(4) as calls:
            for base in (first.base_url, first.base_url, second.base_url):
                calls.submit(httpx.post, base + "/chat/completions",
                             json={"model": "m", "messages": [{"role": "user", "content": "x"}]}, timeout=30)
            both = eventually(lambda: (g := scraper.read(pool, table, 0.0 if scraper.last_at is None else
                                                         scraper.last_at + 1, every=1, timeout=1, stale=60))
                              and g.running == 3 and g, timeout=10, what="3 running over both replicas")
            assert both.complete and both.fresh == 2
            second.stop()
            gone = scraper.read(pool, table, scraper.last_at + 1, every=1, timeout=1, stale=60,
                                held=lambda url: 5.0)
            # The survivor's 2 running count; the dead endpoint is missing, its share held.
            assert gone.ok and not gone.complete and gone.fresh == 1 and gone.endpoints == 2
            assert gone.running == 2 and gone.held == 5.0
            assert scraper.endpoints[metrics_url(second.base_url)].unreachable
            first.stop()
            none = scraper.read(pool, table, scraper.last_at + 1, every=1, timeout=1, stale=60)
            assert not none.ok and scraper.outage(scraper.last_at + 30) == 31
    finally:
        scraper.close()
        first.stop()
        second.stop()


# --- latency -------------------------------------------------------------------------


def test_quantiles_are_read_from_the_growth_of_cumulative_buckets():
    before = [(0.01, 0.0), (0.05, 10.0), (0.1, 10.0), (float("inf"), 10.0)]
    now = [(0.01, 0.0), (0.05, 20.0), (0.1, 110.0), (float("inf"), 110.0)]
    grown = histograms.delta(now, before)
    assert histograms.count(grown) == 100
    assert abs(histograms.quantile(grown, 0.95) - (0.05 + 0.05 * 85 / 90)) < 1e-9
    assert histograms.quantile(histograms.delta(before, now), 0.5) is not None  # a reset starts again
    assert histograms.quantile([(float("inf"), 0.0)], 0.9) is None


def test_the_latency_histograms_of_the_real_simulator_are_read_per_endpoint():
    sim = Simulator([SimModel(name="m", capacity=4, tokens=8)]).start()
    pool = _pool([sim.base_url])
    table = RoutingTable(1, {}, {"gpu": pool}, {"m": ModelInfo("m", sim.base_url, "chat", pool, None, 60.0, None)})
    scraper = Scraper()
    try:
        scraper.read(pool, table, 0.0, every=1, timeout=2, stale=60)
        for _ in range(3):
            httpx.post(sim.base_url + "/chat/completions",
                       json={"model": "m", "messages": [{"role": "user", "content": "x"}]}, timeout=30)
        g = scraper.read(pool, table, 5.0, every=1, timeout=2, stale=60)
        (endpoint, buckets), = g.latency["inter_token"]
        assert endpoint == metrics_url(sim.base_url) and histograms.count(buckets) >= 3 * 7
        assert histograms.count(g.latency["ttft"][0][1]) == 3 and g.latency_window_seconds == 5.0
    finally:
        scraper.close()
        sim.stop()


def _itl(endpoint_p95_ms: dict[str, float], n=100) -> Gauges:
    """Histograms whose observations all sit at one value per endpoint."""
    bounds = [0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, float("inf")]
    latency = []
    for endpoint, ms in endpoint_p95_ms.items():
        latency.append((endpoint, [(le, float(n) if le >= ms / 1000 else 0.0) for le in bounds]))
    return Gauges(ok=True, running=10, latency={"inter_token": latency}, endpoints=len(latency), fresh=len(latency))


LATENCY = normalise({"target_ms": 50.0, "min_samples": 20}, "latency")


def test_the_share_above_a_bucket_bound_is_exact_and_read_linearly_between_bounds():
    buckets = [(0.01, 0.0), (0.025, 30.0), (0.05, 96.0), (0.075, 100.0), (float("inf"), 100.0)]
    assert histograms.share_above(buckets, 0.05) == 0.04
    assert abs(histograms.share_above(buckets, 0.0375) - 0.37) < 1e-9
    assert histograms.share_above(buckets, 0.2) == 0.0 and histograms.share_above(buckets, 0.005) == 1.0


def test_the_latency_law_cuts_in_proportion_when_the_worst_replica_is_over_target():
    s = Signals(width=40, in_flight=40, waiting=5, gauges=_itl({"a": 40.0, "b": 100.0}))
    proposal = latency_law(s, WIDE, LATENCY, {})
    assert proposal.decision == "cut" and 20 <= proposal.width < 40 and "on b" in proposal.reason


def test_a_p95_just_under_the_target_holds():
    # 4 % of the observations above 50 ms: the p95 is under 50 ms, but with too little room to grow.
    mostly = [(0.025, 30.0), (0.05, 96.0), (0.075, 100.0), (float("inf"), 100.0)]
    g = Gauges(ok=True, latency={"inter_token": [("a", mostly)]})
    proposal = latency_law(Signals(width=20, in_flight=20, waiting=5, gauges=g), WIDE, LATENCY, {})
    assert proposal.decision == "hold" and "within tolerance" in proposal.reason


def test_the_latency_law_grows_under_target_only_with_work_waiting_and_holds_near_it():
    fast = _itl({"a": 10.0})
    assert latency_law(Signals(width=20, in_flight=20, waiting=5, gauges=fast), WIDE, LATENCY, {}).decision == "grow"
    assert latency_law(Signals(width=20, in_flight=12, waiting=0, gauges=fast), WIDE, LATENCY, {}).decision == "hold"
    few = Gauges(ok=True, latency={"inter_token": [("a", [(0.01, 3.0), (float("inf"), 3.0)])]})
    assert "fewer than" in latency_law(Signals(width=20, in_flight=20, waiting=5, gauges=few), WIDE, LATENCY,
                                       {}).reason


def test_the_latency_controller_composes_with_the_gauges_by_the_lowest_proposal():
    gauges = Gauges(ok=True, running=40, waiting=0, waiting_capacity=0, kv_usage=0.4,
                    latency={"inter_token": _itl({"a": 100.0}).latency["inter_token"]})
    s = Signals(width=40, in_flight=40, waiting=5, gauges=gauges)
    composed = compose({"vllm": normalise({}, "vllm"), "latency": LATENCY}, s, WIDE, {})
    assert composed.controller == "latency" and composed.width < 40
    assert composed.proposals["vllm"]["decision"] == "grow"


def test_a_latency_controller_with_a_bad_signal_is_refused_naming_it():
    found = problems({"signal": "tpot"}, "latency")
    assert found and "'tpot' is not one of inter_token, ttft" in found[0][1]


# --- utilisation -----------------------------------------------------------------------


def test_utilisation_is_bounded_by_the_running_cap_it_observes():
    params = normalise({"min_intervals": 1, "min_completions": 1}, "utilisation")
    memo: dict = {}
    # A full batch of 100 with the KV cache at 50 % and work waiting in vLLM: max_num_seqs binds.
    capped = Gauges(ok=True, running=100, waiting=20, waiting_capacity=20, kv_usage=0.5)
    proposal = utilisation_law(Signals(width=170, in_flight=170, waiting=5, completions=50, gauges=capped),
                               WIDE, params, memo)
    assert proposal.width == 100 and "running cap" in proposal.reason
    # At the cap, a low utilisation no longer raises it (it used to propose 170).
    calm = Gauges(ok=True, running=100, waiting=0, waiting_capacity=0, kv_usage=0.5)
    for _ in range(3):
        proposal = utilisation_law(Signals(width=100, in_flight=100, waiting=5, completions=50, gauges=calm),
                                   WIDE, params, memo)
        assert proposal.width <= 100


# --- the catalog ------------------------------------------------------------------------


def document(endpoints) -> dict:
    return {
        "pools": [{"name": "gpu", "width": 8, "ceiling": 16, "controller": {"kind": "vllm"}, "endpoints": endpoints}],
        "models": [{"name": "m", "base_url": "http://127.0.0.1:9/v1", "pool": "gpu"}],
        "workflows": [{"name": "chat", "candidates": ["m"]}],
    }


def test_a_pools_endpoints_are_kept_in_the_catalog_and_bad_ones_are_refused(db_url):
    engine = make_engine(db_url)
    try:
        migrate.upgrade(db_url, "schema@head")
        apply_document(engine, document(["http://gpu0:8000/v1", "http://gpu1:8000/v1/"]))
        assert load_routing(engine).pools["gpu"].endpoints == ("http://gpu0:8000/v1", "http://gpu1:8000/v1")
        for bad, said in ((["ftp://x"], "'ftp://x' is not an http(s) URL"),
                          (["http://a/v1", "http://a/v1/"], "listed twice")):
            try:
                apply_document(engine, document(bad))
            except Exception as exc:  # CatalogInvalid, naming the value
                assert said in str(exc) and "pools[0].endpoints" in str(exc)
            else:
                raise AssertionError(f"{bad} was accepted")
        assert load_routing(engine).pools["gpu"].endpoints == ("http://gpu0:8000/v1", "http://gpu1:8000/v1")
    finally:
        engine.dispose()


def test_the_endpoints_revision_keeps_the_lists_through_a_downgrade_and_upgrade(db_url):
    engine = make_engine(db_url)
    try:
        migrate.upgrade(db_url, "schema@head")
        apply_document(engine, document(["http://gpu0:8000/v1", "http://gpu1:8000/v1"]))
        migrate.downgrade(db_url, "catalog_0003")
        with engine.connect() as conn:
            assert "endpoints" not in {c["name"] for c in sa.inspect(conn).get_columns("pools")}
        migrate.upgrade(db_url, "schema@head")
        engine.dispose()
        assert load_routing(engine).pools["gpu"].endpoints == ("http://gpu0:8000/v1", "http://gpu1:8000/v1")
    finally:
        engine.dispose()

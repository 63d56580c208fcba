"""The failover share controller (seed 003) on a real Redis, in simulated time.

Every test the seed names is here (its names, in our words); the clock is a
ManualClock, so dwells and idle intervals pass without sleeping. Outcomes go
in as the walker reports them (``Attempt`` values through the observer path).
"""

from __future__ import annotations

import random

import pytest
import redis

from lanes.catalog import ModelInfo, RoutingTable, WorkflowRoute
from lanes.catalog.failover import FailoverParams
from lanes.clock import ManualClock
from lanes.namespace import Namespace
from lanes.priority import Priority
from lanes.routing.events import EventLog
from lanes.routing.observers import Attempt
from lanes.routing.share import BREACH, HEALTHY, UNKNOWN, ShareController, ShareStore, classify
from lanes.routing.share_metrics import share_metrics

PREFIX = "lanes:test"
DEFAULTS = FailoverParams()
DWELL = DEFAULTS.dwell_ms / 1000
IDLE = DEFAULTS.idle_recovery_ms / 1000


def model(name: str, url: str = "http://127.0.0.1:9/v1", timeout: float = 60.0) -> ModelInfo:
    return ModelInfo(name=name, base_url=url, kind="chat", pool=None, service=None, timeout_seconds=timeout,
                     api_key_env=None)


def route(name: str = "dialog", *, candidates=("a", "b"), failover: FailoverParams | None = DEFAULTS,
          deadline: float | None = None, primary_url: str = "http://127.0.0.1:9/v1") -> WorkflowRoute:
    models = tuple(model(m, primary_url if i == 0 else "http://127.0.0.1:8/v1") for i, m in enumerate(candidates))
    return WorkflowRoute(name=name, priority=Priority.INTERACTIVE, reserve_seconds=0.0,
                         default_deadline_seconds=deadline, candidates=models, fleet=None, failover=failover)


@pytest.fixture
def client(one_redis_url):
    c = redis.Redis.from_url(one_redis_url)
    yield c
    c.close()


@pytest.fixture
def clock():
    return ManualClock()


@pytest.fixture
def events(client):
    log = EventLog(client, prefix=PREFIX)
    yield log
    log.close()


@pytest.fixture
def shares(client, clock, events):
    return ShareController(ShareStore(client, Namespace(PREFIX)), clock=clock, events=events,
                           rng=random.Random(7), metrics=share_metrics())


def attempt(r: WorkflowRoute, generation: int | None, *, ttft: float | None = None, status: int | None = None,
            outcome: str = "served", no_first_token_by: float | None = None, model_name: str | None = None,
            stream_status: int | None = None) -> Attempt:
    return Attempt(workflow=r.name, model=model_name or r.candidates[0].name, pool=None, pool_id=None,
                   priority=Priority.INTERACTIVE, outcome=outcome, status=status, ttft_seconds=ttft,
                   share_generation=generation, no_first_token_by=no_first_token_by,
                   **({} if stream_status is None else {"stream_status": stream_status}))


def feed(shares: ShareController, r: WorkflowRoute, kinds: str, generation: int | None = None) -> None:
    """Feed primary outcomes: 'h' healthy, 'b' breach (slow first token), 'u' unknown (a 500)."""
    gen = generation if generation is not None else shares.store.tick(r, r.failover, shares._now()).generation
    for kind in kinds:
        if kind == "h":
            shares.observe(r, attempt(r, gen, ttft=0.2))
        elif kind == "b":
            shares.observe(r, attempt(r, gen, ttft=12.0))
        else:
            shares.observe(r, attempt(r, gen, outcome="failed", status=500))


def share_of(shares: ShareController, r: WorkflowRoute) -> float:
    return shares.store.read(r.name).share


# --- what an outcome is ----------------------------------------------------------------


@pytest.mark.parametrize(("fields", "expected"), [
    (dict(ttft=0.5), HEALTHY),
    (dict(ttft=10.0), HEALTHY),  # at the budget is within it
    (dict(ttft=10.01), BREACH),
    (dict(outcome="failed", status=529), BREACH),
    (dict(outcome="failed", status=503), BREACH),
    (dict(outcome="failed", status=429), BREACH),  # also when it came inside a streamed 2xx (backend test)
    (dict(outcome="failed", status=500), UNKNOWN),
    (dict(outcome="failed"), UNKNOWN),  # a network error
    (dict(outcome="timeout", no_first_token_by=10.0), BREACH),  # the deadline expired at the budget
    (dict(outcome="abandoned", no_first_token_by=15.0), BREACH),
    (dict(outcome="timeout", no_first_token_by=5.0), UNKNOWN),  # censored before the budget: says nothing
    (dict(outcome="timeout"), UNKNOWN),  # silent mid-answer, after a first token
    (dict(outcome="lease_lost"), UNKNOWN),
    (dict(outcome="rejected", status=400), UNKNOWN),
    (dict(ttft=None), UNKNOWN),  # an answer without a measured first token
])
def test_each_outcome_is_healthy_breach_or_unknown(fields, expected):
    assert classify(attempt(route(), 1, **fields), DEFAULTS) == expected


def test_overload_statuses_are_configurable():
    params = FailoverParams(overload_statuses=(529,))
    assert classify(attempt(route(), 1, outcome="failed", status=503), params) == UNKNOWN
    assert classify(attempt(route(), 1, outcome="failed", status=529), params) == BREACH


# --- the seed's tests -------------------------------------------------------------------


def test_unknown_outcomes_are_excluded_rather_than_vetoing_decisions(shares):
    r = route()
    # 5 breaches in 20 judged outcomes, with 34 unknown ones among them:
    # counted as healthy they would make 5/54 (a hold); excluded, 5/20 (a cut).
    feed(shares, r, "hhhbu" * 4 + "uu" * 15 + "hhh")
    state = shares.store.read(r.name)
    assert state.unknown == 34 and state.samples == 19 and state.share == 1.0  # unknowns are no samples
    feed(shares, r, "b")
    assert share_of(shares, r) == pytest.approx(0.8)


def test_in_flight_attempts_never_hold_a_decision_back(shares):
    r = route()
    in_flight = [shares.choose(r) for _ in range(30)]  # drawn, never finished
    assert all(choice.generation == in_flight[0].generation for choice in in_flight)
    feed(shares, r, "b" * 20, generation=in_flight[0].generation)
    assert share_of(shares, r) == pytest.approx(0.8)


def test_a_breach_rate_inside_the_band_holds_the_share(shares, clock):
    r = route()
    feed(shares, r, "b" * 20)
    assert share_of(shares, r) == pytest.approx(0.8)
    for _ in range(6):  # 1 in 20 = 5 %: above recovery (3 %), not above the target (10 %)
        clock.advance(DWELL)
        feed(shares, r, "hhhhhhhhhbhhhhhhhhhh")
    assert share_of(shares, r) == pytest.approx(0.8)


def test_a_decrease_discards_samples_that_started_at_the_old_share(shares, clock):
    r = route()
    old = shares.choose(r).generation
    feed(shares, r, "b" * 20, generation=old)
    state = shares.store.read(r.name)
    assert state.share == pytest.approx(0.8) and state.generation == old + 1 and state.samples == 0
    clock.advance(DWELL)
    feed(shares, r, "b" * 40, generation=old)  # slow calls that began at 1.0 finish now
    state = shares.store.read(r.name)
    assert state.share == pytest.approx(0.8) and state.samples == 0


def test_repeated_decreases_respect_dwell_and_the_floor(shares, clock):
    r = route()
    feed(shares, r, "b" * 20)
    feed(shares, r, "b" * 40)  # a whole new window of breaches, but within the dwell
    assert share_of(shares, r) == pytest.approx(0.8)
    clock.advance(DWELL)
    feed(shares, r, "b")
    assert share_of(shares, r) == pytest.approx(0.64)
    seen = []
    for _ in range(30):
        clock.advance(DWELL)
        feed(shares, r, "b" * 20)
        seen.append(share_of(shares, r))
    assert min(seen) == pytest.approx(0.05) and seen[-1] == pytest.approx(0.05)
    assert all(later <= earlier for earlier, later in zip(seen, seen[1:]))


def test_recovery_keeps_the_window(shares, clock):
    r = route()
    feed(shares, r, "b" * 20)
    clock.advance(DWELL)
    feed(shares, r, "h" * 20)  # healthy from now on; a dwell must pass at this rate
    assert share_of(shares, r) == pytest.approx(0.8)
    clock.advance(DWELL)
    feed(shares, r, "h")
    state = shares.store.read(r.name)
    assert state.share == pytest.approx(0.85) and state.samples == 21  # the window was kept
    clock.advance(DWELL)
    feed(shares, r, "h")  # the kept window supports the next step one dwell later
    assert share_of(shares, r) == pytest.approx(0.9)
    feed(shares, r, "h" * 5)  # and not sooner
    assert share_of(shares, r) == pytest.approx(0.9)


def test_idle_recovery_credits_elapsed_intervals(shares, clock, events):
    r = route()
    feed(shares, r, "b" * 20)
    clock.advance(3 * IDLE + 1)  # no traffic at all: the window cannot fill
    assert shares.choose(r).share == pytest.approx(0.95)
    clock.advance(IDLE - 2)
    assert shares.choose(r).share == pytest.approx(0.95)
    events.flush()
    changes = [e.detail["change"] for e in events.list(kind="share_change")]
    assert "idle_recovery" in changes and "decrease" in changes


def test_parked_controllers_keep_their_share_and_resume(shares, clock):
    r = route()
    feed(shares, r, "b" * 20)
    single = route(candidates=("a",))
    shares.follow(RoutingTable(2, {r.name: single}, {}, {}))
    state = shares.store.read(r.name)
    assert state.parked and state.share == pytest.approx(0.8)
    assert shares.choose(single) is None  # one candidate: nothing to share
    resumed = shares.choose(r)  # the fallback is back, the same primary
    assert resumed.share == pytest.approx(0.8) and not shares.store.read(r.name).parked


def test_a_parked_controller_is_credited_its_idle_time_when_it_resumes(shares, clock):
    r = route()
    feed(shares, r, "b" * 20)  # 0.8, its window cleared
    shares.follow(RoutingTable(2, {r.name: route(candidates=("a",))}, {}, {}))
    clock.advance(2 * IDLE + 1)  # parked for two idle intervals
    assert shares.choose(r).share == pytest.approx(0.9)


def test_one_breach_in_20_holds_and_one_in_5_cuts(shares):
    holds, cuts = route("holds"), route("cuts")
    feed(shares, holds, "hhhhhhhhhhhhhhhhhhhb")
    feed(shares, cuts, "hhhhb" * 4)
    assert share_of(shares, holds) == 1.0
    assert share_of(shares, cuts) == pytest.approx(0.8)


@pytest.mark.slow
def test_load_dependent_latency_converges_and_recovers_after_a_capacity_step(shares, clock):
    """A primary whose first token is late once its load passes its capacity.

    10 requests a second; the primary serves ``capacity`` of them a second
    within the budget and the excess breaches (plus a 1 % tail). Capacity 5:
    the share settles near 0.5, inside the band; capacity back at 20: it climbs
    back to 1.0 by steps.
    """
    r = route()
    load = random.Random(11)
    rate = 10

    def run(seconds: int, capacity: float) -> list[float]:
        seen = []
        for _ in range(seconds):
            clock.advance(1.0)
            choices = [shares.choose(r) for _ in range(rate)]
            primary = [c for c in choices if c.primary_first]
            over = max(0.0, len(primary) - capacity) / max(1, len(primary))
            for choice in primary:
                late = load.random() < over + 0.01
                shares.observe(r, attempt(r, choice.generation, ttft=12.0 if late else 0.3))
            seen.append(share_of(shares, r))
        return seen

    assert run(60, capacity=20)[-1] == 1.0
    degraded = run(900, capacity=5)
    settled = degraded[-600:]
    assert 0.25 <= min(settled) and max(settled) <= 0.7, (min(settled), max(settled))
    recovered = run(900, capacity=20)
    assert recovered[-1] == 1.0
    assert min(recovered) >= min(settled) - 0.2  # no collapse on the way up


# --- reloads, opting out, the draw --------------------------------------------------------


def test_an_unchanged_reload_keeps_the_controller_and_a_changed_one_retires_it(shares, clock, events):
    r = route()
    feed(shares, r, "b" * 20)
    assert shares.choose(route()).share == pytest.approx(0.8)  # same parameters, deadline, primary
    assert shares.choose(route(deadline=30.0)).share == 1.0  # another deadline: retired
    feed(shares, r, "b" * 20)
    assert shares.choose(route(primary_url="http://10.0.0.1/v1")).share == 1.0  # another primary
    feed(shares, r, "b" * 20)
    assert shares.choose(route(failover=FailoverParams(dwell_ms=1000))).share == 1.0  # other parameters
    events.flush()
    assert [e.detail["change"] for e in events.list(kind="share_change")].count("retired") == 3


def test_a_workflow_with_the_share_turned_off_routes_in_plain_order_and_forgets_it(shares):
    r = route()
    feed(shares, r, "b" * 20)
    off = route(failover=None)
    assert shares.choose(off) is None
    shares.follow(RoutingTable(2, {r.name: off}, {}, {}))
    assert shares.store.read(r.name) is None
    assert shares.choose(r).share == 1.0  # turned on again: a fresh controller


def test_the_draw_follows_the_share(shares):
    r = route()
    feed(shares, r, "b" * 20)
    first = [shares.choose(r).primary_first for _ in range(2000)]
    assert sum(first) / len(first) == pytest.approx(0.8, abs=0.03)


def test_alternate_attempts_never_move_the_share(shares):
    r = route()
    gen = shares.choose(r).generation
    for _ in range(40):
        shares.observe(r, attempt(r, gen, ttft=30.0, model_name="b"))
    state = shares.store.read(r.name)
    assert state.share == 1.0 and state.samples == 0


def test_two_processes_share_one_controller(client, clock):
    r = route()
    one = ShareController(ShareStore(client, Namespace(PREFIX)), clock=clock)
    two = ShareController(ShareStore(client, Namespace(PREFIX)), clock=clock)
    feed(one, r, "b" * 10)
    feed(two, r, "b" * 10)
    assert one.choose(r).share == pytest.approx(0.8) == two.choose(r).share


def test_the_share_metrics_follow_the_window(shares):
    from prometheus_client import REGISTRY

    r = route("metered")
    feed(shares, r, "hhhhb" + "u")
    assert REGISTRY.get_sample_value("lanes_failover_window_samples", {"workflow": "metered"}) == 5
    assert REGISTRY.get_sample_value("lanes_failover_breach_rate", {"workflow": "metered"}) == pytest.approx(0.2)
    assert REGISTRY.get_sample_value("lanes_failover_unknown_outcomes_total", {"workflow": "metered"}) == 1
    assert REGISTRY.get_sample_value("lanes_failover_active", {"workflow": "metered"}) == 1
    # The 10 s edge is exact: a 10.0 s first token is in the le=10 bucket, 12 s is not.
    assert REGISTRY.get_sample_value("lanes_failover_first_token_seconds_bucket",
                                     {"workflow": "metered", "le": "10.0"}) == 4


def test_the_script_opens_with_a_header_and_answers_directly(client):
    from importlib import resources

    body = (resources.files("lanes.routing") / "scripts" / "share.lua").read_text()
    head = body.split("\n\n")[0]
    assert "KEYS[1]" in head and "KEYS[2]" in head and "ARGV[14]" in head
    script = client.register_script(body)
    keys = list(Namespace(PREFIX).share("direct"))
    params = ["0.05", "0.8", "0.05", "0.1", "0.03", "100", "20", "30000", "300000"]
    started = script(keys=keys, args=["tick", "sig", 1000, *params])
    assert started == [b"1", 1, b"started", b"1", 0, 0, 0, 0]
    assert script(keys=keys, args=["record", "sig", 1001, *params, "1", 0])[2] == b"stale"
    assert script(keys=keys, args=["record", "sig", 1002, *params, "1", 1])[4:] == [1, 1, 1, 1]
    for at in range(1003, 1021):
        script(keys=keys, args=["record", "sig", at, *params, "1", 1])
    # The twentieth breach decides: the window is emptied, the reply names the one decided on
    decreased = script(keys=keys, args=["record", "sig", 1021, *params, "1", 1])
    assert decreased[2] == b"decrease" and decreased[4:] == [0, 0, 20, 20]
    # The breaker holds the primary back: held once, then nothing more to say
    assert script(keys=keys, args=["blocked", "sig", 1022, *params])[2] == b"held"
    assert script(keys=keys, args=["blocked", "sig", 1023, *params])[2] == b""


# --- an outage, the events, the identity, the classification (issue 37) -------------------


def test_a_decrease_event_reports_the_window_it_decided_on(shares, events):
    r = route()
    feed(shares, r, "hhhhb" * 2 + "bbbbbbbbbb")  # 12 breaches in 20
    events.flush()
    decrease = [e for e in events.list(kind="share_change") if e.detail["change"] == "decrease"]
    assert len(decrease) == 1
    assert decrease[0].detail["samples"] == 20 and decrease[0].detail["breach_rate"] == pytest.approx(0.6)
    assert shares.store.read(r.name).samples == 0  # the window itself starts afresh


def test_a_resumed_controller_no_longer_says_parked(shares):
    r = route()
    feed(shares, r, "b" * 20)
    shares.follow(RoutingTable(2, {r.name: route(candidates=("a",))}, {}, {}))
    assert shares.store.read(r.name).decision == "parked"
    shares.choose(r)
    state = shares.store.read(r.name)
    assert not state.parked and state.decision == "resumed"


def test_another_key_for_the_primary_retires_the_controller(shares, events):
    import dataclasses

    r = route()
    feed(shares, r, "b" * 20)
    keyed = dataclasses.replace(r, candidates=(dataclasses.replace(r.candidates[0], api_key_env="OTHER_KEY"),
                                               *r.candidates[1:]))
    assert shares.choose(r).share == pytest.approx(0.8)
    assert shares.choose(keyed).share == 1.0
    events.flush()
    assert [e.detail["change"] for e in events.list(kind="share_change")].count("retired") == 1


@pytest.mark.parametrize(("fields", "statuses", "expected"), [
    (dict(outcome="failed", stream_status=504, status=504), (504,), BREACH),  # listed 5xx inside a stream
    (dict(outcome="failed", stream_status=408), (408, 529), BREACH),  # listed 4xx inside a stream
    (dict(outcome="failed", stream_status=408), (429, 503, 529), UNKNOWN),  # not listed
    (dict(outcome="failed", ttft=0.3, status=500), (429, 503, 529), HEALTHY),  # failed after a prompt first token
    (dict(outcome="failed", ttft=12.0, status=500), (429, 503, 529), BREACH),  # failed after a late first token
    (dict(outcome="timeout", ttft=0.4), (429, 503, 529), HEALTHY),  # silent after a prompt first token
])
def test_other_overload_statuses_mid_stream_and_failures_after_the_first_token_are_judged(fields, statuses, expected):
    params = FailoverParams(overload_statuses=statuses)
    assert classify(attempt(route(failover=params), 1, **fields), params) == expected


def test_the_backend_client_keeps_a_streamed_code_and_the_first_token_of_a_failed_stream():
    import json

    from lanes.errors import BackendError
    from lanes.routing.backend import BackendClient
    from tests.routing.test_backend import stream_backend

    error = json.dumps({"error": {"message": "busy", "code": 408}}).encode()
    body = b'data: {"choices": [{"delta": {"content": "o"}}]}\n\ndata: ' + error + b"\n\ndata: [DONE]\n\n"
    client = BackendClient()
    try:
        with stream_backend(body) as hosted, pytest.raises(BackendError) as caught:
            client.call(hosted, {"messages": [{"role": "user", "content": "x"}]}, timeout=5)
    finally:
        client.close()
    assert caught.value.stream_status == 408 and caught.value.status is None
    assert caught.value.ttft_seconds is not None and 0 <= caught.value.ttft_seconds < 5

"""Fleet sizing, the background gate and wait cancellation: the worker's own parts."""


import pytest

from lanes import InvalidInput
from lanes.catalog import apply_document, load_routing, open_catalog
from workers.cancel import CancelRegistry
from workers.fleet import fleet_names, plan_fleet
from workers.gate import BackgroundGate

DOC = {
    "pools": [{"name": "big", "width": 40, "ceiling": 64}, {"name": "small", "width": 1}],
    "models": [
        {"name": "m-big", "base_url": "http://127.0.0.1:9/v1", "pool": "big"},
        {"name": "m-small", "base_url": "http://127.0.0.1:9/v1", "pool": "small"},
        {"name": "hosted", "base_url": "https://api.example.com/v1"},
    ],
    "workflows": [
        {"name": "a", "candidates": ["m-big", "hosted"]},
        {"name": "b", "candidates": ["m-small"]},
        {"name": "c", "candidates": ["hosted"]},
    ],
}


@pytest.fixture
def table(make_settings):
    engine = open_catalog(make_settings())
    apply_document(engine, DOC)
    return load_routing(engine)


def test_a_fleet_runs_width_times_workers_per_lane_within_floor_and_cap(table, make_settings):
    settings = make_settings(workers_per_lane=2, fleet_min_workers=3, fleet_max_workers=50)
    assert fleet_names(table) == ["big", "hosted", "small"]
    big = plan_fleet(table, "big", settings)
    assert (big.width, big.concurrency, big.background_limit) == (40, 50, 49)  # capped
    small = plan_fleet(table, "small", settings)
    assert (small.concurrency, small.background_limit) == (3, 2)  # floor
    assert small.queues == ("lanes.small", "lanes.small.background")
    hosted = plan_fleet(table, "hosted", settings)
    assert hosted.concurrency == 6  # no lane: counted as a pool of the floor's width


def test_an_unknown_fleet_is_refused_with_the_known_ones(table, make_settings):
    with pytest.raises(InvalidInput, match=r"unknown fleet 'nope' \(known: big, hosted, small\)"):
        plan_fleet(table, "nope", make_settings())


class FakeConsumer:
    """Stands in for Celery's consumer loop, which a unit test cannot run; records the calls."""

    def __init__(self):
        self.calls = []

    def call_soon(self, fn, *args):
        self.calls.append((fn.__name__, args))

    def add_task_queue(self, queue):
        pass

    def cancel_task_queue(self, queue):
        pass


def test_the_gate_stops_taking_background_work_before_the_last_thread():
    gate = BackgroundGate(3, "lanes.p.background")
    gate.consumer = FakeConsumer()
    assert gate.enter() and gate.enter()
    assert gate.consumer.calls == []
    assert gate.enter()  # the third of three: stop consuming background
    assert gate.consumer.calls == [("cancel_task_queue", ("lanes.p.background",))]
    assert not gate.enter()  # a message that slipped in is handed back
    gate.leave()
    assert gate.consumer.calls[-1] == ("add_task_queue", ("lanes.p.background",))
    assert gate.active == 2


def test_a_revoked_task_id_cancels_its_wait(monkeypatch):
    from celery.worker import state

    registry = CancelRegistry(watch_interval=0.01)
    item = registry.register("t-1")
    other = registry.register("t-2")
    state.revoked.add("t-1")
    try:
        assert item.event.wait(2)
        assert item.reason == "revoked"
        assert not other.event.is_set()
    finally:
        state.revoked.discard("t-1")


def test_shutdown_cancels_every_wait_and_any_that_starts_after():
    registry = CancelRegistry()
    first = registry.register("a")
    registry.cancel_all("shutdown")
    assert first.event.is_set() and first.reason == "shutdown"
    late = registry.register("b")
    assert late.event.is_set() and late.reason == "shutdown"

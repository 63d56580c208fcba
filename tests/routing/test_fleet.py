"""Wait cancellation: the worker's own parts (fleet sizing: tests/workers/test_fleet_plan.py)."""

from workers.cancel import CancelRegistry


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

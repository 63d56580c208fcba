"""Lane events in Flower's own event state (flower.events.EventsState, as
`lanes flower` runs it): they add the task's lane log and never change its
state, so a revocation still shows and a late one leaves a result alone."""

from __future__ import annotations

import time

from lanes.flower import lane_events
from lanes.flower.server import LaneEventsState


def _state():
    return LaneEventsState(max_tasks_in_memory=100, max_workers_in_memory=10)


def _send(flower_state, kind: str, uuid: str, clock: int, **fields) -> None:
    now = time.time()
    flower_state.event({"type": kind, "uuid": uuid, "hostname": "gpu@host", "timestamp": now + clock * 0.001,
                 "local_received": now, "clock": clock, **fields})


def _admitted(**overrides) -> dict:
    return {"pool": "gpu", "model": "m", "priority": "interactive", "wait_ms": 412.3, "outcome": "served", **overrides}


def test_a_lane_admission_is_logged_on_a_running_task_without_changing_its_state():
    state = _state()
    _send(state, "task-received", "t1", 1, name="lanes.route", args="(request hidden)", kwargs="{}")
    _send(state, "task-started", "t1", 2)
    _send(state, lane_events.BYPASS, "t1", 3, pool="gpu", model="big", priority="interactive", reason="breaker_open")
    _send(state, lane_events.ADMITTED, "t1", 4, **_admitted())

    task = state.tasks["t1"]
    assert task.state == "STARTED"  # Flower keeps its Terminate button
    assert task.lane == ("bypassed model big (lane gpu): breaker_open; "
                         "admitted to lane gpu after 412 ms (interactive); model m: served")
    assert task.as_dict()["lane"] == task.lane  # /api/tasks shows it too
    assert state.counter["gpu@host"][lane_events.ADMITTED] == 1


def test_a_revocation_after_a_lane_event_still_shows_as_revoked():
    state = _state()
    _send(state, "task-received", "t2", 1, name="lanes.route")
    _send(state, "task-started", "t2", 2)
    _send(state, lane_events.ADMITTED, "t2", 3, **_admitted(outcome="failed"))
    _send(state, "task-revoked", "t2", 4, terminated=True)

    assert state.tasks["t2"].state == "REVOKED"


def test_a_late_lane_event_leaves_a_finished_tasks_state_and_result_alone():
    state = _state()
    _send(state, "task-received", "t3", 1, name="lanes.route")
    _send(state, "task-started", "t3", 2)
    _send(state, "task-succeeded", "t3", 3, result="{'answer': 'kept'}", runtime=0.4)
    # Sent before the success, delivered after it; even one carrying a result field.
    _send(state, lane_events.ADMITTED, "t3", 4, result="overwritten?", state="FAILURE", **_admitted())

    task = state.tasks["t3"]
    assert (task.state, task.result) == ("SUCCESS", "{'answer': 'kept'}")
    assert "admitted to lane gpu" in task.lane


def test_a_lane_event_arriving_before_the_task_is_kept_for_it():
    state = _state()
    _send(state, lane_events.ADMITTED, "t4", 1, **_admitted())
    _send(state, "task-received", "t4", 2, name="lanes.route")

    assert state.tasks["t4"].state == "RECEIVED"
    assert state.tasks["t4"].lane.startswith("admitted to lane gpu")


def test_other_custom_task_events_keep_celerys_meaning():
    state = _state()
    _send(state, "task-received", "t5", 1, name="lanes.route")
    _send(state, "task-progress", "t5", 2)

    assert state.tasks["t5"].state == "PROGRESS" and state.tasks["t5"].lane is None

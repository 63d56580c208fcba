"""Submit-time validation that needs no service."""

from datetime import datetime, timedelta, timezone

import pytest

from lanes import InvalidInput, Priority
from lanes.routing.request import RouteRequest, check_payload, parse_deadline


def test_deadline_in_seconds_is_counted_from_now():
    assert parse_deadline(30, now=1000.0) == 1030.0


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf"), "soon", True])
def test_a_deadline_that_is_not_in_the_future_is_refused(bad):
    with pytest.raises(InvalidInput, match="deadline"):
        parse_deadline(bad, now=1000.0)


def test_an_aware_datetime_deadline_is_accepted_and_a_naive_one_refused():
    now = datetime.now(timezone.utc)
    assert parse_deadline(now + timedelta(seconds=10), now=now.timestamp()) == pytest.approx(now.timestamp() + 10)
    with pytest.raises(InvalidInput, match="time zone"):
        parse_deadline(datetime.now() + timedelta(seconds=10), now=now.timestamp())
    with pytest.raises(InvalidInput, match="in the past"):
        parse_deadline(now - timedelta(seconds=1), now=now.timestamp())


def test_payloads_must_be_json_objects_fit_for_the_kind():
    assert check_payload('{"messages": [{"role": "user", "content": "hi"}]}', kind="chat", workflow="w")
    with pytest.raises(InvalidInput, match="not JSON"):
        check_payload("{nope", kind="chat", workflow="w")
    with pytest.raises(InvalidInput, match="JSON object"):
        check_payload([1, 2], kind="chat", workflow="w")
    with pytest.raises(InvalidInput, match="messages"):
        check_payload({"input": "x"}, kind="chat", workflow="w")
    with pytest.raises(InvalidInput, match="input"):
        check_payload({"messages": []}, kind="embedding", workflow="w")
    with pytest.raises(InvalidInput, match="cannot be sent as JSON"):
        check_payload({"messages": [object()]}, kind="chat", workflow="w")


def test_unknown_priorities_are_refused_with_the_known_ones():
    assert Priority.parse("user-tool") is Priority.USER_TOOL
    assert Priority.parse(2) is Priority.BACKGROUND
    with pytest.raises(InvalidInput, match="interactive, user_tool, background"):
        Priority.parse("urgent")


def test_a_request_survives_the_json_round_trip():
    request = RouteRequest(task_id="t", workflow="w", payload={"a": 1}, priority=Priority.USER_TOOL,
                           deadline=12.5, submitted_at=10.0, idempotency_key="k")
    assert RouteRequest.from_message(request.to_message()) == request

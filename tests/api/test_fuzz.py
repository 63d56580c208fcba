"""Whatever JSON a caller sends, the answer is a decision in the error shape, never a 500."""

from __future__ import annotations

from hypothesis import given, strategies as st

from tests.api.conftest import AUTH, CHAT

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10**6) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
    max_leaves=8,
)


def decided(answer, allowed: set[int]) -> dict:
    assert answer.status_code in allowed, answer.text
    body = answer.json()
    if answer.status_code >= 400:
        assert set(body) <= {"error", "message", "problems"} and body["message"], body
    return body


@given(
    workflow=st.sampled_from(["chat", "embed", "nope"]) | json_values,
    payload=st.just(CHAT) | json_values,
    priority=st.sampled_from(["interactive", "background", "urgent"]) | json_values,
    deadline=st.sampled_from([30, "2099-01-01T00:00:00Z", "soon"]) | json_values,
)
def test_any_submit_body_is_accepted_or_refused_by_name(api, workflow, payload, priority, deadline):
    body = {"workflow": workflow, "payload": payload, "priority": priority, "deadline": deadline}
    decided(api.post("/v1/tasks", json=body, headers=AUTH), {202, 400, 422})


pool_fields = st.sampled_from(["width", "floor", "ceiling", "controller", "enabled", "metrics_url", "colour"])


@given(changes=st.dictionaries(pool_fields, st.integers(0, 12) | json_values
                               | st.sampled_from([{"kind": "overload"}, {"kind": "vllm", "max_cut": 2}]), max_size=3))
def test_any_pool_patch_is_applied_or_refused_by_name(api, changes):
    decided(api.patch("/v1/pools/gpu-a", json=changes, headers=AUTH), {200, 400, 422})
    pool = decided(api.get("/v1/pools/gpu-a"), {200})
    assert pool["floor"] <= pool["configured_width"] <= pool["ceiling"], "the catalog never holds a bad pool"

"""A workflow's failover share override in the catalog: the file, the bounds, PATCH, the CLI."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from lanes.catalog import apply_document, catalog_version, export_document, load_routing, validate
from lanes.catalog.failover import DEFAULTS
from lanes.cli import main
from lanes.errors import CatalogInvalid, InvalidInput, NotFound
from lanes.ops.patch import WORKFLOWS, patch_item

UNCHANGED = object()


def document(failover=UNCHANGED, *, timeout_ms: int = 60_000) -> dict:
    workflow = {"name": "dialog", "candidates": ["a", "b"]}
    if failover is not UNCHANGED:
        workflow["failover"] = failover
    return {
        "pools": [{"name": "p", "width": 2}],
        "models": [{"name": "a", "base_url": "http://127.0.0.1:9/v1", "pool": "p", "timeout_ms": timeout_ms},
                   {"name": "b", "base_url": "http://127.0.0.1:8/v1"}],
        "workflows": [workflow, {"name": "single", "candidates": ["a"]}],
    }


def test_a_workflow_without_an_override_runs_the_seed_defaults(engine):
    apply_document(engine, document())
    route = load_routing(engine).workflows["dialog"]
    assert route.failover == DEFAULTS and route.failover_override is None
    assert (DEFAULTS.latency_budget_ms, DEFAULTS.breach_rate_target, DEFAULTS.recovery_breach_rate,
            DEFAULTS.window_samples, DEFAULTS.min_samples, DEFAULTS.share_step, DEFAULTS.share_decay,
            DEFAULTS.share_floor, DEFAULTS.dwell_ms, DEFAULTS.idle_recovery_ms, DEFAULTS.overload_statuses) == (
        10_000, 0.10, 0.03, 100, 20, 0.05, 0.8, 0.05, 30_000, 300_000, (429, 503, 529))


def test_an_override_replaces_the_members_it_names_and_round_trips(engine):
    apply_document(engine, document({"latency_budget_ms": 2000, "dwell_ms": 500, "overload_statuses": [529]}))
    route = load_routing(engine).workflows["dialog"]
    assert route.failover.latency_budget_ms == 2000 and route.failover.dwell_ms == 500
    assert route.failover.overload_statuses == (529,)
    assert route.failover.min_samples == DEFAULTS.min_samples  # an omitted member keeps its default
    exported = export_document(engine)
    version = catalog_version(engine)
    assert apply_document(engine, exported).version == version  # the export re-applies as a no-op


def test_enabled_false_turns_the_share_off(engine):
    apply_document(engine, document({"enabled": False}))
    assert load_routing(engine).workflows["dialog"].failover is None


@pytest.mark.parametrize(("failover", "message"), [
    ({"latency_budget_ms": 0}, "workflows[0].failover.latency_budget_ms: 0 is outside [1, 3.6e+06]"),
    ({"dwell_ms": 86_400_001}, "workflows[0].failover.dwell_ms: 86400001 is outside"),
    ({"idle_recovery_ms": -1}, "workflows[0].failover.idle_recovery_ms: -1 is outside [0,"),
    ({"min_samples": 1}, "workflows[0].failover.min_samples: 1 is outside [2,"),
    ({"window_samples": 100_001}, "workflows[0].failover.window_samples: 100001 is outside"),
    ({"min_samples": 50, "window_samples": 40}, "min_samples: 50 is above window_samples 40"),
    ({"breach_rate_target": 1.0}, "breach_rate_target: 1.0 is outside [0, 1)"),
    ({"recovery_breach_rate": 0.2}, "recovery_breach_rate: 0.2 is above breach_rate_target 0.1"),
    ({"share_decay": 1.0}, "share_decay: 1.0 is outside (0, 1)"),
    ({"share_decay": 0}, "share_decay: 0 is outside (0, 1)"),
    ({"share_step": 0}, "share_step: 0 is outside (0, 1]"),
    ({"share_floor": 1.5}, "share_floor: 1.5 is outside (0, 1]"),
    ({"overload_statuses": [529, 200]}, "overload_statuses: 200 in [529, 200] is not an HTTP status in 400..599"),
    ({"overload_statuses": list(range(400, 433))}, "overload_statuses: 33 statuses are more than the 32 allowed"),
    ({"enabled": "no"}, "workflows[0].failover.enabled: 'no' is not true or false"),
    ({"budget": 5}, "workflows[0].failover.budget: 5 is not a failover setting (known: enabled, latency_budget_ms"),
    ("fast", "workflows[0].failover: 'fast' is not a table of failover settings"),
    ({"latency_budget_ms": 90_000}, "latency_budget_ms: 90000 is above the primary 'a''s timeout_ms 60000"),
])
def test_each_bound_is_refused_naming_the_value(failover, message):
    with pytest.raises(CatalogInvalid) as refused:
        validate(document(failover))
    assert any(message in problem for problem in refused.value.problems), refused.value.problems


def test_the_defaults_on_a_primary_with_a_shorter_timeout_are_allowed():
    validate(document(timeout_ms=5000))  # its cut-off calls are unknown outcomes, not breaches


# --- PATCH ---------------------------------------------------------------------------


def override(engine) -> dict | None:
    return load_routing(engine).workflows["dialog"].failover_override


def test_the_patch_of_the_admin_api_has_the_seeds_semantics(engine):
    """Omitted: unchanged; null: the defaults; {"enabled": false}: off; an object replaces the old one whole."""
    apply_document(engine, document({"dwell_ms": 500, "latency_budget_ms": 2000}))
    version = catalog_version(engine)
    patch_item(engine, WORKFLOWS, "dialog", {"reserve_ms": 10})  # failover omitted
    assert override(engine) == {"dwell_ms": 500, "latency_budget_ms": 2000}
    patch_item(engine, WORKFLOWS, "dialog", {"failover": {"share_floor": 0.1}})
    assert override(engine) == {"share_floor": 0.1}  # replaced whole, never merged
    patch_item(engine, WORKFLOWS, "dialog", {"failover": {"enabled": False}})
    assert load_routing(engine).workflows["dialog"].failover is None
    patch_item(engine, WORKFLOWS, "dialog", {"failover": None})
    assert override(engine) is None and load_routing(engine).workflows["dialog"].failover == DEFAULTS
    assert catalog_version(engine) == version + 4


def test_a_bad_patch_is_refused_naming_the_value_and_changes_nothing(engine):
    apply_document(engine, document({"dwell_ms": 500}))
    version = catalog_version(engine)
    with pytest.raises(InvalidInput, match=r"failover.share_floor: 0 is outside \(0, 1\]"):
        patch_item(engine, WORKFLOWS, "dialog", {"failover": {"share_floor": 0}})
    with pytest.raises(InvalidInput, match="latency_budget_ms: 90000 is above the primary 'a''s timeout_ms"):
        patch_item(engine, WORKFLOWS, "dialog", {"failover": {"latency_budget_ms": 90_000}})
    with pytest.raises(NotFound, match=r"unknown workflow 'dialgo' \(known: dialog, single\)"):
        patch_item(engine, WORKFLOWS, "dialgo", {"failover": None})
    assert catalog_version(engine) == version and override(engine) == {"dwell_ms": 500}


# --- the CLI --------------------------------------------------------------------------


@pytest.fixture
def lanes(isolated_env, db_url, monkeypatch, one_redis_url):
    monkeypatch.setenv("LANES_DATABASE_URL", db_url)
    monkeypatch.setenv("LANES_REDIS_URL", one_redis_url)
    runner = CliRunner()
    return lambda *args: runner.invoke(main, list(args), catch_exceptions=False)


def test_the_cli_sets_and_shows_the_override(lanes, tmp_path):
    path = tmp_path / "catalog.yaml"  # JSON is YAML
    path.write_text(json.dumps(document()))
    assert lanes("catalog", "apply", str(path)).exit_code == 0
    changed = lanes("shares", "set", "dialog", "--override", '{"latency_budget_ms": 2000}')
    assert changed.exit_code == 0 and '{"latency_budget_ms": 2000}' in changed.stdout
    assert "failover" in lanes("catalog", "show").stdout
    workflows = {w["name"]: w for w in json.loads(lanes("catalog", "show", "--json").stdout)["workflows"]}
    assert workflows["dialog"]["failover"] == {"latency_budget_ms": 2000} and workflows["dialog"]["failover_enabled"]
    shown = {row["workflow"]: row for row in json.loads(lanes("shares", "--json").stdout)}
    assert shown["dialog"]["setting"] == "override" and shown["dialog"]["params"]["latency_budget_ms"] == 2000
    assert shown["single"]["setting"] == "one candidate"
    assert lanes("shares", "set", "dialog", "--off").exit_code == 0
    assert json.loads(lanes("shares", "--json").stdout)[0]["setting"] == "off"
    bad = lanes("shares", "set", "dialog", "--override", '{"share_decay": 2}')
    assert bad.exit_code == 2 and "share_decay: 2 is outside (0, 1)" in bad.stderr
    assert lanes("shares", "set", "dialog").exit_code == 2

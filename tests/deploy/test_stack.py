"""The compose stack's files, checked with the tools that read them (no
Docker engine here): the compose specification's JSON schema (vendored in
tests/data, no network), promtool for Prometheus's config and rules, and
the dashboard against the names Lanes exposes.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.conftest import missing_service
from tests.metrics.names import DASHBOARD, ROOT, RULES, dashboard_exprs, exposed, used_names

PROMETHEUS = ROOT / "deploy" / "prometheus"
GRAFANA = ROOT / "deploy" / "grafana"


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        missing_service("promtool is not installed (Debian package prometheus; .ci/run installs it)")
    return found


def test_the_compose_file_follows_the_compose_specification():
    schema = json.loads((ROOT / "tests" / "data" / "compose-spec.json").read_text())
    jsonschema.Draft7Validator.check_schema(schema)
    errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(compose()), key=lambda e: list(e.path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.path))}: {e.message}" for e in errors)


def test_the_schema_check_catches_a_broken_service():
    schema = json.loads((ROOT / "tests" / "data" / "compose-spec.json").read_text())
    broken = compose()
    broken["services"]["redis"]["restart_policy"] = "always"  # not a service key
    assert list(jsonschema.Draft7Validator(schema).iter_errors(broken))


def test_the_stack_has_every_part_and_secrets_are_required_not_defaulted():
    services = compose()["services"]
    for name in ("redis", "postgres", "migrate", "sim", "api", "beat", "flower", "worker-memory",
                 "prometheus", "grafana"):
        assert name in services, name
    assert services["api"]["command"][:2] == ["lanes", "api"]
    assert "8080" in services["api"]["command"]
    assert services["flower"]["command"][:2] == ["lanes", "flower"]
    # No token configured must mean a refusal to start, never an open API or Flower.
    assert ":?" in services["api"]["environment"]["LANES_API_TOKEN"]
    assert ":?" in services["flower"]["environment"]["LANES_FLOWER_BASIC_AUTH"]
    assert ":?" in services["grafana"]["environment"]["GF_SECURITY_ADMIN_PASSWORD"]
    redis_command = services["redis"]["command"]
    assert "noeviction" in redis_command and redis_command[redis_command.index("--appendonly") + 1] == "yes"
    assert redis_command[redis_command.index("--appendfsync") + 1] in ("everysec", "always")
    assert any(volume.endswith(":/data") for volume in services["redis"]["volumes"]), "the AOF outlives the container"


def test_prometheus_scrapes_every_process_that_serves_metrics_on_its_own_port():
    services = compose()["services"]
    ports = {name: s["environment"]["LANES_METRICS_PORT"] for name, s in services.items()
             if "LANES_METRICS_PORT" in s.get("environment", {})}
    assert {n for n in services if n.startswith("worker-")} | {"beat"} == set(ports)
    for name in ports:  # scraped from Prometheus's own container
        assert services[name]["environment"]["LANES_METRICS_HOST"] == "0.0.0.0", name
    config = yaml.safe_load((PROMETHEUS / "prometheus.yml").read_text())
    targets = {t for job in config["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]}
    assert {f"{name}:{port}" for name, port in ports.items()} | {"api:8080", "sim:8700"} <= targets
    for name, mount in (("prometheus", "./deploy/prometheus/prometheus.yml"), ("grafana", "./deploy/grafana/dashboards")):
        assert any(volume.startswith(mount + ":") for volume in services[name]["volumes"]), name
        assert (ROOT / mount).exists()


def test_promtool_accepts_the_config_and_the_alert_rules(tmp_path):
    tool = promtool()
    # The config names the rules where the container mounts them: point it at the repository's copy.
    config = (PROMETHEUS / "prometheus.yml").read_text()
    assert "/etc/prometheus/rules/*.yml" in config
    (tmp_path / "prometheus.yml").write_text(config.replace("/etc/prometheus/rules", str(RULES.parent)))
    checked = subprocess.run([tool, "check", "config", str(tmp_path / "prometheus.yml")],
                             capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "1 rule files found" in checked.stdout + checked.stderr
    rules = subprocess.run([tool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert rules.returncode == 0, rules.stdout + rules.stderr


def test_promtool_rejects_a_broken_rule(tmp_path):
    tool = promtool()
    broken = tmp_path / "broken.yml"
    broken.write_text("groups:\n  - name: x\n    rules:\n      - alert: X\n        expr: max by (pool (lanes_lane_width)\n")
    assert subprocess.run([tool, "check", "rules", str(broken)], capture_output=True).returncode != 0


def test_an_open_breaker_fires_its_alert(tmp_path):
    """promtool's rule unit test: the breaker alert fires after two minutes open, not before."""
    tool = promtool()
    (tmp_path / "test.yml").write_text(yaml.safe_dump({
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{
            "interval": "1m",
            "input_series": [
                {"series": 'lanes_breaker_state{model="m", instance="a"}', "values": "0 2 2 2 2"},
                {"series": 'lanes_breaker_state{model="m", instance="b"}', "values": "0 2 2 2 2"},
            ],
            "alert_rule_test": [
                {"eval_time": "2m", "alertname": "LanesBreakerOpen", "exp_alerts": []},
                {"eval_time": "4m", "alertname": "LanesBreakerOpen",
                 "exp_alerts": [{"exp_labels": {"model": "m", "severity": "warning"},
                                 "exp_annotations": {"summary": "The breaker of m is open: its calls go to fallbacks"}}]},
            ],
        }],
    }))
    ran = subprocess.run([tool, "test", "rules", str(tmp_path / "test.yml")], capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_grafana_provisions_the_datasource_the_dashboard_uses():
    board = json.loads(DASHBOARD.read_text())
    source = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    uid = source["datasources"][0]["uid"]
    assert source["datasources"][0]["url"] == "http://prometheus:9090"
    titles = {panel["title"] for panel in board["panels"]}
    for wanted in ("Width vs in flight", "Queued per priority", "Lane wait p95 per priority",
                   "Bypasses to fallbacks", "Width changes", "Memory runs by status"):
        assert wanted in titles
    for panel in board["panels"]:
        assert panel["datasource"]["uid"] == uid, panel["title"]
        assert panel["targets"], panel["title"]
    provider = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "lanes.yml").read_text())
    assert provider["providers"][0]["options"]["path"] == "/var/lib/grafana/dashboards"
    assert len(dashboard_exprs()) >= 13


def test_every_name_a_panel_or_rule_uses_is_in_the_apis_exposition(tmp_path, one_redis_url):
    """The API's exposition (the default registry with the lane collector): a
    process of its own with a catalog, as the API would run."""
    from lanes.catalog import apply_document, open_catalog
    from lanes.settings import Settings

    settings = Settings(redis_url=one_redis_url, database_url=f"sqlite:///{tmp_path / 'catalog.db'}",
                        state_dir=tmp_path)
    apply_document(open_catalog(settings), {
        "pools": [{"name": "p", "width": 2}],
        "models": [{"name": "m", "base_url": "http://127.0.0.1:9/v1", "pool": "p"}],
        "workflows": [{"name": "w", "priority": "interactive", "candidates": ["m"]}],
    })
    code = (
        "import sys\n"
        "from lanes.settings import Settings\n"
        "from lanes import metrics\n"
        f"metrics.install(Settings(redis_url={one_redis_url!r}, database_url={settings.catalog_url()!r}))\n"
        "sys.stdout.write(metrics.render()[0].decode())\n"
    )
    text = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    missing = used_names() - exposed(text)
    assert not missing, f"panels or rules name series no Lanes process exposes: {sorted(missing)}"

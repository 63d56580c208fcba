"""With Redis away the lane alerts must not simply go quiet.

The lane gauges are read from Redis at scrape time; with Redis stopped their
families are empty, and an empty family fires no alert. The collector's
success gauge (``lanes_lane_collector_up``) says 0 instead, and the rule
``LanesLaneMetricsUnread`` alerts on it. Here a private redis-server is
really stopped between two scrapes of a real collector, and the values those
two scrapes exported are what promtool's rule unit test is fed.
"""

from __future__ import annotations

import subprocess

import redis
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from lanes.catalog import apply_document, load_routing, open_catalog
from lanes.embedded import EmbeddedRedis
from lanes.metrics import LaneCollector
from lanes.routing.runtime import provision_lanes
from lanes.settings import Settings
from tests.deploy.test_stack import promtool
from tests.metrics.names import RULES

LABELS = 'job="lanes-api", instance="api:8080"'


def samples(text: str) -> dict[str, list]:
    found: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found.setdefault(sample.name, []).append((sample.labels, sample.value))
    return found


def scrape(registry) -> dict[str, list]:
    return samples(generate_latest(registry).decode())


def promtool_test(tmp_path, input_series: list[dict], checks: list[dict]) -> subprocess.CompletedProcess:
    (tmp_path / "test.yml").write_text(yaml.safe_dump({
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": input_series, "alert_rule_test": checks}],
    }))
    return subprocess.run([promtool(), "test", "rules", str(tmp_path / "test.yml")], capture_output=True, text=True)


def test_a_scrape_with_redis_stopped_says_so_and_the_alert_fires(tmp_path):
    server = EmbeddedRedis(tmp_path / "redis")
    url = server.ensure()
    try:
        settings = Settings(redis_url=url, database_url=f"sqlite:///{tmp_path / 'catalog.db'}", state_dir=tmp_path)
        engine = open_catalog(settings)
        apply_document(engine, {
            "pools": [{"name": "p", "width": 2}],
            "models": [{"name": "m", "base_url": "http://127.0.0.1:9/v1", "pool": "p"}],
            "workflows": [{"name": "w", "priority": "interactive", "candidates": ["m"]}],
        })
        client = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        provision_lanes(client, settings, load_routing(engine))
        registry = CollectorRegistry()
        registry.register(LaneCollector(settings, client, lambda: load_routing(engine), cache_seconds=0))

        before = scrape(registry)
        assert before["lanes_lane_collector_up"] == [({}, 1.0)]
        assert before["lanes_lane_width"] == [({"pool": "p"}, 2.0)]
    finally:
        server.stop()
    after = scrape(registry)  # Redis is stopped: the process still answers the scrape
    assert after["lanes_lane_collector_up"] == [({}, 0.0)]
    assert "lanes_lane_width" not in after and "lanes_lane_in_flight" not in after

    # What Prometheus would have stored: one scrape a minute, Redis gone after the second.
    up = [before["lanes_lane_collector_up"][0][1]] * 2 + [after["lanes_lane_collector_up"][0][1]] * 5
    width = [str(before["lanes_lane_width"][0][1])] * 2 + ["_"] * 5
    ran = promtool_test(tmp_path, [
        {"series": f"lanes_lane_collector_up{{{LABELS}}}", "values": " ".join(f"{v:g}" for v in up)},
        {"series": f'lanes_lane_width{{{LABELS}, pool="p"}}', "values": " ".join(width)},
    ], [
        {"eval_time": "1m", "alertname": "LanesLaneMetricsUnread", "exp_alerts": []},
        # Down since 2m: pending for its two minutes, firing from 4m.
        {"eval_time": "3m", "alertname": "LanesLaneMetricsUnread", "exp_alerts": []},
        {"eval_time": "5m", "alertname": "LanesLaneMetricsUnread", "exp_alerts": [{
            "exp_labels": {"job": "lanes-api", "instance": "api:8080", "severity": "critical"},
            "exp_annotations": {"summary": "api:8080 cannot read the lanes from Redis or the catalog: "
                                           "lane alerts are blind (lanes redis status)"},
        }]},
        {"eval_time": "5m", "alertname": "LanesLaneMetricsAbsent", "exp_alerts": []},
    ])
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_no_process_exporting_lane_metrics_at_all_fires_too(tmp_path):
    ran = promtool_test(tmp_path, [
        {"series": 'up{job="lanes-api", instance="api:8080"}', "values": "1x15"},
    ], [
        {"eval_time": "5m", "alertname": "LanesLaneMetricsAbsent", "exp_alerts": []},
        {"eval_time": "12m", "alertname": "LanesLaneMetricsAbsent", "exp_alerts": [{
            "exp_labels": {"severity": "warning"},
            "exp_annotations": {"summary": "No Lanes process exports lane metrics: every lane alert is blind"},
        }]},
    ])
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_dropped_events_and_a_possibly_lost_hand_back_alert(tmp_path):
    ran = promtool_test(tmp_path, [
        {"series": f"lanes_events_dropped_total{{{LABELS}}}", "values": "0 0 0 40 40 40"},
        {"series": f'lanes_handback_possibly_lost_total{{{LABELS}, reason="reply_unread"}}',
         "values": "0 0 0 1 1 1"},
    ], [
        {"eval_time": "2m", "alertname": "LanesEventsDropped", "exp_alerts": []},
        {"eval_time": "4m", "alertname": "LanesEventsDropped", "exp_alerts": [{
            "exp_labels": {"job": "lanes-api", "instance": "api:8080", "severity": "info"},
            "exp_annotations": {"summary": "api:8080 dropped 40 routing event(s): Redis could not take them"}}]},
        {"eval_time": "2m", "alertname": "LanesHandbackMayHaveLost", "exp_alerts": []},
        {"eval_time": "4m", "alertname": "LanesHandbackMayHaveLost", "exp_alerts": [{
            "exp_labels": {"job": "lanes-api", "instance": "api:8080", "severity": "warning"},
            "exp_annotations": {"summary": "A shutdown hand-back on api:8080 may have lost a message: see its log"}}]},
    ])
    assert ran.returncode == 0, ran.stdout + ran.stderr

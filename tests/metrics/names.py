"""Which metric names an exposition offers, and which ones the stack's
dashboard and alert rules use (shared by the deploy and end-to-end tests)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy" / "grafana" / "dashboards" / "lanes.json"
RULES = ROOT / "deploy" / "prometheus" / "rules" / "lanes.yml"

# The series a family of each type offers to a query, even before it has a sample.
SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
    "gauge": ("",),
}
LANES_NAME = re.compile(r"\blanes_[a-z0-9_]+")


def exposed(text: str) -> set[str]:
    """Every series name ``text`` (the exposition format) offers, parsed with prometheus_client."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.update(sample.name for sample in family.samples)
        names.update(family.name + suffix for suffix in SUFFIXES.get(family.type, ("",)))
    return names


def dashboard_exprs() -> list[str]:
    board = json.loads(DASHBOARD.read_text())
    exprs = [target["expr"] for panel in board["panels"] for target in panel.get("targets", [])]
    exprs += [var["definition"] for var in board.get("templating", {}).get("list", []) if var.get("definition")]
    return exprs


def rule_exprs() -> list[str]:
    rules = yaml.safe_load(RULES.read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def used_names() -> set[str]:
    """Every lanes_* series a dashboard panel or an alert rule names."""
    return {name for expr in dashboard_exprs() + rule_exprs() for name in LANES_NAME.findall(expr)}

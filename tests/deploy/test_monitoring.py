"""What an SRE gets from the chart: the alerts (unit-tested with promtool), the dashboard, and series
that exist from the first scrape.

The alerts and the dashboard are checked as the chart renders them, against the metric names the
publisher's and the chain keeper's registries expose (read in-process: the registries the two
programs serve at /metrics). promtool comes from Debian's prometheus package (scripts/setup.sh);
without it these tests fail and say so, they are never skipped.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml

from chartlib import CHART, by_kind, one, render
from deploylib import REPO

ALERT_TESTS = Path(__file__).parent / "alerts" / "netclaim.rules.test.yaml"
NAME = re.compile(r"\b((?:netclaim|process)_[a-zA-Z0-9_]+)\b")


def promtool() -> str:
    found = os.environ.get("PROMTOOL") or shutil.which("promtool")
    assert found, "promtool not found: it comes with Debian's prometheus package, which scripts/setup.sh installs"
    return found


def rendered_rules() -> dict[str, Any]:
    docs = render("metrics.prometheusRule.enabled=true")
    return {"groups": one(docs, "PrometheusRule")["spec"]["groups"]}


def rendered_dashboard() -> dict[str, Any]:
    docs = render("metrics.dashboard.enabled=true")
    [cm] = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    return json.loads(cm["data"]["netclaim.json"])


def dashboard_exprs(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def exposed_names() -> set[str]:
    """Every sample name the publisher's and the keeper's registries can expose, by family type."""
    from publisher.keeper.guard import KeeperMetrics
    from publisher.observe.metrics import Metrics

    suffixes = {"counter": ("_total",), "gauge": ("",), "histogram": ("_bucket", "_sum", "_count"),
                "summary": ("_sum", "_count", ""), "info": ("_info",)}
    names: set[str] = set()
    for registry in (Metrics().registry, KeeperMetrics().registry):
        for family in registry.collect():
            names.update(family.name + s for s in suffixes[family.type])
    return names


def test_the_rendered_alerts_pass_their_promtool_unit_tests(tmp_path: Path) -> None:
    (tmp_path / "netclaim.rules.yaml").write_text(yaml.safe_dump(rendered_rules()))
    shutil.copy(ALERT_TESTS, tmp_path / ALERT_TESTS.name)
    check = subprocess.run([promtool(), "check", "rules", "netclaim.rules.yaml"], cwd=tmp_path,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr
    proc = subprocess.run([promtool(), "test", "rules", ALERT_TESTS.name], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tested = set(re.findall(r"alertname: (\w+)", ALERT_TESTS.read_text()))
    alerts = {r["alert"] for g in rendered_rules()["groups"] for r in g["rules"]}
    assert alerts == tested, f"alerts without a promtool test: {alerts - tested}"


def test_every_alert_names_what_to_check_and_takes_the_site_labels() -> None:
    docs = render("metrics.prometheusRule.enabled=true", "metrics.prometheusRule.labels.release=kps",
                  "metrics.prometheusRule.alertLabels.team=net")
    rule = one(docs, "PrometheusRule")
    assert rule["metadata"]["labels"]["release"] == "kps"
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            assert r["labels"]["team"] == "net" and r["labels"]["severity"] in ("warning", "critical"), r
            assert r["annotations"]["summary"], r
            assert "docs/troubleshooting.md" in r["annotations"]["description"], r["alert"]
    sections = set(re.findall(r"^##+ (.+)$", (REPO / "docs" / "troubleshooting.md").read_text(), re.M))
    for group in rule["spec"]["groups"]:
        for r in group["rules"]:
            named = set(re.findall(r'docs/troubleshooting\.md "([^"]+)"', r["annotations"]["description"]))
            named |= set(re.findall(r'and "([^"]+)"', r["annotations"]["description"]))
            assert named and named <= sections, (r["alert"], named - sections)


def test_alerts_and_dashboard_are_rendered_only_when_enabled() -> None:
    default = render()
    assert not by_kind(default, "PrometheusRule")
    assert not [d for d in by_kind(default, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    docs = render("metrics.dashboard.enabled=true", "metrics.dashboard.namespace=monitoring",
                  "metrics.dashboard.annotations.grafana_folder=Network")
    [cm] = [d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-dashboard")]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "monitoring"
    assert cm["metadata"]["annotations"] == {"grafana_folder": "Network"}
    shipped = json.loads((CHART / "dashboards" / "netclaim.json").read_text())
    assert json.loads(cm["data"]["netclaim.json"]) == shipped


def test_every_metric_the_alerts_and_the_dashboard_name_is_exposed(tmp_path: Path) -> None:
    exposed = exposed_names()
    dashboard = rendered_dashboard()
    exprs = dashboard_exprs(dashboard)
    alerts = [r["expr"] for g in rendered_rules()["groups"] for r in g["rules"]]
    named = {n for e in exprs + alerts for n in NAME.findall(e)}
    assert not named - exposed, f"named but never exposed: {sorted(named - exposed)}"
    # Every panel has a query and the queries parse (promtool reads them as recording rules).
    assert all(p.get("targets") for p in dashboard["panels"] if p["type"] != "row")
    wrapped = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": e.replace("$node", ".*")} for i, e in enumerate(exprs)]}]}
    (tmp_path / "dashboard.rules.yaml").write_text(yaml.safe_dump(wrapped))
    proc = subprocess.run([promtool(), "check", "rules", "dashboard.rules.yaml"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # What the alerts are about has a panel too.
    for name in ("netclaim_pods_unchained", "netclaim_devices_unchained_reported_total", "netclaim_chain_contested",
                 "netclaim_spool_depth", "netclaim_apply_errors_total", "netclaim_oldest_pending_event_age_seconds",
                 "netclaim_api_unauthorized_consecutive", "netclaim_ready", "netclaim_api_request_duration_seconds_bucket"):
        assert any(name in e for e in exprs), name


def _literal_labels() -> dict[str, set[str]]:
    """Metric attribute -> the label values the code counts as literals (`.labels("x")`, and the
    reasons handed to the helpers that count them)."""
    found: dict[str, set[str]] = {}
    for path in (REPO / "publisher").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            args = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            owner = node.func.value
            if node.func.attr == "labels" and isinstance(owner, ast.Attribute) and args:
                found.setdefault(owner.attr, set()).add(args[0])
            elif node.func.attr == "_fail" and len(node.args) > 2 and isinstance(node.args[2], ast.Constant):
                found.setdefault("events_failed", set()).add(node.args[2].value)
            elif node.func.attr == "ignored" and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                found.setdefault("events_ignored", set()).add(node.args[1].value)
            elif node.func.attr == "count" and path.name == "events.py" and args:
                found.setdefault("k8s_events", set()).add(args[0])
    return found


def test_labelled_counters_start_at_zero_for_every_value_the_code_counts() -> None:
    from prometheus_client import Counter

    from publisher.observe.metrics import Metrics

    metrics = Metrics()
    literal = _literal_labels()
    assert {"events_rejected", "events_failed", "events_ignored", "k8s_events"} <= set(literal), literal
    for attr, values in literal.items():
        counter = getattr(metrics, attr, None)
        if not isinstance(counter, Counter):
            continue  # a gauge, or a keeper series (per conflist)
        present = {s.labels[counter._labelnames[0]] for f in counter.collect() for s in f.samples}
        assert values <= present, f"{attr}: counted but not at 0 from the start: {values - present}"
    for attr in ("events_received", "events_acked", "events_rejected", "events_failed", "events_ignored",
                 "drift_repaired", "api_purpose", "k8s_events", "interface_changes", "apply_errors"):
        samples = [s for f in getattr(metrics, attr).collect() for s in f.samples]
        assert samples and all(s.value == 0 for s in samples), attr

"""deploy/prometheus: promtool checks and unit tests, alert hygiene, and names that match what we export."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from prometheus_client import CollectorRegistry

from foldline.metrics import ArchiverMetrics, DispatcherMetrics, LoopMetrics, ProjectorMetrics, ProviderMetrics

from .conftest import REPO, DeployTools, run

RULES = REPO / "deploy" / "prometheus" / "rules"
RULE_TESTS = REPO / "deploy" / "prometheus" / "tests"
RUNBOOKS = REPO / "docs" / "RUNBOOKS.md"
METRICS_DOC = REPO / "docs" / "METRICS.md"
DASHBOARD = REPO / "deploy" / "grafana" / "foldline.json"
SEVERITIES = {"critical", "warning"}


def rule_files() -> list[Path]:
    files = sorted(RULES.glob("*.yml"))
    assert files, f"no rule files in {RULES}"
    return files


def alerts() -> list[dict[str, Any]]:
    return [
        r for f in rule_files() for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"] if "alert" in r
    ]


def families() -> dict[str, str]:
    """Every metric family a foldline process can export: name -> type."""
    registry = CollectorRegistry()
    LoopMetrics(registry)
    ProviderMetrics(registry)
    DispatcherMetrics(registry)
    ProjectorMetrics(registry)
    ArchiverMetrics(registry)
    return {fam.name: fam.type for fam in registry.collect()}


def exported_names() -> set[str]:
    """The sample names those families produce."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    return {name + suffix for name, kind in families().items() for suffix in suffixes[kind]}


def test_promtool_check_rules(deploy_tools: DeployTools) -> None:
    done = run(deploy_tools.promtool, "check", "rules", *rule_files())
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_rule_unit_tests(deploy_tools: DeployTools) -> None:
    tests = sorted(RULE_TESTS.glob("*.yml"))
    assert tests
    done = run(deploy_tools.promtool, "test", "rules", *tests)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAILED" not in done.stdout + done.stderr


def test_every_alert_has_for_severity_summary_and_a_runbook_section() -> None:
    headings = set(re.findall(r"^## (\w+)$", RUNBOOKS.read_text(), flags=re.M))
    found = alerts()
    assert len(found) >= 6
    for a in found:
        name = a["alert"]
        assert re.fullmatch(r"\d+[smh]", str(a.get("for", ""))), f"{name}: needs a `for` duration"
        assert a["labels"]["severity"] in SEVERITIES, name
        assert a["annotations"]["summary"].strip(), name
        assert a["annotations"]["runbook_url"] == f"docs/RUNBOOKS.md#{name.lower()}", name
        assert name in headings, f"{name}: no '## {name}' section in docs/RUNBOOKS.md"


def test_every_alert_fires_in_a_unit_test_and_the_drop_alert_also_stays_silent() -> None:
    fired: set[str] = set()
    silent: set[str] = set()
    for f in RULE_TESTS.glob("*.yml"):
        for case in yaml.safe_load(f.read_text())["tests"]:
            for check in case.get("alert_rule_test", []):
                (fired if check.get("exp_alerts") else silent).add(check["alertname"])
    names = {a["alert"] for a in alerts()}
    assert names <= fired, f"alerts never shown firing: {sorted(names - fired)}"
    assert "FoldlineUnexplainedCacheReadDrop" in silent


def _referenced(text: str) -> set[str]:
    return set(re.findall(r"\b(foldline_[a-z0-9_]+)", text))


def test_rules_dashboard_and_docs_name_only_metrics_we_export() -> None:
    samples = exported_names()
    assert "foldline_cache_read_drops_total" in samples
    assert "foldline_projector_apply_duration_seconds_bucket" in samples
    used = set().union(*(_referenced(f.read_text()) for f in rule_files()))
    used |= _referenced(DASHBOARD.read_text())
    assert not used - samples, f"not exported by foldline.metrics: {sorted(used - samples)}"
    json.loads(DASHBOARD.read_text())  # valid JSON


def test_dashboard_queries_are_valid_promql(deploy_tools: DeployTools, tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    exprs += [a["expr"] for a in dashboard["annotations"]["list"]]
    assert len(exprs) >= 20
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query{i}", "expr": e.replace("$__rate_interval", "2m")}
                    for i, e in enumerate(exprs)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard.rules.yml"
    path.write_text(yaml.safe_dump(rules))
    done = run(deploy_tools.promtool, "check", "rules", path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_metrics_doc_lists_every_exported_metric() -> None:
    doc = METRICS_DOC.read_text()
    missing = [
        name
        for name, kind in sorted(families().items())
        if not name.startswith("process_") and f"`{name + '_total' if kind == 'counter' else name}`" not in doc
    ]
    assert not missing, f"docs/METRICS.md does not list: {missing}"

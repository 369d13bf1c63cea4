"""The chart's Grafana dashboard: written by Grafana's own Foundation SDK (hack/dashboard.py), so
every field is one of Grafana's dashboard schema; each panel's query parses as PromQL (promtool)
and reads only series the gateway's components export; the chart ships it, off by default, in a
ConfigMap that Grafana's dashboard sidecar discovers.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard
from prometheus_client import CollectorRegistry

from .test_chart import CHART, HelmRunner, helm, parse_render
from .test_monitoring import SCRAPE_LABELS, labels_named, promtool

__all__ = ["helm", "promtool"]  # the fixtures, imported for this module's tests

# promtool's first build (its modules downloaded, on a cold machine) takes minutes, and this
# module may be the first to ask for it: only the tests are timed.
pytestmark = pytest.mark.timeout(60, func_only=True)

REPO = CHART.parents[1]
DASHBOARD = CHART / "dashboards" / "dra-gateway.json"
# The rows operators look for (issue: admission, translation, allocation latency and queue,
# quotas and cohorts, preemptions, groups, cards and shares per node, health).
ROWS = ["Admission", "Translation", "Allocation", "Quotas and cohorts",
        "Preemption, groups and defragmentation", "Cards and shares per node", "Health"]


def _board() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def _queries(board: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, PromQL) of every panel's every target."""
    return [(panel["title"], target["expr"]) for panel in board["panels"]
            for target in panel.get("targets") or ()]


def test_the_file_is_what_grafanas_sdk_builds() -> None:
    result = subprocess.run([sys.executable, str(REPO / "hack" / "dashboard.py"), "--check"],
                            capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stderr


def test_nothing_in_it_is_outside_grafanas_dashboard_schema() -> None:
    """The SDK's model of a dashboard keeps only the schema's fields: a field it does not know
    (a typo, a field of another Grafana) is lost on the way through, and the two differ."""
    board = _board()
    again = json.loads(json.dumps(Dashboard.from_json(board), cls=JSONEncoder))
    assert again == board


def test_it_has_the_rows_operators_look_for_and_unique_panel_ids() -> None:
    board = _board()
    rows = [p["title"] for p in board["panels"] if p["type"] == "row"]
    assert rows == ROWS
    ids = [p["id"] for p in board["panels"]]
    assert len(ids) == len(set(ids))
    assert {v["name"] for v in board["templating"]["list"]} == {"datasource", "node"}
    assert all(q for _, q in _queries(board))


def _exported_series() -> set[str]:
    """Every series name the webhook's, the allocator's and the node plugin's metrics export."""
    from dra_gateway.allocator.metrics import Metrics as AllocatorMetrics
    from dra_gateway.node_plugin.metrics import Metrics as PluginMetrics
    from dra_gateway.webhook.metrics import Metrics as WebhookMetrics

    registries: list[CollectorRegistry] = [
        WebhookMetrics().registry, AllocatorMetrics().registry, PluginMetrics().registry]
    suffixes = {"counter": ("_total",), "gauge": ("",),
                "histogram": ("_bucket", "_sum", "_count")}
    return {family.name + suffix for registry in registries for family in registry.collect()
            for suffix in suffixes.get(family.type, ("",))}


def test_every_query_reads_series_the_gateway_exports() -> None:
    exported = _exported_series()
    for title, query in _queries(_board()):
        used = set(re.findall(r"\bdra_gateway_[a-z_]+", query))
        assert used, (title, query)
        assert used <= exported, (title, sorted(used - exported))


def test_no_panel_groups_by_or_names_a_label_the_scrape_sets() -> None:
    """`namespace`, `pod`, `endpoint`... of a scraped series are the gateway pod's: a panel by
    one of them shows the gateway's pods where it promised tenants' quotas or webhook endpoints
    (the metrics say those as `quota_namespace` and `webhook_endpoint`)."""
    board = _board()
    for panel in board["panels"]:
        for target in panel.get("targets") or ():
            text = f"{target['expr']} {target.get('legendFormat', '')}"
            assert not labels_named(text) & SCRAPE_LABELS, (panel["title"], text)


def test_every_query_parses_as_promql(promtool: Path, tmp_path: Path) -> None:
    """Each query as a recording rule, with Grafana's variables given values:
    `promtool check rules` parses them all."""
    rules = [{"record": f"dashboard:query_{index}",
              "expr": query.replace("$__rate_interval", "5m").replace("$node", ".*")}
             for index, (_, query) in enumerate(_queries(_board()))]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run([str(promtool), "check", "rules", str(path)], capture_output=True,
                            text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_chart_ships_it_for_grafanas_sidecar_when_asked(helm: HelmRunner) -> None:
    result = helm.template({})
    assert result.returncode == 0, result.stderr
    assert not [r for r in parse_render(result.stdout) if r.source == "dashboard.yaml"]
    result = helm.template({"monitoring": {"dashboard": {
        "enabled": True, "annotations": {"grafana_folder": "GPU"}}}})
    assert result.returncode == 0, result.stderr
    [config_map] = [r.obj for r in parse_render(result.stdout) if r.source == "dashboard.yaml"]
    assert config_map["kind"] == "ConfigMap"
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"grafana_folder": "GPU"}
    assert json.loads(config_map["data"]["dra-gateway.json"]) == _board()


def test_a_label_that_is_not_a_string_is_refused_by_the_values_schema(
        helm: HelmRunner) -> None:
    result = helm.template({"monitoring": {"dashboard": {
        "enabled": True, "labels": {"grafana_dashboard": 1}}}})
    assert result.returncode != 0
    assert "/monitoring/dashboard/labels/grafana_dashboard" in result.stderr

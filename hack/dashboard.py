"""Write the chart's Grafana dashboard (helm/dra-gateway/dashboards/dra-gateway.json) with
Grafana's own Foundation SDK, whose builders and models are generated from Grafana's dashboard
schema: every field the file holds is one the schema has.

    .venv/bin/python hack/dashboard.py [--check]

--check writes nothing and fails when the file differs from what this script builds (the test
suite runs it). Panels read only the gateway's own metrics, as its components export them; the
dashboard's `datasource` variable picks the Prometheus, `node` narrows the node plugin's panels.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import common, dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.common import (
    GraphDrawStyle,
    LegendDisplayMode,
    LegendPlacement,
    TooltipDisplayMode,
)
from grafana_foundation_sdk.models.dashboard import DataSourceRef

OUT = Path(__file__).resolve().parents[1] / "helm" / "dra-gateway" / "dashboards" / \
    "dra-gateway.json"
UID = "dra-gateway"
DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")
RATE = "$__rate_interval"
NODE = 'node=~"$node"'
# A GPUQuota's labels: its namespace is `quota_namespace`, as the allocator exports it (the
# scraped pod's own `namespace` is the gateway's).
QUOTA = "quota_namespace, quota, resource"


@dataclass(frozen=True)
class Graph:
    """One panel: a title, what it shows, and its queries (PromQL, legend)."""

    title: str
    description: str
    queries: tuple[tuple[str, str], ...]
    unit: str = "short"
    kind: str = "timeseries"  # or "stat"


ROWS: tuple[tuple[str, tuple[Graph, ...]], ...] = (
    ("Admission", (
        Graph("Reviews by outcome", "AdmissionReviews the webhook answered, per second.",
              ((f"sum by (webhook_endpoint, outcome) (rate("
                f"dra_gateway_webhook_reviews_total[{RATE}]))",
                "{{webhook_endpoint}} {{outcome}}"),), "reqps"),
        Graph("Answer time, 99th percentile", "How long the webhook took to answer the API "
              "server (its timeout is 10 s; the alert fires above monitoring.alerts."
              "webhookLatencySeconds).",
              ((f"histogram_quantile(0.99, sum by (le, webhook_endpoint) (rate("
                f"dra_gateway_webhook_request_duration_seconds_bucket[{RATE}])))",
                "{{webhook_endpoint}}"),), "s"),
        Graph("Refusals and errors", "Pods refused (by reason), bad requests and internal "
              "errors, per second.",
              ((f"sum by (reason) (rate(dra_gateway_webhook_refusals_total[{RATE}]))",
                "refused: {{reason}}"),
               (f"sum(rate(dra_gateway_webhook_internal_errors_total[{RATE}]))",
                "internal errors"),
               (f"sum(rate(dra_gateway_webhook_bad_requests_total[{RATE}]))",
                "bad requests")), "reqps"),
    )),
    ("Translation", (
        Graph("Translations by rule", "Legacy GPU requests turned into DRA claims, per rule.",
              ((f"sum by (rule) (rate(dra_gateway_webhook_translations_total[{RATE}]))",
                "{{rule}}"),), "ops"),
        Graph("Rules in force", "Translation rules the webhook holds (built-in and the "
              "administrator's).", (("max(dra_gateway_webhook_rules_loaded)", "rules"),),
              kind="stat"),
        Graph("Rule reloads", "Reloads of the rules ConfigMaps, and those that failed (the "
              "previous rules stay in force).",
              ((f"sum by (source) (increase(dra_gateway_webhook_rule_reloads_total[{RATE}]))",
                "reloaded: {{source}}"),
               (f"sum by (source) (increase("
                f"dra_gateway_webhook_rule_reload_failures_total[{RATE}]))",
                "failed: {{source}}")), "short"),
    )),
    ("Allocation", (
        Graph("Leader", "Allocator replicas holding the Lease (exactly one should).",
              (("sum(dra_gateway_allocator_leader)", "leaders"),), kind="stat"),
        Graph("Work queue and waiting pods", "Keys in the allocator's queue, and gated pods "
              "it could not place yet, by reason.",
              (("sum(dra_gateway_allocator_queue_depth)", "queue"),
               ("max by (reason) (dra_gateway_allocator_pending_pods)", "waiting: {{reason}}")),
              "short"),
        Graph("Planning time, 99th percentile", "Time to plan one pod's claims.",
              ((f"histogram_quantile(0.99, sum by (le) (rate("
                f"dra_gateway_allocator_plan_seconds_bucket[{RATE}])))", "p99"),), "s"),
        Graph("Allocations", "Pods and claims allocated, claims released, failed plans and "
              "write conflicts, per second.",
              ((f"sum(rate(dra_gateway_allocator_pods_allocated_total[{RATE}]))", "pods"),
               (f"sum(rate(dra_gateway_allocator_claims_allocated_total[{RATE}]))", "claims"),
               (f"sum(rate(dra_gateway_allocator_claims_released_total[{RATE}]))", "released"),
               (f"sum(rate(dra_gateway_allocator_allocation_failures_total[{RATE}]))",
                "no node"),
               (f"sum(rate(dra_gateway_allocator_conflicts_total[{RATE}]))", "conflicts")),
              "ops"),
    )),
    ("Quotas and cohorts", (
        Graph("Quota used of hard", "Each GPUQuota's usage as a share of its spec.hard.",
              ((f"max by ({QUOTA}) (dra_gateway_allocator_quota_used) / "
                f"max by ({QUOTA}) (dra_gateway_allocator_quota_hard > 0)",
                "{{quota_namespace}}/{{quota}} {{resource}}"),), "percentunit"),
        Graph("Borrowed from the cohort", "Usage past spec.min, lent by the quota's cohort.",
              ((f"max by ({QUOTA}) (dra_gateway_allocator_quota_borrowed)",
                "{{quota_namespace}}/{{quota}} {{resource}}"),), "short"),
    )),
    ("Preemption, groups and defragmentation", (
        Graph("Preemptions", "Pods of lower priority evicted for waiting pods (or refused by "
              "a PodDisruptionBudget), per result.",
              ((f"sum by (result) (increase(dra_gateway_allocator_preemptions_total[{RATE}]))",
                "{{result}}"),), "short"),
        Graph("Pod groups", "All-or-nothing plans of pod groups, by the convention that "
              "sized them and result: placed together, or none placed (they do not all fit).",
              ((f"sum by (source, result) (increase("
                f"dra_gateway_allocator_group_plans_total[{RATE}]))", "{{source}} {{result}}"),),
              "short"),
        Graph("Defragmentation", "Pods the defrag moved, by result, and waiting pods placed "
              "thanks to it.",
              ((f"sum by (result) (increase(dra_gateway_allocator_defrag_moves_total[{RATE}]))",
                "moved: {{result}}"),
               (f"sum(increase(dra_gateway_allocator_defrag_pods_helped_total[{RATE}]))",
                "placed after a move")), "short"),
    )),
    ("Cards and shares per node", (
        Graph("Published devices", "Devices each node plugin publishes in its ResourceSlices.",
              ((f"max by (node) (dra_gateway_node_plugin_published_devices{{{NODE}}})",
                "{{node}}"),), "short"),
        Graph("Claims prepared", "NodePrepareResources and NodeUnprepareResources the kubelet "
              "called, per result.",
              ((f"sum by (node, result) (rate("
                f"dra_gateway_node_plugin_prepare_claims_total{{{NODE}}}[{RATE}]))",
                "prepare {{node}} {{result}}"),
               (f"sum by (node, result) (rate("
                f"dra_gateway_node_plugin_unprepare_claims_total{{{NODE}}}[{RATE}]))",
                "unprepare {{node}} {{result}}")), "ops"),
        Graph("Registered with the kubelet", "1 while the node's kubelet has registered the "
              "plugin.",
              ((f"min by (node) (dra_gateway_node_plugin_registered{{{NODE}}})", "{{node}}"),),
              "short"),
        Graph("Legacy coexistence", "Cards a legacy GPU device plugin holds, and devices "
              "withheld from DRA for it.",
              ((f"max by (node) (dra_gateway_node_plugin_legacy_held_cards{{{NODE}}})",
                "held {{node}}"),
               (f"max by (node) (dra_gateway_node_plugin_legacy_withheld_devices{{{NODE}}})",
                "withheld {{node}}")), "short"),
    )),
    ("Health", (
        Graph("Unhealthy devices", "Devices marked by a fault (tainted or withheld).",
              ((f"max by (node) (dra_gateway_node_plugin_unhealthy_devices{{{NODE}}})",
                "{{node}}"),), "short"),
        Graph("XID events and recoveries", "XIDs NVML (or the fault file) reported, by code, "
              "and devices that recovered.",
              ((f"sum by (node, xid) (increase("
                f"dra_gateway_node_plugin_xid_events_total{{{NODE}}}[{RATE}]))",
                "{{node}} xid {{xid}}"),
               (f"sum by (node) (increase("
                f"dra_gateway_node_plugin_device_recoveries_total{{{NODE}}}[{RATE}]))",
                "{{node}} recovered")), "short"),
        Graph("Pods evicted from failed devices", "Pods the allocator evicted from devices "
              "withheld for a fatal fault (where the API server keeps no device taints; "
              "kube-controller-manager evicts elsewhere), by result.",
              ((f"sum by (result) (increase("
                f"dra_gateway_allocator_health_evictions_total[{RATE}]))", "{{result}}"),),
              "short"),
    )),
)


def _panel(graph: Graph, panel_id: int) -> timeseries.Panel | stat.Panel:
    panel: timeseries.Panel | stat.Panel
    if graph.kind == "stat":
        panel = stat.Panel().reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]))
    else:
        panel = timeseries.Panel().draw_style(GraphDrawStyle.LINE).fill_opacity(10) \
            .legend(common.VizLegendOptions().show_legend(True)
                    .display_mode(LegendDisplayMode.LIST).placement(LegendPlacement.BOTTOM)) \
            .tooltip(common.VizTooltipOptions().mode(TooltipDisplayMode.MULTI))
    panel = panel.id(panel_id).title(graph.title).description(graph.description).unit(graph.unit) \
        .datasource(DATASOURCE).height(8).span(8 if graph.kind == "timeseries" else 4)
    for index, (expr, legend) in enumerate(graph.queries):
        panel = panel.with_target(prometheus.Dataquery().expr(expr).legend_format(legend)
                                  .ref_id(chr(ord("A") + index)).datasource(DATASOURCE))
    return panel


def build() -> dict[str, object]:
    """The dashboard as Grafana stores it (JSON model)."""
    board = dashboard.Dashboard("DRA gateway").uid(UID).tags(["dra-gateway", "gpu"]) \
        .description("Admission, translation, allocation, quotas, preemption and the GPU "
                     "nodes of dra-gateway").refresh("30s").time("now-1h", "now") \
        .timezone("browser").editable()
    board = board.with_variable(dashboard.DatasourceVariable("datasource").label("Prometheus")
                                .type("prometheus"))
    board = board.with_variable(
        dashboard.QueryVariable("node").label("Node").datasource(DATASOURCE)
        .query("label_values(dra_gateway_node_plugin_registered, node)")
        .include_all(True).all_value(".*").multi(True))
    panel_id = 0
    for title, graphs in ROWS:
        panel_id += 1
        board = board.with_row(dashboard.Row(title).id(panel_id))
        for graph in graphs:
            panel_id += 1
            board = board.with_panel(_panel(graph, panel_id))
    encoded = json.dumps(board.build(), cls=JSONEncoder, sort_keys=True)
    loaded: dict[str, object] = json.loads(encoded)
    return loaded


def render() -> str:
    return json.dumps(build(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="fail when the chart's file differs from what this builds")
    args = parser.parse_args()
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is not what hack/dashboard.py builds: run it and commit the file",
                  file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(OUT)
    return 0


if __name__ == "__main__":
    sys.exit(main())

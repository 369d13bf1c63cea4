"""The chart's monitoring objects: a PodMonitor per component and the alerts of its
PrometheusRule, checked by Prometheus' own promtool (`check rules`, and `test rules` making each
alert fire on the series that should fire it, and stay silent on a healthy gateway). The series
are written as Prometheus stores them once scraped through the PodMonitors, with the labels the
scrape adds, from several replicas where a component runs several.

promtool is built from the module pinned in `tests/helm/promtool/go.mod`.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from gotools import build_go_tool
from prometheus_client.metrics import MetricWrapperBase

from .test_chart import HelmRunner, Rendered, helm, parse_render

__all__ = ["helm"]  # the fixture, imported for this module's tests

# promtool's first build (its modules downloaded) takes minutes: only the tests are timed.
pytestmark = pytest.mark.timeout(60, func_only=True)

PROMTOOL_DIR = Path(__file__).resolve().parent / "promtool"
ON = {"monitoring": {"podMonitors": True, "prometheusRule": True,
                     "labels": {"release": "kube-prometheus-stack"}}}


@pytest.fixture(scope="session")
def promtool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_go_tool(PROMTOOL_DIR, tmp_path_factory.mktemp("promtool"),
                         "Prometheus' promtool", "github.com/prometheus/prometheus/cmd/promtool")


def _render(helm: HelmRunner, values: dict[str, Any]) -> list[Rendered]:
    result = helm.template(values)
    assert result.returncode == 0, result.stderr
    return parse_render(result.stdout)


def test_nothing_of_monitoring_is_rendered_by_default(helm: HelmRunner) -> None:
    kinds = {r.kind for r in _render(helm, {})}
    assert not kinds & {"PodMonitor", "PrometheusRule"}


def test_a_pod_monitor_per_component_scrapes_a_port_its_pods_serve(helm: HelmRunner) -> None:
    rendered = _render(helm, ON)
    monitors = {r.name: r.obj for r in rendered if r.kind == "PodMonitor"}
    workloads = {r.obj["metadata"]["labels"]["app.kubernetes.io/component"]: r.obj
                 for r in rendered if r.kind in ("Deployment", "DaemonSet")}
    assert sorted(m["metadata"]["labels"]["app.kubernetes.io/component"]
                  for m in monitors.values()) == sorted(workloads) == [
        "allocator", "node-plugin", "webhook"]
    for monitor in monitors.values():
        component = monitor["metadata"]["labels"]["app.kubernetes.io/component"]
        assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        pod = workloads[component]["spec"]["template"]
        selector = monitor["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod["metadata"]["labels"].items()
        (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
        ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports") or ()}
        assert endpoint["port"] in ports, (component, ports)
        assert endpoint["path"] == "/metrics"
        assert endpoint["relabelings"] == [
            {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}]


def _rules(helm: HelmRunner, tmp_path: Path) -> Path:
    (rule,) = [r.obj for r in _render(helm, ON) if r.kind == "PrometheusRule"]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    return path


def _promtool(promtool: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(promtool), *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, check=False)


def test_promtool_accepts_the_rules(helm: HelmRunner, promtool: Path, tmp_path: Path) -> None:
    rules = _rules(helm, tmp_path)
    result = _promtool(promtool, "check", "rules", str(rules), cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 9 rules found" in result.stdout


# The labels the Prometheus Operator's scrape job gives every series scraped through a
# PodMonitor (the target's namespace, pod, container, endpoint: the port's name, and job), those
# Prometheus itself adds (job, instance), and `service` of a ServiceMonitor's. A metric's own
# label of one of these names arrives renamed `exported_<name>`.
SCRAPE_LABELS = frozenset({"namespace", "pod", "container", "endpoint", "job", "instance",
                           "service"})
GATEWAY_NAMESPACE = "dra-gateway"
PORTS = {"allocator": "metrics", "webhook": "probes", "node-plugin": "metrics"}


def _scraped(metric: str, component: str, replica: str, **labels: str) -> str:
    """`metric`'s series as Prometheus stores it when scraped from one replica of `component`
    through the chart's PodMonitor: its own `labels`, and those the scrape adds."""
    monitor = f"dra-gateway-{component}"
    pod = f"{monitor}-{replica}"
    added = {"namespace": GATEWAY_NAMESPACE, "pod": pod, "container": component,
             "endpoint": PORTS[component], "job": f"{GATEWAY_NAMESPACE}/{monitor}",
             "instance": f"{pod}:8080", "node": "cpu-1", **labels}
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in sorted(added.items())) + "}"


def _case(name: str, alert: str, at: str, series: list[tuple[str, str]],
          *alerts: tuple[dict[str, str], dict[str, str]]) -> dict[str, Any]:
    """A promtool test: `alert` at `at` on `series` is exactly `alerts` (labels, annotations)."""
    return {"interval": "1m", "name": name,
            "input_series": [{"series": s, "values": v} for s, v in series],
            "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": [
                {"exp_labels": labels, "exp_annotations": annotations}
                for labels, annotations in alerts]}]}


def _fires(alert: str, at: str, series: list[tuple[str, str]], labels: dict[str, str],
           annotations: dict[str, str]) -> dict[str, Any]:
    return _case(alert, alert, at, series, (labels, annotations))


def _quota(metric: str, replica: str, namespace: str, quota: str = "q") -> str:
    return _scraped(f"dra_gateway_allocator_quota_{metric}", "allocator", replica,
                    quota_namespace=namespace, quota=quota, resource="memory")


def _quota_exhausted(namespace: str) -> tuple[dict[str, str], dict[str, str]]:
    return ({"severity": "info", "quota_namespace": namespace, "quota": "q",
             "resource": "memory"},
            {"summary": f"GPUQuota {namespace}/q has used all its memory.",
             "description": f"New GPU pods of namespace {namespace} wait until some of its pods "
                            "end or the quota grows."})


SLOW_DESCRIPTION = ("Slow admission delays every pod creation; the API server times the webhook "
                    "out at its timeoutSeconds.")
ALLOCATOR, WEBHOOK, PLUGIN = "allocator", "webhook", "node-plugin"
CASES = [
    _fires("DraGatewayAllocatorNoLeader", "10m",
           [(_scraped("dra_gateway_allocator_leader", ALLOCATOR, "a"), "0x15"),
            (_scraped("dra_gateway_allocator_leader", ALLOCATOR, "b"), "0x15")],
           {"severity": "critical"},
           {"summary": "No dra-gateway allocator replica holds the Lease.",
            "description": "Gated GPU pods get no devices until an allocator leads again; check "
                           "the allocator pods and their Lease dra-gateway-allocator."}),
    _fires("DraGatewayWebhookErrors", "15m",
           [(_scraped("dra_gateway_webhook_internal_errors_total", WEBHOOK, "a",
                      webhook_endpoint="mutate"), "0+120x20")],
           {"severity": "warning"},
           {"summary": "The dra-gateway webhook answers admission reviews with internal errors.",
            "description": "2 internal errors a second; the webhook's log names each review."}),
    _fires("DraGatewayWebhookSlow", "20m",
           [(_scraped("dra_gateway_webhook_request_duration_seconds_bucket", WEBHOOK, "a",
                      webhook_endpoint="mutate", le=le), values)
            for le, values in (("0.5", "0x30"), ("2.5", "0+60x30"), ("+Inf", "0+60x30"))],
           {"severity": "warning"},
           {"summary": "The dra-gateway webhook's 99th percentile answer takes longer than 1s.",
            "description": SLOW_DESCRIPTION}),
    _fires("DraGatewayPodsGated", "20m",
           [(_scraped("dra_gateway_allocator_pending_pods", ALLOCATOR, "a",
                      reason="QuotaExceeded"), "2x30")],
           {"severity": "warning", "reason": "QuotaExceeded"},
           {"summary": "GPU pods have waited for devices longer than 15m (QuotaExceeded).",
            "description": "2 pod(s) wait; `dra-gateway report` says why each one waits."}),
    _fires("DraGatewayQuotaExhausted", "20m",
           [(_quota("used", "a", "ml"), "80x30"), (_quota("hard", "a", "ml"), "80x30")],
           *_quota_exhausted("ml")),
    _fires("DraGatewayPreemptionBurst", "15m",
           [(_scraped("dra_gateway_allocator_preemptions_total", ALLOCATOR, "a",
                      result="evicted"), "0+2x20")],
           {"severity": "warning"},
           {"summary": "The allocator preempted more than 10 pods in 10 minutes.",
            "description": "High-priority GPU pods are displacing others at a high rate; check "
                           "the PriorityClasses and quotas."}),
    _fires("DraGatewayUnhealthyDevices", "5m",
           [(_scraped("dra_gateway_node_plugin_unhealthy_devices", PLUGIN, "x1", node="gpu-1"),
             "2x10")],
           {"severity": "warning", "node": "gpu-1"},
           {"summary": "2 GPU device(s) of node gpu-1 are out of service.",
            "description": "Their taints (or the Node condition GpuDevicesUnhealthy) say why; "
                           "`dra-gateway report` lists them."}),
    _fires("DraGatewayNodePluginNotRegistered", "10m",
           [(_scraped("dra_gateway_node_plugin_registered", PLUGIN, "x1", node="gpu-1"),
             "0x15")],
           {"severity": "critical", "node": "gpu-1"},
           {"summary": "The kubelet of node gpu-1 has not registered the dra-gateway node "
                       "plugin.",
            "description": "No GPU claim can be prepared there; the node plugin's log and the "
                           "kubelet's say why."}),
    _fires("DraGatewayInvalidClaims", "2m",
           [(_scraped("dra_gateway_allocator_invalid_claims", ALLOCATOR, "a"), "1x5"),
            (_scraped("dra_gateway_allocator_invalid_claims", ALLOCATOR, "b"), "0x5")],
           {"severity": "critical"},
           {"summary": "1 ResourceClaim(s) hold an allocation Kubernetes 1.38 refuses.",
            "description": "kube-scheduler 1.38 stops every DRA pod while one holds a negative "
                           "amount; their Events InvalidAllocation and `dra-gateway report` "
                           "name them."}),
]
HEALTHY = {
    "interval": "1m", "name": "a healthy gateway",
    "input_series": [{"series": series, "values": values} for series, values in (
        (_scraped("dra_gateway_allocator_leader", ALLOCATOR, "a"), "1x40"),
        (_scraped("dra_gateway_allocator_leader", ALLOCATOR, "b"), "0x40"),
        (_scraped("dra_gateway_webhook_internal_errors_total", WEBHOOK, "a",
                  webhook_endpoint="mutate"), "3x40"),
        (_scraped("dra_gateway_allocator_pending_pods", ALLOCATOR, "a", reason="QuotaExceeded"),
         "0x40"),
        (_quota("used", "a", "ml"), "40x40"),
        (_quota("hard", "a", "ml"), "80x40"),
        (_scraped("dra_gateway_node_plugin_unhealthy_devices", PLUGIN, "x1", node="gpu-1"),
         "0x40"),
        (_scraped("dra_gateway_node_plugin_registered", PLUGIN, "x1", node="gpu-1"), "1x40"),
        (_scraped("dra_gateway_allocator_invalid_claims", ALLOCATOR, "a"), "0x40"),
    )],
    "alert_rule_test": [{"eval_time": "30m", "alertname": case["name"], "exp_alerts": []}
                        for case in CASES],
}


def _run_tests(promtool: Path, rules: Path, tests: list[dict[str, Any]]) -> None:
    path = rules.parent / "tests.yaml"
    path.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m",
                                    "tests": tests}))
    result = _promtool(promtool, "test", "rules", path.name, cwd=rules.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_each_alert_fires_on_its_fault_and_none_on_a_healthy_gateway(
        helm: HelmRunner, promtool: Path, tmp_path: Path) -> None:
    rules = _rules(helm, tmp_path)
    assert sorted(c["name"] for c in CASES) == sorted(
        r["alert"] for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"])
    _run_tests(promtool, rules, [*CASES, HEALTHY])


def test_quotas_of_one_name_in_two_namespaces_each_fire_with_their_own_quota_namespace(
        helm: HelmRunner, promtool: Path, tmp_path: Path) -> None:
    """Scraped, every quota series carries the allocator pod's `namespace`: the alert tells the
    quotas apart by `quota_namespace` alone, and names the tenant's namespace."""
    series = [(_quota("used", "a", "ml"), "80x30"), (_quota("hard", "a", "ml"), "80x30"),
              (_quota("used", "a", "vision"), "90x30"), (_quota("hard", "a", "vision"), "80x30"),
              (_quota("used", "a", "web"), "10x30"), (_quota("hard", "a", "web"), "80x30")]
    _run_tests(promtool, _rules(helm, tmp_path), [_case(
        "two namespaces' quotas q", "DraGatewayQuotaExhausted", "20m", series,
        _quota_exhausted("ml"), _quota_exhausted("vision"))])


def test_replicas_reporting_the_same_thing_fire_one_alert_with_its_value_once(
        helm: HelmRunner, promtool: Path, tmp_path: Path) -> None:
    """Two allocators overlapping at a handover both report the leader's gauges, a node's second
    node-plugin pod (a rollout) its devices, and two webhook replicas each their own errors and
    latencies: each alert fires once for what it is about, with the value of that, not per
    replica nor their sum where each reports the whole."""
    pending = "dra_gateway_allocator_pending_pods"
    unhealthy = "dra_gateway_node_plugin_unhealthy_devices"
    errors = "dra_gateway_webhook_internal_errors_total"
    buckets = "dra_gateway_webhook_request_duration_seconds_bucket"
    cases = [
        _case("a handover's two leaders: one alert per quota", "DraGatewayQuotaExhausted", "20m",
              [(_quota(metric, replica, "ml"), "80x30") for metric in ("used", "hard")
               for replica in ("a", "b")],
              _quota_exhausted("ml")),
        _case("a handover's two leaders: the pods waiting counted once", "DraGatewayPodsGated",
              "20m", [(_scraped(pending, ALLOCATOR, r, reason="Unschedulable"), "3x30")
                      for r in ("a", "b")],
              ({"severity": "warning", "reason": "Unschedulable"},
               {"summary": "GPU pods have waited for devices longer than 15m (Unschedulable).",
                "description": "3 pod(s) wait; `dra-gateway report` says why each one waits."})),
        _case("a node plugin rolling: the node's devices counted once",
              "DraGatewayUnhealthyDevices", "5m",
              [(_scraped(unhealthy, PLUGIN, r, node="gpu-1"), "2x10") for r in ("x1", "x2")],
              ({"severity": "warning", "node": "gpu-1"},
               {"summary": "2 GPU device(s) of node gpu-1 are out of service.",
                "description": "Their taints (or the Node condition GpuDevicesUnhealthy) say "
                               "why; `dra-gateway report` lists them."})),
        _case("two webhook replicas' errors: one alert, their sum", "DraGatewayWebhookErrors",
              "15m", [(_scraped(errors, WEBHOOK, r, webhook_endpoint=e), "0+60x20")
                      for r in ("a", "b") for e in ("mutate", "validate")],
              ({"severity": "warning"},
               {"summary": "The dra-gateway webhook answers admission reviews with internal "
                           "errors.",
                "description": "4 internal errors a second; the webhook's log names each "
                               "review."})),
        _case("two webhook replicas slow: one alert", "DraGatewayWebhookSlow", "20m",
              [(_scraped(buckets, WEBHOOK, r, webhook_endpoint="mutate", le=le), values)
               for r in ("a", "b")
               for le, values in (("0.5", "0x30"), ("2.5", "0+60x30"), ("+Inf", "0+60x30"))],
              ({"severity": "warning"},
               {"summary": "The dra-gateway webhook's 99th percentile answer takes longer than "
                           "1s.", "description": SLOW_DESCRIPTION})),
    ]
    _run_tests(promtool, _rules(helm, tmp_path), cases)


def test_a_preemption_burst_counts_pods_evicted_not_attempts_a_budget_refused(
        helm: HelmRunner, promtool: Path, tmp_path: Path) -> None:
    """A preemption a PodDisruptionBudget refuses is tried again at each round, each refusal
    counted: the alert says pods were preempted, so it counts those evicted alone."""
    preemptions = "dra_gateway_allocator_preemptions_total"
    _run_tests(promtool, _rules(helm, tmp_path), [_case(
        "preemptions a budget refused, tried again and again", "DraGatewayPreemptionBurst",
        "15m", [(_scraped(preemptions, ALLOCATOR, "a", result="refused"), "0+5x20"),
                (_scraped(preemptions, ALLOCATOR, "a", result="evicted"), "0+0x20")])])


def test_no_alert_reads_a_label_the_scrape_sets(helm: HelmRunner, tmp_path: Path) -> None:
    """An alert that groups by, matches on or names `namespace` (or `pod`, `endpoint`...) reads
    the scraped pod's, not what the gateway's metric said."""
    groups = yaml.safe_load(_rules(helm, tmp_path).read_text())["groups"]
    for rule in (r for g in groups for r in g["rules"]):
        text = " ".join([rule["expr"], *rule.get("annotations", {}).values()])
        assert not labels_named(text) & SCRAPE_LABELS, (rule["alert"], text)


def labels_named(text: str) -> set[str]:
    """The label names a PromQL expression or its templates read: in `by`, `without`, `on`,
    `ignoring` and `group_left|right` lists, selectors' matchers, `$labels.x` and legends'
    `{{x}}`."""
    found: set[str] = set()
    for listed in re.findall(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)",
                             text):
        found.update(name.strip() for name in listed.split(",") if name.strip())
    found.update(re.findall(r"\b([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)\s*\"", text))
    found.update(re.findall(r"\$labels\.([a-zA-Z_][a-zA-Z0-9_]*)", text))
    found.update(re.findall(r"\{\{\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*\}\}", text))
    return found


def _label_names(metrics: object) -> dict[str, tuple[str, ...]]:
    """Each metric of a component's `Metrics` and its label names (prometheus_client shows them
    nowhere public for a labelled metric that has no child yet)."""
    return {metric._name: tuple(metric._labelnames) for metric in vars(metrics).values()
            if isinstance(metric, MetricWrapperBase)}


def test_no_gateway_metric_has_a_label_the_scrape_sets(helm: HelmRunner) -> None:
    """Scraped through the chart's PodMonitors, a metric's own `namespace` (or `pod`,
    `endpoint`, or `node`, which the PodMonitors set from the pod's node) would be renamed
    `exported_namespace` and the scraped pod's put in its place: a GPUQuota's tenant namespace
    read as the gateway's."""
    from dra_gateway.allocator.metrics import Metrics as AllocatorMetrics
    from dra_gateway.node_plugin.metrics import Metrics as PluginMetrics
    from dra_gateway.webhook.metrics import Metrics as WebhookMetrics

    relabeled = {r["targetLabel"] for m in _render(helm, ON) if m.kind == "PodMonitor"
                 for e in m.obj["spec"]["podMetricsEndpoints"] for r in e["relabelings"]}
    assert relabeled == {"node"}
    metrics = {**_label_names(AllocatorMetrics()), **_label_names(PluginMetrics()),
               **_label_names(WebhookMetrics())}
    assert len(metrics) > 40
    assert metrics["dra_gateway_allocator_quota_used"] == ("quota_namespace", "quota", "resource")
    clashes = {name: sorted(set(labels) & (SCRAPE_LABELS | relabeled))
               for name, labels in metrics.items() if set(labels) & (SCRAPE_LABELS | relabeled)}
    assert clashes == {}

"""The chart's monitoring objects: a PodMonitor per component and the alerts of its
PrometheusRule, checked by Prometheus' own promtool (`check rules`, and `test rules` making each
alert fire on the series that should fire it, and stay silent on a healthy gateway).

promtool is built from the module pinned in `tests/helm/promtool/go.mod`.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from gotools import build_go_tool

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


def _fires(alert: str, at: str, series: list[tuple[str, str]], labels: dict[str, str],
           annotations: dict[str, str]) -> dict[str, Any]:
    return {"interval": "1m", "name": alert,
            "input_series": [{"series": s, "values": v} for s, v in series],
            "alert_rule_test": [{"eval_time": at, "alertname": alert, "exp_alerts": [
                {"exp_labels": labels, "exp_annotations": annotations}]}]}


SLOW_DESCRIPTION = ("Slow admission delays every pod creation; the API server times the webhook "
                    "out at its timeoutSeconds.")
CASES = [
    _fires("DraGatewayAllocatorNoLeader", "10m",
           [('dra_gateway_allocator_leader{pod="allocator-a"}', "0x15"),
            ('dra_gateway_allocator_leader{pod="allocator-b"}', "0x15")],
           {"severity": "critical"},
           {"summary": "No dra-gateway allocator replica holds the Lease.",
            "description": "Gated GPU pods get no devices until an allocator leads again; check "
                           "the allocator pods and their Lease dra-gateway-allocator."}),
    _fires("DraGatewayWebhookErrors", "15m",
           [('dra_gateway_webhook_internal_errors_total{pod="w"}', "0+120x20")],
           {"severity": "warning"},
           {"summary": "The dra-gateway webhook answers admission reviews with internal errors.",
            "description": "2 internal errors a second; the webhook's log names each review."}),
    _fires("DraGatewayWebhookSlow", "20m",
           [('dra_gateway_webhook_request_duration_seconds_bucket{le="0.5"}', "0x30"),
            ('dra_gateway_webhook_request_duration_seconds_bucket{le="2.5"}', "0+60x30"),
            ('dra_gateway_webhook_request_duration_seconds_bucket{le="+Inf"}', "0+60x30")],
           {"severity": "warning"},
           {"summary": "The dra-gateway webhook's 99th percentile answer takes longer than 1s.",
            "description": SLOW_DESCRIPTION}),
    _fires("DraGatewayPodsGated", "20m",
           [('dra_gateway_allocator_pending_pods{reason="QuotaExceeded",pod="a"}', "2x30")],
           {"severity": "warning", "reason": "QuotaExceeded"},
           {"summary": "GPU pods have waited for devices longer than 15m (QuotaExceeded).",
            "description": "2 pod(s) wait; `dra-gateway report` says why each one waits."}),
    _fires("DraGatewayQuotaExhausted", "20m",
           [('dra_gateway_allocator_quota_used{namespace="ml",quota="q",resource="memory"}',
             "80x30"),
            ('dra_gateway_allocator_quota_hard{namespace="ml",quota="q",resource="memory"}',
             "80x30")],
           {"severity": "info", "namespace": "ml", "quota": "q", "resource": "memory"},
           {"summary": "GPUQuota ml/q has used all its memory.",
            "description": "New GPU pods of that namespace wait until some of its pods end or "
                           "the quota grows."}),
    _fires("DraGatewayPreemptionBurst", "15m",
           [('dra_gateway_allocator_preemptions_total{result="evicted"}', "0+2x20")],
           {"severity": "warning"},
           {"summary": "The allocator preempted more than 10 pods in 10 minutes.",
            "description": "High-priority GPU pods are displacing others at a high rate; check "
                           "the PriorityClasses and quotas."}),
    _fires("DraGatewayUnhealthyDevices", "5m",
           [('dra_gateway_node_plugin_unhealthy_devices{node="gpu-1",pod="np"}', "2x10")],
           {"severity": "warning", "node": "gpu-1"},
           {"summary": "2 GPU device(s) of node gpu-1 are out of service.",
            "description": "Their taints (or the Node condition GpuDevicesUnhealthy) say why; "
                           "`dra-gateway report` lists them."}),
    _fires("DraGatewayNodePluginNotRegistered", "10m",
           [('dra_gateway_node_plugin_registered{node="gpu-1",pod="np"}', "0x15")],
           {"severity": "critical", "node": "gpu-1"},
           {"summary": "The kubelet of node gpu-1 has not registered the dra-gateway node "
                       "plugin.",
            "description": "No GPU claim can be prepared there; the node plugin's log and the "
                           "kubelet's say why."}),
    _fires("DraGatewayInvalidClaims", "2m",
           [('dra_gateway_allocator_invalid_claims{pod="a"}', "1x5")],
           {"severity": "critical"},
           {"summary": "1 ResourceClaim(s) hold an allocation Kubernetes 1.38 refuses.",
            "description": "kube-scheduler 1.38 stops every DRA pod while one holds a negative "
                           "amount; their Events InvalidAllocation and `dra-gateway report` "
                           "name them."}),
]
HEALTHY = {
    "interval": "1m", "name": "a healthy gateway",
    "input_series": [
        {"series": 'dra_gateway_allocator_leader{pod="allocator-a"}', "values": "1x40"},
        {"series": 'dra_gateway_webhook_internal_errors_total{pod="w"}', "values": "3x40"},
        {"series": 'dra_gateway_allocator_pending_pods{reason="QuotaExceeded"}',
         "values": "0x40"},
        {"series": 'dra_gateway_allocator_quota_used{namespace="ml",quota="q",'
                   'resource="memory"}', "values": "40x40"},
        {"series": 'dra_gateway_allocator_quota_hard{namespace="ml",quota="q",'
                   'resource="memory"}', "values": "80x40"},
        {"series": 'dra_gateway_node_plugin_unhealthy_devices{node="gpu-1"}', "values": "0x40"},
        {"series": 'dra_gateway_node_plugin_registered{node="gpu-1"}', "values": "1x40"},
        {"series": 'dra_gateway_allocator_invalid_claims{pod="a"}', "values": "0x40"},
    ],
    "alert_rule_test": [{"eval_time": "30m", "alertname": case["name"], "exp_alerts": []}
                        for case in CASES],
}


def test_each_alert_fires_on_its_fault_and_none_on_a_healthy_gateway(
        helm: HelmRunner, promtool: Path, tmp_path: Path) -> None:
    rules = _rules(helm, tmp_path)
    assert sorted(c["name"] for c in CASES) == sorted(
        r["alert"] for g in yaml.safe_load(rules.read_text())["groups"] for r in g["rules"])
    tests = tmp_path / "tests.yaml"
    tests.write_text(yaml.safe_dump({"rule_files": [rules.name], "evaluation_interval": "1m",
                                     "tests": [*CASES, HEALTHY]}))
    result = _promtool(promtool, "test", "rules", tests.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr

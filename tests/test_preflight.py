"""`dra-gateway preflight`: each check read from an in-memory cluster, both ways, and the
command's output and exit code."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gateway.cli import main
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import Forbidden, Object
from dra_gateway.kube.node_setup import NodeSetup
from dra_gateway.kube.resources import NODES, PODS, SECRETS, ResourceType
from dra_gateway.preflight import checks
from dra_gateway.preflight.checks import Check, judge
from dra_gateway.preflight.reading import CRDS, DAEMON_SETS, encode_release, read_facts
from dra_gateway.preflight.render import table

VALUES = Path(__file__).resolve().parents[1] / "helm" / "dra-gateway" / "values.yaml"
GPU_LABEL = {"nvidia.com/gpu.present": "true"}


def _node(name: str, labels: dict[str, str] | None = None, *, runtime: str = "containerd://2.0.4",
          setup: NodeSetup | None = None, allocatable: dict[str, str] | None = None,
          taints: list[dict[str, str]] | None = None) -> Object:
    status: dict[str, Any] = {"nodeInfo": {"containerRuntimeVersion": runtime},
                              "allocatable": allocatable or {"cpu": "8"}}
    if setup is not None:
        status["conditions"] = [setup.condition("2026-12-01T10:00:00Z")]
    return {"metadata": {"name": name, "labels": labels or {}},
            "spec": {"taints": taints} if taints else {}, "status": status}


SETUP_OK = NodeSetup(cdi_dir="/var/run/cdi", cdi_writable=True,
                     hami_library="/usr/local/vgpu/libvgpu.so", hami_core="present")


def _daemon_set(name: str, namespace: str, *, image: str = "x",
                labels: dict[str, str] | None = None,
                pod_spec: dict[str, Any] | None = None) -> Object:
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "image": image}],
                                           **(pod_spec or {})}}}}


def _release(values: dict[str, Any]) -> Object:
    release = {"name": "dra-gateway", "config": values,
               "chart": {"metadata": {"name": "dra-gateway"},
                         "values": {"monitoring": {"podMonitors": False},
                                    "certificates": {"mode": "helm"}}}}
    return {"metadata": {"name": "sh.helm.release.v1.dra-gateway.v1", "namespace": "dra-gateway",
                         "labels": {"owner": "helm", "status": "deployed", "name": "dra-gateway"}},
            "type": "helm.sh/release.v1", "data": {"release": encode_release(release)}}


async def _cluster(*nodes: Object, cls: type[MemoryCluster] = MemoryCluster,
                   objects: tuple[tuple[ResourceType, Object], ...] = ()) -> MemoryCluster:
    cluster = cls()
    for node in nodes:
        await cluster.create(NODES, node)
    for rt, obj in objects:
        await cluster.create(rt, obj, namespace=obj["metadata"].get("namespace"))
    return cluster


async def _checks(cluster: MemoryCluster) -> dict[str, Check]:
    facts = await read_facts(cluster, namespace=names.GATEWAY_NAMESPACE)
    return {c.name: c for c in judge(facts)}


def _items(check: Check) -> dict[str, tuple[str, str]]:
    return {i.name: (i.severity, i.message) for i in check.items}


# DRA API and version ---------------------------------------------------------------------------

class OldServer(MemoryCluster):
    """A 1.33 API server: DRA in v1beta1 and v1beta2 only."""

    async def server_version(self) -> Object:
        return {"major": "1", "minor": "33", "gitVersion": "v1.33.5"}

    async def served_versions(self) -> dict[str, list[str]]:
        return {"": ["v1"], "resource.k8s.io": ["v1beta2", "v1beta1"]}


class NewerServer(MemoryCluster):
    async def server_version(self) -> Object:
        return {"major": "1", "minor": "39+", "gitVersion": "v1.39.0-alpha.1"}


async def test_dra_v1_and_a_supported_version_are_ok() -> None:
    found = await _checks(await _cluster(_node("gpu-a", GPU_LABEL, setup=SETUP_OK)))
    assert (found["dra-api"].severity, found["dra-api"].summary) == (
        "ok", "resource.k8s.io/v1 is served")
    assert (found["server-version"].severity, found["server-version"].summary) == (
        "ok", "v1.34.0-dra-gateway")


async def test_a_server_without_dra_v1_is_an_error_and_its_features_are_not_probed() -> None:
    found = await _checks(await _cluster(_node("gpu-a", GPU_LABEL), cls=OldServer))
    assert found["dra-api"].severity == "error"
    assert found["dra-api"].summary == ("resource.k8s.io/v1 is not served (served: v1beta2, "
                                        "v1beta1)")
    assert (found["server-version"].severity, found["server-version"].summary) == (
        "error", "v1.33.5 is older than 1.34")
    assert found["feature-gates"].summary == "not probed: DRA v1 is not served"


async def test_a_release_newer_than_the_newest_tested_is_a_warning() -> None:
    found = await _checks(await _cluster(_node("gpu-a", GPU_LABEL), cls=NewerServer))
    assert found["server-version"].severity == "warning"
    assert "newer than 1.38" in found["server-version"].summary


# Feature gates -------------------------------------------------------------------------------

class GatesOff(MemoryCluster):
    """1.34's defaults: the API server drops the fields of its alpha gates."""

    async def create(self, rt: ResourceType, obj: Object, *, namespace: str | None = None,
                     dry_run: bool = False) -> Object:
        made = await super().create(rt, obj, namespace=namespace, dry_run=dry_run)
        spec = made.get("spec") or {}
        spec.pop("sharedCounters", None)
        for device in spec.get("devices") or ():
            device.pop("allowMultipleAllocations", None)
            device.pop("taints", None)
        return made


class NoProbes(MemoryCluster):
    async def create(self, rt: ResourceType, obj: Object, *, namespace: str | None = None,
                     dry_run: bool = False) -> Object:
        if dry_run:
            raise Forbidden("resourceslices is forbidden: User cannot create")
        return await super().create(rt, obj, namespace=namespace, dry_run=dry_run)


async def test_feature_gates_are_detected_on_and_off_as_the_components_detect_them() -> None:
    on = await _checks(await _cluster(_node("gpu-a", GPU_LABEL)))
    assert on["feature-gates"].severity == "info"
    assert on["feature-gates"].summary == ("DRAConsumableCapacity on, DRADeviceTaints on, "
                                           "DRAPartitionableDevices on")
    off = await _checks(await _cluster(_node("gpu-a", GPU_LABEL), cls=GatesOff))
    assert off["feature-gates"].summary == ("DRAConsumableCapacity off, DRADeviceTaints off, "
                                            "DRAPartitionableDevices off")
    assert _items(off["feature-gates"])["DRAConsumableCapacity"] == (
        "info", "off: the allocator records shares of a card itself (1.34, 1.35)")


async def test_refused_probes_leave_the_gates_unknown_with_the_right_needed() -> None:
    found = await _checks(await _cluster(_node("gpu-a", GPU_LABEL), cls=NoProbes))
    gates = found["feature-gates"]
    assert gates.severity == "warning"
    assert _items(gates)["DRADeviceTaints"][1].startswith("unknown (the dry-run probe slice")
    assert "create on resourceslices" in gates.fix


# Where the node plugin runs --------------------------------------------------------------------

def test_the_chart_defaults_preflight_assumes_are_values_yaml() -> None:
    plugin = yaml.safe_load(VALUES.read_text())["nodePlugin"]
    assert plugin["nodeSelector"] == checks.CHART_NODE_SELECTOR
    assert plugin["affinity"] == checks.CHART_AFFINITY
    assert plugin["tolerations"] == list(checks.CHART_TOLERATIONS)


async def test_nodes_are_selected_by_the_chart_defaults_or_told_the_label_they_miss() -> None:
    found = await _checks(await _cluster(
        _node("gpu-a", GPU_LABEL, taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
        _node("gpu-b", {"feature.node.kubernetes.io/pci-10de.present": "true"}),
        _node("gpu-c", {"nvidia.com/gpu.product": "H100"}), _node("cpu-1")))
    check = found["node-plugin-nodes"]
    assert (check.severity, check.summary) == (
        "warning", "2 of 4 node(s) selected (the chart's defaults (not installed))")
    missing = ("missing label nvidia.com/gpu.present=true or "
               "feature.node.kubernetes.io/pci-10de.present=true")
    assert _items(check) == {
        "cpu-1": ("info", f"not selected: {missing}"),
        "gpu-a": ("ok", "selected"), "gpu-b": ("ok", "selected"),
        "gpu-c": ("warning", f"not selected: {missing}; it looks like a GPU node")}


async def test_no_node_selected_is_an_error_naming_the_label_to_set() -> None:
    found = await _checks(await _cluster(_node("cpu-1")))
    check = found["node-plugin-nodes"]
    assert check.severity == "error"
    assert "kubectl label node NODE nvidia.com/gpu.present=true" in check.fix


async def test_an_installed_daemon_sets_placement_wins_over_the_chart_defaults() -> None:
    plugin = _daemon_set("dra-gateway-node-plugin", "dra-gateway", labels={
        "app.kubernetes.io/name": "dra-gateway", "app.kubernetes.io/component": "node-plugin"},
        pod_spec={"nodeSelector": {"pool": "gpu"}})
    found = await _checks(await _cluster(
        _node("gpu-a", GPU_LABEL), _node("gpu-b", {"pool": "gpu"},
                                          taints=[{"key": "team", "value": "ml",
                                                   "effect": "NoSchedule"}]),
        _node("gpu-c", {"pool": "gpu"}), objects=((DAEMON_SETS, plugin),)))
    check = found["node-plugin-nodes"]
    assert check.summary == ("1 of 3 node(s) selected (DaemonSet "
                             "dra-gateway/dra-gateway-node-plugin)")
    assert _items(check)["gpu-a"] == ("warning", "not selected: missing label pool=gpu; it "
                                                 "looks like a GPU node")
    assert _items(check)["gpu-b"] == ("info", "not selected: taint team=ml:NoSchedule not "
                                              "tolerated")


# What the node plugin found on its nodes -------------------------------------------------------

async def test_a_node_plugins_report_and_the_runtime_make_the_node_ready() -> None:
    found = await _checks(await _cluster(_node("gpu-a", GPU_LABEL, setup=SETUP_OK)))
    check = found["node-setup"]
    assert (check.severity, check.summary) == ("ok", "1 of 1 node(s) reported by the node plugin")
    assert _items(check)["gpu-a"] == ("ok", "cdi /var/run/cdi writable; containerd://2.0.4 reads "
                                            "/var/run/cdi by default; hami-core present")


async def test_a_cdi_folder_not_writable_or_a_runtime_without_cdi_is_an_error() -> None:
    unwritable = NodeSetup(cdi_dir="/var/run/cdi", cdi_writable=False,
                           cdi_problem="Read-only file system",
                           hami_library="/usr/local/vgpu/libvgpu.so", hami_core="missing")
    found = await _checks(await _cluster(
        _node("gpu-a", GPU_LABEL, setup=unwritable),
        _node("gpu-b", GPU_LABEL, setup=SETUP_OK, runtime="containerd://1.6.20"),
        _node("gpu-c", GPU_LABEL, setup=SETUP_OK, runtime="containerd://1.7.22")))
    items = _items(found["node-setup"])
    assert found["node-setup"].severity == "error"
    assert items["gpu-a"][0] == "error"
    assert "cdi /var/run/cdi not writable (Read-only file system)" in items["gpu-a"][1]
    assert "hami-core missing at /usr/local/vgpu/libvgpu.so" in items["gpu-a"][1]
    assert items["gpu-b"] == ("error", "cdi /var/run/cdi writable; containerd://1.6.20 predates "
                                       "CDI support (containerd 1.7 or later); hami-core present")
    assert items["gpu-c"][0] == "warning"
    assert "enable_cdi = true" in items["gpu-c"][1]


async def test_hami_core_missing_alone_is_info() -> None:
    missing = NodeSetup(cdi_dir="/etc/cdi", cdi_writable=True, hami_library="/x/libvgpu.so",
                        hami_core="missing")
    found = await _checks(await _cluster(_node("gpu-a", GPU_LABEL, setup=missing)))
    assert found["node-setup"].severity == "info"
    assert "nodePlugin.hamiCore.hostPath" in found["node-setup"].fix


async def test_a_node_no_plugin_reported_on_is_unknown_a_warning_once_installed() -> None:
    before = await _checks(await _cluster(_node("gpu-a", GPU_LABEL)))
    assert _items(before["node-setup"])["gpu-a"] == (
        "info", "unknown: no node plugin reported here (condition DraGatewayNodeSetup)")
    installed = await _checks(await _cluster(_node("gpu-a", GPU_LABEL),
                                             objects=((SECRETS, _release({})),)))
    assert _items(installed["node-setup"])["gpu-a"][0] == "warning"


# CRDs of the chart's optional objects ----------------------------------------------------------

def _crd(name: str) -> tuple[ResourceType, Object]:
    return CRDS, {"metadata": {"name": name}}


async def test_monitoring_crds_missing_where_the_release_asks_for_them_is_an_error() -> None:
    values = {"monitoring": {"podMonitors": True}, "certificates": {"mode": "cert-manager"}}
    missing = await _checks(await _cluster(_node("gpu-a", GPU_LABEL),
                                           objects=((SECRETS, _release(values)),)))
    assert missing["prometheus-operator"].severity == "error"
    assert missing["prometheus-operator"].summary == (
        "the installed chart uses monitoring.podMonitors or monitoring.prometheusRule; missing "
        "podmonitors.monitoring.coreos.com, prometheusrules.monitoring.coreos.com")
    assert missing["cert-manager"].severity == "error"
    present = await _checks(await _cluster(
        _node("gpu-a", GPU_LABEL), objects=(
            (SECRETS, _release(values)), _crd("podmonitors.monitoring.coreos.com"),
            _crd("prometheusrules.monitoring.coreos.com"), _crd("certificates.cert-manager.io"),
            _crd("issuers.cert-manager.io"))))
    assert present["prometheus-operator"].severity == "ok"
    assert present["cert-manager"].severity == "ok"


async def test_crds_the_release_does_not_use_or_without_a_release_are_info() -> None:
    unused = await _checks(await _cluster(_node("gpu-a", GPU_LABEL),
                                          objects=((SECRETS, _release({})),)))
    assert unused["prometheus-operator"].severity == "info"
    assert unused["cert-manager"].summary.startswith(
        "not used by the installed chart (certificates.mode=cert-manager unset)")
    absent = await _checks(await _cluster(_node("gpu-a", GPU_LABEL)))
    assert absent["cert-manager"].severity == "info"
    assert absent["cert-manager"].summary == ("chart not installed; missing "
                                              "certificates.cert-manager.io, "
                                              "issuers.cert-manager.io")


# Legacy device plugins and the pods they serve --------------------------------------------------

async def test_legacy_device_plugins_call_for_the_audit_first_install() -> None:
    found = await _checks(await _cluster(
        _node("gpu-a", GPU_LABEL, allocatable={"nvidia.com/gpu": "8"}),
        _node("gpu-b", GPU_LABEL, allocatable={"nvidia.com/gpu": "0"}),
        objects=((DAEMON_SETS, _daemon_set(
            "nvidia-device-plugin-daemonset", "kube-system",
            image="nvcr.io/nvidia/k8s-device-plugin:v0.17.0")),)))
    check = found["legacy-device-plugins"]
    assert check.severity == "warning"
    assert "webhook.translation.default=audit" in check.fix
    assert _items(check) == {
        "gpu-a": ("warning", "offers nvidia.com/gpu: 8"),
        "kube-system/nvidia-device-plugin-daemonset": (
            "warning", "DaemonSet of a device plugin (nvcr.io/nvidia/k8s-device-plugin:v0.17.0)")}


async def test_a_cluster_without_legacy_plugins_is_ok() -> None:
    found = await _checks(await _cluster(_node("gpu-a", GPU_LABEL)))
    assert found["legacy-device-plugins"].severity == "ok"
    assert found["legacy-pods"].severity == "ok"


async def test_pods_holding_legacy_gpus_are_named() -> None:
    pod = {"metadata": {"name": "train", "namespace": "ml"},
           "spec": {"nodeName": "gpu-a", "containers": [
               {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]},
           "status": {"phase": "Running"}}
    found = await _checks(await _cluster(_node("gpu-a", GPU_LABEL), objects=((PODS, pod),)))
    check = found["legacy-pods"]
    assert (check.severity, check.summary) == (
        "warning", "1 pod(s) hold legacy GPU resources: ml/train")
    assert "webhook.translation.default=audit" in check.fix


# The command -----------------------------------------------------------------------------------

@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> list[MemoryCluster]:
    """`connect` hands out the cluster a test puts here."""
    clusters: list[MemoryCluster] = []

    async def connect(kind: str, kubeconfig: str | None = None, **_: Any) -> MemoryCluster:
        return clusters[0]

    module = importlib.import_module("dra_gateway.kube.cluster.connect")
    monkeypatch.setattr(module, "connect", connect)
    return clusters


async def test_the_exit_code_is_the_worst_severity(memory: list[MemoryCluster],
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    memory.append(await _cluster(_node("gpu-a", GPU_LABEL, setup=SETUP_OK)))
    assert await _main(["preflight"]) == 0
    memory[0] = await _cluster(_node("gpu-a", GPU_LABEL, setup=SETUP_OK,
                                     allocatable={"nvidia.com/gpu": "1"}))
    assert await _main(["preflight"]) == 3
    memory[0] = await _cluster(_node("cpu-1"))
    assert await _main(["preflight"]) == 4
    capsys.readouterr()


async def _main(argv: list[str]) -> int:
    import asyncio

    # main() runs its own event loop: run it beside the test's.
    return await asyncio.to_thread(main, argv)


async def test_json_is_one_stable_document(memory: list[MemoryCluster],
                                           capsys: pytest.CaptureFixture[str]) -> None:
    memory.append(await _cluster(_node("gpu-a", GPU_LABEL, setup=SETUP_OK)))
    assert await _main(["preflight", "-o", "json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert list(body) == ["apiVersion", "kind", "namespace", "server", "chart", "severity",
                          "exitCode", "checks"]
    assert (body["kind"], body["severity"], body["exitCode"]) == ("PreflightReport", "info", 0)
    assert [c["name"] for c in body["checks"]] == [
        "dra-api", "server-version", "feature-gates", "node-plugin-nodes", "node-setup",
        "prometheus-operator", "cert-manager", "legacy-device-plugins", "legacy-pods"]
    assert list(body["checks"][0]) == ["name", "title", "severity", "summary", "fix", "items"]


async def test_the_table_fits_the_terminal() -> None:
    facts = await read_facts(await _cluster(
        _node("gpu-a", GPU_LABEL), _node("a-very-long-node-name-in-a-big-cluster-pool-7")),
        namespace="dra-gateway")
    shown = table(facts, judge(facts), 80)
    assert max(len(line) for line in shown.splitlines()) <= 80
    assert shown.splitlines()[0] == "OK     DRA resource.k8s.io/v1 served: resource.k8s.io/v1 " \
                                    "is served"
    assert "       fix: label the GPU nodes" not in shown  # a node is selected
    assert shown.rstrip().endswith("exit code 0")


def test_a_missing_kubeconfig_is_said_as_an_error_line(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["preflight", "--kubeconfig", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert err.count("\n") == 1

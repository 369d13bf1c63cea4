"""Moving a live cluster, on a real control plane: a node whose GPUs a legacy device plugin
serves is cut over to the gateway while a legacy pod still holds two of its cards, and no card
is ever offered to both; a namespace in audit mode admits a HAMi pod unchanged with its
warning; `migrate plan` and `migrate quotas` read the live cluster, and the GPUQuotas they write
are accepted by the real API server.

The kubelet is played twice: KWOK runs the pods and keeps the Node's status, and a fake kubelet
pod-resources server, built in Go from the kubelet's own `podresources/v1` package
(tests/node_plugin/podresources), tells the node plugin which legacy devices the device plugin
offers and which running containers hold, as the real kubelet's socket would. The scenario's
node, namespaces and pods are removed at the end: the other modules of the tier see the
installation as `install` made it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from gotools import build_go_tool

from dra_gateway.kube import names
from dra_gateway.realcluster import ApiError, path_of
from e2e.support import (
    NAMESPACE,
    REPO,
    Component,
    Gateway,
    _node_plugin_kubeconfig,
    _short_dir,
    cards,
    holdings,
    over_capacity,
    pod_claims,
    wait_until,
)

NODE = "gpu-legacy-1"
UUIDS = tuple(f"GPU-5e1f0c3a-0000-4000-8000-00000000000{i}" for i in range(4))
HELD = UUIDS[:2]
LEGACY_NS = "legacy"  # label disabled: the legacy workload stays as it is
TRAIN_NS = "train"  # label enabled
AUDIT_NS = "rehearsal"  # label audit
BURST = 6
JSON = dict[str, Any]


def _inventory(path: Path) -> Path:
    gpus = [{"index": i, "uuid": uuid, "productName": "NVIDIA A100-SXM4-80GB", "brand": "Nvidia",
             "architecture": "Ampere", "memory": "80Gi", "cudaComputeCapability": "8.0",
             "pciBusID": f"0000:{0x10 + i:02x}:00.0", "numaNode": 0}
            for i, uuid in enumerate(UUIDS)]
    path.write_text(yaml.safe_dump({"driverVersion": "535.104.05", "cudaDriverVersion": "12.2",
                                    "sharing": "shared", "gpus": gpus}))
    return path


class FakeKubelet:
    """The fake pod-resources server and the state file it answers from."""

    def __init__(self, binary: Path, folder: Path) -> None:
        self.socket = folder / "kubelet.sock"
        self.state = folder / "state.json"
        self.write(offered=True, holders={})
        self.process = subprocess.Popen(
            [str(binary), "-socket", str(self.socket), "-state", str(self.state)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line.startswith("serving "), f"the fake kubelet did not start: {line!r}"

    def write(self, *, offered: bool, holders: dict[str, tuple[str, ...]]) -> None:
        """What the kubelet says: whether NVIDIA's device plugin offers the four cards, and
        which pod (namespace/name) holds which card through nvidia.com/gpu."""
        state = {
            "allocatable": {"devices": [{"resource_name": "nvidia.com/gpu",
                                         "device_ids": list(UUIDS)}] if offered else []},
            "list": {"pod_resources": [
                {"namespace": pod.split("/")[0], "name": pod.split("/")[1],
                 "containers": [{"name": "main", "devices": [
                     {"resource_name": "nvidia.com/gpu", "device_ids": list(held)}]}]}
                for pod, held in holders.items()]},
        }
        # Renamed over the old one: the server never reads half a file.
        temporary = self.state.with_suffix(".tmp")
        temporary.write_text(json.dumps(state))
        os.replace(temporary, self.state)

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture(scope="module")
def fake_kubelet_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_go_tool(REPO / "tests" / "node_plugin" / "podresources",
                         tmp_path_factory.mktemp("podresources"),
                         "the fake kubelet pod-resources server")


def _set_gpus(gateway: Gateway, amount: str | None) -> None:
    """The Node's legacy nvidia.com/gpu, as the kubelet writes it for the device plugin
    (None: the name never offered)."""
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    if amount is not None:
        resources["nvidia.com/gpu"] = amount
    gateway.api.apply_status(path_of("v1", "nodes", name=NODE),
                             {"status": {"capacity": resources, "allocatable": resources}})


@contextlib.contextmanager
def _legacy_node(gateway: Gateway, binary: Path) -> Iterator[FakeKubelet]:
    api = gateway.api
    sockets = _short_dir()
    kubelet = FakeKubelet(binary, sockets)
    plugin: Component | None = None
    try:
        for name, mode in ((LEGACY_NS, "disabled"), (TRAIN_NS, "enabled"), (AUDIT_NS, "audit")):
            api.create(path_of("v1", "namespaces"), {
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": {names.TRANSLATION_LABEL: mode}}})
        gateway.plane.add_node(NODE, labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
        _set_gpus(gateway, "4")
        gateway.plane.wait_nodes_ready([NODE])
        base = sockets / "plugin"
        plugin = Component(f"node-plugin-{NODE}", [
            "node-plugin", "serve", "--inventory", str(_inventory(gateway.work / "legacy.yaml")),
            "--node-name", NODE, "--cluster", "kube",
            "--kubeconfig", _node_plugin_kubeconfig(gateway, NODE),
            "--plugins-dir", str(base / "plugins"), "--registry-dir", str(base / "registry"),
            "--cdi-dir", str(base / "cdi"), "--state-dir", str(base / "state"),
            "--pod-resources-socket", str(kubelet.socket), "--legacy-poll-interval", "0.5",
            "--legacy-node-interval", "1"], gateway.work / "logs" / f"node-plugin-{NODE}.log")
        gateway.components[plugin.name] = plugin
        plugin.start()
        yield kubelet
    finally:
        _clean_up(gateway, plugin, kubelet)


def _clean_up(gateway: Gateway, plugin: Component | None, kubelet: FakeKubelet) -> None:
    """Remove what the scenario made, pods first (force: KWOK plays their kubelet, and the
    node goes last), so that the namespaces finish terminating."""
    api = gateway.api
    for name in (TRAIN_NS, AUDIT_NS, LEGACY_NS):
        with contextlib.suppress(ApiError):
            for pod in api.list(path_of("v1", "pods", namespace=name)):
                api.delete(path_of("v1", "pods", namespace=name, name=pod["metadata"]["name"]),
                           grace_period_s=0)
        with contextlib.suppress(ApiError):
            api.delete(path_of("v1", "namespaces", name=name))
    for name in (TRAIN_NS, AUDIT_NS, LEGACY_NS):
        wait_until(f"namespace {name} to be gone",
                   lambda n=name: not api.exists(path_of("v1", "namespaces", name=n)), 120)
    if plugin is not None:
        plugin.stop()
        gateway.components.pop(plugin.name, None)
    kubelet.stop()
    for item in api.list(path_of("resource.k8s.io/v1", "resourceslices")):
        if item["spec"].get("nodeName") == NODE:
            with contextlib.suppress(ApiError):
                api.delete(path_of("resource.k8s.io/v1", "resourceslices",
                                   name=item["metadata"]["name"]))
    with contextlib.suppress(ApiError):
        api.delete(path_of("v1", "nodes", name=NODE))


def _condition(gateway: Gateway) -> JSON:
    node = gateway.api.get(path_of("v1", "nodes", name=NODE))
    return next((c for c in (node.get("status") or {}).get("conditions") or []
                 if c.get("type") == names.NODE_MIGRATION_CONDITION), {})


def _published_uuids(gateway: Gateway) -> set[str]:
    """The cards the gateway's node plugin publishes on NODE, by UUID."""
    out = set()
    for item in gateway.api.list(path_of("resource.k8s.io/v1", "resourceslices")):
        if item["spec"].get("nodeName") != NODE or item["spec"].get("driver") != names.DRIVER:
            continue
        for device in item["spec"].get("devices") or []:
            out.add(device["attributes"][names.ATTR_UUID]["string"])
    return out


def _device_uuids(gateway: Gateway) -> dict[tuple[str, str, str], str]:
    out = {}
    for item in gateway.api.list(path_of("resource.k8s.io/v1", "resourceslices")):
        spec = item["spec"]
        if spec.get("nodeName") == NODE and spec.get("driver") == names.DRIVER:
            for device in spec.get("devices") or []:
                out[(names.DRIVER, spec["pool"]["name"], device["name"])] = \
                    device["attributes"][names.ATTR_UUID]["string"]
    return out


def _burst_cards(gateway: Gateway, uuids: dict[tuple[str, str, str], str]) -> dict[str, str]:
    """pod -> UUID of the card its claim was allocated, for the burst pods placed so far."""
    published = cards(gateway.api)
    placed = {}
    for pod in gateway.api.list(path_of("v1", "pods", namespace=TRAIN_NS)):
        for claim in pod_claims(gateway.api, pod):
            for holding in holdings(claim, published):
                placed[pod["metadata"]["name"]] = uuids.get(holding.device, "?")
    return placed


def _migrate(gateway: Gateway, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_gateway", "migrate", *args,
         "--kubeconfig", str(gateway.plane.admin_kubeconfig)],
        capture_output=True, text=True, timeout=120, check=False)


def _gpu_pod(name: str, namespace: str, gpus: int) -> JSON:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE},
                     "containers": [{"name": "main", "image": "cuda:12.4",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}


def test_a_node_is_cut_over_while_a_legacy_pod_holds_two_cards_and_none_is_booked_twice(
        gateway: Gateway, fake_kubelet_binary: Path) -> None:
    api = gateway.api
    with _legacy_node(gateway, fake_kubelet_binary) as kubelet:
        # 1. Legacy: NVIDIA's device plugin offers the four cards; the gateway publishes none.
        wait_until("the node plugin to report Legacy",
                   lambda: _condition(gateway).get("reason") == names.NODE_STATE_LEGACY, 60,
                   gateway.check)
        assert _published_uuids(gateway) == set()
        # A legacy trainer takes two cards through the device plugin (its namespace is
        # disabled: the webhook is not even called).
        api.create(path_of("v1", "pods", namespace=LEGACY_NS),
                   _gpu_pod("trainer", LEGACY_NS, 2))
        wait_until("the legacy trainer to be bound", lambda: bool(api.get(path_of(
            "v1", "pods", namespace=LEGACY_NS, name="trainer"))["spec"].get("nodeName")), 60)
        trainer = api.get(path_of("v1", "pods", namespace=LEGACY_NS, name="trainer"))
        assert "resourceClaims" not in trainer["spec"]
        kubelet.write(offered=True, holders={f"{LEGACY_NS}/trainer": HELD})

        # `migrate node` labels the node and says what it still waits for.
        waiting = _migrate(gateway, "node", NODE, "-o", "json")
        assert waiting.returncode == 3, waiting.stderr
        said = json.loads(waiting.stdout)
        assert said["labelled"] is True
        state = said["node"]
        assert state["cut_over"] is True
        assert state["legacy_plugins"] == {"nvidia.com/gpu": "4"}
        assert state["legacy_pods"] == [f"{LEGACY_NS}/trainer"]
        node = api.get(path_of("v1", "nodes", name=NODE))
        assert node["metadata"]["labels"][names.NODE_CUT_OVER_LABEL] == "true"

        # 2. The legacy plugin leaves (its DaemonSet avoids cut-over nodes): the kubelet offers
        # nothing and the Node's amount drops to zero, but the trainer still holds its cards.
        kubelet.write(offered=False, holders={f"{LEGACY_NS}/trainer": HELD})
        _set_gpus(gateway, "0")
        wait_until("the node plugin to report CuttingOver", lambda: _condition(gateway).get(
            "reason") == names.NODE_STATE_CUTTING_OVER, 60, gateway.check)
        assert _condition(gateway)["message"].startswith(
            f"2 of 4 card(s) held by legacy pods: {LEGACY_NS}/trainer (nvidia.com/gpu)")
        wait_until("the two free cards to be published",
                   lambda: _published_uuids(gateway) == set(UUIDS[2:]), 30, gateway.check)

        # 3. A burst of translated pods: two fit on the free cards, the rest wait.
        for i in range(BURST):
            api.create(path_of("v1", "pods", namespace=TRAIN_NS), _gpu_pod(f"w{i}", TRAIN_NS, 1))
        uuids = _device_uuids(gateway)
        wait_until("two burst pods to be allocated",
                   lambda: len(_burst_cards(gateway, uuids)) == 2, 90, gateway.check)
        time.sleep(3)  # the allocator has seen every pod: nothing more may land
        placed = _burst_cards(gateway, uuids)
        assert sorted(placed.values()) == sorted(UUIDS[2:]), placed
        gated = [p["metadata"]["name"] for p in api.list(path_of("v1", "pods",
                                                                 namespace=TRAIN_NS))
                 if any(g.get("name") == names.SCHEDULING_GATE
                        for g in p["spec"].get("schedulingGates") or [])]
        assert len(gated) == BURST - 2
        assert _published_uuids(gateway) == set(UUIDS[2:])

        # 4. The trainer ends: its two cards come back within seconds and take waiting pods.
        api.delete(path_of("v1", "pods", namespace=LEGACY_NS, name="trainer"), grace_period_s=0)
        kubelet.write(offered=False, holders={})
        wait_until("the node plugin to report DRA",
                   lambda: _condition(gateway).get("reason") == names.NODE_STATE_DRA, 30,
                   gateway.check)
        uuids = _device_uuids(gateway)
        assert set(uuids.values()) == set(UUIDS)
        wait_until("four burst pods to be allocated",
                   lambda: len(_burst_cards(gateway, uuids)) == 4, 90, gateway.check)
        assert sorted(_burst_cards(gateway, uuids).values()) == sorted(UUIDS)
        assert over_capacity(api) == []
        done = _migrate(gateway, "node", NODE, "-o", "json")
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["node"]["condition"]["reason"] == names.NODE_STATE_DRA

        # 5. The audit namespace admits a HAMi pod unchanged and says what it would become.
        warnings: list[str] = []
        hami = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "llm", "namespace": AUDIT_NS},
                "spec": {"containers": [{"name": "server", "image": "vllm:0.6", "resources": {
                    "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000",
                               "nvidia.com/gpucores": "30"}}}]}}
        created = api.create(path_of("v1", "pods", namespace=AUDIT_NS), hami, warnings=warnings)
        assert "resourceClaims" not in created["spec"]
        assert "schedulingGates" not in created["spec"]
        # As written (the API server spells 8000 as 8k).
        assert created["spec"]["containers"][0]["resources"]["limits"] == {
            "nvidia.com/gpu": "1", "nvidia.com/gpumem": "8k", "nvidia.com/gpucores": "30"}
        (said,) = [w for w in warnings if w.startswith("dra-gateway audit: ")]
        assert said.startswith(
            'dra-gateway audit: container "server" (nvidia.com/gpu: 1, nvidia.com/gpucores: 30, '
            "nvidia.com/gpumem: 8k) would get 1 device of class gpu.dra-gateway.io, capacity "
            "memory 8000Mi, cores 30 by rule hami, from ResourceClaimTemplate dra-gateway-"), said
        assert api.list(path_of("resource.k8s.io/v1", "resourceclaimtemplates",
                                namespace=AUDIT_NS)) == []

        # 6. `migrate plan` and `migrate quotas` read the live cluster.
        api.create(path_of("v1", "resourcequotas", namespace=TRAIN_NS), {
            "apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "gpus", "namespace": TRAIN_NS},
            "spec": {"hard": {"requests.nvidia.com/gpu": "4"}}})
        plan = _migrate(gateway, "plan", "-o", "json")
        assert plan.returncode == 0, plan.stderr
        planned = json.loads(plan.stdout)
        modes = {n["name"]: n["mode"] for n in planned["namespaces"]}
        assert (modes[LEGACY_NS], modes[TRAIN_NS], modes[AUDIT_NS]) == (
            "disabled", "enabled", "audit")
        quotas = _migrate(gateway, "quotas", "-o", "json")
        assert quotas.returncode == 0, quotas.stderr
        written = [q for q in json.loads(quotas.stdout)["gpuQuotas"]
                   if q["metadata"]["namespace"] == TRAIN_NS]
        assert [q["spec"]["hard"] for q in written] == [{"devices": 4}], written
        for quota in written:
            api.create(path_of(names.API_VERSION, "gpuquotas", namespace=TRAIN_NS), quota)
        assert api.exists(path_of(names.API_VERSION, "gpuquotas", namespace=TRAIN_NS,
                                  name="gpus"))
    assert NAMESPACE  # the gateway's own namespace is untouched by the scenario

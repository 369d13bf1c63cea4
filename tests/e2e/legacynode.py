"""A GPU node served by a legacy device plugin, for the e2e tier's live-migration scenario and
`hack/live-migration-walkthrough.py`.

The kubelet is played twice: KWOK runs the pods and keeps the Node's status (`set_gpus` writes
the legacy nvidia.com/gpu it shows), and a fake kubelet pod-resources server, built in Go from the
kubelet's own `podresources/v1` package (tests/node_plugin/podresources), tells the node
plugin which legacy devices the device plugin offers and which running containers hold
(`FakeKubelet.write`), as the real kubelet's socket would. `legacy_node` adds the node, its
namespaces (one per translation mode) and its node plugin to an installed gateway, and removes
them all afterwards, so the installation is left as `install` made it.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from dra_gateway.devkit.realcluster import path_of
from dra_gateway.devkit.simnode import install_hami_core
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError
from e2e.support import (
    NAMESPACE,
    Component,
    Gateway,
    cards,
    holdings,
    node_plugin_kubeconfig,
    pod_claims,
    short_dir,
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


def set_gpus(gateway: Gateway, amount: str | None) -> None:
    """The Node's legacy nvidia.com/gpu, as the kubelet writes it for the device plugin
    (None: the name never offered)."""
    resources = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    if amount is not None:
        resources["nvidia.com/gpu"] = amount
    gateway.api.apply_status(path_of("v1", "nodes", name=NODE),
                             {"status": {"capacity": resources, "allocatable": resources}})


@contextlib.contextmanager
def legacy_node(gateway: Gateway, binary: Path) -> Iterator[FakeKubelet]:
    api = gateway.api
    sockets = short_dir()
    kubelet = FakeKubelet(binary, sockets)
    plugin: Component | None = None
    try:
        for name, mode in ((LEGACY_NS, "disabled"), (TRAIN_NS, "enabled"), (AUDIT_NS, "audit")):
            api.create(path_of("v1", "namespaces"), {
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": {names.TRANSLATION_LABEL: mode}}})
        gateway.plane.add_node(NODE, labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
        set_gpus(gateway, "4")
        gateway.plane.wait_nodes_ready([NODE])
        base = sockets / "plugin"
        plugin = Component(f"node-plugin-{NODE}", [
            "node-plugin", "serve", "--inventory", str(_inventory(gateway.work / "legacy.yaml")),
            "--node-name", NODE, "--cluster", "kube",
            "--kubeconfig", node_plugin_kubeconfig(gateway, NODE),
            "--plugins-dir", str(base / "plugins"), "--registry-dir", str(base / "registry"),
            "--cdi-dir", str(base / "cdi"), "--state-dir", str(base / "state"),
            "--hami-library", str(install_hami_core(base / "hami-core")),
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
    # The stand-in pod the plugin's token was bound to (node_plugin_kubeconfig), so that a later
    # scenario can add the node again.
    stand_in = f"{gateway.service_accounts['node-plugin']}-{NODE}"
    with contextlib.suppress(ApiError):
        api.delete(path_of("v1", "pods", namespace=NAMESPACE, name=stand_in), grace_period_s=0)
    for item in api.list(path_of("resource.k8s.io/v1", "resourceslices")):
        if item["spec"].get("nodeName") == NODE:
            with contextlib.suppress(ApiError):
                api.delete(path_of("resource.k8s.io/v1", "resourceslices",
                                   name=item["metadata"]["name"]))
    with contextlib.suppress(ApiError):
        api.delete(path_of("v1", "nodes", name=NODE))


def condition(gateway: Gateway) -> JSON:
    node = gateway.api.get(path_of("v1", "nodes", name=NODE))
    return next((c for c in (node.get("status") or {}).get("conditions") or []
                 if c.get("type") == names.NODE_MIGRATION_CONDITION), {})


def published_uuids(gateway: Gateway) -> set[str]:
    """The cards the gateway's node plugin publishes on NODE, by UUID."""
    out = set()
    for item in gateway.api.list(path_of("resource.k8s.io/v1", "resourceslices")):
        if item["spec"].get("nodeName") != NODE or item["spec"].get("driver") != names.DRIVER:
            continue
        for device in item["spec"].get("devices") or []:
            out.add(device["attributes"][names.ATTR_UUID]["string"])
    return out


def device_uuids(gateway: Gateway) -> dict[tuple[str, str, str], str]:
    out = {}
    for item in gateway.api.list(path_of("resource.k8s.io/v1", "resourceslices")):
        spec = item["spec"]
        if spec.get("nodeName") == NODE and spec.get("driver") == names.DRIVER:
            for device in spec.get("devices") or []:
                out[(names.DRIVER, spec["pool"]["name"], device["name"])] = \
                    device["attributes"][names.ATTR_UUID]["string"]
    return out


def burst_cards(gateway: Gateway, uuids: dict[tuple[str, str, str], str]) -> dict[str, str]:
    """pod -> UUID of the card its claim was allocated, for the burst pods placed so far."""
    published = cards(gateway.api)
    placed = {}
    for pod in gateway.api.list(path_of("v1", "pods", namespace=TRAIN_NS)):
        for claim in pod_claims(gateway.api, pod):
            for holding in holdings(claim, published):
                placed[pod["metadata"]["name"]] = uuids.get(holding.device, "?")
    return placed


def gpu_pod(name: str, namespace: str, gpus: int) -> JSON:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE},
                     "containers": [{"name": "main", "image": "cuda:12.4",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}}

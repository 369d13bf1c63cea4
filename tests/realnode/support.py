"""The gateway on a real node: a real control plane, a real kubelet with containerd, runc and CNI
(`dra_gateway.devkit.realnode`), the gateway's chart, webhook and allocator as in the e2e tier, and
the node plugin as its DaemonSet's pod runs it: with the kubelet's own folders (plugins, plugin
registry, pod-resources socket), the runtime's CDI folder and a token of the chart's node-plugin
ServiceAccount bound to a pod that this kubelet runs.

Each setup builds (cached) what it needs with hack/build-node.sh and hack/build-control-plane.sh;
without root, Go or helm, or when a build fails, the tier skips with the reason, except in CI
(CI=true), where that is a failure.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from e2e.support import (
    EXAMPLES,
    NAMESPACE,
    RECOVERY_S,
    REPO,
    Component,
    Gateway,
    _fail_or_skip,
    build_binaries,
    fault_file,
    install,
    run_build_script,
    wait_until,
)

from dra_gateway.devkit.realcluster import Api, ControlPlane, path_of
from dra_gateway.devkit.realnode import (
    IMAGE,
    STATE_ROOT,
    NodeBinaries,
    NodeError,
    NodeNetwork,
    RealNode,
    node_problems,
    preflight,
)
from dra_gateway.devkit.simnode import install_hami_core
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError

NODE_SCRIPT = REPO / "hack" / "build-node.sh"
NODE = "gpu-node-1"
# Eight H100 80GB cards, each shared by memory and compute (the demo's H100 node).
INVENTORY = EXAMPLES / "demo" / "gpu-h100-1.yaml"
WORKLOADS = "inference"
# (id, control plane release, kubelet release): the oldest supported release, and the newest
# control plane with the newest kubelet that builds here (hack/build-node.sh says why).
SETUPS: tuple[tuple[str, str, str], ...] = (
    ("1.34.4", "1.34.4", "1.34.4"),
    ("1.38.0-beta.0", "1.38.0-beta.0", "1.37.2"),
)
JSON = dict[str, Any]


def build_image(folder: Path) -> tuple[Path, str]:
    """The gateway's image, built by hack/build-image.sh into `folder`: the OCI archive and the
    image's name."""
    started = time.monotonic()
    result = subprocess.run(["bash", str(REPO / "hack" / "build-image.sh"),
                             str(folder / "dra-gateway.oci.tar")],
                            capture_output=True, text=True, timeout=900, check=False)
    if result.returncode != 0:
        _fail_or_skip(f"hack/build-image.sh failed ({result.returncode}):\n"
                      + "\n".join(result.stderr.splitlines()[-30:]))
    print(f"image built in {time.monotonic() - started:.0f}s")
    archive, name = result.stdout.split()
    return Path(archive), name


def build_node(kubelet_version: str) -> Path:
    """The folder of `kubelet_version`'s kubelet with containerd and crictl beside it."""
    return run_build_script(NODE_SCRIPT, kubelet_version,
                            f"node binaries of {kubelet_version}",
                            "the real-node tier builds the kubelet, containerd and crictl")


@dataclass
class NodeClient:
    """The real node's pods, slices and CDI specs, seen through the API server and the node."""

    plane: ControlPlane
    node: RealNode

    @property
    def api(self) -> Api:
        return self.plane.api()

    def check(self) -> None:
        self.plane.check()
        self.node.check()

    def logs(self) -> str:
        return node_problems(self.node)

    # The kubelet

    def wait_registered(self, since: int = 0, timeout_s: float = 60.0) -> None:
        """Until the kubelet logs the plugin's registration (after log offset `since`)."""
        wait_until("the kubelet to register the node plugin",
                   lambda: self.registrations(since) > 0, timeout_s, self.check)

    def registrations(self, since: int = 0) -> int:
        text = self.node.kubelet_log()[since:]
        return sum(1 for line in text.splitlines()
                   if "Registered DRA plugin" in line and names.DRIVER in line)

    def kubelet_log_size(self) -> int:
        return len(self.node.kubelet_log())

    # What the cluster holds

    def slices(self) -> list[JSON]:
        return [s for s in self.api.list(path_of("resource.k8s.io/v1", "resourceslices"))
                if s["spec"].get("driver") == names.DRIVER and s["spec"].get("nodeName") == NODE]

    def cdi_specs(self) -> list[Path]:
        return sorted(self.node.cdi_dir.glob("*.json"))

    # Pods

    def create_pod(self, manifest: Mapping[str, Any]) -> JSON:
        body = yaml.safe_load(yaml.safe_dump(dict(manifest)))
        body.setdefault("metadata", {}).setdefault("namespace", WORKLOADS)
        spec = body["spec"]
        spec.setdefault("terminationGracePeriodSeconds", 1)
        for container in spec.get("containers", []):
            container.setdefault("image", IMAGE)
            container.setdefault("imagePullPolicy", "Never")
        return self.api.create(path_of("v1", "pods", namespace=body["metadata"]["namespace"]),
                               body)

    def pod(self, name: str, namespace: str = WORKLOADS) -> JSON:
        return self.api.get(path_of("v1", "pods", namespace=namespace, name=name))

    def wait_running(self, name: str, namespace: str = WORKLOADS, timeout_s: float = 90.0
                     ) -> JSON:
        def running() -> bool:
            status = self.pod(name, namespace).get("status") or {}
            return status.get("phase") == "Running" and all(
                c.get("ready") for c in status.get("containerStatuses") or [{}])

        try:
            wait_until(f"pod {namespace}/{name} to run", running, timeout_s, self.check)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{yaml.safe_dump(self.pod(name, namespace))}\n"
                                 f"{self.events(namespace)}\n{self.logs()}") from None
        return self.pod(name, namespace)

    def events(self, namespace: str) -> str:
        return "\n".join(
            f"{e.get('involvedObject', {}).get('name')}: {e.get('reason')}: {e.get('message')}"
            for e in self.api.list(path_of("v1", "events", namespace=namespace)))

    def container_output(self, name: str, container: str, *, until: str,
                         namespace: str = WORKLOADS, timeout_s: float = 30.0) -> str:
        """What the container printed, once it printed `until`."""
        wait_until(f"{namespace}/{name}/{container} to print {until!r}",
                   lambda: until in self.node.container_log(namespace, name, container),
                   timeout_s, self.check)
        return self.node.container_log(namespace, name, container)

    def delete_pod(self, name: str, namespace: str = WORKLOADS, *, wait: bool = True,
                   timeout_s: float = 60.0) -> None:
        with contextlib.suppress(ApiError):
            self.api.delete(path_of("v1", "pods", namespace=namespace, name=name))
        if wait:
            wait_until(f"pod {namespace}/{name} to be gone",
                       lambda: not self.api.exists(path_of("v1", "pods", namespace=namespace,
                                                           name=name)), timeout_s, self.check)

    def claims_of(self, pod: Mapping[str, Any]) -> list[JSON]:
        namespace = pod["metadata"]["namespace"]
        found = []
        for status in (pod.get("status") or {}).get("resourceClaimStatuses") or []:
            if status.get("resourceClaimName"):
                found.append(self.api.get(path_of(
                    "resource.k8s.io/v1", "resourceclaims", namespace=namespace,
                    name=status["resourceClaimName"])))
        return found

    def card_uuids(self) -> dict[str, str]:
        """device name -> its `uuid` attribute, as the node's slices publish them."""
        found = {}
        for slice_ in self.slices():
            for device in slice_["spec"].get("devices") or []:
                uuid = (device.get("attributes") or {}).get("uuid", {}).get("string")
                if uuid:
                    found[device["name"]] = uuid
        return found

    def allocated_uuids(self, pod: Mapping[str, Any]) -> list[str]:
        """The UUIDs of the cards the pod's claims were allocated."""
        uuids = self.card_uuids()
        found = []
        for claim in self.claims_of(pod):
            allocation = (claim.get("status") or {}).get("allocation") or {}
            for result in (allocation.get("devices") or {}).get("results") or []:
                found.append(uuids[result["device"]])
        return found


@dataclass
class Cluster(NodeClient):
    """The gateway installed on a control plane whose one GPU node is a real kubelet; its
    webhook and allocator run as processes of the host, its node plugin as the DaemonSet's pod
    would run it."""

    gateway: Gateway
    hami_library: Path

    def check(self) -> None:
        self.gateway.check()
        self.node.check()

    def logs(self) -> str:
        return self.gateway.logs() + "\n" + node_problems(self.node)

    # The node plugin, as its DaemonSet pod runs it

    @property
    def plugin(self) -> Component:
        return self.gateway.components["node-plugin"]

    def plugin_args(self, hami_library: Path | None = None, instance: str = "",
                    cdi_dir: Path | None = None) -> list[str]:
        node = self.node
        hami_library = hami_library or self.hami_library
        return [
            "node-plugin", "serve", *(["--instance", instance] if instance else []),
            "--inventory", str(INVENTORY), "--node-name", NODE,
            "--cluster", "kube", "--kubeconfig", str(self.gateway.work / "node-plugin.kubeconfig"),
            "--plugins-dir", str(node.plugins_dir), "--registry-dir", str(node.registry_dir),
            "--cdi-dir", str(cdi_dir or node.cdi_dir), "--hami-library", str(hami_library),
            "--pod-resources-socket", str(node.pod_resources_socket),
            # Legacy devices read every second (the kubelet's API and the Node's status).
            "--legacy-poll-interval", "1", "--legacy-node-interval", "1",
            # Health events as NVML would send them; a degraded card recovers in seconds.
            "--fault-file", str(self.fault_file), "--recovery-seconds", str(RECOVERY_S)]

    @property
    def fault_file(self) -> Path:
        """The file the node plugin follows for health events (one JSON object a line)."""
        return fault_file(self.gateway, NODE)

    def fault(self, event: Mapping[str, Any]) -> None:
        """Append a health event for the node plugin, as NVML would report it."""
        with self.fault_file.open("a") as f:
            f.write(json.dumps(dict(event)) + "\n")

    def start_plugin(self, *, hami_library: Path | None = None, instance: str = "",
                     cdi_dir: Path | None = None) -> None:
        """Start the node plugin (with HAMi-core's library looked for at `hami_library`
        instead of where the node has it; on sockets named by `instance`, as the chart's pods
        run it; writing CDI specs into `cdi_dir` instead of the runtime's folder)."""
        component = Component("node-plugin", self.plugin_args(hami_library, instance, cdi_dir),
                              self.gateway.work / "logs" / "node-plugin.log")
        self.gateway.components["node-plugin"] = component
        component.start()

    def stop_plugin(self) -> None:
        self.plugin.stop()


def container_env(output: str) -> dict[str, str]:
    """The `env` a container printed (lines K=V)."""
    pairs = (line.split("=", 1) for line in output.splitlines() if "=" in line)
    return dict(pairs)


def node_parts(plane_version: str, kubelet_version: str) -> tuple[Path, NodeBinaries]:
    """The control plane's binaries folder and the node's binaries, built when missing; skips
    (fails in CI) where no real node can run."""
    why_not = preflight()
    if why_not:
        _fail_or_skip(f"no real node on this machine: {why_not}")
    bin_dir = build_binaries(plane_version)
    try:
        return bin_dir, NodeBinaries.of(build_node(kubelet_version))
    except NodeError as exc:
        _fail_or_skip(str(exc))
        raise


def check_hami_share(cluster: NodeClient, name: str, hami_library: Path) -> JSON:
    """Pod `name` (one share: 8000 MiB, 30% of a card) runs with HAMi-core's limits in its
    environment and the library bind-mounted from the node at the same path; the pod."""
    pod = cluster.wait_running(name)
    [uuid] = cluster.allocated_uuids(pod)
    output = cluster.container_output(name, "c0", until="done")
    env = container_env(output)
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "8000m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert env["LD_PRELOAD"] == str(hami_library)
    assert "preload-mounted" in output
    return pod


@contextlib.contextmanager
def real_node_cluster(plane_version: str, kubelet_version: str, helm: str, work: Path,
                      feature_gates: Mapping[str, bool] | None = None) -> Iterator[Cluster]:
    bin_dir, binaries = node_parts(plane_version, kubelet_version)
    gates = dict(feature_gates or {})
    network = NodeNetwork()
    network.create()
    node: RealNode | None = None
    try:
        with install(plane_version, gates, bin_dir, helm, work, address=network.host_ip,
                     gpu_nodes=()) as gateway:
            node = RealNode(NODE, gateway.plane, binaries, network, work / "node",
                            feature_gates=gates)
            started = time.monotonic()
            node.start()
            print(f"kubelet {kubelet_version} Ready in {time.monotonic() - started:.1f}s")
            # The node's HAMi-core, as its inventory's GPUs: simulated.
            hami_library = install_hami_core(STATE_ROOT / "hami-core")
            cluster = Cluster(gateway.plane, node, gateway=gateway, hami_library=hami_library)
            _node_plugin_kubeconfig(cluster)
            cluster.start_plugin()
            cluster.wait_registered()
            wait_until("the node plugin's ResourceSlices", lambda: bool(cluster.slices()), 60,
                       cluster.check)
            yield cluster
    finally:
        if node is not None:
            node.stop()
        network.delete()


def _node_plugin_kubeconfig(cluster: Cluster) -> None:
    """A token of the chart's node-plugin ServiceAccount bound to a pod that the real kubelet
    runs, as the DaemonSet's pod gets it."""
    gateway = cluster.gateway
    account = gateway.service_accounts["node-plugin"]
    pod = cluster.create_pod({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{account}-{NODE}", "namespace": NAMESPACE,
                     "labels": {"app.kubernetes.io/component": "node-plugin-stand-in"}},
        "spec": {"nodeName": NODE, "serviceAccountName": account,
                 "containers": [{"name": "node-plugin"}]}})
    gateway.plane.service_account_kubeconfig(
        NAMESPACE, account, gateway.work / "node-plugin.kubeconfig", bound_pod=pod)

"""The gateway's chart on a real node: `helm install` of helm/dra-gateway on a control plane whose
node is a real kubelet with containerd and kube-proxy, as an operator's first day does it. The
gateway's image (hack/build-image.sh) is pushed by hack/publish-image.sh to a real registry (the
CNCF distribution registry of hack/build-registry-tools.sh) listening on the host's end of the
node's network, and the chart is installed with the values the script prints and the chart's own
pull policy (IfNotPresent): containerd pulls the image from that registry over plain HTTP (the
node's `insecure_registries`). Every component runs as the chart's own pod: the webhook (its
certificate from the chart's bootstrap, called by the API server through its Service), the
allocator, the node plugin's DaemonSet (through its hostPath mounts), the `helm test` pod and the
pre-delete Job of `helm uninstall`. Nothing of the gateway runs on the host.

The control plane is an in-cluster one (`ControlPlane(in_cluster=True)`): ServiceAccount tokens
are mounted, the `kubernetes` Service has endpoints, and the API server reaches webhooks at their
Service's endpoints. Pods resolve Services by name through a cluster DNS on the host's end of the
node's network (`dra_gateway.devkit.clusterdns`), as CoreDNS serves them in a cluster. Users' verbs
go through that release's kubectl.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from e2e.support import (
    CHART,
    NAMESPACE,
    RELEASE,
    run_helm,
    wait_until,
)
from realnode.support import INVENTORY, NODE, WORKLOADS, NodeClient, node_parts
from registrytools import publish_image, registry_tool, serve_registry

from dra_gateway.devkit.clusterdns import ClusterDNS
from dra_gateway.devkit.realcluster import ControlPlane, path_of
from dra_gateway.devkit.realnode import (
    CLUSTER_DOMAIN,
    STATE_ROOT,
    NodeNetwork,
    RealNode,
)
from dra_gateway.devkit.simnode import install_hami_core
from dra_gateway.kube.cluster.port import ApiError

JSON = dict[str, Any]
# The label NVIDIA's GPU feature discovery puts on GPU nodes; the chart's DaemonSet selects it.
GPU_NODE_LABEL = "nvidia.com/gpu.present"
COMPONENTS = ("webhook", "allocator", "node-plugin")
# Where hack/publish-image.sh pushes the gateway's image in the node's registry.
REPOSITORY = "gpu/dra-gateway"


@dataclass(frozen=True)
class Published:
    """The gateway's image as hack/publish-image.sh pushed it: `repository@digest`, and the
    `helm install` values it printed."""

    reference: str
    image_values: JSON

    @property
    def digest(self) -> str:
        return self.reference.rpartition("@")[2]


def publish_gateway_image(registry: str, archive: Path) -> Published:
    """Push the gateway's OCI archive to `registry` (plain HTTP) with the project's own
    hack/publish-image.sh, at the tag it picks (the chart's appVersion)."""
    result = publish_image(registry_tool("crane"), f"{registry}/{REPOSITORY}", str(archive),
                           insecure=True)
    assert result.returncode == 0, f"hack/publish-image.sh failed:\n{result.stderr}"
    reference, settings, *_ = result.stdout.splitlines()
    # "--set image.repository=R --set image.tag=T": the values an operator passes to helm.
    values = dict(s.split("=", 1) for s in settings.split() if s.startswith("image."))
    image = {key.removeprefix("image."): value for key, value in values.items()}
    assert image.get("repository") == f"{registry}/{REPOSITORY}", settings
    return Published(reference, image)


@dataclass
class ChartCluster(NodeClient):
    """The gateway installed by its chart on a control plane whose one GPU node is real."""

    helm: str
    kubectl_binary: Path
    work: Path
    image: Published
    hami_library: Path

    def values(self, **overrides: Any) -> JSON:
        """The chart's values for this node: the image as hack/publish-image.sh printed it (the
        chart's pull policy), inventory discovery with the demo's H100 node, the kubelet's and
        the runtime's folders; `overrides` merged on top per section."""
        values: JSON = {
            "image": dict(self.image.image_values),
            "nodePlugin": {
                "discovery": "inventory", "inventory": yaml.safe_load(INVENTORY.read_text()),
                "kubeletDir": str(self.node.root_dir), "cdiDir": str(self.node.cdi_dir),
                "stateDir": str(STATE_ROOT / "dra-gateway"),
                "hamiCore": {"hostPath": str(self.hami_library)},
            },
        }
        for section, settings in overrides.items():
            values.setdefault(section, {}).update(settings)
        return values

    def helm_release(self, verb: str, values: Mapping[str, Any], *args: str) -> str:
        """`helm install` or `helm upgrade` of the chart with `values`, waiting until every
        Deployment and DaemonSet is ready."""
        path = self.work / f"values-{verb}.yaml"
        path.write_text(yaml.safe_dump(dict(values)))
        try:
            return self.run_helm(verb, RELEASE, str(CHART), "--namespace", NAMESPACE,
                                 "--values", str(path), "--wait", "--timeout", "4m", *args)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.pod_states()}\n{self.logs()}") from None

    def render(self, values: Mapping[str, Any]) -> list[JSON]:
        """The objects `helm template` renders with `values` for this cluster's release."""
        path = self.work / "values-template.yaml"
        path.write_text(yaml.safe_dump(dict(values)))
        text = self.run_helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                             "--kube-version", self.plane.version(), "--values", str(path))
        return [o for o in yaml.safe_load_all(text) if isinstance(o, dict)]

    def run_helm(self, *args: str) -> str:
        return run_helm(self.helm, self.work, self.plane.admin_kubeconfig, *args,
                        timeout_s=300)

    def pod_states(self) -> str:
        """Each pod of the gateway's namespace: phase, and each container's state."""
        lines = []
        for pod in self.api.list(path_of("v1", "pods", namespace=NAMESPACE)):
            status = pod.get("status") or {}
            states = [f"{c['name']} ready={c.get('ready')} restarts={c.get('restartCount')} "
                      f"{c.get('state')} last={c.get('lastState')}"
                      for c in status.get("containerStatuses") or []]
            lines.append(f"{pod['metadata']['name']}: {status.get('phase')} {states}")
        return "\n".join(lines)

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        """That release's kubectl with the admin's kubeconfig; its standard output."""
        result = subprocess.run(
            [str(self.kubectl_binary), "--kubeconfig", str(self.plane.admin_kubeconfig), *args],
            input=stdin, capture_output=True, text=True, timeout=120, check=False)
        assert result.returncode == 0, f"kubectl {' '.join(args)} failed:\n{result.stderr}"
        return result.stdout

    def component_pods(self, component: str) -> list[JSON]:
        return self.api.list(path_of("v1", "pods", namespace=NAMESPACE),
                             labelSelector=f"app.kubernetes.io/component={component}")

    def logs(self) -> str:
        """The node's logs, then each gateway pod's (read from the kubelet's log files)."""
        parts = [super().logs()]
        for component in COMPONENTS:
            for pod in self.component_pods(component):
                name = pod["metadata"]["name"]
                parts.append(f"--- {name} ---\n"
                             + self.node.container_log(NAMESPACE, name, component)[-3000:])
        return "\n".join(parts)


def _cluster_ip(plane: ControlPlane) -> Callable[[str, str], str | None]:
    """The cluster DNS's lookup: a Service's cluster IP, read from the API server."""
    def lookup(service: str, namespace: str) -> str | None:
        try:
            found = plane.api().get(path_of("v1", "services", namespace=namespace, name=service))
        except ApiError as exc:
            if exc.code == 404:
                return None
            raise
        return str((found.get("spec") or {}).get("clusterIP") or "None")

    return lookup


@contextlib.contextmanager
def chart_cluster(plane_version: str, kubelet_version: str, helm: str, work: Path,
                  image: tuple[Path, str]) -> Iterator[ChartCluster]:
    """A control plane and a real node with kube-proxy and a cluster DNS, the gateway's image
    pushed to a registry on the node's network, nothing installed."""
    bin_dir, binaries = node_parts(plane_version, kubelet_version)
    network = NodeNetwork()
    network.create()
    plane = ControlPlane(bin_dir, work_dir=work / "kube", startup_timeout_s=180,
                         address=network.host_ip, in_cluster=True)
    node: RealNode | None = None
    try:
        with contextlib.ExitStack() as stack:
            started = time.monotonic()
            registry = stack.enter_context(serve_registry(work / "registry", network.host_ip))
            published = publish_gateway_image(registry, image[0])
            print(f"{published.reference} pushed in {time.monotonic() - started:.1f}s")
            stack.enter_context(ClusterDNS(network.host_ip, _cluster_ip(plane),
                                           domain=CLUSTER_DOMAIN))
            node = RealNode(NODE, plane, binaries, network, work / "node", kube_proxy=True,
                            labels={GPU_NODE_LABEL: "true"}, insecure_registries=[registry],
                            cluster_dns=network.host_ip)
            started = time.monotonic()
            plane.start()
            node.start()
            print(f"Kubernetes {plane.version()} and kubelet {kubelet_version} ready in "
                  f"{time.monotonic() - started:.1f}s")
            api = plane.api()
            for namespace in (NAMESPACE, WORKLOADS):
                api.create(path_of("v1", "namespaces"), {
                    "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
            # The node's HAMi-core, as its inventory's GPUs: simulated.
            hami_library = install_hami_core(STATE_ROOT / "hami-core")
            cluster = ChartCluster(plane, node, helm=helm, kubectl_binary=binaries.kubectl,
                                   work=work, image=published, hami_library=hami_library)
            wait_until("the kubernetes Service's root CA in the gateway's namespace",
                       lambda: api.exists(path_of("v1", "configmaps", namespace=NAMESPACE,
                                                  name="kube-root-ca.crt")), 60, cluster.check)
            yield cluster
    finally:
        if node is not None:
            # The pods' logs outlive the node, for a report.
            shutil.copytree(node.pod_logs_dir, work / "pod-logs", dirs_exist_ok=True,
                            ignore_dangling_symlinks=True)
            node.stop()
        plane.stop()
        network.delete()


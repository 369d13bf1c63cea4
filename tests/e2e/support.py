"""The gateway installed on a real control plane, as a user installs it, for the e2e tier.

`install` builds (or finds cached) the Kubernetes binaries of a version with
`hack/build-control-plane.sh`, starts them with `dra_gateway.devkit.realcluster.ControlPlane`,
installs the Helm chart into the API server (its webhook configurations pointed by `webhook.url` at
a webhook served on loopback, with a certificate for `localhost` in the chart's `secret` mode), adds
KWOK nodes for the demo's simulated GPU nodes, and runs the webhook, the allocator and one node
plugin per GPU node as local processes, each with a token of the chart's own ServiceAccount for that
component: what its RBAC does not grant fails as it would in a pod.

The helpers below read placements the way `dra-gateway demo` reports them: pods bound or not,
claims allocated, devices on the pod's node, and how much of each card every allocation holds.
"""

from __future__ import annotations

import base64
import contextlib
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from dra_gateway.devkit.realcluster import (
    Api,
    ControlPlane,
    free_port,
    log_tail,
    path_of,
)
from dra_gateway.devkit.simnode import install_hami_core
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError
from dra_gateway.kube.quantity import bytes_of

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "hack" / "build-control-plane.sh"
# The chart to install: this repository's, or another (a packaged release, say) named by
# DRA_GATEWAY_E2E_CHART.
CHART = Path(os.environ.get("DRA_GATEWAY_E2E_CHART") or REPO / "helm" / "dra-gateway")
EXAMPLES = REPO / "examples"
RELEASE = "dra-gateway"
NAMESPACE = "dra-gateway"
TLS_SECRET = "dra-gateway-local-webhook-tls"
# The demo's simulated GPU nodes (node -> inventory) and its CPU node.
RECOVERY_S = 3  # the node plugins' --recovery-seconds
GPU_NODES = (("gpu-a100-1", "gpu-a100-1.yaml"), ("gpu-h100-1", "gpu-h100-1.yaml"))
CPU_NODES = ("cpu-1",)
# Namespaces the examples use.
WORKLOAD_NAMESPACES = ("inference", "research", "batch", "ml")
# Beyond the controllers ControlPlane runs, the disruption controller, which computes a
# PodDisruptionBudget's status.disruptionsAllowed (the defrag scenario's budgets, the Eviction
# API's answer); a second --controllers adds to the first.
CONTROL_PLANE_ARGS = {"kube-controller-manager": ("--controllers", "disruption-controller")}
# The webhook's --gated-event-after: short, so that a test sees the Event on pods left gated
# while no allocator leads (the chart's default is two minutes).
GATED_EVENT_AFTER_S = 4

JSON = dict[str, Any]


def _fail_or_skip(reason: str) -> None:
    # Here, so that the end-to-end benchmark (dra_gateway.devkit.bench.e2e) imports this module
    # without pytest.
    import pytest

    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def build_binaries(version: str) -> Path:
    """The folder of Kubernetes `version`'s binaries, built by the project's script if needed;
    skips (fails in CI) without Go or when the build fails."""
    return run_build_script(BUILD_SCRIPT, version, f"Kubernetes {version} binaries",
                            f"the e2e tier builds Kubernetes {version}")


def run_build_script(script: Path, version: str, what: str, why: str) -> Path:
    """The folder `hack/<script> VERSION` prints last, once it built `what` (cached); skips
    (fails in CI) without Go, saying `why` Go is needed, or when the script fails."""
    if shutil.which("go") is None:
        _fail_or_skip(f"go not found on PATH: {why} from the Go module proxy with "
                      f"hack/{script.name}")
    started = time.monotonic()
    result = subprocess.run(["bash", str(script), version], capture_output=True,
                            text=True, timeout=1800, check=False)
    if result.returncode != 0:
        _fail_or_skip(f"hack/{script.name} {version} failed ({result.returncode}):\n"
                      + "\n".join(result.stderr.splitlines()[-30:]))
    print(f"{what} ready in {time.monotonic() - started:.0f}s")
    return Path(result.stdout.strip().splitlines()[-1])


def find_helm() -> str:
    """The helm binary (DRA_GATEWAY_HELM, else helm on PATH); skips (fails in CI) without."""
    path = os.environ.get("DRA_GATEWAY_HELM") or shutil.which("helm")
    if not path or not Path(path).is_file():
        _fail_or_skip("helm not found: set DRA_GATEWAY_HELM to a helm v3 binary or put helm on "
                      f"PATH (DRA_GATEWAY_HELM={os.environ.get('DRA_GATEWAY_HELM')!r}); "
                      ".ci/run builds one")
    assert path is not None
    return path


# Waiting ---------------------------------------------------------------------------------------

def wait_until(what: str, ready: Callable[[], bool], timeout_s: float,
               check: Callable[[], None] | None = None, poll_s: float = 0.25) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if check is not None:
            check()
        if ready():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g}s waiting for {what}")
        time.sleep(poll_s)


# Local processes -------------------------------------------------------------------------------

@dataclass
class Component:
    """A gateway component run as a local process (`python -m dra_gateway ...`)."""

    name: str
    args: list[str]
    log: Path
    process: subprocess.Popen[bytes] | None = None
    # What runs `args`: dra-gateway's command line, or a devkit module that wraps it (the NVML
    # stand-in's, for a node with MIG cards).
    module: str = "dra_gateway"

    def start(self) -> None:
        argv = [sys.executable, "-m", self.module, *self.args]
        with self.log.open("ab") as out:
            out.write(("$ " + " ".join(argv) + "\n").encode())
            out.flush()
            self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                            stderr=subprocess.STDOUT,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace_s: float = 10.0) -> None:
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                process.wait()
        self.process = None

    def check(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError(f"{self.name} exited with code {self.process.returncode}:\n"
                                 f"{log_tail(self.log)}")


# The installation ------------------------------------------------------------------------------

@dataclass
class Gateway:
    """A control plane with the gateway installed and its components running."""

    version: str
    feature_gates: Mapping[str, bool]
    plane: ControlPlane
    work: Path
    webhook_port: int
    components: dict[str, Component] = field(default_factory=dict)
    service_accounts: dict[str, str] = field(default_factory=dict)

    @property
    def api(self) -> Api:
        return self.plane.api()

    @property
    def consumable_capacity(self) -> bool:
        """Whether this API server keeps consumable-capacity fields (the gate's default is on
        from 1.36)."""
        minor = int(self.version.split(".")[1])
        return bool(self.feature_gates.get("DRAConsumableCapacity", minor >= 36))

    @property
    def partitionable_devices(self) -> bool:
        """Whether this API server keeps counter sets (DRAPartitionableDevices: on from 1.36)."""
        minor = int(self.version.split(".")[1])
        return bool(self.feature_gates.get("DRAPartitionableDevices", minor >= 36))

    @property
    def device_taints(self) -> bool:
        """Whether this API server keeps device taints (the gate's default is on from 1.36)."""
        minor = int(self.version.split(".")[1])
        return bool(self.feature_gates.get("DRADeviceTaints", minor >= 36))

    def check(self) -> None:
        self.plane.check()
        for component in self.components.values():
            component.check()

    def logs(self) -> str:
        """The tails of every log, for a failure message."""
        parts = [f"--- {name} ---\n{log_tail(path, 15)}" for name, path in self.plane.logs()]
        parts += [f"--- {c.name} ---\n{log_tail(c.log, 15)}" for c in self.components.values()]
        return "\n".join(parts)

    def grep(self, needle: str) -> list[str]:
        """Lines of every log that contain `needle`."""
        found: list[str] = []
        paths = [*(p for _, p in self.plane.logs()), *(c.log for c in self.components.values())]
        for path in paths:
            with contextlib.suppress(OSError):
                found += [f"{path.stem}: {line}" for line in
                          path.read_text(errors="replace").splitlines() if needle in line]
        return found

    def webhook_ready(self) -> bool:
        context = ssl.create_default_context(cafile=str(self.work / "webhook-tls" / "ca.crt"))
        try:
            with urllib.request.urlopen(f"https://localhost:{self.webhook_port}/readyz",
                                        context=context, timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False


def run_helm(helm: str, work: Path, kubeconfig: Path, *args: str, timeout_s: float = 120.0
             ) -> str:
    home = work / "helm-home"
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home),
           "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data"), "KUBECONFIG": str(kubeconfig)}
    result = subprocess.run([helm, *args], capture_output=True, text=True, env=env,
                            timeout=timeout_s, check=False)
    assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stderr}"
    return result.stdout


def _service_accounts(manifest: str) -> dict[str, str]:
    """component -> name of the ServiceAccount the chart made for it."""
    accounts: dict[str, str] = {}
    for obj in yaml.safe_load_all(manifest):
        if isinstance(obj, dict) and obj.get("kind") == "ServiceAccount":
            labels = obj["metadata"].get("labels") or {}
            accounts[str(labels["app.kubernetes.io/component"])] = str(obj["metadata"]["name"])
    return accounts


def short_dir() -> Path:
    """A folder for kubelet-style unix sockets, whose paths must stay within 107 bytes."""
    temp = tempfile.gettempdir()
    return Path(tempfile.mkdtemp(prefix="dg-", dir=temp if len(temp) <= 24 else "/tmp"))


@contextlib.contextmanager
def install(version: str, feature_gates: Mapping[str, bool], bin_dir: Path, helm: str,
            work: Path, *, apiserver_args: Sequence[str] = (), address: str = "127.0.0.1",
            gpu_nodes: Sequence[tuple[str, str]] = GPU_NODES) -> Iterator[Gateway]:
    """The gateway installed on a fresh control plane (`apiserver_args`: more flags for the
    API server, as --runtime-config for an API group off by default; `address`: the one it
    listens on). `gpu_nodes` (node, inventory file of examples/demo) are played by KWOK, with a
    node plugin each; with none, no KWOK node is made and the caller brings its own."""
    from dra_gateway.certs.generate import make_bundle, write_bundle

    extra = {**CONTROL_PLANE_ARGS, "kube-apiserver": tuple(apiserver_args)}
    plane = ControlPlane(bin_dir, feature_gates=feature_gates, work_dir=work / "kube",
                         startup_timeout_s=180, extra_args=extra, address=address)
    sockets = short_dir()
    gateway: Gateway | None = None
    try:
        started = time.monotonic()
        plane.start()
        print(f"Kubernetes {plane.version()} up in {time.monotonic() - started:.1f}s")
        api = plane.api()
        for namespace in (NAMESPACE, *WORKLOAD_NAMESPACES):
            api.create(path_of("v1", "namespaces"), {
                "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
        # The webhook's serving certificate, for the URL the configurations call; the chart
        # takes it as an existing Secret (certificates.mode secret).
        tls = write_bundle(make_bundle(dns_names=["localhost"], ip_addresses=["127.0.0.1"]),
                           work / "webhook-tls")
        api.create(path_of("v1", "secrets", namespace=NAMESPACE), {
            "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
            "metadata": {"name": TLS_SECRET, "namespace": NAMESPACE},
            "data": {key: base64.b64encode(path.read_bytes()).decode() for key, path in
                     (("tls.crt", tls.cert), ("tls.key", tls.key), ("ca.crt", tls.ca_cert))}})
        webhook_port = free_port()
        values = {
            "webhook": {"url": f"https://localhost:{webhook_port}"},
            "certificates": {"mode": "secret", "secret": {
                "name": TLS_SECRET,
                "caBundle": base64.b64encode(tls.ca_cert.read_bytes()).decode()}},
        }
        values_file = work / "values.yaml"
        values_file.write_text(yaml.safe_dump(values))
        run_helm(helm, work, plane.admin_kubeconfig, "install", RELEASE, str(CHART),
              "--namespace", NAMESPACE, "--values", str(values_file))
        manifest = run_helm(helm, work, plane.admin_kubeconfig, "get", "manifest", RELEASE,
                         "--namespace", NAMESPACE)
        gateway = Gateway(version, feature_gates, plane, work, webhook_port,
                          service_accounts=_service_accounts(manifest))
        _seed(plane, kwok_nodes=bool(gpu_nodes))
        _start_components(gateway, sockets, gpu_nodes)
        nodes = [node for node, _ in gpu_nodes]
        try:
            wait_until("the gateway to be ready", lambda: _ready(gateway, nodes), 120,
                       gateway.check)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: still missing {_not_ready(gateway, nodes)}\n"
                                 + gateway.logs()) from None
        yield gateway
    finally:
        if gateway is not None:
            with contextlib.suppress(Exception):
                _dump_state(gateway)
            for component in reversed(list(gateway.components.values())):
                component.stop()
        plane.stop()
        shutil.rmtree(sockets, ignore_errors=True)


def _dump_state(gateway: Gateway) -> None:
    """The cluster's pods, claims, slices and events as YAML beside the logs, for a report."""
    api = gateway.api
    state = {plural: api.list(path_of(version, plural)) for version, plural in (
        ("v1", "pods"), ("resource.k8s.io/v1", "resourceclaims"),
        ("resource.k8s.io/v1", "resourceslices"), ("v1", "events"))}
    (gateway.work / "state.yaml").write_text(yaml.safe_dump(state))


def _seed(plane: ControlPlane, *, kwok_nodes: bool = True) -> None:
    """The demo's nodes (played by KWOK; not without `kwok_nodes`) and the template its
    DRA-native example names."""
    seed = list(yaml.safe_load_all((EXAMPLES / "demo" / "seed.yaml").read_text()))
    api = plane.api()
    nodes = [d for d in seed if d["kind"] == "Node" and kwok_nodes]
    for node in nodes:
        allocatable = node["status"]["allocatable"]
        plane.add_node(node["metadata"]["name"], labels=node["metadata"].get("labels"),
                       cpu=allocatable["cpu"], memory=allocatable["memory"],
                       pods=allocatable["pods"])
    if nodes:
        plane.wait_nodes_ready([n["metadata"]["name"] for n in nodes])
    for doc in seed:
        if doc["kind"] == "ResourceClaimTemplate":
            api.create(path_of("resource.k8s.io/v1", "resourceclaimtemplates",
                               namespace=doc["metadata"]["namespace"]), doc)


def _start_components(gateway: Gateway, sockets: Path,
                      gpu_nodes: Sequence[tuple[str, str]]) -> None:
    plane = gateway.plane
    logs = gateway.work / "logs"
    logs.mkdir(exist_ok=True)

    def kubeconfig(component: str) -> str:
        account = gateway.service_accounts[component]
        return str(plane.service_account_kubeconfig(
            NAMESPACE, account, gateway.work / f"{component}.kubeconfig"))

    # Command lines as the chart's, with local paths; defaults otherwise.
    kube = ("--cluster", "kube", "--namespace", NAMESPACE)
    specs = [
        ("webhook", ["webhook", "--listen", f"127.0.0.1:{gateway.webhook_port}",
                     "--tls-dir", str(gateway.work / "webhook-tls"), *kube,
                     "--gated-event-after", f"{GATED_EVENT_AFTER_S}s",
                     "--kubeconfig", kubeconfig("webhook")]),
        ("allocator", ["allocator", *kube, "--strategy", "default",
                       "--kubeconfig", kubeconfig("allocator")]),
    ]
    for node, inventory in gpu_nodes:
        base = sockets / node
        specs.append((f"node-plugin-{node}", [
            "node-plugin", "serve", "--inventory", str(EXAMPLES / "demo" / inventory),
            "--node-name", node, "--cluster", "kube",
            "--kubeconfig", node_plugin_kubeconfig(gateway, node),
            "--plugins-dir", str(base / "plugins"), "--registry-dir", str(base / "registry"),
            "--cdi-dir", str(base / "cdi"), "--state-dir", str(base / "state"),
            "--fault-file", str(fault_file(gateway, node)),
            "--hami-library", str(install_hami_core(base / "hami-core")),
            "--recovery-seconds", str(RECOVERY_S)]))
    for name, args in specs:
        component = Component(name, args, logs / f"{name}.log")
        gateway.components[name] = component
        component.start()


def fault_file(gateway: Gateway, node: str) -> Path:
    """The file the node plugin of `node` follows for health events (--fault-file)."""
    return gateway.work / f"faults-{node}.jsonl"


def node_plugin_kubeconfig(gateway: Gateway, node: str) -> str:
    """A kubeconfig for the node plugin of `node`, as its DaemonSet pod there gets it: a token
    of the chart's node-plugin ServiceAccount bound to a pod on that node (KWOK runs the
    stand-in pod), so the API server names the node in the token's user."""
    plane = gateway.plane
    account = gateway.service_accounts["node-plugin"]
    pod = plane.api().create(path_of("v1", "pods", namespace=NAMESPACE), {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{account}-{node}", "namespace": NAMESPACE,
                     "labels": {"app.kubernetes.io/component": "node-plugin-stand-in"}},
        "spec": {"nodeName": node, "serviceAccountName": account,
                 "containers": [{"name": "node-plugin", "image": "dra-gateway:e2e"}]}})
    return str(plane.service_account_kubeconfig(
        NAMESPACE, account, gateway.work / f"node-plugin-{node}.kubeconfig", bound_pod=pod))


def _not_ready(gateway: Gateway, nodes: Sequence[str]) -> str:
    """What the gateway still lacks to be ready ("" when ready), for the failure message."""
    if not gateway.webhook_ready():
        return f"the webhook's /readyz on localhost:{gateway.webhook_port}"
    api = gateway.api
    published = {s["spec"].get("nodeName") for s in
                 api.list(path_of("resource.k8s.io/v1", "resourceslices"))
                 if s["spec"].get("driver") == names.DRIVER and s["spec"].get("devices")}
    missing = set(nodes) - published
    if missing:
        return f"ResourceSlices of {', '.join(sorted(missing))}"
    if not _ready(gateway, nodes):
        return "the allocator's Lease"
    return ""


def _ready(gateway: Gateway, nodes: Sequence[str]) -> bool:
    if not gateway.webhook_ready():
        return False
    api = gateway.api
    published = {s["spec"].get("nodeName") for s in
                 api.list(path_of("resource.k8s.io/v1", "resourceslices"))
                 if s["spec"].get("driver") == names.DRIVER and s["spec"].get("devices")}
    if not set(nodes) <= published:
        return False
    try:
        lease = api.get(path_of("coordination.k8s.io/v1", "leases", namespace=NAMESPACE,
                                name="dra-gateway-allocator"))
    except ApiError as exc:
        if exc.code == 404:
            return False
        raise
    return bool((lease.get("spec") or {}).get("holderIdentity"))


# Reading placements ----------------------------------------------------------------------------

def pods(api: Api, namespace: str | None = None, **query: str) -> list[JSON]:
    return api.list(path_of("v1", "pods", namespace=namespace), **query)


def pod_claims(api: Api, pod: Mapping[str, Any]) -> list[JSON]:
    """The ResourceClaims of a pod that exist now."""
    namespace = pod["metadata"]["namespace"]
    generated = {s.get("name"): s.get("resourceClaimName")
                 for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
    claims = []
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = entry.get("resourceClaimName") or generated.get(entry.get("name"))
        if not name:
            continue
        with contextlib.suppress(ApiError):
            claims.append(api.get(path_of("resource.k8s.io/v1", "resourceclaims",
                                          namespace=namespace, name=name)))
    return claims


@dataclass(frozen=True)
class Card:
    node: str
    pool: str
    device: str
    kind: str  # "gpu" | "mig"
    memory: int
    cores: int


def cards(api: Api) -> dict[tuple[str, str, str], Card]:
    """Every device the gateway's node plugins publish, by (driver, pool, device)."""
    found: dict[tuple[str, str, str], Card] = {}
    for item in api.list(path_of("resource.k8s.io/v1", "resourceslices")):
        spec = item["spec"]
        if spec.get("driver") != names.DRIVER:
            continue
        for device in spec.get("devices") or []:
            capacity = device.get("capacity") or {}
            memory = int(bytes_of((capacity.get("memory") or {}).get("value", "0")))
            cores = int((capacity.get("cores") or {}).get("value", names.CORES_PER_CARD))
            kind = ((device.get("attributes") or {}).get("type") or {}).get("string", "gpu")
            key = (names.DRIVER, str(spec["pool"]["name"]), str(device["name"]))
            found[key] = Card(str(spec.get("nodeName")), key[1], key[2], str(kind), memory,
                              cores)
    return found


@dataclass(frozen=True)
class Holding:
    """What one allocation result holds of a device: all of it, or a share."""

    claim: str
    device: tuple[str, str, str]
    whole: bool
    memory: int
    cores: int


def holdings(claim: Mapping[str, Any], published: Mapping[tuple[str, str, str], Card]
             ) -> list[Holding]:
    """Each device a claim's allocation holds and how much of it: `consumedCapacity` (native),
    the allocator's GpuShareAllocation record in the allocation (the fallback form; the
    `dra-gateway.io/shares` annotation is for people and not trusted, as in the gateway), else
    the whole device."""
    from dra_gateway.gpu.shares import allocated_shares, result_key

    allocation = (claim.get("status") or {}).get("allocation") or {}
    recorded = {share.key: share for share in allocated_shares(allocation)}
    name = f"{claim['metadata']['namespace']}/{claim['metadata']['name']}"
    held = []
    for result in (allocation.get("devices") or {}).get("results") or []:
        key = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
        consumed = result.get("consumedCapacity")
        if consumed is None and result_key(result) in recorded:
            consumed = recorded[result_key(result)].consumed_capacity
        card = published.get(key)
        if consumed is None or card is None:
            held.append(Holding(name, key, True, card.memory if card else 0,
                                card.cores if card else names.CORES_PER_CARD))
            continue
        memory = int(bytes_of(consumed.get("memory", "0")))
        cores = int(consumed.get("cores", 0))
        whole = memory >= card.memory and cores >= card.cores
        held.append(Holding(name, key, whole, memory, cores))
    return held


def over_capacity(api: Api) -> list[str]:
    """Every device some allocations together hold more of than it has, counting every
    allocated claim in the cluster, whoever wrote it."""
    published = cards(api)
    by_device: dict[tuple[str, str, str], list[Holding]] = {}
    for claim in api.list(path_of("resource.k8s.io/v1", "resourceclaims")):
        for holding in holdings(claim, published):
            by_device.setdefault(holding.device, []).append(holding)
    problems = []
    for key, held in sorted(by_device.items()):
        card = published.get(key)
        if card is None:
            continue
        memory = sum(h.memory for h in held)
        cores = sum(h.cores for h in held)
        if (any(h.whole for h in held) and len(held) > 1) or memory > card.memory \
                or cores > card.cores:
            problems.append(f"{key[1]}/{key[2]}: {len(held)} allocations hold {memory} of "
                            f"{card.memory} bytes and {cores} of {card.cores} cores: "
                            + ", ".join(f"{h.claim}{' (whole)' if h.whole else ''}"
                                        for h in held))
    return problems


def free_capacity(api: Api) -> dict[tuple[str, str, str], tuple[int, int, bool]]:
    """(free memory, free cores, untouched) per published full GPU (MIG instances left out)."""
    published = cards(api)
    used: dict[tuple[str, str, str], list[Holding]] = {}
    for claim in api.list(path_of("resource.k8s.io/v1", "resourceclaims")):
        for holding in holdings(claim, published):
            used.setdefault(holding.device, []).append(holding)
    free = {}
    for key, card in published.items():
        if card.kind != "gpu":
            continue
        held = used.get(key, [])
        if any(h.whole for h in held):
            free[key] = (0, 0, False)
        else:
            free[key] = (card.memory - sum(h.memory for h in held),
                         card.cores - sum(h.cores for h in held), not held)
    return free


def namespace_state(api: Api, namespace: str) -> str:
    """The namespace's pods and claims as a line each, for a failure message."""
    lines = [f"pod {p['metadata']['name']}: node {p['spec'].get('nodeName')}, phase "
             f"{(p.get('status') or {}).get('phase')}, deleting "
             f"{bool(p['metadata'].get('deletionTimestamp'))}, finalizers "
             f"{p['metadata'].get('finalizers')}" for p in pods(api, namespace)]
    lines += [f"claim {c['metadata']['name']}: allocated "
              f"{bool((c.get('status') or {}).get('allocation'))}, reservedFor "
              f"{[r.get('name') for r in (c.get('status') or {}).get('reservedFor') or ()]}, "
              f"finalizers {c['metadata'].get('finalizers')}"
              for c in api.list(path_of("resource.k8s.io/v1", "resourceclaims",
                                        namespace=namespace))]
    return "\n".join(lines)


def remove_namespace(gateway: Gateway, namespace: str, *, timeout_s: float = 60.0) -> None:
    """Delete the namespace's pods, wait until they are gone and their claims released (the
    cards free for the next test), then delete the namespace and wait until it is gone."""
    api = gateway.api
    for pod in pods(api, namespace):
        with contextlib.suppress(ApiError):
            api.delete(path_of("v1", "pods", namespace=namespace,
                               name=pod["metadata"]["name"]), grace_period_s=0)

    def released() -> bool:
        return not pods(api, namespace) and not any(
            (c.get("status") or {}).get("allocation")
            for c in api.list(path_of("resource.k8s.io/v1", "resourceclaims",
                                      namespace=namespace)))

    try:
        wait_until(f"the pods of {namespace} to be gone and their claims released", released,
                   timeout_s, gateway.check)
    except AssertionError as exc:
        raise AssertionError(f"{exc}:\n{namespace_state(api, namespace)}") from None
    api.delete(path_of("v1", "namespaces", name=namespace))
    wait_until(f"namespace {namespace} to be gone",
               lambda: not api.exists(path_of("v1", "namespaces", name=namespace)), 120)


def remove_gpu_node(gateway: Gateway, node: str) -> None:
    """Take away a GPU node a test added: its node plugin, the ResourceSlices of its pool (its
    devices and counter sets), the installation's pods on it (stand-ins KWOK cannot stop) and
    the node. Errors are ignored: it runs in a test's clean-up, whatever the test left."""
    api = gateway.api
    plugin = gateway.components.pop(f"node-plugin-{node}", None)
    if plugin is not None:
        plugin.stop()
    for item in api.list(path_of("resource.k8s.io/v1", "resourceslices")):
        if item["spec"].get("nodeName") == node or item["spec"]["pool"]["name"] == node:
            with contextlib.suppress(ApiError):
                api.delete(path_of("resource.k8s.io/v1", "resourceslices",
                                   name=item["metadata"]["name"]))
    for pod in api.list(path_of("v1", "pods", namespace=NAMESPACE)):
        if pod["spec"].get("nodeName") == node:
            with contextlib.suppress(ApiError):
                api.delete(path_of("v1", "pods", namespace=NAMESPACE,
                                   name=pod["metadata"]["name"]), grace_period_s=0)
    with contextlib.suppress(ApiError):
        api.delete(path_of("v1", "nodes", name=node))


def apply_manifests(api: Api, documents: Sequence[Mapping[str, Any]]) -> list[JSON]:
    """Create each object through the API, at the REST path of its kind."""
    plurals = {"Pod": ("v1", "pods"), "Deployment": ("apps/v1", "deployments"),
               "Job": ("batch/v1", "jobs"), "CronJob": ("batch/v1", "cronjobs")}
    created = []
    for document in documents:
        api_version, plural = plurals[str(document["kind"])]
        namespace = str(document["metadata"].get("namespace") or "default")
        created.append(api.create(path_of(api_version, plural, namespace=namespace), document))
    return created


def pod_devices(api: Api, pod: JSON) -> list[tuple[str, str, bool]]:
    """(node, device, whole) of every device the pod's allocated claims hold."""
    published = cards(api)
    held = []
    for claim in pod_claims(api, pod):
        for holding in holdings(claim, published):
            card = published.get(holding.device)
            held.append((card.node if card else "?", holding.device[2], holding.whole))
    return held


def placed_on_its_node(api: Api, pod: JSON) -> bool:
    """Bound, and its claims allocated on devices of the node it is bound to."""
    node = pod["spec"].get("nodeName")
    devices = pod_devices(api, pod)
    return bool(node) and bool(devices) and all(d[0] == node for d in devices)

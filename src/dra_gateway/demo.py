"""`dra-gateway demo`: the main job on the embedded default, no cluster needed.

It starts, as separate processes of the same Python interpreter, the embedded API server
(`cluster serve`, with its control-plane stand-in), the webhook, the allocator and one node
plugin per simulated GPU node, each against the served API through the same kubernetes-asyncio
code it uses in production; then it creates the example pods through that API, waits until
they are bound and shows what each asked for, the claim template it was translated to and the
GPU share it got. Playing the kubelet, it then asks each node plugin over its DRA gRPC socket to
prepare the claims of the pods bound to its node, and shows what a container would see (the CDI
devices and their environment). The embedded cluster runs no workload controllers, so for a
Deployment, Job, CronJob or training job the demo creates the pods such a controller would
(`<name>-<role>-<i>`).

With the bundled examples it then shows one GPUQuota at work (`examples/demo/quota.yaml`, served
with `cluster serve --policies`): of two pods of namespace quota-demo that the quota cannot hold
together, the second waits gated with the condition dra-gateway.io/QuotaExceeded and an Event
until the demo marks the first finished (phase Succeeded, as its kubelet would), then is placed.

Every child process is stopped (SIGTERM, then SIGKILL after a grace period) whatever happens,
errors and Ctrl-C included; each writes its log into the work directory, and a failure names
the step, the process and the tail of its log. This module decides nothing about pods: it
drives the components and reports what they did.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dra_gateway.kube.cluster.port import Cluster

EXAMPLES = Path(__file__).resolve().parent / "examples"
DEMO_DIR = EXAMPLES / "demo"
DEFAULT_PODS = tuple(sorted((EXAMPLES / "pods").glob("*.yaml")))
# The quota shown at work with the bundled examples, and the two pods it cannot hold together.
QUOTA_POLICIES = DEMO_DIR / "quota.yaml"
QUOTA_PODS = DEMO_DIR / "quota-pods.yaml"
QUOTA_CONDITION = "dra-gateway.io/QuotaExceeded"
# The simulated GPU nodes: node name -> inventory (the seed holds their Node objects).
NODES: tuple[tuple[str, str], ...] = (
    ("gpu-a100-1", "gpu-a100-1.yaml"),
    ("gpu-h100-1", "gpu-h100-1.yaml"),
)
NAMESPACE = "dra-gateway"
WEBHOOK_SERVICE = "dra-gateway-webhook"
GRACE_S = 5.0
LOG_TAIL_LINES = 25
_POLL_S = 0.2
# Most pods the demo creates (workloads' replicas included): its nodes hold a dozen GPUs.
MAX_PODS = 500
# Longest work directory whose node folders still fit a kubelet socket path (107 bytes).
_SHORT_PATH = 48
# Resource names the demo does not count as a legacy GPU request when it shows one.
_PLAIN_RESOURCES = ("cpu", "memory", "ephemeral-storage", "pods")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "demo", help="run the gateway end to end on an embedded cluster",
        description="Start the embedded API server, the webhook, the allocator and node plugins "
                    "for simulated GPU nodes as separate processes, create example pods that "
                    "ask for GPUs the legacy way, and show how each was translated and placed.")
    parser.add_argument("--pods", action="append", default=[], metavar="FILE", type=Path,
                        help="manifests to create instead of the bundled examples (Pods, or "
                             "workloads whose pods the demo creates; repeatable)")
    parser.add_argument("--timeout", type=float, default=120.0, metavar="SECONDS",
                        help="how long to wait for the pods to be placed (default: %(default)s)")
    parser.add_argument("--startup-timeout", type=float, default=120.0, metavar="SECONDS",
                        help="how long the components may take to start and become ready "
                             "(default: %(default)s)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (logs, kubeconfig, certificates) and "
                             "print where it is")
    parser.add_argument("--work-dir", type=Path, metavar="DIR",
                        help="work in DIR (created if missing, never removed) instead of a "
                             "temporary directory")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table",
                        help="table for people (default) or a JSON summary on standard output")
    parser.set_defaults(func=run)


class DemoError(Exception):
    """A step of the demo failed; `log` is the log file of the process at fault, if any."""

    def __init__(self, step: str, message: str, *, log: Path | None = None) -> None:
        super().__init__(f"{step}: {message}")
        self.step = step
        self.message = message
        self.log = log


class _Terminated(BaseException):
    """SIGTERM reached the demo: unwind like Ctrl-C so that every child is stopped."""


# Workloads -------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class DemoPod:
    """A pod to create, and the manifest document it came from."""

    pod: dict[str, Any]
    source: str  # e.g. "Deployment research/notebook"

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"].get("namespace") or "default")

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])


def _replicas(document: Any, path: str) -> int:
    """Replicas of the pod template at `path` (its parent's `replicas`, else 1)."""
    parts = [p for p in path.replace("[", ".[").split(".") if p]
    parent: Any = document
    for part in parts[:-1]:
        parent = parent[int(part[1:-1])] if part.startswith("[") else parent[part]
    value = parent.get("replicas") if isinstance(parent, dict) else None
    if isinstance(value, bool) or not isinstance(value, int):
        return 1
    return max(value, 0)


def _role(path: str) -> str:
    """`spec.pytorchReplicaSpecs.Worker.template` -> "worker"; a plain pod template -> ""."""
    parts = [p for p in path.split(".") if p and not p.startswith("[")]
    if len(parts) >= 2 and parts[-1] == "template" and parts[-2] not in ("spec", "jobTemplate"):
        return parts[-2].lower()
    return ""


def _objects(documents: Sequence[Any], source: str) -> Iterator[tuple[int, str, Any]]:
    """(index, how messages name it, object) per object; the items of a `kind: List` (what
    `kubectl get -o yaml` writes) are objects of their own."""
    for index, document in enumerate(documents):
        where = f"{source} (document {index + 1})"
        items = document.get("items") if isinstance(document, dict) else None
        if (isinstance(items, list) and isinstance(document.get("kind"), str)
                and document["kind"].endswith("List")):
            for number, item in enumerate(items):
                yield number, f"{where[:-1]}, item {number + 1})", item
        else:
            yield index, where, document


def pods_of(documents: Sequence[Any], source: str) -> list[DemoPod]:
    """The pods to create for manifests: Pods as they are, workloads expanded to their pods."""
    from dra_gateway.translator.manifests import describe, pod_specs

    pods: list[DemoPod] = []
    for index, where, document in _objects(documents, source):
        if not isinstance(document, dict) or not isinstance(document.get("metadata"), dict):
            raise DemoError("reading pods", f"{where}: expected a Kubernetes object with "
                            "apiVersion, kind and metadata")
        meta = document["metadata"]
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise DemoError("reading pods", f"{where}: metadata.name is required")
        namespace = str(meta.get("namespace") or "default")
        found = list(pod_specs(document))
        if not found:
            raise DemoError("reading pods", f"{where}: {describe(document, index)} holds no pod "
                            "(no spec.containers anywhere); give Pods or workloads")
        label = describe(document, index)
        if document.get("kind") == "Pod" and not found[0][0]:
            pod = dict(document)
            pod["metadata"] = {**meta, "namespace": namespace}
            pods.append(DemoPod(pod, label))
            continue
        for path, template in found:
            role = _role(path)
            replicas = _replicas(document, path)
            if len(pods) + replicas > MAX_PODS:
                # Each replica becomes a pod here: a production replica count hung the demo.
                raise DemoError("reading pods", f"{where}: {label} asks for {replicas} "
                                f"replicas; the demo creates at most {MAX_PODS} pods on its "
                                "three nodes: lower its replicas")
            for replica in range(replicas):
                pod_meta = dict(template.get("metadata") or {})
                pod_meta["name"] = "-".join(p for p in (name, role, str(replica)) if p)
                pod_meta["namespace"] = namespace
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta,
                       "spec": template["spec"]}
                pods.append(DemoPod(pod, label))
    seen: set[tuple[str, str]] = set()
    for item in pods:
        key = (item.namespace, item.name)
        if key in seen:
            raise DemoError("reading pods", f"pod {item.namespace}/{item.name} ({item.source}) "
                            "appears twice; give each pod or workload its own name")
        seen.add(key)
    return pods


def read_pods(paths: Sequence[Path]) -> list[DemoPod]:
    import yaml

    pods: list[DemoPod] = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise DemoError("reading pods", f"cannot read {path}: {exc.strerror or exc}; pass "
                            "an existing manifest file to --pods") from None
        except UnicodeDecodeError:
            raise DemoError("reading pods", f"{path} is not a text file (not UTF-8): pass YAML "
                            "or JSON manifests to --pods") from None
        try:
            documents = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or exc
            raise DemoError("reading pods", f"{path} is not valid YAML{where}: "
                            f"{problem}") from None
        pods.extend(pods_of(documents, str(path)))
    if not pods:
        raise DemoError("reading pods", f"no pods in {', '.join(map(str, paths))}: give at "
                        "least one Pod or workload")
    return pods


# Child processes -------------------------------------------------------------------------------

def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return f"(no log at {path})"
    tail = text.rstrip("\n").splitlines()[-lines:]
    return "\n".join(tail) if tail else "(empty log)"


@dataclass
class Child:
    name: str
    argv: list[str]
    log: Path
    process: subprocess.Popen[bytes]

    def check(self, step: str) -> None:
        code = self.process.poll()
        if code is not None:
            raise DemoError(step, f"{self.name} exited with code {code}", log=self.log)


@dataclass
class Children:
    """The processes the demo started, stopped together and always."""

    log_dir: Path
    started: list[Child] = field(default_factory=list)

    def start(self, name: str, *args: str) -> Child:
        argv = [sys.executable, "-m", "dra_gateway", *args]
        log = self.log_dir / f"{name}.log"
        with log.open("wb") as out:
            out.write(("$ " + " ".join(argv) + "\n").encode())
            out.flush()
            env = {**os.environ, "PYTHONUNBUFFERED": "1"}
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out,
                                       stderr=subprocess.STDOUT, env=env)
        child = Child(name, argv, log, process)
        self.started.append(child)
        return child

    def check(self, step: str) -> None:
        for child in self.started:
            child.check(step)

    def stop(self, grace: float = GRACE_S) -> list[str]:
        """SIGTERM every child, SIGKILL what is left after `grace`; names of those killed.

        The first child (the API server) goes last, so the others can still release their
        Lease and say goodbye through it.
        """
        killed = self._stop(self.started[1:], grace)
        return killed + self._stop(self.started[:1], grace)

    @staticmethod
    def _stop(children: Sequence[Child], grace: float) -> list[str]:
        for child in children:
            if child.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        killed: list[str] = []
        for child in children:
            try:
                child.process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                killed.append(child.name)
                with contextlib.suppress(ProcessLookupError):
                    child.process.kill()
                child.process.wait()
        return killed


def free_port() -> int:
    """A loopback port free right now (the API server must know the webhook's before both run)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Setup -----------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Layout:
    root: Path
    # Node plugins' kubelet sockets live below here: a unix socket path holds at most 107
    # bytes, so a deep work directory gets a short temporary one beside it.
    nodes_root: Path

    @property
    def certs(self) -> Path:
        return self.root / "certs"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    @property
    def seed(self) -> Path:
        return self.root / "seed-gateway.yaml"

    def node(self, name: str) -> Path:
        return self.nodes_root / name


def prepare(layout: Layout) -> None:
    """Certificates and the gateway's cluster-wide objects, written into the work directory."""
    import yaml

    from dra_gateway.certs.generate import make_bundle, write_bundle
    from dra_gateway.node_plugin.deviceclasses import device_classes
    from dra_gateway.translator.rules import load_rules
    from dra_gateway.webhook.config import configurations

    for folder in (layout.logs, layout.nodes_root):
        folder.mkdir(parents=True, exist_ok=True)
    # The API server dials the webhook as NAME.NAMESPACE.svc (checked against the certificate)
    # at the loopback address it was given for that Service.
    bundle = make_bundle(dns_names=[f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc"],
                         ip_addresses=["127.0.0.1"])
    paths = write_bundle(bundle, layout.certs)
    mutating, validating = configurations(
        load_rules(), service_namespace=NAMESPACE, service_name=WEBHOOK_SERVICE,
        ca_bundle=paths.ca_cert.read_bytes(), gateway_namespace=NAMESPACE)
    documents = [*device_classes(), mutating, validating]
    layout.seed.write_text(yaml.safe_dump_all(documents, sort_keys=False), encoding="utf-8")


def start_api(children: Children, layout: Layout, webhook_port: int, *,
              policies: Sequence[Path] = ()) -> Child:
    return children.start(
        "cluster", "cluster", "serve", "--listen", "127.0.0.1:0",
        "--kubeconfig", str(layout.kubeconfig),
        "--seed", str(DEMO_DIR / "seed.yaml"), "--seed", str(layout.seed),
        *(arg for path in policies for arg in ("--policies", str(path))),
        "--webhook-service", f"{NAMESPACE}/{WEBHOOK_SERVICE}=127.0.0.1:{webhook_port}")


def start_components(children: Children, layout: Layout, webhook_port: int) -> None:
    kube = ("--cluster", "kube", "--kubeconfig", str(layout.kubeconfig))
    # The embedded API server keeps consumable-capacity fields (as Kubernetes 1.36 does): the
    # node plugins and the allocator both detect it with their defaults, so shared cards are
    # published natively and the allocator hands out native shares.
    children.start("webhook", "webhook", "--listen", f"127.0.0.1:{webhook_port}",
                   "--tls-dir", str(layout.certs), "--ca-file", str(layout.certs / "ca.crt"),
                   "--namespace", NAMESPACE, *kube)
    children.start("allocator", "allocator", "--namespace", NAMESPACE, *kube)
    for node, inventory in NODES:
        base = layout.node(node)
        children.start(f"node-plugin-{node}", "node-plugin", "serve",
                       "--inventory", str(DEMO_DIR / inventory), "--node-name", node,
                       "--plugins-dir", str(base / "plugins"),
                       "--registry-dir", str(base / "registry"),
                       "--cdi-dir", str(base / "cdi"), "--state-dir", str(base / "state"),
                       *kube)


async def wait_for(step: str, children: Children, deadline: float, culprit: Child | None,
                   ready: Callable[[], Awaitable[bool]], waiting_for: str) -> None:
    """Poll the coroutine function `ready` until true; children dying or time running out fail."""
    while True:
        children.check(step)
        if await ready():
            return
        if time.monotonic() > deadline:
            raise DemoError(step, f"timed out waiting for {waiting_for}",
                            log=culprit.log if culprit else None)
        await asyncio.sleep(_POLL_S)


def _api_started(layout: Layout, api: Child) -> bool:
    return layout.kubeconfig.is_file() and "serving the Kubernetes API" in log_tail(api.log, 200)


def _webhook_ssl(layout: Layout) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(layout.certs / "ca.crt"))


async def webhook_ready(port: int, context: ssl.SSLContext) -> bool:
    import aiohttp

    try:
        async with aiohttp.ClientSession() as session, session.get(
                f"https://127.0.0.1:{port}/readyz", ssl=context,
                timeout=aiohttp.ClientTimeout(total=2)) as response:
            return response.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError):
        return False


async def slices_published(cluster: Cluster) -> set[str]:
    from dra_gateway.kube import names
    from dra_gateway.kube.resources import RESOURCE_SLICES

    listed = await cluster.list(RESOURCE_SLICES)
    return {str(s["spec"].get("nodeName")) for s in listed.items
            if s["spec"].get("driver") == names.DRIVER and s["spec"].get("devices")}


async def allocator_leads(cluster: Cluster) -> bool:
    from dra_gateway.kube.cluster.port import NotFound
    from dra_gateway.kube.resources import LEASES

    try:
        lease = await cluster.get(LEASES, "dra-gateway-allocator", namespace=NAMESPACE)
    except NotFound:
        return False
    return bool((lease.get("spec") or {}).get("holderIdentity"))


# Placement -------------------------------------------------------------------------------------

@dataclass
class PodReport:
    namespace: str
    name: str
    source: str
    legacy: str
    rule: str
    templates: list[str]
    expected: str  # "bound" | "pending"
    why_pending: str = ""
    node: str | None = None
    claims: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "source": self.source,
                "legacyRequest": self.legacy, "rule": self.rule or None,
                "templates": self.templates, "expected": self.expected,
                "whyPending": self.why_pending or None, "node": self.node,
                "claims": self.claims, "ok": self.ok, "problems": self.problems}


def legacy_request(original: Mapping[str, Any], created: Mapping[str, Any]) -> tuple[str, str]:
    """What the pod asked for the legacy way, and the rule that translated it."""
    from dra_gateway.kube import names, objects

    annotations = objects.annotations(created)
    recorded = annotations.get(names.ANNOTATION_TRANSLATED)
    parts: list[str] = []
    rules: list[str] = []
    if recorded:
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            for container in (json.loads(recorded).get("containers") or {}).values():
                amounts = {**(container.get("requests") or {}), **(container.get("limits") or {})}
                parts.extend(f"{k}={v}" for k, v in amounts.items())
                if container.get("rule") and container["rule"] not in rules:
                    rules.append(str(container["rule"]))
    if not parts:
        spec = original.get("spec") or {}
        for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            resources = container.get("resources") or {}
            amounts = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
            parts.extend(f"{k}={v}" for k, v in amounts.items()
                         if k not in _PLAIN_RESOURCES and not k.startswith("hugepages-"))
        if not parts and spec.get("resourceClaims"):
            parts.append("DRA claims (native)")
    return " ".join(parts) or "no GPU", ",".join(rules)


def _quantity_bytes(value: Any) -> int | None:
    from dra_gateway.kube.quantity import QuantityError, bytes_of

    try:
        return int(bytes_of(value))
    except (QuantityError, ValueError, TypeError):
        return None


def human_bytes(amount: int | None) -> str:
    if amount is None:
        return "?"
    units = (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
    for unit, size in units:  # exact first: 8000Mi stays 8000Mi, not 7.812Gi
        if amount >= size and amount % size == 0:
            return f"{amount // size}{unit}"
    for unit, size in units:
        if amount >= size:
            return f"{amount / size:.4g}{unit}"
    return str(amount)


def claim_devices(claim: Mapping[str, Any], slices: Mapping[tuple[str, str, str], Any]
                  ) -> list[dict[str, Any]]:
    """Each allocated device with its node and the share of it the claim holds."""
    from dra_gateway.kube import names
    from dra_gateway.kube.shares import recorded_shares, result_key

    allocation = (claim.get("status") or {}).get("allocation") or {}
    recorded = recorded_shares(claim)
    devices: list[dict[str, Any]] = []
    for result in (allocation.get("devices") or {}).get("results") or []:
        key = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
        published = slices.get(key) or {}
        capacity = {k: (v or {}).get("value") for k, v in
                    ((published.get("device") or {}).get("capacity") or {}).items()}
        consumed = result.get("consumedCapacity")
        if consumed is None:
            consumed = next((r.consumed_capacity for r in recorded
                             if r.key == result_key(result)), None)
        held = consumed if consumed is not None else capacity
        memory = _quantity_bytes(held.get("memory")) if held.get("memory") is not None else None
        cores = held.get("cores")
        if consumed is None and cores is None and published.get("type") == "gpu":
            cores = str(names.CORES_PER_CARD)
        # A share of the whole card's capacity is the whole card, whatever the world.
        whole = consumed is None or all(
            _quantity_bytes(consumed.get(k)) == _quantity_bytes(capacity.get(k))
            for k in capacity)
        request = str(result.get("request") or "")
        devices.append({
            "request": result.get("request"), "driver": key[0], "pool": key[1],
            "device": key[2], "node": published.get("node"),
            "share": "whole" if whole else "shared",
            "memory": memory, "cores": int(str(cores)) if cores is not None else None,
            "enforcement": _share_config(allocation, request).get("enforcement"),
        })
    return devices


def _share_config(allocation: Mapping[str, Any], request: str) -> dict[str, Any]:
    """The GpuShareConfig parameters the allocation hands a request (later entries win)."""
    from dra_gateway.kube.models import share_parameters

    configs = (allocation.get("devices") or {}).get("config") or []
    try:
        return share_parameters(configs, request)
    except ValueError:
        return {}  # the node plugin refuses such a claim; the demo only shows what it can


def describe_devices(devices: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for d in devices:
        what = [human_bytes(d["memory"])] if d["memory"] is not None else []
        if d["cores"] is not None:
            what.append(f"{d['cores']}% cores")
        if d["share"] == "shared" and d.get("enforcement"):
            # What the share's numbers mean in the container: limits or only accounting.
            what.append("not enforced" if d["enforcement"] == "none"
                        else f"{d['enforcement']} limits")
        parts.append(f"{d['device']} ({d['share']}: {', '.join(what) or 'device'})")
    return "; ".join(parts) or "-"


# The run ---------------------------------------------------------------------------------------

@dataclass
class Outcome:
    reports: list[PodReport]
    template: dict[str, Any] | None
    template_of: str | None
    quota: QuotaReport | None = None


def _index_slices(items: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, str], Any]:
    index: dict[tuple[str, str, str], Any] = {}
    for item in items:
        spec = item.get("spec") or {}
        pool = (spec.get("pool") or {}).get("name")
        for device in spec.get("devices") or []:
            attributes = device.get("attributes") or {}
            kind = (attributes.get("type") or {}).get("string")
            index[(str(spec.get("driver")), str(pool), str(device.get("name")))] = {
                "node": spec.get("nodeName"), "device": device, "type": kind}
    return index


async def _template_classes(cluster: Cluster, namespace: str, name: str) -> set[str]:
    from dra_gateway.kube.cluster.port import NotFound
    from dra_gateway.kube.resources import RESOURCE_CLAIM_TEMPLATES

    try:
        template = await cluster.get(RESOURCE_CLAIM_TEMPLATES, name, namespace=namespace)
    except NotFound:
        return set()
    requests = (((template.get("spec") or {}).get("spec") or {}).get("devices") or {}).get(
        "requests") or []
    classes: set[str] = set()
    for request in requests:
        if (request.get("exactly") or {}).get("deviceClassName"):
            classes.add(str(request["exactly"]["deviceClassName"]))
        for alternative in request.get("firstAvailable") or []:
            if alternative.get("deviceClassName"):
                classes.add(str(alternative["deviceClassName"]))
    return classes


async def create_pods(cluster: Cluster, pods: Sequence[DemoPod]) -> list[PodReport]:
    from dra_gateway.kube.cluster.port import ApiError
    from dra_gateway.kube.resources import DEVICE_CLASSES, PODS

    installed = {c["metadata"]["name"] for c in (await cluster.list(DEVICE_CLASSES)).items}
    reports = []
    for item in pods:
        try:
            created = await cluster.create(PODS, item.pod, namespace=item.namespace)
        except ApiError as exc:
            raise DemoError("creating pods", f"the API refused pod {item.namespace}/{item.name} "
                            f"({item.source}): {exc.message}") from None
        legacy, rule = legacy_request(item.pod, created)
        templates = [str(e["resourceClaimTemplateName"])
                     for e in (created.get("spec") or {}).get("resourceClaims") or []
                     if e.get("resourceClaimTemplateName")]
        missing: set[str] = set()
        for template in templates:
            missing |= await _template_classes(cluster, item.namespace, template) - installed
        report = PodReport(item.namespace, item.name, item.source, legacy, rule, templates,
                           expected="pending" if missing else "bound")
        if missing:
            report.why_pending = (f"DeviceClass {', '.join(sorted(missing))} is not installed "
                                  "here: on a real cluster its vendor's DRA driver serves it")
        if not rule and not templates and legacy != "no GPU":
            # Nothing in the embedded cluster would stop such a pod from being bound.
            report.problems.append(
                f"its request {legacy} was not translated into a claim: no rule matches it, or "
                f"the webhook skips its namespace (it skips {NAMESPACE} and kube-system)")
        reports.append(report)
    return reports


async def wait_bound(cluster: Cluster, children: Children, reports: Sequence[PodReport],
                     deadline: float) -> None:
    from dra_gateway.kube.resources import PODS

    waiting = {(r.namespace, r.name) for r in reports if r.expected == "bound"}
    while waiting:
        children.check("placing pods")
        for namespace, name in sorted(waiting):
            pod = await cluster.get(PODS, name, namespace=namespace)
            if (pod.get("spec") or {}).get("nodeName"):
                waiting.discard((namespace, name))
        if waiting and time.monotonic() > deadline:
            return  # the caller reports each pod still unbound
        if waiting:
            await asyncio.sleep(_POLL_S)


async def inspect(cluster: Cluster, reports: Sequence[PodReport]) -> None:
    """Fill in each pod's node and claims, and note every way it differs from what it should."""
    from dra_gateway.kube.cluster.port import NotFound
    from dra_gateway.kube.resources import PODS, RESOURCE_CLAIMS, RESOURCE_SLICES

    slices = _index_slices((await cluster.list(RESOURCE_SLICES)).items)
    for report in reports:
        pod = await cluster.get(PODS, report.name, namespace=report.namespace)
        spec = pod.get("spec") or {}
        report.node = spec.get("nodeName")
        generated = {s.get("name"): s.get("resourceClaimName")
                     for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        for entry in spec.get("resourceClaims") or []:
            claim_name = entry.get("resourceClaimName") or generated.get(entry.get("name"))
            info: dict[str, Any] = {"name": claim_name, "podClaim": entry.get("name"),
                                    "template": entry.get("resourceClaimTemplateName"),
                                    "allocated": False, "devices": []}
            report.claims.append(info)
            if not claim_name:
                if report.expected == "bound":
                    report.problems.append(f"claim {entry.get('name')} was never created")
                continue
            try:
                claim = await cluster.get(RESOURCE_CLAIMS, claim_name,
                                          namespace=report.namespace)
            except NotFound:
                report.problems.append(f"claim {claim_name} does not exist")
                continue
            info["uid"] = claim["metadata"].get("uid")
            info["allocated"] = bool((claim.get("status") or {}).get("allocation"))
            info["devices"] = claim_devices(claim, slices)
            if report.expected == "pending":
                continue
            if not info["allocated"]:
                report.problems.append(f"claim {claim_name} is not allocated")
            elif not info["devices"]:
                report.problems.append(f"claim {claim_name} is allocated no device")
            for device in info["devices"]:
                if device["node"] is None:
                    report.problems.append(f"claim {claim_name}: device {device['pool']}/"
                                           f"{device['device']} is published by no slice")
                elif report.node and device["node"] != report.node:
                    report.problems.append(f"claim {claim_name}: device {device['device']} is "
                                           f"on {device['node']}, the pod on {report.node}")
        if report.expected == "bound" and not report.node:
            gates = [g.get("name") for g in spec.get("schedulingGates") or []]
            report.problems.insert(0, "not bound" + (f" (still gated by {', '.join(gates)})"
                                                     if gates else ""))
            reason = await _latest_warning(cluster, report.namespace, report.name)
            if reason:
                report.problems.insert(1, reason)
        if report.expected == "pending" and report.node:
            report.problems.append(f"bound to {report.node} although {report.why_pending}")


async def _latest_warning(cluster: Cluster, namespace: str, pod: str) -> str | None:
    """The last Warning event about a pod (the allocator says there why it cannot place it)."""
    from dra_gateway.kube.resources import EVENTS

    events = [e for e in (await cluster.list(EVENTS, namespace=namespace)).items
              if e.get("type") == "Warning"
              and (e.get("involvedObject") or {}).get("kind") == "Pod"
              and (e.get("involvedObject") or {}).get("name") == pod]
    if not events:
        return None
    last = max(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))
    source = (last.get("source") or {}).get("component") or last.get("reportingComponent")
    return f"{source or 'event'}: {last.get('reason')}: {last.get('message')}"


def _cdi_env(cdi_dir: Path) -> dict[str, list[str]]:
    """Environment per qualified CDI device name (`vendor/class=name`) of the specs in a dir."""
    env: dict[str, list[str]] = {}
    for path in sorted(cdi_dir.glob("*.json")):
        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        common = list((spec.get("containerEdits") or {}).get("env") or [])
        for device in spec.get("devices") or []:
            edits = device.get("containerEdits") or {}
            env[f"{spec.get('kind')}={device.get('name')}"] = [*common,
                                                                *(edits.get("env") or [])]
    return env


async def prepare_on_nodes(layout: Layout, reports: Sequence[PodReport]) -> None:
    """Play the kubelet: ask each node's plugin to prepare the claims of the pods bound there.

    Over the plugin's DRA gRPC socket, as the kubelet does before starting a container; the
    CDI specs the plugin writes say what each container would see (devices and limits).
    """
    import grpc
    import grpc.aio

    from dra_gateway.kube import names
    from dra_gateway.node_plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc
    from dra_gateway.node_plugin.server import dra_socket_path

    simulated = {node for node, _ in NODES}
    for node in sorted(simulated):
        work = [(r, c) for r in reports if r.node == node for c in r.claims
                if c["allocated"] and c.get("uid")
                and any(d["driver"] == names.DRIVER for d in c["devices"])]
        if not work:
            continue
        socket_path = dra_socket_path(layout.node(node) / "plugins")
        request = dra_v1_pb2.NodePrepareResourcesRequest(claims=[
            dra_v1_pb2.Claim(namespace=r.namespace, name=c["name"], uid=c["uid"])
            for r, c in work])
        try:
            async with grpc.aio.insecure_channel(f"unix://{socket_path}") as channel:
                response = await dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                    request, timeout=30)
        except grpc.aio.AioRpcError as exc:
            raise DemoError("preparing claims on the nodes", f"NodePrepareResources on "
                            f"{socket_path} failed: {exc.code().name}: {exc.details()}",
                            log=layout.logs / f"node-plugin-{node}.log") from None
        env = _cdi_env(layout.node(node) / "cdi")
        for report, claim in work:
            result = response.claims[claim["uid"]]
            ids = [i for d in result.devices for i in d.cdi_device_ids]
            claim["prepared"] = {"error": result.error or None, "cdiDevices": ids,
                                 # Devices of one request carry the same environment.
                                 "env": list(dict.fromkeys(e for i in ids
                                                           for e in env.get(i, [])))}
            if result.error:
                report.problems.append(f"node plugin on {node} could not prepare claim "
                                       f"{claim['name']}: {result.error}")
            elif not ids:
                report.problems.append(f"node plugin on {node} prepared claim {claim['name']} "
                                       "without any CDI device")


async def show_template(cluster: Cluster, reports: Sequence[PodReport]
                        ) -> tuple[dict[str, Any] | None, str | None]:
    """One translated pod's ResourceClaimTemplate, preferring a shared (fractional) one."""
    from dra_gateway.kube.resources import RESOURCE_CLAIM_TEMPLATES

    candidates = [r for r in reports if r.rule and r.templates]
    candidates.sort(key=lambda r: not any(d["share"] == "shared" for c in r.claims
                                          for d in c["devices"]))
    for report in candidates:
        template = await cluster.get(RESOURCE_CLAIM_TEMPLATES, report.templates[0],
                                     namespace=report.namespace)
        meta = template.get("metadata") or {}
        for noisy in ("uid", "resourceVersion", "creationTimestamp", "managedFields",
                      "generation"):
            meta.pop(noisy, None)
        return template, f"{report.namespace}/{report.name}"
    return None, None


@dataclass
class QuotaReport:
    """The quota step: the waiting pod's condition and Event, and where each pod went."""

    quota: str  # namespace/name of the GPUQuota
    hard: dict[str, Any] = field(default_factory=dict)
    first: str = ""
    first_node: str | None = None
    waiting: str = ""
    condition: dict[str, Any] | None = None  # the waiting pod's condition while held back
    event: str | None = None  # the QuotaExceeded Event's message
    used_while_waiting: dict[str, Any] = field(default_factory=dict)
    node: str | None = None  # where the waiting pod went once the first finished
    cleared: dict[str, Any] | None = None  # its condition once placed
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"quota": self.quota, "hard": self.hard, "first": self.first,
                "firstNode": self.first_node, "waiting": self.waiting,
                "condition": self.condition, "event": self.event,
                "usedWhileWaiting": self.used_while_waiting, "node": self.node,
                "clearedCondition": self.cleared, "ok": self.ok, "problems": self.problems}


def _condition(pod: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind:
            return dict(condition)
    return None


async def _poll(children: Children, step: str, deadline: float,
                check: Callable[[], Awaitable[Any]]) -> Any:
    """`check()` until it returns something truthy, or None once the deadline passed."""
    while True:
        children.check(step)
        found = await check()
        if found:
            return found
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(_POLL_S)


async def show_quota(cluster: Cluster, children: Children, *, place_s: float,
                     say: Callable[[str], None]) -> QuotaReport:
    """One GPUQuota at work: the first pod placed, the second held back for quota (condition
    and Event), the first finished, the second placed."""
    import yaml

    from dra_gateway.kube.resources import EVENTS, GPU_QUOTAS, PODS

    quota_doc = yaml.safe_load(QUOTA_POLICIES.read_text(encoding="utf-8"))
    quota_ns = str(quota_doc["metadata"]["namespace"])
    quota_name = str(quota_doc["metadata"]["name"])
    first, second = read_pods([QUOTA_PODS])
    report = QuotaReport(f"{quota_ns}/{quota_name}", hard=dict(quota_doc["spec"]["hard"]),
                         first=f"{first.namespace}/{first.name}",
                         waiting=f"{second.namespace}/{second.name}")
    step = "showing a quota at work"

    async def node_of(pod: DemoPod) -> str | None:
        found = await cluster.get(PODS, pod.name, namespace=pod.namespace)
        return (found.get("spec") or {}).get("nodeName")

    say(f"quota: creating {report.first}, within GPUQuota {report.quota}")
    await cluster.create(PODS, first.pod, namespace=first.namespace)
    report.first_node = await _poll(children, step, time.monotonic() + place_s,
                                    lambda: node_of(first))
    if report.first_node is None:
        report.problems.append(f"{report.first} was not placed within {place_s:g}s")
        return report
    say(f"quota: creating {report.waiting}, which the quota cannot hold next to it")
    await cluster.create(PODS, second.pod, namespace=second.namespace)

    async def held() -> dict[str, Any] | None:
        pod = await cluster.get(PODS, second.name, namespace=second.namespace)
        found = _condition(pod, QUOTA_CONDITION)
        return found if found and found.get("status") == "True" else None

    report.condition = await _poll(children, step, time.monotonic() + place_s, held)
    if report.condition is None:
        report.problems.append(f"{report.waiting} never got the condition {QUOTA_CONDITION}")
        return report
    if await node_of(second):
        report.problems.append(f"{report.waiting} was placed although the quota was full")
    events = (await cluster.list(EVENTS, namespace=second.namespace)).items
    report.event = next((str(e.get("message")) for e in reversed(events)
                         if e.get("reason") == "QuotaExceeded"
                         and (e.get("involvedObject") or {}).get("name") == second.name), None)
    if report.event is None:
        report.problems.append(f"no QuotaExceeded Event names {report.waiting}")

    async def used() -> dict[str, Any] | None:
        quota = await cluster.get(GPU_QUOTAS, quota_name, namespace=quota_ns)
        found = dict((quota.get("status") or {}).get("used") or {})
        return found if any(str(v) not in ("0", "") for v in found.values()) else None

    # The allocator writes status.used at most every 2s: the first pod's share shows by then.
    report.used_while_waiting = await _poll(children, step, time.monotonic() + 6, used) or {}
    say(f"quota: {report.first} finishes (phase Succeeded, as its kubelet would write)")
    await cluster.patch(PODS, first.name, {"status": {"phase": "Succeeded"}},
                        namespace=first.namespace, subresource="status")
    report.node = await _poll(children, step, time.monotonic() + place_s,
                              lambda: node_of(second))
    if report.node is None:
        report.problems.append(f"{report.waiting} was not placed within {place_s:g}s of "
                               f"{report.first} finishing")
        return report
    pod = await cluster.get(PODS, second.name, namespace=second.namespace)
    report.cleared = _condition(pod, QUOTA_CONDITION)
    return report


async def demo(layout: Layout, children: Children, pods: Sequence[DemoPod], *,
               startup_s: float, place_s: float, say: Callable[[str], None],
               quota: bool = False) -> Outcome:
    from dra_gateway.kube.cluster.connect import ClusterConfigError, connect
    from dra_gateway.kube.cluster.port import ApiError

    webhook_port = free_port()
    say("starting the embedded API server")
    api = start_api(children, layout, webhook_port,
                    policies=(QUOTA_POLICIES,) if quota else ())
    deadline = time.monotonic() + startup_s

    async def api_up() -> bool:
        return _api_started(layout, api)

    await wait_for("starting the API server", children, deadline, api, api_up,
                   "the API server to write its kubeconfig")
    say("starting the webhook, the allocator and node plugins for "
        + ", ".join(n for n, _ in NODES))
    start_components(children, layout, webhook_port)
    try:
        cluster = await connect("kube", str(layout.kubeconfig))
    except ClusterConfigError as exc:
        raise DemoError("connecting to the API server", str(exc), log=api.log) from None
    try:
        by_name = {c.name: c for c in children.started}
        context = _webhook_ssl(layout)

        async def webhook_up() -> bool:
            return await webhook_ready(webhook_port, context)

        await wait_for("starting the webhook", children, deadline, by_name["webhook"],
                       webhook_up, f"the webhook's /readyz on 127.0.0.1:{webhook_port}")
        for node, _ in NODES:
            async def published(node: str = node) -> bool:
                return node in await slices_published(cluster)

            await wait_for("starting the node plugins", children, deadline,
                           by_name[f"node-plugin-{node}"], published,
                           f"node {node}'s ResourceSlices")

        async def leads() -> bool:
            return await allocator_leads(cluster)

        await wait_for("starting the allocator", children, deadline, by_name["allocator"],
                       leads, f"the allocator to take its Lease {NAMESPACE}/"
                       "dra-gateway-allocator")
        say(f"creating {len(pods)} pods")
        reports = await create_pods(cluster, pods)
        await wait_bound(cluster, children, reports, time.monotonic() + place_s)
        # Pods expected to stay pending are judged once the others settled.
        await inspect(cluster, reports)
        await prepare_on_nodes(layout, reports)
        template, template_of = await show_template(cluster, reports)
        quota_report = await show_quota(cluster, children, place_s=place_s, say=say) \
            if quota else None
        return Outcome(reports, template, template_of, quota_report)
    except ApiError as exc:
        raise DemoError("talking to the API server", exc.message, log=api.log) from None
    finally:
        await cluster.close()


def print_table(reports: Sequence[PodReport], out: IO[str]) -> None:
    rows = [("POD", "LEGACY REQUEST", "TEMPLATE", "NODE", "DEVICES (SHARE)")]
    for r in reports:
        devices = "; ".join(describe_devices(c["devices"]) for c in r.claims if c["devices"])
        node = r.node or ("(pending)" if r.expected == "pending" else "(not bound)")
        rows.append((f"{r.namespace}/{r.name}", r.legacy + (f" [{r.rule}]" if r.rule else ""),
                     ", ".join(r.templates) or "-", node, devices or "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        out.write("  ".join(cell.ljust(widths[i]) for i, cell in enumerate(row[:4]))
                  + "  " + row[4] + "\n")
    for r in reports:
        if r.expected == "pending" and r.ok:
            out.write(f"\n{r.namespace}/{r.name} stays pending as expected: {r.why_pending}.\n")
        for problem in r.problems:
            out.write(f"\nFAILED {r.namespace}/{r.name}: {problem}\n")


def print_quota(report: QuotaReport, out: IO[str]) -> None:
    hard = ", ".join(f"{k}={v}" for k, v in report.hard.items())
    used = ", ".join(f"{k}={v}" for k, v in report.used_while_waiting.items())
    width = max(len(report.first), len(report.waiting))
    out.write(f"\nOne quota at work: GPUQuota {report.quota} (hard {hard}).\n")
    if report.first_node:
        out.write(f"  {report.first:<{width}}  placed on {report.first_node}\n")
    if report.condition:
        out.write(f"  {report.waiting:<{width}}  waits, gated: condition {QUOTA_CONDITION}="
                  f"{report.condition.get('status')} ({report.condition.get('reason')}): "
                  f"{report.condition.get('message')}\n")
    if report.event:
        out.write(f"  {'':<{width}}  Event QuotaExceeded: {report.event}\n")
    if used:
        out.write(f"  {'':<{width}}  status.used of the quota: {used}\n")
    if report.node:
        out.write(f"  {report.first:<{width}}  finished (phase Succeeded): its claim released\n")
        cleared = report.cleared or {}
        out.write(f"  {report.waiting:<{width}}  placed on {report.node}"
                  + (f" (condition {cleared.get('status')}: {cleared.get('reason')})"
                     if cleared else "") + "\n")
    for problem in report.problems:
        out.write(f"\nFAILED quota step: {problem}\n")


def _short_temp_dir() -> str:
    """Where the node folders go when the work directory is too long for their sockets: the
    temporary directory if short enough (mkdtemp adds 23 characters), else /tmp ($TMPDIR may
    be as long as the work directory)."""
    temp = tempfile.gettempdir()
    return temp if len(temp) + 23 <= _SHORT_PATH else "/tmp"


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Terminated


def run(args: argparse.Namespace) -> int:
    err = sys.stderr
    as_json = args.output == "json"

    def say(text: str) -> None:
        if not as_json:
            print(f"demo: {text}", flush=True)

    for option, value in (("--timeout", args.timeout), ("--startup-timeout",
                                                         args.startup_timeout)):
        if not value > 0:
            print(f"demo: {option} {value:g} must be a positive number of seconds", file=err)
            return 2
    try:
        pods = read_pods(args.pods or DEFAULT_PODS)
    except DemoError as exc:
        print(f"demo: {exc}", file=err)
        return 2
    try:
        if args.work_dir is not None:
            root = args.work_dir.resolve()
            root.mkdir(parents=True, exist_ok=True)
            remove = False
        else:
            root = Path(tempfile.mkdtemp(prefix="dra-gateway-demo-"))
            remove = not args.keep
        if len(str(root)) <= _SHORT_PATH:
            nodes_root, remove_nodes = root / "n", False
        else:
            nodes_root = Path(tempfile.mkdtemp(prefix="dra-gateway-n-", dir=_short_temp_dir()))
            remove_nodes = not args.keep
    except OSError as exc:
        print(f"demo: cannot create the work directory {exc.filename or ''}: "
              f"{exc.strerror or exc}; pass a writable --work-dir", file=err)
        return 2
    layout = Layout(root, nodes_root)
    children = Children(layout.logs)
    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    code = 1
    outcome: Outcome | None = None
    failure: DemoError | None = None
    try:
        say(f"work directory {root}")
        prepare(layout)
        # The quota step needs the bundled examples' room on the nodes: pods of --pods may
        # fill them.
        outcome = asyncio.run(demo(layout, children, pods, startup_s=args.startup_timeout,
                                   place_s=args.timeout, say=say, quota=not args.pods))
        code = 0 if all(r.ok for r in outcome.reports) \
            and (outcome.quota is None or outcome.quota.ok) else 1
    except DemoError as exc:
        failure = exc
    except (KeyboardInterrupt, _Terminated):
        print("demo: interrupted; stopping every process it started", file=err)
        code = 130
    except OSError as exc:
        failure = DemoError("setting up", f"{exc.filename or 'the work directory'}: "
                            f"{exc.strerror or exc}")
    except Exception as exc:  # a bug: keep the trace for a report, but show no trace
        trace = layout.logs / "demo-error.log"
        with contextlib.suppress(OSError):
            trace.parent.mkdir(parents=True, exist_ok=True)
            trace.write_text(traceback.format_exc(), encoding="utf-8")
        failure = DemoError("running the demo", f"unexpected {type(exc).__name__}: {exc} "
                            f"(please report it with {trace})")
    finally:
        try:
            killed = children.stop()
        except (KeyboardInterrupt, _Terminated):
            killed = children.stop(grace=0)  # asked twice: no more patience
        signal.signal(signal.SIGTERM, previous)
    if killed:
        print(f"demo: {', '.join(killed)} did not stop within {GRACE_S:g}s of SIGTERM and was "
              "killed", file=err)
    if failure is not None:
        if as_json:
            json.dump({"ok": False, "failedStep": failure.step, "message": failure.message,
                       "log": str(failure.log) if failure.log else None, "workDir": str(root)},
                      sys.stdout, indent=2)
            sys.stdout.write("\n")
        print(f"demo: failed at step \"{failure.step}\": {failure.message}", file=err)
        if failure.log is not None:
            print(f"--- last lines of {failure.log} ---\n{log_tail(failure.log)}\n---", file=err)
        remove = False  # the logs are what the user needs now
    if outcome is not None:
        if code != 0:
            remove = False  # the logs explain it; the JSON summary must say where they are
        if as_json:
            summary = {"ok": code == 0, "workDir": str(root) if not remove else None,
                       "pods": [r.to_json() for r in outcome.reports],
                       "template": {"pod": outcome.template_of, "object": outcome.template},
                       "quota": outcome.quota.to_json() if outcome.quota else None}
            json.dump(summary, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            _print_outcome(outcome, sys.stdout)
        if outcome.quota is not None and not outcome.quota.ok:
            print(f"demo: failed at step \"showing a quota at work\": "
                  f"{'; '.join(outcome.quota.problems)}; the allocator's log is "
                  f"{layout.logs / 'allocator.log'}", file=err)
        failed = [f"{r.namespace}/{r.name}" for r in outcome.reports if not r.ok]
        if failed:
            print(f"demo: failed at step \"checking placements\": {len(failed)} pod"
                  f"{'s' if len(failed) != 1 else ''} not placed as expected: "
                  f"{', '.join(failed)}; each component's log is in {layout.logs}", file=err)
            if any(not r.ok and not r.node and r.expected == "bound" for r in outcome.reports):
                allocator_log = layout.logs / "allocator.log"
                print(f"--- last lines of {allocator_log} ---\n{log_tail(allocator_log)}\n---",
                      file=err)
    if remove_nodes:
        shutil.rmtree(nodes_root, ignore_errors=True)
    elif nodes_root.parent != root:
        print(f"demo: the node plugins' sockets and CDI specs are in {nodes_root}", file=err)
    if remove:
        shutil.rmtree(root, ignore_errors=True)
    elif code != 130 or args.keep:
        print(f"demo: logs, kubeconfig and certificates kept in {root}", file=err)
    return code


def _print_outcome(outcome: Outcome, out: IO[str]) -> None:
    import yaml

    out.write("\n")
    print_table(outcome.reports, out)
    if outcome.quota is not None:
        print_quota(outcome.quota, out)
    if outcome.template is not None:
        out.write(f"\nThe ResourceClaimTemplate of pod {outcome.template_of}, as the webhook "
                  "translated its legacy request:\n\n")
        out.write(yaml.safe_dump(outcome.template, sort_keys=False))
        shown = next((r for r in outcome.reports
                      if f"{r.namespace}/{r.name}" == outcome.template_of), None)
        prepared = [c["prepared"] for c in (shown.claims if shown else [])
                    if c.get("prepared")]
        if prepared:
            ids = ", ".join(i for p in prepared for i in p["cdiDevices"])
            out.write("\nIts node plugin prepared the claim as the kubelet asks it to; the "
                      f"container sees (CDI {ids}):\n\n")
            out.write("".join(f"  {e}\n" for p in prepared for e in p["env"]))

"""End-to-end placement throughput on a real control plane: the gateway's path against DRA
written natively, side by side, one run, one cluster.

    .venv/bin/python -m dra_gateway.devkit.bench.e2e [--version 1.37.2] [--pods 500] [--workers 4]
        [--paths gateway,native] [--gpu-nodes N] [--timeout 900] [--keep]

It installs the gateway as the e2e tier does (tests/e2e/support.py `install`: the Helm chart in
a real kube-apiserver, kube-controller-manager, kube-scheduler and KWOK nodes, the webhook, the
allocator and the node plugins as local processes with the chart's ServiceAccount tokens), from
binaries that `hack/build-control-plane.sh VERSION` has cached. Then it creates, interleaved
(gateway pod i, native pod i, ...) from `--workers` client threads, `--pods` pods of each kind:

- gateway: a HAMi share pod (`nvidia.com/gpu: 1`, `gpumem: 1000`, `gpucores: 1`): the webhook
  translates it and gates it, the claim controller makes its claim from the translated template,
  the allocator allocates the claim and lifts the gate, kube-scheduler binds the pod;
- native: the same request written for DRA (a ResourceClaimTemplate asking one device of a
  DeviceClass with `capacity.requests` memory 1000Mi and cores 1); the claim controller makes
  the claim and kube-scheduler allocates it itself and binds the pod.

Why this native path is fair: its devices are the gateway's own. After the node plugins publish
their ResourceSlices, the bench publishes a copy of each under another driver (and pool) name,
with the same devices, attributes, capacities, sharing policies and counters, on the same nodes,
and a DeviceClass that selects that driver's full GPUs with the same expression as the gateway's
`gpu.dra-gateway.io`. So both paths place the same shares on identical cards of the same nodes,
through the same API server (the webhook sees the native pods too and leaves them alone), and
differ only in who allocates: the gateway's allocator (after the webhook's translation and gate)
or kube-scheduler's DRA plugin. The gateway's own class cannot serve as the native path: the
webhook gates DRA-native pods of that class like translated ones (the allocator owns its cards).
Sharing needs consumable capacity in the API server: on by default from 1.36; on older releases
the bench turns on the DRAConsumableCapacity gate.

Time to bound is from just before the pod's create request to the moment a watch of the pods
sees `spec.nodeName` set. Pods/s per path is its pods over the time from its first create to its
last bind. It reports both, p50/p99 time to bound, and the ratio gateway/native (goal: >= 0.8).
Both paths' pods come from the same client threads, so while the cluster keeps up, pods/s follows
the create rate and the ratio stays near 1; time to bound shows what each path adds per pod,
and more `--workers` push harder.
A second table says where each path's time goes, step by step (p50 and p99 of each step's time
since the step before it), from watches of the bench's pods and of ResourceClaims: admitted (the
create request answered, admission webhooks included), claim created (by the claim controller),
allocated (the claim's status.allocation written: by the allocator, or by kube-scheduler on the
native path), gate lifted (gateway only) and bound.
The machine's load average is printed before and after: wall-clock figures on a shared machine
move with it.

CPU seconds per process (the API server, etcd, the scheduler, the controller manager, KWOK,
the webhook, the allocator, the node plugins) over the same span come from /proc.
API writes per pod come from the API server's own count of the requests it served
(`apiserver_request_total` on /metrics, before and after the pods), by resource and verb, for
what a pod's path writes (pods, their bindings and status, claims and their status, templates,
events); Leases and Nodes, which the control plane and KWOK renew on their own clock, are left
out. `--paths gateway` runs one path alone, so that the writes are that path's.

`--gpu-nodes N` adds N KWOK nodes of eight shared H100s (`examples/demo/gpu-h100-1.yaml`, each
card with a UUID of its node) to the demo's two. Their ResourceSlices are built by the node
plugin's own code (`devices_of`, `build_slices`) and published by the bench, one publisher for
every simulated node, as a node plugin serving many nodes would: KWOK nodes have no kubelet to
call a plugin, and the pods' path never calls one. For example, 50 nodes and 2,000 pods:

    .venv/bin/python -m dra_gateway.devkit.bench.e2e --gpu-nodes 50 --pods 2000 --paths gateway
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

# The repository root (src/dra_gateway/devkit/bench/ is four levels down): the tiers' helpers
# under tests/ are not installed.
REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "tests"))

import yaml  # noqa: E402
from e2e.support import (  # type: ignore[import-not-found]  # noqa: E402
    EXAMPLES,
    GPU_NODES,
    install,
)

from dra_gateway.devkit.realcluster import Api, cache_dir, missing_binaries, path_of  # noqa: E402
from dra_gateway.kube import names  # noqa: E402

NATIVE_DRIVER = "native.bench.dra-gateway.io"
NATIVE_CLASS = "gpu.native.bench.dra-gateway.io"
NAMESPACES = {"gateway": "bench-gateway", "native": "bench-native"}
LABEL = "dra-gateway.io/bench-path"
TEMPLATE = "bench-share"
MEMORY_MIB, CORES = 1000, 1

JSON = dict[str, Any]


def _gateway_pod(i: int) -> JSON:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"g-{i}", "namespace": NAMESPACES["gateway"],
                     "labels": {LABEL: "gateway"}},
        "spec": {"containers": [{"name": "c", "image": "bench:0", "resources": {"limits": {
            "nvidia.com/gpu": 1, "nvidia.com/gpumem": MEMORY_MIB,
            "nvidia.com/gpucores": CORES}}}]},
    }


def _native_pod(i: int) -> JSON:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"n-{i}", "namespace": NAMESPACES["native"],
                     "labels": {LABEL: "native"}},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}],
                 "containers": [{"name": "c", "image": "bench:0",
                                 "resources": {"claims": [{"name": "gpu"}]}}]},
    }


def _setup_native(api: Api) -> int:
    """The native driver's copy of every gateway ResourceSlice, its DeviceClass and the
    template; the number of devices copied."""
    copied = 0
    for item in api.list(path_of("resource.k8s.io/v1", "resourceslices")):
        spec = item["spec"]
        if spec.get("driver") != names.DRIVER:
            continue
        new_spec = copy.deepcopy(spec)
        new_spec["driver"] = NATIVE_DRIVER
        new_spec["pool"]["name"] = "native-" + str(spec["pool"]["name"])
        copied += len(new_spec.get("devices") or [])
        api.create(path_of("resource.k8s.io/v1", "resourceslices"), {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": "native-" + item["metadata"]["name"]}, "spec": new_spec})
    api.create(path_of("resource.k8s.io/v1", "deviceclasses"), {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": NATIVE_CLASS},
        "spec": {"selectors": [{"cel": {"expression":
                 f"device.driver == '{NATIVE_DRIVER}' && "
                 f"device.attributes['{NATIVE_DRIVER}'].type == 'gpu'"}}]}})
    for namespace in NAMESPACES.values():
        api.create(path_of("v1", "namespaces"), {
            "apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    api.create(path_of("resource.k8s.io/v1", "resourceclaimtemplates",
                       namespace=NAMESPACES["native"]), {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": TEMPLATE, "namespace": NAMESPACES["native"]},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": NATIVE_CLASS, "allocationMode": "ExactCount", "count": 1,
            "capacity": {"requests": {"memory": f"{MEMORY_MIB}Mi", "cores": str(CORES)}}}}]}}}})
    return copied


def _add_gpu_nodes(gateway: Any, count: int, pods: int) -> list[str]:
    """`count` KWOK nodes of eight shared H100s, with their ResourceSlices as the node plugin
    builds them; their names."""
    from dra_gateway.node_plugin.devices import DeviceOptions, devices_of
    from dra_gateway.node_plugin.inventory import parse_inventory
    from dra_gateway.node_plugin.publish import build_slices

    inventory = yaml.safe_load((EXAMPLES / "demo" / "gpu-h100-1.yaml").read_text())
    options = DeviceOptions(default_sharing="shared", consumable_capacity=True)
    nodes = [f"bench-gpu-{i:03d}" for i in range(count)]
    api = gateway.api
    for node in nodes:
        gateway.plane.add_node(node, labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                               cpu="192", memory="2Ti", pods=str(2 * pods + 200))
    gateway.plane.wait_nodes_ready(nodes, timeout_s=60.0 + count)
    for node in nodes:
        facts = copy.deepcopy(inventory)
        for gpu in facts["gpus"]:
            card = uuid.uuid5(uuid.NAMESPACE_URL, f"{node}/{gpu['index']}")
            gpu["uuid"] = f"GPU-{card}"
        devices = devices_of(parse_inventory(facts, source=f"{node}'s inventory"), options)
        node_uid = api.get(path_of("v1", "nodes", name=node))["metadata"]["uid"]
        for item in build_slices(node_name=node, driver=names.DRIVER, devices=devices,
                                 generation=1, node_uid=node_uid):
            api.create(path_of("resource.k8s.io/v1", "resourceslices"), item)
    return nodes


# What a pod's path writes, by resource (apiserver_request_total's resource/subresource).
_POD_PATH_RESOURCES = ("pods", "pods/binding", "pods/status", "resourceclaims",
                       "resourceclaims/status", "resourceclaimtemplates", "events")
_WRITES = ("POST", "PUT", "PATCH", "APPLY", "DELETE")


def _api_writes(api: Api) -> Counter[tuple[str, str]]:
    """The API server's count of the write requests it answered, by (resource, verb)."""
    from prometheus_client.parser import text_string_to_metric_families

    text = str(api.request("GET", "/metrics").get("text") or "")
    out: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        if family.name != "apiserver_request":
            continue
        for sample in family.samples:
            if sample.name != "apiserver_request_total":
                continue
            labels = sample.labels
            resource = labels.get("resource", "")
            if labels.get("subresource"):
                resource += "/" + labels["subresource"]
            if labels.get("verb") in _WRITES and resource in _POD_PATH_RESOURCES:
                out[(resource, labels["verb"])] += int(sample.value)
    return out


def _processes(gateway: Any) -> dict[str, list[int]]:
    """The pids of the control plane's and the gateway's processes, by name (the node plugins
    together)."""
    out: dict[str, list[int]] = {}
    for process in gateway.plane.processes:
        out.setdefault(process.name, []).append(process.popen.pid)
    for name, component in gateway.components.items():
        if component.process is not None:
            key = "node-plugins" if name.startswith("node-plugin") else name
            out.setdefault(key, []).append(component.process.pid)
    return out


def _cpu_seconds(pids: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds (user + system) each process has used so far, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for name, pid_list in pids.items():
        total = 0.0
        for pid in pid_list:
            with contextlib.suppress(OSError, ValueError, IndexError):
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick
        out[name] = total
    return out


def _raise_pod_limit(api: Api, pods: int) -> None:
    """Room on each GPU node for every bench pod (the demo's nodes allow 110)."""
    for node, _ in GPU_NODES:
        current = api.get(path_of("v1", "nodes", name=node))["status"]
        resources = {**current.get("allocatable", {}), "pods": str(2 * pods + 200)}
        api.apply_status(path_of("v1", "nodes", name=node),
                         {"status": {"capacity": resources, "allocatable": resources}})


# The steps of a pod's path, in order, as the bench sees them from outside (watches of pods and
# claims): each is the first moment it was seen, in the bench's monotonic clock.
STEPS = ("admitted", "claim created", "allocated", "gate lifted", "bound")


class _Watch(threading.Thread):
    """Records, from a watch of `plural`, the first moment each bench pod reached each step
    `observe` says an event shows."""

    def __init__(self, api: Api, api_version: str, plural: str, seen: dict[str, dict[str, float]],
                 lock: threading.Lock, *, label_selector: str | None = None) -> None:
        super().__init__(daemon=True)
        self.api = api
        self.path = path_of(api_version, plural)
        self.query = {"labelSelector": label_selector} if label_selector else {}
        self.seen = seen
        self.lock = lock
        self.stopping = False
        listing = api.request("GET", self.path, query=self.query or None)
        self.resource_version = str(listing["metadata"]["resourceVersion"])

    def run(self) -> None:
        while not self.stopping:
            with contextlib.suppress(OSError, ValueError):
                self._stream()

    def _stream(self) -> None:
        query = urllib.parse.urlencode({**self.query, "watch": "1",
                                        "resourceVersion": self.resource_version,
                                        "allowWatchBookmarks": "true"})
        request = urllib.request.Request(f"{self.api.server}{self.path}?{query}",
                                         headers={"Authorization": f"Bearer {self.api.token}"})
        with urllib.request.urlopen(request, context=self.api._context,
                                    timeout=60) as response:
            for line in response:
                now = time.monotonic()
                event = json.loads(line)
                obj = event.get("object") or {}
                meta = obj.get("metadata") or {}
                if meta.get("resourceVersion"):
                    self.resource_version = str(meta["resourceVersion"])
                if event.get("type") in ("ADDED", "MODIFIED"):
                    steps = self.observe(obj)
                    if steps:
                        with self.lock:
                            for key, step in steps:
                                self.seen.setdefault(key, {}).setdefault(step, now)
                if self.stopping:
                    return

    def observe(self, obj: JSON) -> list[tuple[str, str]]:
        raise NotImplementedError


class _PodWatch(_Watch):
    def observe(self, pod: JSON) -> list[tuple[str, str]]:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        steps = []
        if not any(g.get("name") == names.SCHEDULING_GATE
                   for g in spec.get("schedulingGates") or []):
            steps.append((key, "gate lifted"))
        if spec.get("nodeName"):
            steps.append((key, "bound"))
        return steps


class _ClaimWatch(_Watch):
    def observe(self, claim: JSON) -> list[tuple[str, str]]:
        meta = claim.get("metadata") or {}
        if meta.get("namespace") not in NAMESPACES.values():
            return []
        owners = [o.get("name") for o in meta.get("ownerReferences") or []
                  if o.get("kind") == "Pod"]
        steps = []
        for owner in owners:
            key = f"{meta['namespace']}/{owner}"
            steps.append((key, "claim created"))
            if (claim.get("status") or {}).get("allocation"):
                steps.append((key, "allocated"))
        return steps


def _breakdown(created: dict[str, float], seen: dict[str, dict[str, float]]
               ) -> dict[str, dict[str, list[float]]]:
    """Per path and step, the time each pod took from the step before it (its create request
    for the first). A step a path does not take (the native path has no gate) is skipped; the
    "gate lifted" of a native pod is the moment it was first seen without a gate."""
    out: dict[str, dict[str, list[float]]] = {}
    for path, namespace in NAMESPACES.items():
        steps: dict[str, list[float]] = {step: [] for step in STEPS}
        for key, started in created.items():
            if not key.startswith(namespace + "/"):
                continue
            at = seen.get(key, {})
            before = started
            for step in STEPS:
                if step == "gate lifted" and path == "native":
                    continue
                if step not in at:
                    break
                # Watches may deliver a later step first; time never runs backwards here.
                moment = max(at[step], before)
                steps[step].append(moment - before)
                before = moment
        out[path] = steps
    return out


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


def run(args: argparse.Namespace) -> int:
    version = args.version.removeprefix("v")
    bin_dir = cache_dir(version)
    missing = missing_binaries(bin_dir)
    if missing:
        print(f"Kubernetes {version}: {bin_dir} lacks {', '.join(missing)}; build them with "
              f"hack/build-control-plane.sh {version}", file=sys.stderr)
        return 2
    helm = os.environ.get("DRA_GATEWAY_HELM") or str(REPO / ".ci" / "bin" / "helm")
    if not Path(helm).is_file():
        print(f"helm not found at {helm}: set DRA_GATEWAY_HELM to a helm v3 binary, or build the "
              "pinned one as .ci/run does: GOBIN=$PWD/.ci/bin go install "
              "helm.sh/helm/v3/cmd/helm@v3.19.5", file=sys.stderr)
        return 2
    minor = int(version.split(".")[1])
    gates = {"DRAConsumableCapacity": True} if minor < 36 else {}
    work = Path(tempfile.mkdtemp(prefix="dra-gateway-e2e-bench-"))
    load_before = os.getloadavg()
    with install(version, gates, bin_dir, helm, work) as gateway:
        api = gateway.api
        if args.gpu_nodes:
            added = _add_gpu_nodes(gateway, args.gpu_nodes, args.pods)
            print(f"{len(added)} KWOK nodes of eight H100s added, their slices published")
        devices = _setup_native(api)
        _raise_pod_limit(api, args.pods)
        print(f"native driver: {devices} devices copied from the gateway's slices")
        time.sleep(2)  # the scheduler's informers see the new slices and class
        lock = threading.Lock()
        seen: dict[str, dict[str, float]] = {}
        watches = [_PodWatch(api, "v1", "pods", seen, lock, label_selector=LABEL),
                   _ClaimWatch(api, "resource.k8s.io/v1", "resourceclaims", seen, lock)]
        for watch in watches:
            watch.start()
        created: dict[str, float] = {}
        errors: list[str] = []

        def create(pod: JSON) -> None:
            key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
            started = time.monotonic()
            try:
                api.create(path_of("v1", "pods", namespace=pod["metadata"]["namespace"]), pod)
            except Exception as exc:
                errors.append(f"{key}: {exc}")
                return
            answered = time.monotonic()
            with lock:
                created[key] = started
                seen.setdefault(key, {}).setdefault("admitted", answered)

        makers = [make for path, make in (("gateway", _gateway_pod), ("native", _native_pod))
                  if path in args.paths]
        order = [make(i) for i in range(args.pods) for make in makers]
        writes_before = _api_writes(api)
        pids = _processes(gateway)
        cpu_before = _cpu_seconds(pids)
        begin = time.monotonic()
        with ThreadPoolExecutor(args.workers) as pool:
            list(pool.map(create, order))
        deadline = time.monotonic() + args.timeout
        while time.monotonic() < deadline:
            gateway.check()
            with lock:
                if all("bound" in seen.get(key, {}) for key in created):
                    break
            time.sleep(0.5)
        for watch in watches:
            watch.stopping = True
        writes = _api_writes(api)
        writes.subtract(writes_before)
        cpu = {name: used - cpu_before.get(name, 0.0)
               for name, used in _cpu_seconds(pids).items()}
        with lock:
            bound = {k: v["bound"] for k, v in seen.items() if "bound" in v}
            steps_seen = {k: dict(v) for k, v in seen.items()}
        load_after = os.getloadavg()

        rows = {}
        for path in args.paths:
            keys = [k for k in created if k.startswith(NAMESPACES[path] + "/")]
            times = [bound[k] - created[k] for k in keys if k in bound]
            first = min((created[k] for k in keys), default=begin)
            last = max((bound[k] for k in keys if k in bound), default=first)
            rows[path] = {
                "pods": len(keys), "bound": len(times),
                "pods_per_s": len(times) / (last - first) if last > first else 0.0,
                "p50_s": statistics.median(times) if times else float("nan"),
                "p99_s": _percentile(times, 0.99) if times else float("nan"),
                "span_s": last - first,
            }
        gpu_nodes = len(GPU_NODES) + args.gpu_nodes
        print(f"\nKubernetes {gateway.plane.version()}, {gpu_nodes} GPU nodes, {args.pods} pods "
              f"per path ({', '.join(args.paths)}), interleaved, {args.workers} client threads; "
              f"{os.cpu_count()} CPUs, load average {load_before[0]:.2f} before, "
              f"{load_after[0]:.2f} after")
        print("| path | pods bound | span (s) | pods/s | p50 time to bound (s) "
              "| p99 time to bound (s) |")
        print("|---|---|---|---|---|---|")
        for path, row in rows.items():
            print(f"| {path} | {row['bound']}/{row['pods']} | {row['span_s']:.1f} | "
                  f"{row['pods_per_s']:.1f} | {row['p50_s']:.2f} | {row['p99_s']:.2f} |")
        breakdown = _breakdown(created, steps_seen)
        print("\nWhere a pod's time goes: each step's time since the step before it (s); "
              "admitted is the create request's answer (admission webhooks included)")
        print("| step | " + " | ".join(f"{path} p50 | {path} p99" for path in args.paths)
              + " |")
        print("|---|" + "---|---|" * len(args.paths))
        for step in STEPS:
            cells = []
            for path in args.paths:
                values = breakdown[path].get(step)
                cells += ([f"{statistics.median(values):.3f}", f"{_percentile(values, 0.99):.3f}"]
                          if values else ["-", "-"])
            print(f"| {step} | " + " | ".join(cells) + " |")
        created_pods = len(created)
        print(f"\nAPI writes of the pods' paths per pod ({created_pods} pods; "
              "apiserver_request_total, Leases and Nodes left out)")
        print("| resource | verb | writes | per pod |")
        print("|---|---|---|---|")
        for (resource, verb), count in sorted(writes.items()):
            if count:
                print(f"| {resource} | {verb} | {count} | {count / max(created_pods, 1):.2f} |")
        total_writes = sum(writes.values())
        print(f"| all | | {total_writes} | {total_writes / max(created_pods, 1):.2f} |")
        print(f"\nCPU seconds each process used while the pods were placed ({created_pods} pods; "
              "the bench's own client threads not counted)")
        print("| process | CPU s | CPU ms per pod |")
        print("|---|---|---|")
        for name, used in sorted(cpu.items(), key=lambda item: -item[1]):
            print(f"| {name} | {used:.1f} | {1000 * used / max(created_pods, 1):.1f} |")
        ratio = float("nan")
        if "native" in rows and "gateway" in rows and rows["native"]["pods_per_s"]:
            ratio = rows["gateway"]["pods_per_s"] / rows["native"]["pods_per_s"]
            print(f"\ngateway/native pods/s: {ratio:.2f} (goal >= 0.8); time to bound "
                  f"p50 {rows['gateway']['p50_s'] / rows['native']['p50_s']:.2f}x, "
                  f"p99 {rows['gateway']['p99_s'] / rows['native']['p99_s']:.2f}x native")
        if errors:
            print(f"{len(errors)} create errors, first: {errors[0]}")
        if args.json:
            print(json.dumps({"version": version, "rows": rows, "ratio": ratio,
                              "breakdown": {path: {step: {
                                  "p50_s": statistics.median(v),
                                  "p99_s": _percentile(v, 0.99)}
                                  for step, v in steps.items() if v}
                                  for path, steps in breakdown.items()},
                              "writes": {f"{r} {v}": n for (r, v), n in writes.items() if n},
                              "writes_per_pod": total_writes / max(created_pods, 1),
                              "gpu_nodes": gpu_nodes, "cpu_seconds": cpu,
                              "load": [load_before[0], load_after[0]]}))
        complete = all(r["bound"] == r["pods"] == args.pods for r in rows.values())
    if args.keep:
        print(f"logs kept in {work}")
    else:
        import shutil

        shutil.rmtree(work, ignore_errors=True)
    return 0 if complete else 1


def _paths(text: str) -> tuple[str, ...]:
    paths = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in paths if p not in NAMESPACES]
    if unknown or not paths:
        raise argparse.ArgumentTypeError(
            f"unknown path {', '.join(unknown) or '(none)'}: name gateway, native or both")
    return tuple(p for p in NAMESPACES if p in paths)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="1.37.2", help="Kubernetes release (cached)")
    parser.add_argument("--pods", type=int, default=500, help="pods per path")
    parser.add_argument("--workers", type=int, default=4, help="client threads creating pods")
    parser.add_argument("--paths", type=_paths, default=("gateway", "native"),
                        help="the paths to run, comma-separated (default: gateway,native)")
    parser.add_argument("--gpu-nodes", type=int, default=0, metavar="N",
                        help="KWOK nodes of eight H100s to add to the demo's two")
    parser.add_argument("--timeout", type=float, default=900.0,
                        help="seconds to wait for every pod to bind")
    parser.add_argument("--json", action="store_true", help="also print the figures as JSON")
    parser.add_argument("--keep", action="store_true", help="keep the logs' folder")
    args = parser.parse_args()

    def terminate(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    # Stop the control plane and the gateway's processes on SIGTERM too.
    signal.signal(signal.SIGTERM, terminate)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())

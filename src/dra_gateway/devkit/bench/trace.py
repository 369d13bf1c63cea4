"""`dra-gateway bench allocator`: replay an openb-format trace through the planner, per packing
strategy.

The replay follows the FGD paper's simulator (Weng et al., USENIX ATC'23;
`../shared/data/openb/README.md`): every pod of the list plus seeded random copies until the
GPU requests reach `--load` times the cluster's GPUs, shuffled, each placed once, no deletions;
a pod is placed only where its CPU and memory fit and on the GPU models its `gpu_spec` allows.
Each trace pod goes the way a real one would: a pod with legacy requests (`nvidia.com/gpu: N`
for whole cards; HAMi's `gpucores` + `gpumem-percentage` for shares, so memory is the share
times the card's memory; `gpu_spec` as HAMi's `nvidia.com/use-gputype`) is translated by the
built-in rules, its claim is made from the template as the claim controller would, and the
nodes publish slices as the node plugin builds them; `plan_pod` places it and the plan is
assumed. Nothing is faked: the figures are those of the code the allocator runs.

Reported per strategy: GPU allocation ratio (allocated GPU share over all GPUs, mean over seeds),
unallocated GPUs, claims placed per second of planning time, and p50/p99 planning time per
claim. Times are the planning thread's CPU time (one core; other processes on a shared
machine still slow it, through the caches and the host); the JSON output adds wall-clock
figures (`wall_*`) measured alongside.
With `--gpu-policies` each replay runs twice, side by side pod by pod (each pod is placed in
both before the next, first in each in turn): without policies and with 200 GPUQuotas and 50
GPUSharingPolicies (`gpu_policies`) over 200 namespaces the trace pods are dealt into (the
same namespaces in both runs), so their cost is a ratio measured at the same moments on the
same noisy machine.
This module does I/O (reads the CSVs, prints); the planner it drives does none.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from dra_gateway.allocator.planner import (
    STRATEGIES,
    ClusterState,
    PlannerSettings,
    PodPlan,
    TaskType,
    Workload,
    plan_pod,
)
from dra_gateway.kube import names
from dra_gateway.kube.runtime.collector import settle
from dra_gateway.policy.catalog import Catalog

# Card memory per trace model. P100, T4, V100 (16 and 32 GB) and A10 are public cards; the
# trace does not disclose G1-G3, so they get the memory of the data-centre cards of their era
# (stated here, and irrelevant to the ratio: shares are relative to the card).
MODEL_MEMORY_GIB: dict[str, int] = {
    "P100": 16, "T4": 16, "V100M16": 16, "V100M32": 32, "A10": 24,
    "G1": 16, "G2": 32, "G3": 32,
}
_DEFAULT_MEMORY_GIB = 16
_GIB = 1 << 30
_MIB = 1 << 20
_FULL = 1000  # a whole card, in thousandths (the trace's gpu_milli)


class TraceError(ValueError):
    """A trace file that cannot be read; the message names the file, row and column."""


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class TracePod:
    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: tuple[str, ...]

    @property
    def gpu_share(self) -> float:
        """GPUs this pod takes, as the paper counts them."""
        if self.num_gpu == 0:
            return 0.0
        if self.num_gpu == 1:
            return self.gpu_milli / 1000
        return float(self.num_gpu)

    @property
    def shape(self) -> tuple[int, int, int, int, tuple[str, ...]]:
        return (self.cpu_milli, self.memory_mib, self.num_gpu, self.gpu_milli, self.gpu_spec)


def _int(path: Path, row: int, column: str, value: str | None) -> int:
    try:
        return int(float(value or 0))
    except ValueError:
        raise TraceError(f"{path}: row {row}: column {column}: {value!r} is not a number") from None


def _rows(path: Path, required: Sequence[str]) -> Iterable[tuple[int, dict[str, str]]]:
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            missing = [c for c in required if c not in (reader.fieldnames or ())]
            if missing:
                raise TraceError(f"{path}: missing column(s) {', '.join(missing)}; an openb "
                                 f"file has {', '.join(required)}")
            yield from enumerate(reader, start=2)
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path}: not a text file (not UTF-8); give an openb CSV") from None


def read_nodes(path: Path) -> list[TraceNode]:
    nodes = [
        TraceNode(name=row["sn"], cpu_milli=_int(path, i, "cpu_milli", row["cpu_milli"]),
                  memory_mib=_int(path, i, "memory_mib", row["memory_mib"]),
                  gpus=_int(path, i, "gpu", row["gpu"]), model=(row.get("model") or "").strip())
        for i, row in _rows(path, ("sn", "cpu_milli", "memory_mib", "gpu"))
    ]
    if not nodes:
        raise TraceError(f"{path}: no nodes")
    return nodes


def read_pods(path: Path) -> list[TracePod]:
    pods = []
    for i, row in _rows(path, ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")):
        spec = tuple(s for s in (row.get("gpu_spec") or "").split("|") if s)
        pods.append(TracePod(name=row["name"], cpu_milli=_int(path, i, "cpu_milli",
                                                                row["cpu_milli"]),
                             memory_mib=_int(path, i, "memory_mib", row["memory_mib"]),
                             num_gpu=_int(path, i, "num_gpu", row["num_gpu"]),
                             gpu_milli=_int(path, i, "gpu_milli", row["gpu_milli"]),
                             gpu_spec=spec))
    if not pods:
        raise TraceError(f"{path}: no pods")
    return pods


def parse_seeds(text: str) -> list[int]:
    """`42-51` or `42,43,50`: the seeds of the replays."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            part = part.strip()
            if "-" in part:
                low, high = (int(p) for p in part.split("-", 1))
                seeds.extend(range(low, high + 1))
            elif part:
                seeds.append(int(part))
    except ValueError:
        raise TraceError(f"--seeds {text!r}: write a range such as 42-51 or a list such as "
                         "42,43") from None
    if not seeds:
        raise TraceError(f"--seeds {text!r}: no seed given")
    return seeds


def parse_scales(text: str | None) -> list[int]:
    """--scale: one factor (8) or several to compare in one run (1,8)."""
    if not text:
        return []
    try:
        scales = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        scales = []
    if not scales or any(n < 1 for n in scales):
        raise TraceError(f"--scale {text!r}: give whole factors of at least 1, e.g. 8 or 1,8")
    return scales


def sample(pods: Sequence[TracePod], total_gpus: int, load: float, seed: int) -> list[TracePod]:
    """The paper's workload: every pod, plus random copies until GPU requests reach
    `load` x the cluster's GPUs, shuffled with `seed`."""
    rng = random.Random(seed)
    out = list(pods)
    requested = sum(p.gpu_share for p in out)
    target = load * total_gpus
    gpu_pods = [p for p in pods if p.num_gpu > 0]
    while gpu_pods and requested < target:
        extra = rng.choice(pods)
        out.append(extra)
        requested += extra.gpu_share
    rng.shuffle(out)
    return out


class Cluster:
    """The simulated cluster's objects, built once and fed to a fresh state per replay."""

    def __init__(self, nodes: Sequence[TraceNode]) -> None:
        from dra_gateway.node_plugin.deviceclasses import device_classes
        from dra_gateway.node_plugin.devices import DeviceOptions, devices_of
        from dra_gateway.node_plugin.facts import GpuFacts, NodeFacts
        from dra_gateway.node_plugin.publish import build_slices

        options = DeviceOptions(default_sharing="shared", consumable_capacity=True)
        self.total_gpus = sum(n.gpus for n in nodes)
        self.classes = device_classes()
        self.nodes: list[dict[str, Any]] = []
        self.slices: list[dict[str, Any]] = []
        for n, node in enumerate(nodes):
            memory = MODEL_MEMORY_GIB.get(node.model, _DEFAULT_MEMORY_GIB) * _GIB
            facts = NodeFacts(gpus=tuple(
                GpuFacts(index=i, uuid=f"GPU-{n:05d}-{i:02d}", product_name=node.model or "GPU",
                         memory=memory, numa_node=i * 2 // max(node.gpus, 1),
                         pci_bus_id=f"0000:{0x10 + i:02x}:00.0")
                for i in range(node.gpus)))
            devices = devices_of(facts, options)
            self.slices += build_slices(node_name=node.name, driver=names.DRIVER,
                                        devices=devices, generation=1, node_uid=None)
            self.nodes.append({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": node.name,
                             "labels": {"kubernetes.io/hostname": node.name}},
                "status": {"allocatable": {"cpu": f"{node.cpu_milli}m",
                                           "memory": f"{node.memory_mib}Mi", "pods": "110"}},
            })

    def state(self, settings: PlannerSettings) -> ClusterState:
        state = ClusterState(settings)
        for obj in self.classes:
            state.set_device_class(obj)
        for obj in self.nodes:
            state.set_node(obj)
        for obj in self.slices:
            state.set_slice(obj)
        return state


def share_percent(pod: TracePod) -> int:
    """The percent of a card a share pod asks (HAMi's gpucores and gpumem-percentage): its
    gpu_milli in whole percents, at least one."""
    return max(1, pod.gpu_milli // 10)


class Translator:
    """Trace pods to (pod, claims) through the built-in rules, once per pod shape."""

    def __init__(self) -> None:
        from dra_gateway.translator.rules import load_rules

        self.rules = load_rules()
        self._cache: dict[tuple[Any, ...], tuple[dict[str, Any], list[dict[str, Any]]]] = {}

    def legacy_pod(self, pod: TracePod) -> dict[str, Any]:
        resources: dict[str, str] = {"cpu": f"{pod.cpu_milli}m", "memory": f"{pod.memory_mib}Mi"}
        limits: dict[str, str] = {}
        annotations: dict[str, str] = {}
        if pod.num_gpu > 1 or (pod.num_gpu == 1 and pod.gpu_milli >= 1000):
            limits["nvidia.com/gpu"] = str(pod.num_gpu)
        elif pod.num_gpu == 1 and pod.gpu_milli > 0:
            percent = share_percent(pod)
            limits["nvidia.com/gpu"] = "1"
            limits["nvidia.com/gpucores"] = str(percent)
            limits["nvidia.com/gpumem-percentage"] = str(percent)
        if pod.gpu_spec and limits:
            annotations["nvidia.com/use-gputype"] = ",".join(pod.gpu_spec)
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": pod.name, "namespace": "openb", "annotations": annotations},
            "spec": {"containers": [{"name": "main", "image": "trace",
                                     "resources": {"requests": resources,
                                                   "limits": {**resources, **limits}}}]},
        }

    def translate(self, pod: TracePod) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The translated pod and the ResourceClaimTemplates it points at, in its order."""
        cached = self._cache.get(pod.shape)
        if cached is not None:
            return cached
        import jsonpatch

        from dra_gateway.translator.translate import translate

        legacy = self.legacy_pod(pod)
        plan = translate(legacy, self.rules)
        if plan.refusal is not None:
            raise TraceError(f"pod {pod.name}: the built-in rules refuse it: "
                             f"{plan.refusal.message}")
        translated = jsonpatch.apply_patch(legacy, plan.patch) if plan.patch else legacy
        by_name = {t["metadata"]["name"]: t for t in plan.templates}
        templates = [by_name[entry["resourceClaimTemplateName"]]
                     for entry in (translated.get("spec") or {}).get("resourceClaims") or ()
                     if entry.get("resourceClaimTemplateName") in by_name]
        self._cache[pod.shape] = (translated, templates)
        return translated, templates


def claims_for(pod: Mapping[str, Any],
               templates: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The ResourceClaims the claim controller makes from the pod's templates: named after the
    pod and its claim entry, owned by the pod, with the template's labels and annotations."""
    meta = pod["metadata"]
    entries = [e for e in (pod.get("spec") or {}).get("resourceClaims") or ()
               if e.get("resourceClaimTemplateName")]
    claims = []
    for i, (entry, template) in enumerate(zip(entries, templates, strict=False)):
        template_meta = (template.get("spec") or {}).get("metadata") or {}
        claims.append({
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {
                "name": f"{meta['name']}-{entry['name']}-{i}",
                "namespace": meta.get("namespace", ""),
                "uid": f"{meta['uid']}-claim-{i}",
                "labels": dict(template_meta.get("labels") or {}),
                "annotations": {**(template_meta.get("annotations") or {}),
                                names.K8S_POD_CLAIM_NAME_ANNOTATION: entry["name"]},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                     "uid": meta["uid"], "controller": True,
                                     "blockOwnerDeletion": True}],
            },
            "spec": template["spec"]["spec"],
        })
    return claims


@dataclass(slots=True)
class RunResult:
    ratio: float
    unallocated: float
    claims: int
    seconds: float
    per_claim_ms: list[float]
    wall_seconds: float
    wall_per_claim_ms: list[float]
    placed_pods: int
    failed_pods: int
    # With `losses`: per card, the GPU shares (thousandths) the pods placed on it hold.
    cards: dict[tuple[str, str, str], list[int]] | None = None


NAMESPACES = 200


def namespace_of(n: int) -> str:
    return f"team-{n % NAMESPACES:03d}"


def gpu_policies(total_gpus: int, *, quotas: int = NAMESPACES, sharing: int = 50) -> Catalog:
    """`quotas` GPUQuotas (one per namespace: memory, cores, cards and claims around twice the
    namespace's even share of the cluster, so that the busiest bind) and `sharing`
    GPUSharingPolicies, each selecting the namespaces of one tier label: every policy caps
    claims per card and sets a minimum share, every fifth isolates teams (a label of the
    namespace), every seventh requires compute with every share."""
    namespaces, quota_objects, policies = policy_objects(total_gpus, quotas=quotas,
                                                         sharing=sharing)
    catalog = Catalog.build(quotas=quota_objects, sharing=policies, namespaces=namespaces)
    if catalog.errors:
        raise TraceError("generated policies do not validate: " + "; ".join(catalog.errors))
    return catalog


def policy_objects(total_gpus: int, *, quotas: int = NAMESPACES, sharing: int = 50,
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]]:
    """The Namespaces, GPUQuotas and GPUSharingPolicies of `gpu_policies` as API objects (the
    webhook benchmark loads them into its cluster)."""
    per = max(1, 2 * total_gpus // max(quotas, 1))
    namespaces = [{"apiVersion": "v1", "kind": "Namespace",
                   "metadata": {"name": namespace_of(i),
                                "labels": {"tier": f"t{i % sharing}", "team": f"g{i % 20}"}}}
                  for i in range(NAMESPACES)]
    quota_objects = [{
        "apiVersion": names.API_VERSION, "kind": "GPUQuota",
        "metadata": {"name": "gpu", "namespace": namespace_of(i)},
        "spec": {"hard": {"memory": f"{per * 16}Gi", "cores": per * 100, "devices": per,
                          "claims": 4 * per}}} for i in range(quotas)]
    policies = []
    for k in range(sharing):
        spec: dict[str, Any] = {"namespaceSelector": {"matchLabels": {"tier": f"t{k}"}},
                                "maxClaimsPerDevice": 4 + k % 5,
                                "minShare": {"memory": "256Mi"}}
        if k % 5 == 0:
            spec["isolation"] = {"mode": "Label", "labelKey": "team"}
        if k % 7 == 0:
            spec["requireCores"] = True
        policies.append({"apiVersion": names.API_VERSION, "kind": "GPUSharingPolicy",
                         "metadata": {"name": f"tier-{k:02d}"}, "spec": spec})
    return namespaces, quota_objects, policies


class _Replay:
    """One configuration's replay of a trace, a pod at a time."""

    def __init__(self, cluster: Cluster, translator: Translator, *, strategy: str,
                 workload: Workload, catalog: Catalog | None, namespaces: bool,
                 keep: bool = False, losses: bool = False) -> None:
        self.translator = translator
        # With `losses`, what each card holds, for where the unallocated share lies.
        self.cards: dict[tuple[str, str, str], list[int]] | None = {} if losses else None
        # With `keep`, every pod as it ended (placed: bound, its claims allocated; or not) and
        # its GPU share, for what runs after the replay (defrag).
        self.keep = keep
        self.kept: list[tuple[dict[str, Any], list[dict[str, Any]], PodPlan, float]] = []
        self.total_gpus = cluster.total_gpus
        self.namespaces = namespaces
        self.state = cluster.state(PlannerSettings(default_strategy=strategy))
        self.state.set_workload(workload)
        if catalog is not None:
            self.state.set_policies(catalog)
        self.allocated = 0.0
        self.claims_placed = 0
        self.seconds = 0.0
        self.wall_seconds = 0.0
        self.per_claim: list[float] = []
        self.per_claim_wall: list[float] = []
        self.placed = self.failed = 0

    def place(self, n: int, trace_pod: TracePod) -> None:
        translated, templates = self.translator.translate(trace_pod)
        pod = {**translated, "metadata": {**translated["metadata"], "name": f"p{n}",
                                          "uid": f"pod-{n}"}}
        if self.namespaces:
            pod["metadata"]["namespace"] = namespace_of(n)
        claims = claims_for(pod, templates)
        state = self.state
        start = time.thread_time()
        wall_start = time.perf_counter()
        plan = plan_pod(state, pod, claims)
        if plan.node_name is not None:
            state.assume(pod, plan)
        elapsed = time.thread_time() - start
        wall = time.perf_counter() - wall_start
        if claims:
            self.seconds += elapsed
            self.wall_seconds += wall
            self.per_claim.extend([elapsed * 1000 / len(claims)] * len(claims))
            self.per_claim_wall.extend([wall * 1000 / len(claims)] * len(claims))
        if self.keep:
            self.kept.append((pod, claims, plan, trace_pod.gpu_share))
        if plan.node_name is None:
            self.failed += 1
            return
        self.placed += 1
        self.claims_placed += len(claims)
        self.allocated += trace_pod.gpu_share
        if self.cards is not None and trace_pod.num_gpu:
            # What the pod asks of each card: whole cards, or its share in whole percents (the
            # trace's gpu_milli for every openb trace).
            share = (10 * share_percent(trace_pod)
                     if trace_pod.num_gpu == 1 and trace_pod.gpu_milli < _FULL else _FULL)
            for allocation in plan.allocations.values():
                for result in (allocation.get("devices") or {}).get("results") or ():
                    self.cards.setdefault((plan.node_name, result["pool"], result["device"]),
                                          []).append(share)

    def result(self) -> RunResult:
        total = self.total_gpus
        return RunResult(ratio=100 * self.allocated / total if total else 0.0,
                         unallocated=total - self.allocated, claims=self.claims_placed,
                         seconds=self.seconds, per_claim_ms=self.per_claim,
                         wall_seconds=self.wall_seconds, wall_per_claim_ms=self.per_claim_wall,
                         placed_pods=self.placed, failed_pods=self.failed, cards=self.cards)


def replay(cluster: Cluster, translator: Translator, pods: Sequence[TracePod], *,
           strategy: str, load: float, seed: int, workload: Workload,
           catalog: Catalog | None = None, namespaces: bool = False) -> RunResult:
    return side_by_side(cluster, translator, pods, strategy=strategy, load=load, seed=seed,
                        workload=workload, catalogs=[catalog], namespaces=namespaces)[0]


def side_by_side(cluster: Cluster, translator: Translator, pods: Sequence[TracePod], *,
                 strategy: str, load: float, seed: int, workload: Workload,
                 catalogs: Sequence[Catalog | None], namespaces: bool = False,
                 losses: bool = False) -> list[RunResult]:
    """One replay per catalog (None: no policies), pod by pod side by side: each pod is
    placed in every configuration before the next pod, first in each in turn, so that
    the configurations see the same machine at the same moments (a shared machine's speed
    moves by tens of per cent over seconds)."""
    # As a long-running allocator would after its initial sync (and periodically after): move
    # what is loaded out of the cyclic collector's way, so full collections stay short.
    settle()
    replays = [_Replay(cluster, translator, strategy=strategy, workload=workload,
                       catalog=catalog, namespaces=namespaces, losses=losses)
               for catalog in catalogs]
    for n, trace_pod in enumerate(sample(pods, cluster.total_gpus, load, seed)):
        if n % 1000 == 999:
            # Outside the timed region, what the replays have kept so far joins the frozen
            # set, so no full collection lands inside one claim's planning.
            gc.freeze()
        turn = n % len(replays)
        for one in replays[turn:] + replays[:turn]:
            one.place(n, trace_pod)
    gc.unfreeze()
    return [one.result() for one in replays]


def trace_workload(pods: Sequence[TracePod]) -> Workload:
    """The target workload of FGD: the trace's pod types, weighted by frequency."""
    counts: Counter[TaskType] = Counter()
    for pod in pods:
        if pod.num_gpu == 0:
            continue
        milli = pod.gpu_milli if pod.num_gpu == 1 and pod.gpu_milli < 1000 else 1000
        counts[TaskType(pod.cpu_milli * 1, pod.memory_mib * _MIB, pod.num_gpu, milli,
                        frozenset(pod.gpu_spec))] += 1
    return Workload.from_counts(counts.items())


def _percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def scaled(nodes: Sequence[TraceNode], pods: Sequence[TracePod],
           factor: int) -> tuple[list[TraceNode], list[TracePod]]:
    """The cluster and its pods `factor` times over: each node and each pod copied under new
    names, so the replay keeps the trace's mix and load on a cluster `factor` times larger."""
    if factor == 1:
        return list(nodes), list(pods)
    return ([replace(n, name=f"{n.name}-x{k}") for k in range(factor) for n in nodes],
            [replace(p, name=f"{p.name}-x{k}") for k in range(factor) for p in pods])


def resident_mib() -> float:
    """This process's resident memory now, in MiB (Linux; 0 where /proc is absent)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


@dataclass(frozen=True, slots=True)
class Trace:
    """A trace read for replays: its pods, the cluster of its nodes, and what a replay needs
    beside them (the translator, FGD's target workload)."""

    pods: list[TracePod]
    cluster: Cluster
    translator: Translator
    workload: Workload


def load_trace(nodes_path: Path, pods_path: Path) -> Trace:
    pods = read_pods(pods_path)
    return Trace(pods, Cluster(read_nodes(nodes_path)), Translator(), trace_workload(pods))


def run(nodes_path: Path, pods_path: Path, *, strategies: Sequence[str], load: float,
        seeds: Sequence[int], gpu_policies_too: bool = False,
        scales: Sequence[int] = (), losses: bool = False) -> dict[str, dict[str, Any]]:
    """Per configuration, the summary of its replays (`_summary`); with `losses`, also where
    the unallocated share lies at their end (`losses_of`)."""
    if scales:
        return run_scales(nodes_path, pods_path, strategies=strategies, load=load, seeds=seeds,
                          scales=scales)
    trace = load_trace(nodes_path, pods_path)
    pods, cluster, translator, workload = (trace.pods, trace.cluster, trace.translator,
                                           trace.workload)
    results: dict[str, dict[str, Any]] = {}
    catalog = gpu_policies(cluster.total_gpus) if gpu_policies_too else None
    for strategy in strategies:
        configurations: dict[str, list[RunResult]] = {strategy: []}
        catalogs: list[Catalog | None] = [None]
        if catalog is not None:
            configurations[f"{strategy}+policies"] = []
            catalogs.append(catalog)
        for seed in seeds:
            # Side by side, pod by pod: both configurations see the same machine load.
            results_ = side_by_side(cluster, translator, pods, strategy=strategy, load=load,
                                    seed=seed, workload=workload, catalogs=catalogs,
                                    namespaces=catalog is not None, losses=losses)
            for runs_, result in zip(configurations.values(), results_, strict=True):
                runs_.append(result)
        for label, runs in configurations.items():
            results[label] = dict(_summary(runs))
            if losses:
                results[label]["losses"] = losses_of(runs, cluster.total_gpus)
        if catalog is not None:
            base = results[strategy]["claims_per_second"]
            results[f"{strategy}+policies"]["claims_per_second_ratio"] = round(
                results[f"{strategy}+policies"]["claims_per_second"] / base, 3) if base else 0.0
    return results


def run_scales(nodes_path: Path, pods_path: Path, *, strategies: Sequence[str], load: float,
               seeds: Sequence[int], scales: Sequence[int]) -> dict[str, dict[str, Any]]:
    """Per strategy and scale, the replay of the trace multiplied (`scaled`), with the
    resident memory the replay's state added to the process, and claims/s as a ratio of the
    first scale's (in one run, on one machine)."""
    base_nodes = read_nodes(nodes_path)
    base_pods = read_pods(pods_path)
    translator = Translator()
    workload = trace_workload(base_pods)
    results: dict[str, dict[str, Any]] = {}
    for strategy in strategies:
        first: float | None = None
        for factor in scales:
            nodes, pods = scaled(base_nodes, base_pods, factor)
            runs = []
            peak = 0.0
            for seed in seeds:
                gc.collect()
                before = resident_mib()
                cluster = Cluster(nodes)
                runs.append(replay(cluster, translator, pods, strategy=strategy, load=load,
                                   seed=seed, workload=workload))
                peak = max(peak, resident_mib() - before)
                del cluster
            label = f"{strategy} x{factor}"
            results[label] = _summary(runs)
            results[label].update(scale=factor, nodes=len(nodes),
                                  cards=sum(n.gpus for n in nodes),
                                  state_mib=round(peak, 1))
            rate = results[label]["claims_per_second"]
            first = rate if first is None else first
            results[label]["claims_per_second_vs_first_scale"] = (
                round(rate / first, 3) if first else 0.0)
    return results


def _summary(runs: Sequence[RunResult]) -> dict[str, float]:
    timings = [t for r in runs for t in r.per_claim_ms]
    seconds = sum(r.seconds for r in runs)
    walls = [t for r in runs for t in r.wall_per_claim_ms]
    wall = sum(r.wall_seconds for r in runs)
    claims = sum(r.claims for r in runs)
    return {
        "allocation_ratio": round(statistics.fmean(r.ratio for r in runs), 2),
        "unallocated_gpus": round(statistics.fmean(r.unallocated for r in runs), 1),
        "claims_per_second": round(claims / seconds, 1) if seconds else 0.0,
        "p50_ms": round(_percentile(timings, 0.50), 3),
        "p99_ms": round(_percentile(timings, 0.99), 3),
        "max_ms": round(max(timings, default=0.0), 3),
        "wall_claims_per_second": round(claims / wall, 1) if wall else 0.0,
        "wall_p99_ms": round(_percentile(walls, 0.99), 3),
        "placed_pods": round(statistics.fmean(r.placed_pods for r in runs), 1),
        "failed_pods": round(statistics.fmean(r.failed_pods for r in runs), 1),
    }


def losses_of(runs: Sequence[RunResult], total_gpus: int, *, rows: int = 12,
              ) -> list[dict[str, Any]]:
    """Where the unallocated GPU share lies at the end of the replays: per content of a card
    (the shares it holds, largest first; "" for a card nothing was placed on), the cards that
    end so and their free share in GPUs, both a mean over the runs, largest first; the rest
    summed in a last row "other"."""
    free: Counter[tuple[int, ...]] = Counter()
    cards: Counter[tuple[int, ...]] = Counter()
    for run_ in runs:
        held = run_.cards or {}
        for shares in held.values():
            left = _FULL - sum(shares)
            if left > 0:
                content = tuple(sorted(shares, reverse=True))
                free[content] += left
                cards[content] += 1
        untouched = total_gpus - len(held)
        if untouched > 0:
            free[()] += untouched * _FULL
            cards[()] += untouched
    count = len(runs) or 1
    total = sum(free.values()) or 1
    out: list[dict[str, Any]] = []
    ordered = free.most_common()
    for content, left in ordered[:rows]:
        out.append({"holds": "+".join(map(str, content)), "cards": round(cards[content] / count, 1),
                    "unallocated_gpus": round(left / _FULL / count, 1),
                    "share_of_unallocated": round(100 * left / total, 1)})
    rest = ordered[rows:]
    if rest:
        left = sum(v for _, v in rest)
        out.append({"holds": "other", "cards": round(sum(cards[c] for c, _ in rest) / count, 1),
                    "unallocated_gpus": round(left / _FULL / count, 1),
                    "share_of_unallocated": round(100 * left / total, 1)})
    return out


def _losses_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    lines: list[str] = []
    for label, r in results.items():
        if "losses" not in r:
            continue
        lines += ["", f"{label}: where the unallocated share lies (card holds, in thousandths)",
                  f"{'holds':<24} {'cards':>8} {'unalloc GPUs':>12} {'% of unalloc':>12}"]
        lines += [f"{row['holds'] or '(nothing)':<24} {row['cards']:>8.1f} "
                  f"{row['unallocated_gpus']:>12.1f} {row['share_of_unallocated']:>12.1f}"
                  for row in r["losses"]]
    return "\n".join(lines)


def _table(results: Mapping[str, Mapping[str, Any]], seeds: Sequence[int]) -> str:
    width = max([10, *(len(p) for p in results)])
    header = (f"{'policy':<{width}} {'GPU alloc %':>11} {'unalloc GPUs':>12} {'claims/s':>9} "
              f"{'p50 ms':>7} {'p99 ms':>7}")
    lines = [header, "-" * len(header)]
    for label, r in results.items():
        ratio = r.get("claims_per_second_ratio")
        lines.append(f"{label:<{width}} {r['allocation_ratio']:>11.2f} "
                     f"{r['unallocated_gpus']:>12.1f} {r['claims_per_second']:>9.0f} "
                     f"{r['p50_ms']:>7.3f} {r['p99_ms']:>7.3f}"
                     + (f"  ({ratio:.3f} x without)" if ratio is not None else ""))
    lines.append(f"(mean over {len(seeds)} seed(s): {','.join(map(str, seeds))})")
    scaled_rows = [(label, r) for label, r in results.items() if "scale" in r]
    if scaled_rows:
        lines.append(f"{'':<{width}} {'nodes':>7} {'cards':>7} {'state MiB':>10} "
                     f"{'claims/s vs first scale':>24}")
        lines += [f"{label:<{width}} {r['nodes']:>7.0f} {r['cards']:>7.0f} "
                  f"{r['state_mib']:>10.1f} {r['claims_per_second_vs_first_scale']:>24.3f}"
                  for label, r in scaled_rows]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    strategies = list(args.strategies or STRATEGIES)
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown:
        # Named as the user typed it: --strategy, or its deprecated alias --policy.
        flag = getattr(args, "strategy_option", None) or "--strategy"
        print(f"dra-gateway bench allocator: {flag} {unknown[0]!r} is not a {flag[2:]}; use "
              f"one of {', '.join(STRATEGIES)}", file=sys.stderr)
        return 2
    if not args.load > 0:
        print("dra-gateway bench allocator: --load must be above 0, e.g. 1.3", file=sys.stderr)
        return 2
    percent = getattr(args, "defrag_moves", None)
    if percent is not None and not 0 <= percent <= 100:
        print("dra-gateway bench allocator: --defrag-moves is a percentage of the pods placed, "
              "from 0 to 100, e.g. 5", file=sys.stderr)
        return 2
    if percent is not None and getattr(args, "gpu_policies", False):
        print("dra-gateway bench allocator: --defrag-moves and --gpu-policies measure different "
              "things; run them one at a time", file=sys.stderr)
        return 2
    if getattr(args, "scale", None) and (percent is not None
                                         or getattr(args, "gpu_policies", False)):
        print("dra-gateway bench allocator: --scale measures the planner alone; run it without "
              "--defrag-moves and --gpu-policies", file=sys.stderr)
        return 2
    preemption = getattr(args, "preemption", None)
    if preemption is not None and not 0 < preemption <= 100:
        print("dra-gateway bench allocator: --preemption is a percentage of the pods replayed, "
              "above 0 and at most 100, e.g. 10", file=sys.stderr)
        return 2
    if preemption is not None and (percent is not None or getattr(args, "gpu_policies", False)
                                   or getattr(args, "scale", None)):
        print("dra-gateway bench allocator: --preemption measures preemption alone; run it "
              "without --defrag-moves, --gpu-policies and --scale", file=sys.stderr)
        return 2
    groups = getattr(args, "groups", False)
    if groups and (preemption is not None or percent is not None
                   or getattr(args, "gpu_policies", False) or getattr(args, "scale", None)):
        print("dra-gateway bench allocator: --groups measures pod groups alone; run it "
              "without --preemption, --defrag-moves, --gpu-policies and --scale",
              file=sys.stderr)
        return 2
    losses = getattr(args, "losses", False)
    if losses and (percent is not None or getattr(args, "scale", None)):
        print("dra-gateway bench allocator: --losses reports the plain replays; run it without "
              "--defrag-moves and --scale", file=sys.stderr)
        return 2
    try:
        seeds = parse_seeds(args.seeds)
        if groups:
            from dra_gateway.devkit import groups_bench

            results = groups_bench.run(Path(args.nodes), Path(args.pods), strategies=strategies,
                                       load=args.load, seeds=seeds)
        elif preemption is not None:
            from dra_gateway.devkit import preemption_bench

            results = preemption_bench.run(Path(args.nodes), Path(args.pods),
                                           strategies=strategies, load=args.load, seeds=seeds,
                                           percent=preemption)
        elif percent is not None:
            from dra_gateway.devkit import defrag_bench

            results = defrag_bench.run(Path(args.nodes), Path(args.pods), strategies=strategies,
                                       load=args.load, seeds=seeds, percent=percent)
        else:
            results = run(Path(args.nodes), Path(args.pods), strategies=strategies,
                          load=args.load, seeds=seeds,
                          gpu_policies_too=getattr(args, "gpu_policies", False),
                          scales=parse_scales(getattr(args, "scale", None)), losses=losses)
    except TraceError as exc:
        print(f"dra-gateway bench allocator: {exc}", file=sys.stderr)
        return 2
    if groups and args.output != "json":
        from dra_gateway.devkit import groups_bench

        print(groups_bench.table(results, seeds))
    elif preemption is not None and args.output != "json":
        from dra_gateway.devkit import preemption_bench

        print(preemption_bench.table(results, seeds, preemption))
    elif percent is not None and args.output != "json":
        from dra_gateway.devkit import defrag_bench

        print(defrag_bench.table(results, seeds, percent))
    elif args.output == "json":
        print(json.dumps({"policies": results, "seeds": seeds, "load": args.load}, indent=2))
    else:
        print(_table(results, seeds) + ("\n" + _losses_table(results) if losses else ""))
    return 0

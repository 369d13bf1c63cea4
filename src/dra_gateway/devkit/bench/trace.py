"""The trace library of the allocator benchmarks: an openb-format trace read, replayed through
the planner.

The replay follows the FGD paper's simulator (Weng et al., USENIX ATC'23;
`../shared/data/openb/README.md`): every pod of the list plus seeded random copies until the
GPU requests reach `--load` times the cluster's GPUs, shuffled, each placed once, no deletions;
a pod is placed only where its CPU and memory fit and on the GPU models its `gpu_spec` allows.
Each trace pod goes the way a real one would: a pod with legacy requests (`nvidia.com/gpu: N`
for whole cards; HAMi's `gpucores` + `gpumem-percentage` for shares, so memory is the share
times the card's memory; `gpu_spec` as HAMi's `nvidia.com/use-gputype`) is translated by the
built-in rules (`Translator`), its claim is made from the template as the claim controller
would (`claims_for`), and the nodes publish slices as the node plugin builds them (`TraceCluster`);
`plan_pod` places it and the plan is assumed (`Replay`). Nothing is faked: the figures are
those of the code the allocator runs.

Here: reading the CSVs (`read_nodes`, `read_pods`, `load_trace`), the workload (`sample`,
`trace_workload`), the generated GPU policies (`gpu_policies`, `policy_objects`), the replay
primitives (`Replay`, `replay`, `side_by_side`, `RunResult`) and what the results share
(`parse_seeds`, `percentile`). The entry points (`allocator`, `topology`, `webhook`) and the
allocator's variants (`groups`, `preemption`, `defrag`) build on it; it imports none of them.
This module reads files; the planner it drives does no I/O.
"""

from __future__ import annotations

import csv
import gc
import random
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_gateway.allocator.planner import (
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
FULL = 1000  # a whole card, in thousandths (the trace's gpu_milli)


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


class TraceCluster:
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
        state.load(classes=self.classes, nodes=self.nodes, slices=self.slices)
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


class Replay:
    """One configuration's replay of a trace, a pod at a time."""

    def __init__(self, cluster: TraceCluster, translator: Translator, *, strategy: str,
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
                     if trace_pod.num_gpu == 1 and trace_pod.gpu_milli < FULL else FULL)
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


def replay(cluster: TraceCluster, translator: Translator, pods: Sequence[TracePod], *,
           strategy: str, load: float, seed: int, workload: Workload,
           catalog: Catalog | None = None, namespaces: bool = False) -> RunResult:
    return side_by_side(cluster, translator, pods, strategy=strategy, load=load, seed=seed,
                        workload=workload, catalogs=[catalog], namespaces=namespaces)[0]


def side_by_side(cluster: TraceCluster, translator: Translator, pods: Sequence[TracePod], *,
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
    replays = [Replay(cluster, translator, strategy=strategy, workload=workload,
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


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@dataclass(frozen=True, slots=True)
class Trace:
    """A trace read for replays: its pods, the cluster of its nodes, and what a replay needs
    beside them (the translator, FGD's target workload)."""

    pods: list[TracePod]
    cluster: TraceCluster
    translator: Translator
    workload: Workload


def load_trace(nodes_path: Path, pods_path: Path) -> Trace:
    pods = read_pods(pods_path)
    return Trace(pods, TraceCluster(read_nodes(nodes_path)), Translator(), trace_workload(pods))



"""`dra-gateway bench topology`: how often multi-card pods land on aligned cards.

A cluster of `--nodes` copies of one inventory file's node (by default `examples/inventory/
pcie8.yaml`: eight cards, four per NUMA node, one PCIe root per NUMA node) serves a seeded
stream of whole-card pods asking for 1, 2 or 4 cards (half, 30% and 20% of them), one arriving
per tick, each running for an exponentially drawn time whose mean keeps the cards asked at
`--load` of the cluster's (0.9 by default): pods come and go, so free cards scatter. A pod that
fits nowhere when it arrives is dropped. The same stream is replayed side by side, pod by pod,
in three configurations:

- **topology**: the allocator's default (fragmentation-aware strategy, topology preference);
- **no topology**: the same strategy without the topology preference (`PlannerSettings.
  topology=False`);
- **first-fit**: first-fit, without it.

The figures: per configuration and size of pod (2 and 4 cards), the pods placed and the share
of them whose cards share one PCIe root, one NUMA node and one NVLink island (islands only
where the node publishes them); and the share of the cluster's card-ticks allocated.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from dra_gateway.allocator.planner import ClusterState, PlannerSettings, PodPlan, plan_pod
from dra_gateway.allocator.planner.topology import topology_key
from dra_gateway.devkit.bench import trace
from dra_gateway.kube import names

SIZES = ((1, 0.5), (2, 0.3), (4, 0.2))
CONFIGS = (("topology", "default", True), ("no topology", "default", False),
           ("first-fit", "first-fit", False))
DEFAULT_INVENTORY = Path(__file__).resolve().parents[2] / "examples" / "inventory" / "pcie8.yaml"


@dataclass(slots=True)
class _Tally:
    """One configuration's replay."""

    placed: dict[int, int] = field(default_factory=dict)  # cards per pod -> pods placed
    one_root: dict[int, int] = field(default_factory=dict)
    one_numa: dict[int, int] = field(default_factory=dict)
    one_island: dict[int, int] = field(default_factory=dict)
    dropped: int = 0
    card_ticks: float = 0.0


def _cluster(inventory: Path, count: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]],
                                                    list[dict[str, Any]], int]:
    from dra_gateway.node_plugin.deviceclasses import device_classes
    from dra_gateway.node_plugin.devices import DeviceOptions, devices_of
    from dra_gateway.node_plugin.facts import NodeFacts
    from dra_gateway.node_plugin.inventory import load_inventory
    from dra_gateway.node_plugin.publish import build_slices

    facts = load_inventory(inventory)
    options = DeviceOptions(default_sharing="exclusive", consumable_capacity=True)
    nodes, slices = [], []
    for n in range(count):
        name = f"node-{n:03d}"
        copy = NodeFacts(gpus=tuple(replace(g, uuid=f"{g.uuid[:-6]}{n:06d}", sharing="exclusive")
                                    for g in facts.gpus))
        slices += build_slices(node_name=name, driver=names.DRIVER,
                               devices=devices_of(copy, options), generation=1, node_uid=None)
        nodes.append({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
                      "status": {"allocatable": {"cpu": "256", "memory": "2Ti",
                                                 "pods": "110"}}})
    return device_classes(), nodes, slices, count * len(facts.gpus)


def _stream(seed: int, pods: int, cards: int, load: float) -> list[tuple[int, float]]:
    """(cards asked, run time in ticks) of each arriving pod."""
    rng = random.Random(seed)
    mean_cards = sum(size * share for size, share in SIZES)
    mean_run = load * cards / mean_cards
    sizes = [size for size, _ in SIZES]
    weights = [share for _, share in SIZES]
    return [(rng.choices(sizes, weights)[0], rng.expovariate(1 / mean_run))
            for _ in range(pods)]


def _aligned(state: ClusterState, plan: PodPlan) -> tuple[bool, bool, bool]:
    keys = [topology_key(state.devices[(r["driver"], r["pool"], r["device"])])
            for allocation in plan.allocations.values()
            for r in allocation["devices"]["results"]]

    def one(level: int) -> bool:
        values = {k[level] for k in keys}
        return len(values) == 1 and None not in values

    return one(2), one(1), one(0)


def _replay(objects: tuple[list[dict[str, Any]], list[dict[str, Any]], list[dict[str, Any]]],
            stream: Sequence[tuple[int, float]], translator: trace.Translator, *,
            strategy: str, topology: bool) -> tuple[_Tally, ClusterState]:
    classes, nodes, slices = objects
    state = ClusterState(PlannerSettings(default_strategy=strategy, topology=topology))
    state.load(classes=classes, nodes=nodes, slices=slices)
    tally = _Tally()
    running: list[tuple[float, int, dict[str, Any], PodPlan]] = []
    for tick, (size, run_time) in enumerate(stream):
        while running and running[0][0] <= tick:
            _, _, pod, plan = heapq.heappop(running)
            state.forget(pod, plan)
        legacy = trace.TracePod(f"p{size}", 1000, 1024, size, 1000, ())
        translated, templates = translator.translate(legacy)
        pod = {**translated, "metadata": {**translated["metadata"], "name": f"p{tick}",
                                          "uid": f"pod-{tick}"}}
        plan = plan_pod(state, pod, trace.claims_for(pod, templates))
        if plan.node_name is None:
            tally.dropped += 1
            continue
        state.assume(pod, plan)
        heapq.heappush(running, (tick + run_time, tick, pod, plan))
        tally.card_ticks += size * min(run_time, len(stream) - tick)
        if size > 1:
            root, numa, island = _aligned(state, plan)
            tally.placed[size] = tally.placed.get(size, 0) + 1
            tally.one_root[size] = tally.one_root.get(size, 0) + root
            tally.one_numa[size] = tally.one_numa.get(size, 0) + numa
            tally.one_island[size] = tally.one_island.get(size, 0) + island
    return tally, state


def run(inventory: Path, *, nodes: int, pods: int, load: float,
        seeds: Sequence[int]) -> dict[str, dict[str, float]]:
    classes, node_objs, slices, cards = _cluster(inventory, nodes)
    translator = trace.Translator()
    tallies: dict[str, list[_Tally]] = {label: [] for label, _, _ in CONFIGS}
    for seed in seeds:
        stream = _stream(seed, pods, cards, load)
        order = CONFIGS if seed % 2 == 0 else tuple(reversed(CONFIGS))  # side by side
        for label, strategy, topology in order:
            tally, _ = _replay((classes, node_objs, slices), stream, translator,
                               strategy=strategy, topology=topology)
            tallies[label].append(tally)
    results: dict[str, dict[str, float]] = {}
    for label, done in tallies.items():
        row: dict[str, float] = {}
        for size in (2, 4):
            placed = sum(t.placed.get(size, 0) for t in done)
            row[f"placed_{size}"] = placed
            for what, counts in (("root", "one_root"), ("numa", "one_numa"),
                                 ("island", "one_island")):
                hits = sum(getattr(t, counts).get(size, 0) for t in done)
                row[f"one_{what}_{size}"] = round(100 * hits / placed, 1) if placed else 0.0
        row["dropped"] = sum(t.dropped for t in done)
        row["allocated_pct"] = round(100 * sum(t.card_ticks for t in done)
                                     / (cards * pods * len(done)), 2)
        results[label] = row
    return results


def table(results: Mapping[str, Mapping[str, float]], *, inventory: Path, nodes: int,
          pods: int, load: float, seeds: Sequence[int]) -> str:
    header = (f"{'configuration':<13} {'2-card pods':>11} {'one root %':>10} {'one NUMA %':>10} "
              f"{'4-card pods':>11} {'one root %':>10} {'one NUMA %':>10} {'dropped':>7} "
              f"{'allocated %':>11}")
    lines = [header, "-" * len(header)]
    for label, r in results.items():
        lines.append(f"{label:<13} {r['placed_2']:>11.0f} {r['one_root_2']:>10.1f} "
                     f"{r['one_numa_2']:>10.1f} {r['placed_4']:>11.0f} {r['one_root_4']:>10.1f} "
                     f"{r['one_numa_4']:>10.1f} {r['dropped']:>7.0f} {r['allocated_pct']:>11.2f}")
    lines.append(f"({nodes} nodes of {inventory.name}; {pods} pods per seed asking 1, 2 or 4 "
                 f"cards, load {load:g}; summed over seed(s) {','.join(map(str, seeds))})")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from dra_gateway.node_plugin.inventory import InventoryError

    if args.nodes < 1 or args.pods < 1 or not 0 < args.load <= 1.5:
        print("dra-gateway bench topology: --nodes and --pods must be at least 1 and --load "
              "above 0 and at most 1.5, e.g. 0.9", file=sys.stderr)
        return 2
    try:
        seeds = trace.parse_seeds(args.seeds)
        inventory = Path(args.inventory) if args.inventory else DEFAULT_INVENTORY
        results = run(inventory, nodes=args.nodes, pods=args.pods, load=args.load, seeds=seeds)
    except (trace.TraceError, InventoryError, OSError) as exc:
        print(f"dra-gateway bench topology: {exc}", file=sys.stderr)
        return 2
    if args.output == "json":
        print(json.dumps({"configurations": results, "seeds": seeds}, indent=2))
    else:
        print(table(results, inventory=inventory, nodes=args.nodes, pods=args.pods,
                    load=args.load, seeds=seeds))
    return 0


__all__ = ["DEFAULT_INVENTORY", "main", "run", "table"]

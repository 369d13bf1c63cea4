"""`python -m dra_gateway.devkit.bench.mig`: MIG instances made on demand, placed by the
gateway's rule (`gpu.mig.choose`: keep the bigger profiles placeable) or by kube-scheduler's
first fit in slice order (`gpu.mig.first_fit`), on one stream of requests.

A cluster of `--nodes` nodes of eight cards of one model (`--model`, from the NVML stand-in's
tables, `dra_gateway.devkit.migcards`) serves a seeded stream of requests, one arriving per
tick: MIG profiles of every size and whole cards, in the mix of `MIX`, each held for an
exponentially drawn time whose mean keeps the memory slices asked at `--load` of the cluster's
(a whole card asks all eight). A request that fits nowhere when it arrives is refused. Both
rules replay the same stream side by side, request by request; every placement is checked
against the card's counters (no memory slice, no media extension given twice).

The figures: per rule, the requests placed by size, the big ones served (7g instances and whole
cards: what fragmentation refuses first), the share of slice-ticks held, and the gateway's ratio
to first fit.
"""

from __future__ import annotations

import argparse
import heapq
import json
import random
import sys
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_gateway.devkit.bench.trace import TraceError, parse_seeds
from dra_gateway.devkit.migcards import MODELS
from dra_gateway.gpu import mig
from dra_gateway.gpu.mig import Card, CardUse, Placement

WHOLE = "whole card"
MIX: tuple[tuple[str, float], ...] = (
    ("1g", 0.34), ("1g+me", 0.04), ("1g double", 0.10), ("2g", 0.15), ("3g", 0.15),
    ("4g", 0.05), ("7g", 0.09), (WHOLE, 0.08))
"""The request mix, by kind: a kind is the size class every model has (`_profiles`)."""
BIG = ("7g", WHOLE)
RULES: dict[str, Callable[..., tuple[int, Placement] | None]] = {
    "gateway": mig.choose, "first-fit": mig.first_fit}
DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"


def _profiles(geometry: mig.Geometry) -> dict[str, str]:
    """Each kind of `MIX` to the model's profile name."""
    by_size = {(p.size, p.compute_slices, p.media_extensions): p.name for p in geometry.profiles}
    return {"1g": by_size[1, 1, False], "1g+me": by_size[1, 1, True],
            "1g double": by_size[2, 1, False], "2g": by_size[2, 2, False],
            "3g": by_size[4, 3, False], "4g": by_size[4, 4, False], "7g": by_size[8, 7, False],
            WHOLE: by_size[8, 7, False]}


@dataclass(slots=True)
class Tally:
    """One rule's replay."""

    asked: Counter[str] = field(default_factory=Counter)
    placed: Counter[str] = field(default_factory=Counter)
    slice_ticks: float = 0.0

    def figures(self, ticks: int, slices: int) -> dict[str, Any]:
        big_asked = sum(self.asked[k] for k in BIG)
        big_placed = sum(self.placed[k] for k in BIG)
        return {"placed": sum(self.placed.values()), "asked": sum(self.asked.values()),
                "big_placed": big_placed, "big_asked": big_asked,
                "by_kind": {k: [self.placed[k], self.asked[k]] for k, _ in MIX},
                "slice_share": round(self.slice_ticks / (ticks * slices), 4)}


def stream(seed: int, requests: int, cards: int, load: float) -> list[tuple[str, float]]:
    """(kind, duration) per tick: the kinds drawn from `MIX`, the durations exponential with
    a mean that keeps `load` of the cards' memory slices asked."""
    rng = random.Random(seed)
    kinds, weights = zip(*MIX, strict=True)
    mean_slices = sum(w * _slices(k) for k, w in MIX)
    mean_duration = load * cards * 8 / mean_slices
    return [(rng.choices(kinds, weights)[0], rng.expovariate(1 / mean_duration))
            for _ in range(requests)]


def _slices(kind: str) -> int:
    return {"1g": 1, "1g+me": 1, "1g double": 2, "2g": 2, "3g": 4, "4g": 4}.get(kind, 8)


def replay(rule: str, geometry: mig.Geometry, cards: int,
           requests: Sequence[tuple[str, float]]) -> Tally:
    profiles = _profiles(geometry)
    uses = [CardUse() for _ in range(cards)]
    leaving: list[tuple[float, int, int, Placement]] = []  # (when, seq, card, placement)
    tally = Tally()
    for tick, (kind, duration) in enumerate(requests):
        while leaving and leaving[0][0] <= tick:
            _, _, card, placement = heapq.heappop(leaving)
            uses[card] = uses[card].without_placement(placement)
        tally.asked[kind] += 1
        candidates = [Card(i, geometry, use) for i, use in enumerate(uses)]
        if kind == WHOLE:  # the full card device: every counter free
            chosen = next(((c.key, Placement(geometry.profile(profiles[WHOLE]), 0))
                           for c in candidates if c.use == CardUse()), None)
        else:
            chosen = RULES[rule](candidates, profiles[kind])
        if chosen is None:
            continue
        card, placement = chosen
        if not mig.fits(geometry, uses[card], placement):
            raise AssertionError(f"{rule} over-committed card {card}: {placement}")
        uses[card] = uses[card].with_placement(placement)
        tally.placed[kind] += 1
        tally.slice_ticks += placement.profile.size * duration
        heapq.heappush(leaving, (tick + duration, tick, card, placement))
    return tally


class PlannerReplay:
    """One rule's replay through the allocator's planner: nodes of eight cards cut on demand,
    published by the node plugin's builders (1.35's layout), each request a pod with one claim
    (a profile of the MIG class, or a whole card of the GPU class), planned and assumed as the
    allocator does; a departure forgets its plan. `strategy` `default` is the gateway's rule,
    `first-fit` kube-scheduler's (nodes by name, devices in slice order)."""

    def __init__(self, strategy: str, model: str, nodes: int) -> None:
        from dra_gateway.allocator.planner import ClusterState, PlannerSettings
        from dra_gateway.kube import names
        from dra_gateway.node_plugin.devices import DeviceOptions, counter_sets_of, devices_of
        from dra_gateway.node_plugin.facts import GpuFacts, NodeFacts
        from dra_gateway.node_plugin.publish import build_slices

        card_model = MODELS[model]
        self.geometry = geometry = card_model.geometry()
        self.names = names
        self.state = ClusterState(PlannerSettings(default_strategy=strategy))
        for cls, kind in ((names.GPU_CLASS, "gpu"), (names.MIG_CLASS, "mig")):
            self.state.set_device_class({
                "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
                "metadata": {"name": cls}, "spec": {"selectors": [{"cel": {"expression": (
                    f"device.driver == '{names.DRIVER}' && "
                    f"device.attributes['{names.DRIVER}'].type == '{kind}'")}}]}})
        facts = NodeFacts(gpus=tuple(
            GpuFacts(index=i, uuid=f"GPU-{i}", product_name=card_model.name,
                     memory=card_model.memory_mib << 20, mig_enabled=True,
                     mig_geometry=geometry) for i in range(8)))
        options = DeviceOptions(partitionable_devices=True)
        self.spots: dict[str, tuple[int, Placement]] = {}
        for i in range(8):
            self.spots[f"gpu-{i}"] = (i, Placement(geometry.ranked()[0], 0))
            for placement in mig.placements_of(geometry):
                self.spots[mig.device_name(i, placement)] = (i, placement)
        for n in range(nodes):
            name = f"node-{n:03d}"
            self.state.set_node({"apiVersion": "v1", "kind": "Node", "metadata": {
                "name": name}, "status": {"allocatable": {"cpu": "256", "memory": "2Ti",
                                                          "pods": "1000"}}})
            for slice_ in build_slices(node_name=name, driver=names.DRIVER,
                                       devices=devices_of(facts, options), generation=1,
                                       node_uid=None, max_devices=64,
                                       counter_sets=counter_sets_of(facts),
                                       counters_apart=True):
                self.state.set_slice(slice_)
        self.node_index = {f"node-{n:03d}": n for n in range(nodes)}
        self._plans: dict[int, tuple[Any, Any]] = {}

    def place(self, seq: int, profile: str | None) -> tuple[tuple[int, int], Placement] | None:
        """Plan one pod asking `profile` (None: a whole card); its card and placement."""
        from dra_gateway.allocator.planner import plan_pod

        names = self.names
        if profile is None:
            exactly: dict[str, Any] = {"deviceClassName": names.GPU_CLASS}
        else:
            exactly = {"deviceClassName": names.MIG_CLASS, "selectors": [{"cel": {
                "expression": f"device.attributes['{names.DRIVER}'].profile == '{profile}'"}}]}
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": f"c{seq}", "namespace": "bench", "uid": f"c{seq}"},
                 "spec": {"devices": {"requests": [{"name": "main", "exactly": {
                     **exactly, "allocationMode": "ExactCount", "count": 1}}]}}}
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": f"p{seq}", "namespace": "bench", "uid": f"p{seq}"},
               "spec": {"containers": [{"name": "main", "image": "x"}]}}
        plan = plan_pod(self.state, pod, [claim])
        if plan.node_name is None:
            return None
        self.state.assume(pod, plan)
        self._plans[seq] = (pod, plan)
        (result,) = plan.allocations[f"c{seq}"]["devices"]["results"]
        card, placement = self.spots[result["device"]]
        return (self.node_index[plan.node_name], card), placement

    def leave(self, seq: int) -> None:
        self.state.forget(*self._plans.pop(seq))


def replay_planner(strategy: str, model: str, nodes: int,
                   requests: Sequence[tuple[str, float]]) -> Tally:
    """`replay`, through the planner (`PlannerReplay`); every placement is checked against
    the card's use, read from the devices given."""
    replay_ = PlannerReplay(strategy, model, nodes)
    geometry = replay_.geometry
    profiles = _profiles(geometry)
    uses: dict[tuple[int, int], CardUse] = {}
    leaving: list[tuple[float, int, tuple[int, int], Placement]] = []
    tally = Tally()
    for tick, (kind, duration) in enumerate(requests):
        while leaving and leaving[0][0] <= tick:
            _, seq, card, placement = heapq.heappop(leaving)
            uses[card] = uses[card].without_placement(placement)
            replay_.leave(seq)
        tally.asked[kind] += 1
        chosen = replay_.place(tick, None if kind == WHOLE else profiles[kind])
        if chosen is None:
            continue
        card, placement = chosen
        if not mig.fits(geometry, uses.get(card, CardUse()), placement):
            raise AssertionError(f"planner {strategy} over-committed card {card}: {placement}")
        uses[card] = uses.get(card, CardUse()).with_placement(placement)
        tally.placed[kind] += 1
        tally.slice_ticks += placement.profile.size * duration
        heapq.heappush(leaving, (tick + duration, tick, card, placement))
    return tally


PLANNER_STRATEGIES = {"gateway": "default", "first-fit": "first-fit"}


def run(*, model: str, nodes: int, requests: int, load: float,
        seeds: Sequence[int], planner: bool = False) -> dict[str, Any]:
    geometry = MODELS[model].geometry()
    cards = nodes * 8
    tallies: dict[str, list[dict[str, Any]]] = {rule: [] for rule in RULES}
    for seed in seeds:
        trace = stream(seed, requests, cards, load)
        for rule in RULES:
            tally = (replay_planner(PLANNER_STRATEGIES[rule], model, nodes, trace) if planner
                     else replay(rule, geometry, cards, trace))
            tallies[rule].append(tally.figures(requests, cards * geometry.memory_slices))
    out: dict[str, Any] = {"model": model, "nodes": nodes, "requests": requests, "load": load,
                           "seeds": list(seeds), "planner": planner, "rules": {}}
    for rule, runs in tallies.items():
        out["rules"][rule] = {
            "placed": sum(r["placed"] for r in runs), "asked": sum(r["asked"] for r in runs),
            "big_placed": sum(r["big_placed"] for r in runs),
            "big_asked": sum(r["big_asked"] for r in runs),
            "slice_share": round(sum(r["slice_share"] for r in runs) / len(runs), 4),
            "by_kind": {k: [sum(r["by_kind"][k][0] for r in runs),
                            sum(r["by_kind"][k][1] for r in runs)] for k, _ in MIX}}
    gateway, first = out["rules"]["gateway"], out["rules"]["first-fit"]
    out["ratio"] = {"placed": _ratio(gateway["placed"], first["placed"]),
                    "big_placed": _ratio(gateway["big_placed"], first["big_placed"])}
    return out


def _ratio(a: int, b: int) -> float | None:
    return round(a / b, 3) if b else None


def table(result: Mapping[str, Any]) -> str:
    kinds = [k for k, _ in MIX]
    lines = [f"{'rule':<10} {'placed':>13} {'7g+whole':>11} {'slices held':>11}  "
             + "  ".join(f"{k:>9}" for k in kinds)]
    for rule, r in result["rules"].items():
        lines.append(
            f"{rule:<10} {r['placed']:>6}/{r['asked']:<6} {r['big_placed']:>5}/{r['big_asked']:<5}"
            f" {r['slice_share']:>11.1%}  "
            + "  ".join(f"{r['by_kind'][k][0]:>4}/{r['by_kind'][k][1]:<4}" for k in kinds))
    ratio = result["ratio"]
    lines.append(f"gateway / first-fit: placed x{ratio['placed']}, 7g and whole cards served "
                 f"x{ratio['big_placed']}")
    lines.append(f"({result['model']}, {result['nodes']} nodes of 8 cards, {result['requests']} "
                 f"requests per seed at load {result['load']}, seeds "
                 f"{', '.join(map(str, result['seeds']))}"
                 + (", through the planner" if result.get("planner") else "") + ")")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dra_gateway.devkit.bench.mig",
        description="MIG placement: the gateway's rule against first fit in slice order.")
    parser.add_argument("--model", default=DEFAULT_MODEL, choices=sorted(MODELS),
                        help="the card model, from the NVML stand-in's tables")
    parser.add_argument("--nodes", type=int, default=16, metavar="COUNT",
                        help="nodes of eight cards (default 16)")
    parser.add_argument("--requests", type=int, default=20_000, metavar="COUNT",
                        help="requests per seed, one per tick (default 20000)")
    parser.add_argument("--load", type=float, default=1.0,
                        help="memory slices asked, as a share of the cluster's (default 1.0)")
    parser.add_argument("--seeds", default="1-3", help="e.g. 7, 1,2,5 or 1-3 (default 1-3)")
    parser.add_argument("--planner", action="store_true",
                        help="replay through the allocator's planner on the node plugin's "
                             "slices (strategies default and first-fit) instead of the "
                             "placement rules alone")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.requests < 1 or args.load <= 0:
        print("error: --nodes and --requests must be at least 1 and --load above 0",
              file=sys.stderr)
        return 2
    try:
        seeds = parse_seeds(args.seeds)
    except TraceError:
        print(f"error: --seeds {args.seeds!r}: write 7, 1,2,5 or 1-3", file=sys.stderr)
        return 2
    result = run(model=args.model, nodes=args.nodes, requests=args.requests, load=args.load,
                 seeds=seeds, planner=args.planner)
    print(json.dumps(result, indent=2) if args.output == "json" else table(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""What the planner's speed layer buys: `plan_pod` against the plain reference planner, on the
openb trace.

Run: `python -m dra_gateway.devkit.bench.speedlayer --nodes openb_node_list_gpu_node.csv
--pods openb_pod_list_default.csv [--node-count N] [--pod-count M] [--strategy S] [--load L]
[--seeds 42] [--repeat R] [--variants real,no-memo,no-rankings,reference] [-o json]`.

The speed layer is what `plan_pod` adds to the plain search: node classes, the searches
memoised per class (`memokeys.py`, `caches.py`) and the rankings walked best first. The
reference (`dra_gateway.devkit.reference_planner`) has none of it: every node in name order,
the device search run afresh on each. `no-memo` and `no-rankings` are `plan_pod` with one part
turned off (`PlannerSettings.memo`, `.rankings`), to see what each part buys on its own.
All get the same pod sequence on identical states: the
trace library's cluster (`trace.TraceCluster`: the first `--node-count` nodes of the list, their
slices as the node plugin publishes them) and its workload (`trace.sample`: every pod of the
list plus seeded copies up to `--load` times the cards, shuffled; cut where the requests reach
`--load` times the cards of the nodes taken, so that part of the cluster gets the load the
whole does; then the first `--pod-count` of them), each pod translated and its claims made as
in `dra-gateway bench allocator`. Each
planner plans every pod and its own plan is assumed into its own state, as the allocator
does. The runs are one after the other, not interleaved (their states differ in what the
caches hold), and their order rotates by one across repetitions (`--repeat`, 2 by default:
with two planners, one each way) and seeds, so that none always runs on the warmer or the
cooler machine; before the first, each plans the first 100 pods untimed, so that what the
process keeps for all states is not charged to the planner that happens to go first.

Reported: pods planned (and placed), the time of each planner (the planning thread's CPU time
of `plan` + `assume`, summed over repetitions and seeds; wall-clock beside it), the ratio
reference over real, and whether every plan agreed: the same node and the same devices, claim
by claim, as the first run of `plan_pod` on that seed (the other runs of `plan_pod` are
compared too, so a planner that varies from run to run shows). A disagreement is printed on
stderr and the exit code is 1; once plans differ the states differ, so only the first of a
run is sure to be a real difference. Quotas and GPU policies are out (the reference leaves
quotas to the planner). This module reads the CSVs and prints; the planners do no I/O.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_gateway.allocator.planner import (
    STRATEGIES,
    ClusterState,
    PlannerSettings,
    PodPlan,
    Workload,
    plan_pod,
)
from dra_gateway.devkit.bench.trace import (
    TraceCluster,
    TraceError,
    TracePod,
    Translator,
    claims_for,
    parse_seeds,
    read_nodes,
    read_pods,
    sample,
    trace_workload,
)
from dra_gateway.devkit.reference_planner import reference_plan
from dra_gateway.kube.runtime.collector import settle

Planner = Callable[[ClusterState, Mapping[str, Any], Sequence[Mapping[str, Any]]], PodPlan]
Where = tuple[str | None, tuple[tuple[str, tuple[tuple[str, str], ...]], ...]]

PLANNERS: dict[str, Planner] = {
    "real": plan_pod,
    "no-memo": plan_pod,
    "no-rankings": plan_pod,
    "reference": reference_plan,
}
# The speed layer's parts each variant turns off (`PlannerSettings.memo`, `.rankings`).
LAYERS: dict[str, dict[str, bool]] = {
    "no-memo": {"memo": False},
    "no-rankings": {"rankings": False},
}
BASELINE = "real"
SHOWN = 10  # disagreements printed (all are counted)
WARMUP = 100  # pods each planner plans, untimed, before the first timed run


def where(plan: PodPlan) -> Where:
    """Where a plan puts the pod: its node and, claim by claim, the devices (pool, device)."""
    return plan.node_name, tuple(
        (key, tuple((r["pool"], r["device"])
                    for r in (allocation.get("devices") or {}).get("results") or ()))
        for key, allocation in sorted(plan.allocations.items()))


@dataclass(slots=True)
class Run:
    """One planner's run over one seed's pod sequence."""

    planner: str
    seed: int
    repetition: int
    seconds: float = 0.0
    wall_seconds: float = 0.0
    placed: int = 0
    plans: list[Where] = field(default_factory=list)


def pod_sequence(pods: Sequence[TracePod], total_gpus: int, *, load: float, seed: int,
                 pod_count: int | None) -> list[TracePod]:
    """The trace library's sample, cut where its GPU requests reach `load` times the cluster's
    GPUs (the whole sample on the trace's own cluster, whose pods ask less than that; on the
    first N nodes, the same load rather than every pod of the list), then its first
    `pod_count` pods."""
    sequence = sample(pods, total_gpus, load, seed)
    target = load * total_gpus
    requested = 0.0
    for n, pod in enumerate(sequence):
        if requested >= target:
            sequence = sequence[:n]
            break
        requested += pod.gpu_share
    return sequence if pod_count is None else sequence[:pod_count]


def run_one(planner: str, cluster: TraceCluster, translator: Translator,
            sequence: Sequence[TracePod], *, strategy: str, workload: Workload, seed: int,
            repetition: int) -> Run:
    """Plan `sequence` on a fresh state with one planner, assuming each plan as the allocator
    does; timed as `bench allocator` times it (the pod and its claims built outside)."""
    plan_of = PLANNERS[planner]
    layer = LAYERS.get(planner, {})
    state = cluster.state(PlannerSettings(default_strategy=strategy,
                                          memo=layer.get("memo", True),
                                          rankings=layer.get("rankings", True)))
    state.set_workload(workload)
    run = Run(planner, seed, repetition)
    settle()
    try:
        for n, trace_pod in enumerate(sequence):
            if n % 1000 == 999:
                gc.freeze()
            translated, templates = translator.translate(trace_pod)
            pod = {**translated, "metadata": {**translated["metadata"], "name": f"p{n}",
                                              "uid": f"pod-{n}"}}
            claims = claims_for(pod, templates)
            start = time.thread_time()
            wall_start = time.perf_counter()
            plan = plan_of(state, pod, claims)
            if plan.node_name is not None:
                state.assume(pod, plan)
            run.seconds += time.thread_time() - start
            run.wall_seconds += time.perf_counter() - wall_start
            run.placed += plan.node_name is not None
            run.plans.append(where(plan))
    finally:
        gc.unfreeze()
    return run


def measure(nodes_path: Path, pods_path: Path, *, node_count: int | None = None,
            pod_count: int | None = None, strategy: str = "default", load: float = 1.3,
            seeds: Sequence[int] = (42,), repeat: int = 2,
            variants: Sequence[str] = (BASELINE, "reference"),
            ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The figures, and the disagreements (each: seed, repetition, planner, pod, the first
    `plan_pod` run's placement of it and that planner's). `variants` are planned in turn, the
    order rotating by one at each repetition; the real planner is always among them."""
    names = [BASELINE, *(v for v in variants if v != BASELINE)]
    nodes = read_nodes(nodes_path)
    if node_count is not None:
        nodes = nodes[:node_count]
    pods = read_pods(pods_path)
    cluster = TraceCluster(nodes)
    translator = Translator()
    workload = trace_workload(pods)
    runs: list[list[Run]] = []  # per repetition, in the order run
    disagreements: list[dict[str, Any]] = []
    planned = placed = 0
    turn = 0
    for seed in seeds:
        sequence = pod_sequence(pods, cluster.total_gpus, load=load, seed=seed,
                                pod_count=pod_count)
        for trace_pod in sequence:  # translated once, outside every timed run
            translator.translate(trace_pod)
        if turn == 0:
            # Untimed, what the process keeps once for all states (compiled selectors and
            # the like) is filled, so that it is not charged to whichever planner goes first.
            for name in names:
                run_one(name, cluster, translator, sequence[:WARMUP], strategy=strategy,
                        workload=workload, seed=seed, repetition=-1)
        baseline: Run | None = None
        for repetition in range(repeat):
            shift = turn % len(names)
            order = names[shift:] + names[:shift]
            turn += 1
            done = [run_one(name, cluster, translator, sequence, strategy=strategy,
                            workload=workload, seed=seed, repetition=repetition)
                    for name in order]
            runs.append(done)
            if baseline is None:
                baseline = next(r for r in done if r.planner == BASELINE)
                planned += len(sequence)
                placed += baseline.placed
            for other in done:
                if other is baseline:
                    continue
                for n, (expected, got) in enumerate(zip(baseline.plans, other.plans,
                                                        strict=True)):
                    if expected != got:
                        disagreements.append({
                            "seed": seed, "repetition": repetition, "planner": other.planner,
                            "pod": f"p{n}", "trace_pod": sequence[n].name,
                            "plan_pod": _shown(expected), "got": _shown(got)})
    per_pod = planned * repeat or 1
    totals = {name: (sum(r.seconds for rs in runs for r in rs if r.planner == name),
                     sum(r.wall_seconds for rs in runs for r in rs if r.planner == name))
              for name in names}
    real_s, real_wall = totals[BASELINE]
    figures: dict[str, Any] = {
        "nodes": len(nodes), "cards": cluster.total_gpus, "strategy": strategy, "load": load,
        "seeds": list(seeds), "repeat": repeat, "variants": names,
        "pods": planned, "pods_placed": placed,
        **{name: {"seconds": round(cpu, 3), "wall_seconds": round(wall, 3),
                  "ms_per_pod": round(1000 * cpu / per_pod, 3),
                  "times_real": round(cpu / real_s, 2) if real_s else 0.0}
           for name, (cpu, wall) in totals.items()},
        "runs": [{"seed": done[0].seed, "repetition": done[0].repetition,
                  "first": done[0].planner, "order": [r.planner for r in done],
                  **{f"{r.planner}_seconds": round(r.seconds, 3) for r in done}}
                 for done in runs],
        "agree": not disagreements,
        "disagreements": len(disagreements),
    }
    if "reference" in totals:
        ref_s, ref_wall = totals["reference"]
        figures["ratio"] = round(ref_s / real_s, 2) if real_s else 0.0
        figures["wall_ratio"] = round(ref_wall / real_wall, 2) if real_wall else 0.0
        for run in figures["runs"]:
            real = run[f"{BASELINE}_seconds"]
            run["ratio"] = round(run["reference_seconds"] / real, 2) if real else 0.0
    return figures, disagreements


def _shown(place: Where) -> str:
    node, claims = place
    if node is None:
        return "(not placed)"
    return node + " " + "; ".join(
        f"{key}: {', '.join(f'{pool}/{device}' for pool, device in devices)}"
        for key, devices in claims)


def table(figures: Mapping[str, Any]) -> str:
    lines = [
        f"{figures['nodes']} nodes ({figures['cards']} cards), strategy {figures['strategy']}, "
        f"{figures['pods']} pods planned ({figures['pods_placed']} placed), seeds "
        f"{','.join(map(str, figures['seeds']))}, {figures['repeat']} repetition(s) each",
        f"{'planner':<12} {'CPU s':>9} {'wall s':>9} {'ms/pod':>9} {'x real':>7}",
    ]
    for name in figures["variants"]:
        r = figures[name]
        lines.append(f"{name:<12} {r['seconds']:>9.3f} {r['wall_seconds']:>9.3f} "
                     f"{r['ms_per_pod']:>9.3f} {r['times_real']:>7.2f}")
    if "ratio" in figures:
        lines.append(f"reference / real: {figures['ratio']:.2f}x CPU, "
                     f"{figures['wall_ratio']:.2f}x wall (per repetition: "
                     + ", ".join(f"{run['ratio']:.2f}x ({run['first']} first)"
                                 for run in figures["runs"]) + ")")
    lines.append("plans: every one agreed (node and devices)" if figures["agree"] else
                 f"plans: {figures['disagreements']} DISAGREED (see stderr)")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", required=True, help="node list CSV (openb format)")
    parser.add_argument("--pods", required=True, help="pod list CSV (openb format)")
    parser.add_argument("--node-count", type=int, default=None, metavar="N",
                        help="the first N nodes of the list (default: all)")
    parser.add_argument("--pod-count", type=int, default=None, metavar="M",
                        help="the first M pods of the sampled sequence (default: all)")
    parser.add_argument("--strategy", default="default",
                        help=f"packing strategy: {', '.join(STRATEGIES)} (default: %(default)s)")
    parser.add_argument("--load", type=float, default=1.3,
                        help="GPU requests sampled, times the cluster's GPUs (default: "
                             "%(default)s)")
    parser.add_argument("--seeds", "--seed", default="42",
                        help="seeds of the pod sequences: 42, 42-44 or 42,50 "
                             "(default: %(default)s)")
    parser.add_argument("--repeat", type=int, default=2,
                        help="runs of each planner per seed, the order alternating "
                             "(default: %(default)s)")
    parser.add_argument("--variants", default=f"{BASELINE},reference",
                        help="planners to time against the real one, comma-separated: "
                             f"{', '.join(PLANNERS)} (default: %(default)s)")
    parser.add_argument("-o", "--output", choices=("table", "json"), default="table")
    args = parser.parse_args(argv)
    prog = "dra_gateway.devkit.bench.speedlayer"
    if args.strategy not in STRATEGIES:
        print(f"{prog}: --strategy {args.strategy!r} is not a strategy; use one of "
              f"{', '.join(STRATEGIES)}", file=sys.stderr)
        return 2
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in PLANNERS]
    if unknown:
        print(f"{prog}: --variants: {', '.join(map(repr, unknown))} is not a planner; use "
              f"{', '.join(PLANNERS)}", file=sys.stderr)
        return 2
    for flag, value in (("--node-count", args.node_count), ("--pod-count", args.pod_count),
                        ("--repeat", args.repeat)):
        if value is not None and value < 1:
            print(f"{prog}: {flag} must be at least 1", file=sys.stderr)
            return 2
    if not args.load > 0:
        print(f"{prog}: --load must be above 0, e.g. 1.3", file=sys.stderr)
        return 2
    try:
        figures, disagreements = measure(
            Path(args.nodes), Path(args.pods), node_count=args.node_count,
            pod_count=args.pod_count, strategy=args.strategy, load=args.load,
            seeds=parse_seeds(args.seeds), repeat=args.repeat, variants=variants)
    except TraceError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    for d in disagreements[:SHOWN]:
        print(f"{prog}: seed {d['seed']} repetition {d['repetition']} pod {d['pod']} "
              f"({d['trace_pod']}): first plan_pod run: {d['plan_pod']}; {d['planner']}: "
              f"{d['got']}", file=sys.stderr)
    if len(disagreements) > SHOWN:
        print(f"{prog}: ... and {len(disagreements) - SHOWN} more", file=sys.stderr)
    if args.output == "json":
        print(json.dumps({**figures, "disagreement_list": disagreements[:SHOWN]}, indent=2))
    else:
        print(table(figures))
    return 0 if figures["agree"] else 1


if __name__ == "__main__":
    sys.exit(main())

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
The trace, the cluster and the replay are the trace library's (`trace`); the variants
(`--groups`, `--preemption`, `--defrag-moves`) are modules of their own, which this one
dispatches to. This module does I/O (reads the CSVs, prints); the planner it drives does none.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dra_gateway.allocator.planner import STRATEGIES
from dra_gateway.devkit.bench.trace import (
    FULL,
    RunResult,
    TraceCluster,
    TraceError,
    TraceNode,
    TracePod,
    Translator,
    gpu_policies,
    load_trace,
    parse_seeds,
    percentile,
    read_nodes,
    read_pods,
    replay,
    side_by_side,
    trace_workload,
)
from dra_gateway.policy.catalog import Catalog


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
                cluster = TraceCluster(nodes)
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
        "p50_ms": round(percentile(timings, 0.50), 3),
        "p99_ms": round(percentile(timings, 0.99), 3),
        "max_ms": round(max(timings, default=0.0), 3),
        "wall_claims_per_second": round(claims / wall, 1) if wall else 0.0,
        "wall_p99_ms": round(percentile(walls, 0.99), 3),
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
            left = FULL - sum(shares)
            if left > 0:
                content = tuple(sorted(shares, reverse=True))
                free[content] += left
                cards[content] += 1
        untouched = total_gpus - len(held)
        if untouched > 0:
            free[()] += untouched * FULL
            cards[()] += untouched
    count = len(runs) or 1
    total = sum(free.values()) or 1
    out: list[dict[str, Any]] = []
    ordered = free.most_common()
    for content, left in ordered[:rows]:
        out.append({"holds": "+".join(map(str, content)), "cards": round(cards[content] / count, 1),
                    "unallocated_gpus": round(left / FULL / count, 1),
                    "share_of_unallocated": round(100 * left / total, 1)})
    rest = ordered[rows:]
    if rest:
        left = sum(v for _, v in rest)
        out.append({"holds": "other", "cards": round(sum(cards[c] for c, _ in rest) / count, 1),
                    "unallocated_gpus": round(left / FULL / count, 1),
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
            from dra_gateway.devkit.bench import groups as groups_bench

            results = groups_bench.run(Path(args.nodes), Path(args.pods), strategies=strategies,
                                       load=args.load, seeds=seeds)
        elif preemption is not None:
            from dra_gateway.devkit.bench import preemption as preemption_bench

            results = preemption_bench.run(Path(args.nodes), Path(args.pods),
                                           strategies=strategies, load=args.load, seeds=seeds,
                                           percent=preemption)
        elif percent is not None:
            from dra_gateway.devkit.bench import defrag as defrag_bench

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
        from dra_gateway.devkit.bench import groups as groups_bench

        print(groups_bench.table(results, seeds))
    elif preemption is not None and args.output != "json":
        from dra_gateway.devkit.bench import preemption as preemption_bench

        print(preemption_bench.table(results, seeds, preemption))
    elif percent is not None and args.output != "json":
        from dra_gateway.devkit.bench import defrag as defrag_bench

        print(defrag_bench.table(results, seeds, percent))
    elif args.output == "json":
        print(json.dumps({"policies": results, "seeds": seeds, "load": args.load}, indent=2))
    else:
        print(_table(results, seeds) + ("\n" + _losses_table(results) if losses else ""))
    return 0


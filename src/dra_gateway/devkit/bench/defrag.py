"""`dra-gateway bench allocator --defrag-moves P`: what moving placed pods wins on a trace.

Each seed's replay (`trace.Replay`) runs to its end; then, on the state it left:

1. **retry**: every pod that did not fit is planned once more, in arrival order, moving
   nothing (what a scheduler that retries pending pods gains);
2. **defrag**: the pods still waiting are given to the defrag planner
   (`allocator.planner.defrag.plan_defrag`) in arrival order, which may move at most P% of
   the pods placed. Every trace pod may move (the trace's pods are replicas re-created by
   their controllers), all of one priority.

The figures are GPU allocation (placed GPU share over all GPUs) before, after retrying and after
defrag, the moves made (and as a share of the pods placed), the pods placed by each step, and
the defrag planner's time. Both steps use the code the allocator and `dra-gateway defrag plan`
run.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dra_gateway.allocator.planner.defrag import Limits, plan_defrag
from dra_gateway.allocator.planner.leaving import Resident, Waiter
from dra_gateway.devkit.bench import trace


@dataclass(frozen=True, slots=True)
class DefragRun:
    before: float  # GPU allocation, %
    after_retry: float
    after_defrag: float
    placed: int  # pods placed by the replay
    retried: int  # pods placed by retrying
    helped: int  # pods placed by defrag (moving pods)
    moves: int
    seconds: float  # the defrag planner's wall time


def defragment(replay: trace.Replay, percent: float, limits: Limits | None = None,
               ) -> DefragRun:
    """Retry, then defrag, on the state a finished replay (`keep=True`) left."""
    total = replay.total_gpus
    residents: list[Resident] = []
    waiting: list[tuple[Waiter, float]] = []
    for pod, claims, plan, share in replay.kept:
        if plan.node_name is None:
            if claims:
                waiting.append((Waiter(pod, tuple(claims)), share))
            continue
        bound = {**pod, "spec": {**pod["spec"], "nodeName": plan.node_name}}
        allocated = tuple({**c, "status": {"allocation": plan.allocations[c["metadata"]["uid"]]}}
                          for c in claims)
        residents.append(Resident(bound, allocated))
    share_of = {w.pod["metadata"]["uid"]: share for w, share in waiting}
    before = replay.allocated
    retry = plan_defrag(replay.state, [w for w, _ in waiting], residents, Limits(max_moves=0))
    retried = {h.uid for h in retry.helped}
    after_retry = before + sum(share_of[uid] for uid in retried)
    still = [w for w, _ in waiting if w.pod["metadata"]["uid"] not in retried]
    waiter_of = {w.pod["metadata"]["uid"]: w for w, _ in waiting}
    bound_now = list(residents)
    for h in retry.helped:
        w = waiter_of[h.uid]
        bound_now.append(Resident({**w.pod, "spec": {**w.pod["spec"],
                                                    "nodeName": h.placement.node}},
                                  tuple(_allocated(w.claims, h.plan.allocations))))
    budget = int(len(bound_now) * percent / 100)
    given = limits or Limits()
    start = time.perf_counter()
    result = plan_defrag(replay.state, still, bound_now, Limits(
        max_moves=budget, max_moves_per_pod=given.max_moves_per_pod,
        nodes_tried=given.nodes_tried, depth=given.depth))
    seconds = time.perf_counter() - start
    after = after_retry + sum(share_of[h.uid] for h in result.helped)
    return DefragRun(before=100 * before / total, after_retry=100 * after_retry / total,
                     after_defrag=100 * after / total, placed=len(residents),
                     retried=len(retried), helped=len(result.helped),
                     moves=len(result.moves), seconds=seconds)


def _allocated(claims: Sequence[Mapping[str, Any]],
               allocations: Mapping[str, Any]) -> list[dict[str, Any]]:
    return [{**c, "status": {"allocation": allocations[c["metadata"]["uid"]]}} for c in claims]


def run(nodes_path: Path, pods_path: Path, *, strategies: Sequence[str], load: float,
        seeds: Sequence[int], percent: float) -> dict[str, dict[str, float]]:
    loaded = trace.load_trace(nodes_path, pods_path)
    pods, cluster, translator, workload = (loaded.pods, loaded.cluster, loaded.translator,
                                           loaded.workload)
    results: dict[str, dict[str, float]] = {}
    for strategy in strategies:
        runs = []
        for seed in seeds:
            replay = trace.Replay(cluster, translator, strategy=strategy, workload=workload,
                                   catalog=None, namespaces=False, keep=True)
            for n, trace_pod in enumerate(trace.sample(pods, cluster.total_gpus, load, seed)):
                replay.place(n, trace_pod)
            runs.append(defragment(replay, percent))
        results[strategy] = {
            "allocation_ratio": round(statistics.fmean(r.before for r in runs), 2),
            "after_retry": round(statistics.fmean(r.after_retry for r in runs), 2),
            "after_defrag": round(statistics.fmean(r.after_defrag for r in runs), 2),
            "pods_placed": round(statistics.fmean(r.placed for r in runs), 1),
            "pods_retried": round(statistics.fmean(r.retried for r in runs), 1),
            "pods_helped": round(statistics.fmean(r.helped for r in runs), 1),
            "moves": round(statistics.fmean(r.moves for r in runs), 1),
            "moves_percent": round(100 * sum(r.moves for r in runs)
                                   / max(1, sum(r.placed for r in runs)), 2),
            "defrag_seconds": round(statistics.fmean(r.seconds for r in runs), 2),
        }
    return results


def table(results: Mapping[str, Mapping[str, float]], seeds: Sequence[int],
          percent: float) -> str:
    width = max([10, *(len(p) for p in results)])
    header = (f"{'strategy':<{width}} {'GPU alloc %':>11} {'+retry %':>9} {'+defrag %':>10} "
              f"{'moves':>7} {'moved %':>8} {'helped':>7} {'defrag s':>9}")
    lines = [header, "-" * len(header)]
    for label, r in results.items():
        lines.append(f"{label:<{width}} {r['allocation_ratio']:>11.2f} {r['after_retry']:>9.2f} "
                     f"{r['after_defrag']:>10.2f} {r['moves']:>7.1f} {r['moves_percent']:>8.2f} "
                     f"{r['pods_helped']:>7.1f} {r['defrag_seconds']:>9.2f}")
    lines.append(f"(mean over {len(seeds)} seed(s): {','.join(map(str, seeds))}; defrag may "
                 f"move at most {percent:g}% of the pods placed)")
    return "\n".join(lines)

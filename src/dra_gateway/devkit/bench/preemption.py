"""`dra-gateway bench allocator --preemption P`: what preemption does once a trace fills the
cluster.

Each seed is replayed (`trace.Replay`) twice side by side, pod by pod, every pod of priority
0, to the end of its sample. Then P% more pods (10 by default), drawn from the same trace with
another seed, arrive one at a time with priority 100, in both replays side by side:

- **off**: each is planned as the cluster is (what the allocator did before preemption);
- **on**: each is planned, and one that fits nowhere is given to the preemption planner
  (`allocator.planner.preemption.plan_preemption`, the allocator's code) over every placed pod
  of lower priority; its victims leave the state and it is assumed where the plan puts it.

The figures: the high-priority pods placed, off and on; victims per preemption (mean, max); the
victim search's time (p50, p99, over the preemptions tried); and the planning time of the
arriving pods' claims, off and on (claims/s, p99 per claim, the ratio per claim), measured
with the thread's CPU clock as the replay measures it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_gateway.allocator.planner.leaving import Resident, Waiter
from dra_gateway.allocator.planner.plan import plan_pod
from dra_gateway.allocator.planner.preemption import Preemption, plan_preemption
from dra_gateway.devkit.bench import trace
from dra_gateway.kube import objects

HIGH = 100


@dataclass(slots=True)
class _Arrivals:
    """One configuration's high-priority arrivals."""

    preempt: bool
    placed: int = 0
    claims: int = 0
    seconds: float = 0.0
    per_claim_ms: list[float] = field(default_factory=list)
    victims: list[int] = field(default_factory=list)
    search_ms: list[float] = field(default_factory=list)


def _residents(replay: trace.Replay) -> list[Resident]:
    out = []
    for pod, claims, plan, _ in replay.kept:
        if plan.node_name is None or not claims:
            continue
        bound = {**pod, "spec": {**pod["spec"], "nodeName": plan.node_name}}
        out.append(Resident(bound, tuple(
            {**c, "status": {"allocation": plan.allocations[c["metadata"]["uid"]]}}
            for c in claims)))
    return out


def _arrive(replay: trace.Replay, arrivals: _Arrivals, residents: list[Resident],
            pod: Mapping[str, Any], claims: Sequence[Mapping[str, Any]]) -> None:
    state = replay.state
    start = time.thread_time()
    plan = plan_pod(state, pod, list(claims))
    found: Preemption | str | None = None
    if plan.node_name is None and arrivals.preempt:
        searched = time.thread_time()
        found = plan_preemption(state, Waiter(pod, tuple(claims), HIGH), residents, {})
        arrivals.search_ms.append((time.thread_time() - searched) * 1000)
        if isinstance(found, Preemption):
            gone = {v.uid for v in found.victims}
            for resident in [r for r in residents if objects.uid(r.pod) in gone]:
                state.take_out(objects.uid(resident.pod),
                               [objects.uid(c) for c in resident.claims])
                residents.remove(resident)
            plan = found.plan
            arrivals.victims.append(len(found.victims))
    if plan.node_name is not None:
        state.assume(pod, plan)
    elapsed = time.thread_time() - start
    if claims:
        arrivals.claims += len(claims)
        arrivals.seconds += elapsed
        arrivals.per_claim_ms.extend([elapsed * 1000 / len(claims)] * len(claims))
    if plan.node_name is not None:
        arrivals.placed += 1


def _seed(cluster: trace.TraceCluster, translator: trace.Translator, pods: Sequence[trace.TracePod],
          *, strategy: str, load: float, seed: int, percent: float,
          workload: Any) -> tuple[_Arrivals, _Arrivals, int]:
    replays = [trace.Replay(cluster, translator, strategy=strategy, workload=workload,
                             catalog=None, namespaces=False, keep=True) for _ in range(2)]
    sampled = trace.sample(pods, cluster.total_gpus, load, seed)
    for n, trace_pod in enumerate(sampled):
        for one in replays[n % 2:] + replays[:n % 2]:
            one.place(n, trace_pod)
    residents = [_residents(one) for one in replays]
    off, on = _Arrivals(preempt=False), _Arrivals(preempt=True)
    count = max(1, round(len(sampled) * percent / 100))
    high = trace.sample(pods, cluster.total_gpus, load, seed + 10_000)[:count]
    for n, trace_pod in enumerate(high):
        translated, templates = translator.translate(trace_pod)
        pod = {**translated,
               "metadata": {**translated["metadata"], "name": f"high{n}", "uid": f"high-{n}"},
               "spec": {**translated["spec"], "priority": HIGH}}
        claims = trace.claims_for(pod, templates)
        pairs = [(replays[0], off, residents[0]), (replays[1], on, residents[1])]
        for replay, arrivals, placed in pairs[n % 2:] + pairs[:n % 2]:
            _arrive(replay, arrivals, placed, pod, claims)
    return off, on, count


def run(nodes_path: Path, pods_path: Path, *, strategies: Sequence[str], load: float,
        seeds: Sequence[int], percent: float) -> dict[str, dict[str, float]]:
    loaded = trace.load_trace(nodes_path, pods_path)
    pods, cluster, translator, workload = (loaded.pods, loaded.cluster, loaded.translator,
                                           loaded.workload)
    results: dict[str, dict[str, float]] = {}
    for strategy in strategies:
        offs: list[_Arrivals] = []
        ons: list[_Arrivals] = []
        arrived = 0
        for seed in seeds:
            off, on, count = _seed(cluster, translator, pods, strategy=strategy, load=load,
                                   seed=seed, percent=percent, workload=workload)
            offs.append(off)
            ons.append(on)
            arrived += count
        victims = [v for a in ons for v in a.victims]
        search = [ms for a in ons for ms in a.search_ms]

        def claims_per_s(runs: Sequence[_Arrivals]) -> float:
            seconds = sum(a.seconds for a in runs)
            return sum(a.claims for a in runs) / seconds if seconds else 0.0

        def p99(runs: Sequence[_Arrivals]) -> float:
            return trace.percentile([ms for a in runs for ms in a.per_claim_ms], 0.99)

        per_claim_off = statistics.fmean([ms for a in offs for ms in a.per_claim_ms] or [0.0])
        per_claim_on = statistics.fmean([ms for a in ons for ms in a.per_claim_ms] or [0.0])
        results[strategy] = {
            "arrived": arrived,
            "placed_off": sum(a.placed for a in offs),
            "placed_on": sum(a.placed for a in ons),
            "preemptions": len(victims),
            "victims_mean": round(statistics.fmean(victims), 2) if victims else 0.0,
            "victims_max": max(victims, default=0),
            "search_p50_ms": round(trace.percentile(search, 0.50), 2) if search else 0.0,
            "search_p99_ms": round(trace.percentile(search, 0.99), 2) if search else 0.0,
            "claims_per_s_off": round(claims_per_s(offs), 1),
            "claims_per_s_on": round(claims_per_s(ons), 1),
            "p99_ms_off": round(p99(offs), 3),
            "p99_ms_on": round(p99(ons), 3),
            "per_claim_ratio": round(per_claim_on / per_claim_off, 2) if per_claim_off else 0.0,
        }
    return results


def table(results: Mapping[str, Mapping[str, float]], seeds: Sequence[int],
          percent: float) -> str:
    width = max([10, *(len(p) for p in results)])
    header = (f"{'strategy':<{width}} {'arrived':>7} {'placed off':>10} {'placed on':>9} "
              f"{'victims mean/max':>16} {'search p50/p99 ms':>17} {'claims/s off/on':>15} "
              f"{'p99 ms off/on':>13} {'per claim':>9}")
    lines = [header, "-" * len(header)]
    for label, r in results.items():
        lines.append(
            f"{label:<{width}} {r['arrived']:>7.0f} {r['placed_off']:>10.0f} "
            f"{r['placed_on']:>9.0f} {r['victims_mean']:>11.2f}/{r['victims_max']:<4.0f} "
            f"{r['search_p50_ms']:>10.2f}/{r['search_p99_ms']:<6.2f} "
            f"{r['claims_per_s_off']:>7.0f}/{r['claims_per_s_on']:<7.0f} "
            f"{r['p99_ms_off']:>6.2f}/{r['p99_ms_on']:<6.2f} {r['per_claim_ratio']:>8.2f}x")
    lines.append(f"(summed over {len(seeds)} seed(s): {','.join(map(str, seeds))}; "
                 f"{percent:g}% more pods of priority {HIGH} arrive once each replay ends)")
    return "\n".join(lines)

"""`dra-gateway bench allocator --groups`: multi-pod jobs with and without group awareness.

Each seed's sample of the trace (`trace.sample`) is replayed twice side by side, pod
by pod. Its multi-card pods (two cards or more) are dealt, in arrival order, to jobs: up to
`OPEN_JOBS` jobs are open at once, each of a size drawn from 2 to 16 (the seed's own draw); a pod
joins one open job at random, or opens a new one while fewer are open, and a job closes once
it has its size; a job still open at the end has the members it got (one member: no job). The
members keep their trace shapes, so the GPUs asked are the plain replay's.

- **off**: every pod is planned alone as it arrives (a gateway without groups);
- **on**: a job's members wait, holding nothing, until its last member arrives, and are then
  planned together (`allocator.planner.groups.plan_group`, the allocator's code: all or nothing,
  on one GPU model); every other pod as off.

The figures, per configuration: jobs placed whole, and of those the ones whose cards are of
more than one GPU model; jobs left partly placed and the GPUs their
placed members hold at the end (the trace replays arrivals only, nothing ends, so these are
GPUs held for the rest of the run, not card-hours); the GPU allocation ratio; claims/s and the
p99 per claim, measured with the thread's CPU clock as the replay measures it.
"""

from __future__ import annotations

import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dra_gateway.allocator.planner.groups import plan_group, plan_models
from dra_gateway.allocator.planner.plan import plan_pod
from dra_gateway.allocator.planner.settings import PlannerSettings
from dra_gateway.devkit.bench import trace

OPEN_JOBS = 4
SIZES = (2, 16)


@dataclass(slots=True)
class _Run:
    """One configuration's replay of one seed."""

    groups: bool
    allocated: float = 0.0
    claims: int = 0
    seconds: float = 0.0
    per_claim_ms: list[float] = field(default_factory=list)
    jobs: int = 0
    whole: int = 0
    partial: int = 0
    partial_gpus: float = 0.0
    mixed: int = 0  # jobs placed whole on cards of more than one model


def deal_jobs(pods: Sequence[trace.TracePod], seed: int) -> dict[int, int]:
    """Which job each multi-card pod (by position) belongs to (see the module)."""
    rng = random.Random(seed + 20_000)
    job_of: dict[int, int] = {}
    open_jobs: dict[int, int] = {}  # job -> members still to come
    members: dict[int, list[int]] = {}
    next_job = 0
    for n, pod in enumerate(pods):
        if pod.num_gpu < 2:
            continue
        if len(open_jobs) < OPEN_JOBS and (not open_jobs or rng.random() < 0.5):
            job = next_job
            next_job += 1
            open_jobs[job] = rng.randint(*SIZES)
            members[job] = []
        else:
            job = rng.choice(sorted(open_jobs))
        job_of[n] = job
        members[job].append(n)
        open_jobs[job] -= 1
        if open_jobs[job] == 0:
            del open_jobs[job]
    return {n: job for n, job in job_of.items() if len(members[job]) > 1}


def _replay(cluster: trace.TraceCluster, translator: trace.Translator,
            pods: Sequence[trace.TracePod], jobs: Mapping[int, int], *, strategy: str,
            workload: Any, groups: bool) -> _Run:
    run = _Run(groups=groups)
    state = cluster.state(PlannerSettings(default_strategy=strategy))
    state.set_workload(workload)
    size: dict[int, int] = {}
    for member_of in jobs.values():
        size[member_of] = size.get(member_of, 0) + 1
    waiting: dict[int, list[tuple[int, dict[str, Any], list[dict[str, Any]]]]] = {}
    placed: dict[int, list[int]] = {}  # job -> members placed
    models: dict[int, set[str | None]] = {}  # job -> the models its placed members' cards are
    for n, trace_pod in enumerate(pods):
        translated, templates = translator.translate(trace_pod)
        job = jobs.get(n)
        meta = {**translated["metadata"], "name": f"p{n}", "uid": f"pod-{n}"}
        pod = {**translated, "metadata": meta}
        claims = trace.claims_for(pod, templates)
        if groups and job is not None:
            waiting.setdefault(job, []).append((n, pod, claims))
            if len(waiting[job]) < size[job]:
                continue
            members = waiting.pop(job)
            start = time.thread_time()
            found = plan_group(state, [(p, c) for _, p, c in members], same_model=True)
            if found.placed:
                for (_, p, _c), plan in zip(members, found.plans, strict=True):
                    state.assume(p, plan)
                    models.setdefault(job, set()).update(plan_models(state, plan))
            _time(run, time.thread_time() - start, sum(len(c) for _, _, c in members))
            if found.placed:
                placed[job] = [m for m, _, _ in members]
                run.allocated += sum(pods[m].gpu_share for m, _, _ in members)
            continue
        start = time.thread_time()
        plan = plan_pod(state, pod, claims)
        if plan.node_name is not None:
            state.assume(pod, plan)
        _time(run, time.thread_time() - start, len(claims))
        if plan.node_name is not None:
            run.allocated += trace_pod.gpu_share
            if job is not None:
                placed.setdefault(job, []).append(n)
                models.setdefault(job, set()).update(plan_models(state, plan))
    run.jobs = len(size)
    for job, count in size.items():
        held = placed.get(job, [])
        if len(held) == count:
            run.whole += 1
            run.mixed += len(models.get(job, set())) > 1
        elif held:
            run.partial += 1
            run.partial_gpus += sum(pods[m].gpu_share for m in held)
    return run


def _time(run: _Run, elapsed: float, claims: int) -> None:
    if claims:
        run.claims += claims
        run.seconds += elapsed
        run.per_claim_ms.extend([elapsed * 1000 / claims] * claims)


def run(nodes_path: Path, pods_path: Path, *, strategies: Sequence[str], load: float,
        seeds: Sequence[int]) -> dict[str, dict[str, float]]:
    loaded = trace.load_trace(nodes_path, pods_path)
    cluster, translator, workload = loaded.cluster, loaded.translator, loaded.workload
    results: dict[str, dict[str, float]] = {}
    for strategy in strategies:
        runs: dict[bool, list[_Run]] = {False: [], True: []}
        for seed in seeds:
            sampled = trace.sample(loaded.pods, cluster.total_gpus, load, seed)
            jobs = deal_jobs(sampled, seed)
            order = (False, True) if seed % 2 == 0 else (True, False)  # side by side
            for groups in order:
                runs[groups].append(_replay(cluster, translator, sampled, jobs,
                                            strategy=strategy, workload=workload,
                                            groups=groups))
        for groups, done in runs.items():
            seconds = sum(r.seconds for r in done)
            label = f"{strategy} {'groups' if groups else 'alone'}"
            results[label] = {
                "jobs": sum(r.jobs for r in done),
                "jobs_whole": sum(r.whole for r in done),
                "jobs_partial": sum(r.partial for r in done),
                "jobs_mixed_models": sum(r.mixed for r in done),
                "partial_gpus": round(sum(r.partial_gpus for r in done) / len(done), 1),
                "allocation_ratio": round(sum(r.allocated for r in done) * 100
                                          / (cluster.total_gpus * len(done)), 2),
                "claims_per_second": round(sum(r.claims for r in done) / seconds, 1)
                if seconds else 0.0,
                "p99_ms": round(trace.percentile(
                    [ms for r in done for ms in r.per_claim_ms], 0.99), 3),
            }
    return results


def table(results: Mapping[str, Mapping[str, float]], seeds: Sequence[int]) -> str:
    width = max([16, *(len(p) for p in results)])
    header = (f"{'strategy':<{width}} {'jobs':>6} {'whole':>6} {'mixed models':>12} "
              f"{'partial':>7} "
              f"{'GPUs held by partial':>20} {'GPU alloc %':>11} {'claims/s':>9} "
              f"{'p99 ms':>7}")
    lines = [header, "-" * len(header)]
    for label, r in results.items():
        lines.append(f"{label:<{width}} {r['jobs']:>6.0f} {r['jobs_whole']:>6.0f} "
                     f"{r['jobs_mixed_models']:>12.0f} {r['jobs_partial']:>7.0f} "
                     f"{r['partial_gpus']:>20.1f} "
                     f"{r['allocation_ratio']:>11.2f} {r['claims_per_second']:>9.0f} "
                     f"{r['p99_ms']:>7.3f}")
    lines.append(f"(jobs summed and the rest a mean over {len(seeds)} seed(s): "
                 f"{','.join(map(str, seeds))}; multi-card pods dealt to jobs of "
                 f"{SIZES[0]}-{SIZES[1]} members, {OPEN_JOBS} open at once; GPUs held by "
                 "partly placed jobs at the end of the replay)")
    return "\n".join(lines)


__all__ = ["deal_jobs", "run", "table"]

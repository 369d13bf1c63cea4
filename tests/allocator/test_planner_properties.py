"""Random claim sequences never overcommit a card and never share a whole one."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_gateway.allocator.planner import STRATEGIES, TaskType, Workload
from dra_gateway.kube import names
from dra_gateway.kube.quantity import parse_quantity

from .planner_support import claim, cluster, gpu, place, pod, share_config

GI = 1 << 30

request = st.one_of(
    st.tuples(st.just("whole"), st.integers(1, 3)),
    st.tuples(st.just("share"), st.integers(1, 16), st.integers(1, 100)),  # GiB, cores
    st.tuples(st.just("percent"), st.integers(1, 100), st.integers(1, 100)),
)


def _claim_for(n: int, spec: tuple[Any, ...], native: bool) -> dict[str, Any]:
    kind = spec[0]
    if kind == "whole":
        return claim(f"c{n}", count=spec[1])
    if kind == "share":
        if not native:  # the API server drops capacity.requests: the config carries it
            return claim(f"c{n}", config=[share_config(["main"], memory=spec[1] * GI,
                                                       cores=spec[2])])
        return claim(f"c{n}", capacity={"memory": f"{spec[1]}Gi", "cores": str(spec[2])},
                     config=[share_config(["main"], memory=spec[1] * GI, cores=spec[2])])
    return claim(f"c{n}", capacity={"cores": str(spec[2])} if native else None,
                 config=[share_config(["main"], memoryPercent=spec[1], cores=spec[2])])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(request, min_size=1, max_size=30), policy=st.sampled_from(STRATEGIES),
       releases=st.lists(st.integers(0, 29), max_size=8), native=st.booleans())
def test_random_claims_never_exceed_a_card_or_share_a_whole_one(
    specs: list[tuple[Any, ...]], policy: str, releases: list[int], native: bool
) -> None:
    memory = {"n1": 16, "n2": 24}
    state = cluster({"n1": [gpu(0, memory_gib=16, shared=native),
                            gpu(1, memory_gib=16, shared=native)],
                     "n2": [gpu(i, memory_gib=24, shared=native) for i in range(3)]},
                    strategy=policy, consumable_capacity=native)
    placed: dict[str, tuple[str, dict[str, Any], dict[str, str]]] = {}
    for n, spec in enumerate(specs):
        c = _claim_for(n, spec, native)
        uid = c["metadata"]["uid"]
        plan = place(state, pod(f"p{n}", cpu="10m"), c)
        if plan.node_name is not None:
            placed[uid] = (spec[0], plan.allocations[uid], plan.annotations.get(uid, {}))
        if n in releases and placed:
            # The owning pod went away: release its claim, as the controller does.
            gone = sorted(placed)[0]
            state.remove_claim(gone)
            del placed[gone]
    used_memory: dict[tuple[str, str], int] = defaultdict(int)
    used_cores: dict[tuple[str, str], int] = defaultdict(int)
    holders: dict[tuple[str, str], list[str]] = defaultdict(list)
    for kind, allocation, notes in placed.values():
        recorded = json.loads(notes.get(names.ANNOTATION_SHARES, "[]"))
        for result in allocation["devices"]["results"]:
            key = (result["pool"], result["device"])
            holders[key].append(kind)
            consumed = result.get("consumedCapacity")
            if consumed is None:
                entries = [e for e in recorded if (e["pool"], e["device"]) == key]
                consumed = entries[0]["consumedCapacity"] if entries else {
                    names.CAPACITY_MEMORY: f"{memory[key[0]]}Gi", names.CAPACITY_CORES: "100"}
            used_memory[key] += parse_quantity(consumed[names.CAPACITY_MEMORY]).value()
            used_cores[key] += parse_quantity(consumed[names.CAPACITY_CORES]).value()
    for key, amount in used_memory.items():
        assert amount <= memory[key[0]] * GI, key
        assert used_cores[key] <= names.CORES_PER_CARD, key
        if "whole" in holders[key]:
            assert holders[key] == ["whole"], f"whole card {key} shared: {holders[key]}"


def _direct_fragmentation(types: list[tuple[TaskType, float]], cards: tuple[int, ...],
                          cpu: int, memory: int, model: str) -> float:
    """FGD's definition written out task by task, to check the aggregated evaluation."""
    total = sum(cards)
    full = cards.count(1000)
    mass = sum(w for t, w in types if t.gpus > 0)
    value = 0.0
    for task, weight in types:
        if task.gpus == 0:
            continue
        p = weight / mass
        if task.cpu > cpu or task.memory > memory or (task.models and model not in task.models):
            value += p * total
        elif task.milli < 1000:
            value += p * sum(f for f in cards if f < task.milli)
        elif full < task.gpus:
            value += p * total
        else:
            value += p * (total - 1000 * full)
    return value


task_type = st.builds(
    TaskType, cpu=st.integers(0, 8), memory=st.integers(0, 8),
    gpus=st.integers(0, 4), milli=st.sampled_from([100, 250, 500, 750, 1000]),
    models=st.sampled_from([frozenset(), frozenset({"T4"}), frozenset({"A10", "T4"})]))


@settings(max_examples=200, deadline=None)
@given(types=st.lists(st.tuples(task_type, st.floats(0.1, 10)), min_size=1, max_size=12),
       cards=st.lists(st.integers(0, 1000), max_size=8), cpu=st.integers(0, 8),
       memory=st.integers(0, 8), model=st.sampled_from(["T4", "A10", "P100"]))
def test_aggregated_fragmentation_equals_the_definition(
    types: list[tuple[TaskType, float]], cards: list[int], cpu: int, memory: int, model: str
) -> None:
    normalised = [(t if t.milli == 1000 or t.gpus <= 1 else TaskType(t.cpu, t.memory, t.gpus,
                                                                      1000, t.models), w)
                  for t, w in types]
    if not any(t.gpus > 0 for t, _ in normalised):
        return
    merged: dict[TaskType, float] = {}
    for t, w in normalised:
        merged[t] = merged.get(t, 0.0) + w
    workload = Workload(list(merged.items()))
    key = tuple(sorted(cards))
    assert workload.fragmentation(key, cpu, memory, model) == pytest.approx(
        _direct_fragmentation(list(merged.items()), key, cpu, memory, model))

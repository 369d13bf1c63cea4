"""Pod groups on a real control plane (allocator/groups.py): a distributed job gets all its
GPUs or none.

Two jobs of three workers each, every worker asking for two cards by their legacy name and
pinned to the demo's eight-card H100 node, are created interleaved (a-0, b-0, a-1, b-1, a-2,
b-2), each job a Kueue pod group (the label `kueue.x-k8s.io/pod-group-name` and the annotation
`kueue.x-k8s.io/pod-group-total-count: "3"`, as Kueue's plain-pod integration writes them).
Six cards hold one job, not two: one job is placed whole (its three workers allocated two cards
each and bound to the node), the other holds nothing and says so in its condition
`dra-gateway.io/PodGroup` (GroupDoesNotFit); once the first job's workers are gone, the second
is placed whole. At every poll no card is held past its capacity, and at most one job holds
devices while the first runs.

One model per group: with seven of the H100 node's cards held by a filler pod, a job of three
one-card workers has room only across two models (one H100 and the A100 node's two whole
cards); it holds nothing and says, per model, how many of its workers fit. Once the filler is
gone the three land together on H100s.
"""

from __future__ import annotations

import time
from typing import Any

from dra_gateway.gpu.groups import KUEUE_COUNT_ANNOTATION, KUEUE_GROUP_LABEL
from dra_gateway.kube import names
from e2e.support import Gateway, placed_on_its_node, pod_devices, pods, wait_until
from e2e.test_preemption import (
    CARDS,
    NODE,
    PLACE_S,
    _free_cards,
    _gated,
    _no_over_capacity,
    _pod_path,
    _scene,
    _wait_for_free_cards,
)

JSON = dict[str, Any]
GROUPS_NS = "pod-groups"
WORKERS = 3
GROUP_CONDITION = f"{names.DOMAIN}/PodGroup"


def _worker(job: str, index: int, *, cards: int = 2, pinned: bool = True) -> JSON:
    spec: JSON = {"terminationGracePeriodSeconds": 0,
                  "containers": [{"name": "main", "image": "example.com/cuda:1",
                                  "resources": {"limits": {"nvidia.com/gpu": str(cards)}}}]}
    if pinned:
        spec["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{job}-{index}", "namespace": GROUPS_NS,
                         "labels": {KUEUE_GROUP_LABEL: f"job-{job}"},
                         "annotations": {KUEUE_COUNT_ANNOTATION: str(WORKERS)}},
            "spec": spec}


def _condition(pod: JSON) -> JSON | None:
    return next((c for c in (pod.get("status") or {}).get("conditions") or []
                 if c.get("type") == GROUP_CONDITION), None)


def test_two_interleaved_jobs_one_placed_whole_the_other_holding_nothing(
        gateway: Gateway) -> None:
    with _scene(gateway, GROUPS_NS) as api:
        _wait_for_free_cards(gateway, api)

        def workers(job: str) -> list[JSON]:
            return [p for p in pods(api, GROUPS_NS) if p["metadata"]["name"].startswith(
                f"{job}-") and not p["metadata"].get("deletionTimestamp")]

        def held(job: str) -> int:
            return sum(len(pod_devices(api, p)) for p in workers(job))

        def one_job_at_most() -> None:
            _no_over_capacity(gateway)
            holding = [job for job in "ab" if held(job)]
            assert len(holding) <= 1, f"both jobs hold cards: a {held('a')}, b {held('b')}"

        for index in range(WORKERS):
            for job in "ab":
                api.create(_pod_path(GROUPS_NS), _worker(job, index))

        def whole() -> str | None:
            for job in "ab":
                members = workers(job)
                if len(members) == WORKERS and all(placed_on_its_node(api, p)
                                                   for p in members):
                    return job
            return None

        started = time.monotonic()
        wait_until("one job to be placed whole", lambda: whole() is not None, PLACE_S,
                   one_job_at_most)
        first = whole()
        assert first is not None
        print(f"job {first} placed whole {time.monotonic() - started:.1f}s after the last "
              "worker was created")
        second = "b" if first == "a" else "a"
        assert held(first) == 2 * WORKERS
        for pod in workers(first):
            assert pod["spec"]["nodeName"] == NODE
        # The other job: nothing held, every worker gated, and it says why.
        wait_until(f"job {second} to say it does not fit", lambda: all(
            (_condition(p) or {}).get("reason") == "GroupDoesNotFit"
            for p in workers(second)), 30, one_job_at_most)
        assert held(second) == 0
        assert all(_gated(p) for p in workers(second))
        said = _condition(workers(second)[0]) or {}
        assert f"pod group {GROUPS_NS}/job-{second}" in said.get("message", ""), said
        assert _free_cards(api) == 8 - 2 * WORKERS

        # The first job ends: the second is placed whole.
        for pod in workers(first):
            api.delete(_pod_path(GROUPS_NS, pod["metadata"]["name"]), grace_period_s=0)
        wait_until(f"job {second} to be placed whole", lambda: whole() == second, PLACE_S,
                   lambda: _no_over_capacity(gateway))
        assert held(second) == 2 * WORKERS
        wait_until(f"job {second} to say it is placed", lambda: all(
            (_condition(p) or {}).get("reason") == "GroupPlaced"
            for p in workers(second)), 30, gateway.check)


def test_a_job_with_room_only_across_two_models_waits_then_lands_on_one(
        gateway: Gateway) -> None:
    with _scene(gateway, GROUPS_NS) as api:
        filler = _worker("filler", 0, cards=CARDS - 1)
        del filler["metadata"]["labels"], filler["metadata"]["annotations"]
        api.create(_pod_path(GROUPS_NS), filler)
        wait_until("the filler to hold seven H100s",
                   lambda: placed_on_its_node(api, api.get(_pod_path(GROUPS_NS, "filler-0"))),
                   PLACE_S, gateway.check)
        assert _free_cards(api) == 1

        def workers() -> list[JSON]:
            return [p for p in pods(api, GROUPS_NS) if p["metadata"]["name"].startswith("m-")]

        for index in range(WORKERS):
            api.create(_pod_path(GROUPS_NS), _worker("m", index, cards=1, pinned=False))
        wait_until("the job to say no model has room for it", lambda: all(
            (_condition(p) or {}).get("reason") == "GroupDoesNotFit"
            for p in workers()), 30, lambda: _no_over_capacity(gateway))
        said = (_condition(workers()[0]) or {}).get("message", "")
        assert "no model has room for all" in said, said
        assert "NVIDIA H100 80GB HBM3: 1 of 3 fit" in said, said
        assert "NVIDIA A100-SXM4-80GB: 2 of 3 fit" in said, said
        assert sum(len(pod_devices(api, p)) for p in workers()) == 0
        assert all(_gated(p) for p in workers())

        api.delete(_pod_path(GROUPS_NS, "filler-0"), grace_period_s=0)
        wait_until("the job to be placed whole", lambda: len(workers()) == WORKERS and all(
            placed_on_its_node(api, p) for p in workers()), PLACE_S,
            lambda: _no_over_capacity(gateway))
        assert {p["spec"]["nodeName"] for p in workers()} == {NODE}

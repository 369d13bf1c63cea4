"""Borrowed GPU quota in the planner: pods borrow a cohort's unused guarantees, claims placed on
borrowed quota are marked, and a lender takes its guarantee back by preempting borrowed pods
(allocator/planner/preemption.py `plan_reclaim`, allocator/eviction/preemption.py
`find_preemptions`)."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_gateway.allocator.eviction.inputs import Inputs
from dra_gateway.allocator.eviction.preemption import find_preemptions
from dra_gateway.allocator.planner import ClusterState, PodPlan, plan_pod
from dra_gateway.allocator.planner.leaving import Resident, Waiter
from dra_gateway.allocator.planner.preemption import Preemption, plan_preemption, plan_reclaim
from dra_gateway.kube import names
from dra_gateway.policy.catalog import Catalog

from .planner_support import cluster, gpu
from .test_planner_policies import gpod, whole


def cohort_quota(namespace: str, *, hard: int = 8, min_: int = 4,
                 cohort: str = "research") -> dict[str, Any]:
    return {"apiVersion": names.API_VERSION, "kind": "GPUQuota",
            "metadata": {"name": "gpu", "namespace": namespace},
            "spec": {"hard": {"devices": hard}, "min": {"devices": min_}, "cohort": cohort}}


def world(cards: int = 8, **mins: int) -> ClusterState:
    state = cluster({"n0": [gpu(i) for i in range(cards)]})
    catalog = Catalog.build(quotas=[cohort_quota(ns, min_=m) for ns, m in mins.items()])
    assert not catalog.errors, catalog.errors
    state.set_policies(catalog)
    return state


def placed(state: ClusterState, name: str, ns: str, *, count: int = 1, priority: int = 0,
           created: int = 0) -> tuple[Resident, PodPlan]:
    pod = gpod(name, ns, created=created, priority=priority)
    claim = whole(f"{name}-c", ns, count)
    plan = plan_pod(state, pod, [claim])
    assert plan.node_name is not None, plan.reason
    state.assume(pod, plan)
    bound = {**pod, "spec": {**pod["spec"], "nodeName": plan.node_name}}
    allocated = {**claim, "status": {"allocation": plan.allocations[claim["metadata"]["uid"]]}}
    return Resident(bound, (allocated,), priority=priority), plan


def waiter(name: str, ns: str, *, count: int = 1, priority: int = 0) -> Waiter:
    return Waiter(gpod(name, ns, created=3000, priority=priority),
                  (whole(f"{name}-c", ns, count),), priority)


def test_borrowed_claims_are_marked_and_a_lender_takes_its_guarantee_back() -> None:
    state = world(a=4, b=4)
    residents, plans = [], []
    for i in range(8):  # b fills the node: four of its own, four of a's guarantee
        resident, plan = placed(state, f"b{i}", "b", priority=i % 2, created=i)
        residents.append(resident)
        plans.append(plan)
    marks = [next(iter(p.annotations.values()), {}).get(names.ANNOTATION_BORROWED)
             for p in plans]
    assert marks == [None] * 4 + ["research"] * 4
    # a's pod is within its guarantee: it waits because the guarantee is lent.
    a = waiter("a0", "a", count=2)
    planned = plan_pod(state, a.pod, list(a.claims))
    assert planned.node_name is None
    assert planned.quota
    assert planned.quota[0].reclaims
    found = plan_reclaim(state, a, residents, {})
    assert isinstance(found, Preemption)
    assert found.cohort == "research"
    # Lowest priority first (the even ones), then the newest: b6 and b4.
    assert sorted(v.pod for v in found.victims) == ["b/b4", "b/b6"]
    assert found.plan.node_name == "n0"
    assert names.ANNOTATION_BORROWED not in str(
        found.plan.annotations)
    # The state is as it was.
    assert plan_pod(state, a.pod, list(a.claims)).node_name is None


def test_a_pod_that_would_borrow_takes_nothing_back() -> None:
    state = world(a=2, b=2)
    residents = [placed(state, f"a{i}", "a", created=i)[0] for i in range(2)]
    residents += [placed(state, f"b{i}", "b", created=i)[0] for i in range(2)]
    # The cohort guarantees 4 and uses 4: a's third card would borrow, and nobody borrows.
    extra = waiter("a9", "a")
    planned = plan_pod(state, extra.pod, list(extra.claims))
    assert planned.quota
    assert not planned.quota[0].reclaims
    assert plan_reclaim(state, extra, residents, {}) == \
        "no other namespace of its cohort borrows"
    found = find_preemptions(Inputs(state, [extra], residents, {}, {}, {}), {})
    assert found == []


def test_priority_preemption_spares_a_lender_within_its_guarantee() -> None:
    state = world(a=4, b=4)
    residents = [placed(state, f"a{i}", "a", created=i)[0] for i in range(4)]
    residents += [placed(state, f"b{i}", "b", created=10 + i)[0] for i in range(4)]
    urgent = waiter("urgent", "b", priority=100)
    found = plan_preemption(state, urgent, residents, {})
    assert isinstance(found, Preemption)
    assert found.cohort is None
    # a runs within its guarantee: only b's own pods of lower priority make room.
    assert [v.pod.split("/")[0] for v in found.victims] == ["b"]


def test_find_preemptions_reclaims_for_a_pod_of_equal_priority() -> None:
    state = world(a=4, b=4)
    residents = [placed(state, f"b{i}", "b", created=i)[0] for i in range(8)]
    a = waiter("a0", "a")
    found = find_preemptions(Inputs(state, [a], residents, {}, {}, {}), {})
    assert [(p.pod, p.cohort, [v.pod for v in p.victims]) for p in found] == [
        ("a/a0", "research", ["b/b7"])]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arrivals=st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 3),
                                   st.integers(0, 2)), min_size=1, max_size=14),
       mins=st.tuples(st.integers(0, 4), st.integers(0, 4), st.integers(0, 4)))
def test_placing_and_reclaiming_keeps_every_bound(arrivals: list[tuple[str, int, int]],
                                                 mins: tuple[int, int, int]) -> None:
    """Pods arrive, are placed when they fit, and take guarantees back when they do not:
    after every step no card is held twice, no namespace passes hard, and what the cohort
    borrows stays within what its lenders leave unused; a reclaim's victims all borrowed."""
    state = world(cards=8, **dict(zip("abc", mins, strict=True)))
    residents: list[Resident] = []
    ledger = state.policies.ledger
    for step, (ns, count, priority) in enumerate(arrivals):
        pod = gpod(f"p{step}", ns, created=step, priority=priority)
        claim = whole(f"p{step}-c", ns, count)
        plan = plan_pod(state, pod, [claim])
        if plan.node_name is None:
            found = plan_reclaim(state, Waiter(pod, (claim,), priority), residents, {})
            if isinstance(found, Preemption):
                borrowing = ledger.cohort_peers(ns)
                gone = {v.uid for v in found.victims}
                assert all(borrowing[v.pod.split("/")[0]] for v in found.victims)
                for r in [r for r in residents if r.pod["metadata"]["uid"] in gone]:
                    state.take_out(r.pod["metadata"]["uid"], [r.claims[0]["metadata"]["uid"]])
                residents = [r for r in residents if r.pod["metadata"]["uid"] not in gone]
                plan = plan_pod(state, pod, [claim])
                assert plan.node_name is not None, plan.reason
        if plan.node_name is not None:
            state.assume(pod, plan)
            bound = {**pod, "spec": {**pod["spec"], "nodeName": plan.node_name}}
            allocated = {**claim, "status": {
                "allocation": plan.allocations[claim["metadata"]["uid"]]}}
            residents.append(Resident(bound, (allocated,), priority=priority))
        quotas = [ledger.quotas(n)[0] for n in "abc"]
        used = [ledger.used(q).devices for q in quotas]
        assert all(u <= 8 for u in used)
        assert sum(max(0, u - m) for u, m in zip(used, mins, strict=True)) <= \
            sum(max(0, m - u) for u, m in zip(used, mins, strict=True))
        held = [d for r in residents for d in r.claims[0]["status"]["allocation"]["devices"][
            "results"]]
        assert len({h["device"] for h in held}) == len(held) <= 8


def test_a_quota_leaving_its_cohort_loses_the_cohort_parts_of_its_status() -> None:
    from dra_gateway.allocator.quotastatus import _current, _status_patch

    before = {"hard": {"devices": 8}, "used": {"devices": 6}, "min": {"devices": 4},
              "borrowed": {"devices": 2}, "lent": {"devices": 0}, "waiting": 1}
    plain = {"hard": {"devices": 8}, "used": {"devices": 6}}
    assert not _current(before, plain)
    assert _status_patch(before, plain) == {"hard": {"devices": 8}, "used": {"devices": 6},
                                            "min": None, "borrowed": None, "lent": None}
    assert _current(before, {**plain, "min": {"devices": 4}, "borrowed": {"devices": 2},
                             "lent": {"devices": 0}})

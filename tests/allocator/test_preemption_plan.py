"""The preemption planner (allocator/planner/preemption.py): strictly lower priority only, never
for a pod whose policy is Never, victims minimal, the node kube-scheduler would pick."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_gateway.allocator.planner import ClusterState, PodPlan
from dra_gateway.allocator.planner.leaving import Resident, Waiter
from dra_gateway.allocator.planner.preemption import Preemption, plan_preemption

from .planner_support import claim, cluster, gpu, place, pod


def _placed(state: ClusterState, name: str, c: dict[str, Any], *, priority: int = 0,
            budgets: tuple[str, ...] = ()) -> Resident:
    p = pod(name, priority=priority)
    plan: PodPlan = place(state, p, c)
    assert plan.node_name is not None, plan.reason
    bound = {**p, "spec": {**p["spec"], "nodeName": plan.node_name}}
    allocated = ({**c, "status": {"allocation": plan.allocations[c["metadata"]["uid"]]}},)
    return Resident(bound, allocated, priority=priority, budgets=budgets)


def _waiter(name: str, count: int, priority: int, **spec: Any) -> Waiter:
    return Waiter(pod(name, priority=priority, **spec), (claim(f"{name}-c", count=count),),
                  priority)


def _full_node(priorities: list[int]) -> tuple[ClusterState, list[Resident]]:
    state = cluster({"n0": [gpu(i) for i in range(len(priorities))]})
    residents = [_placed(state, f"r{i}", claim(f"r{i}-c", count=1), priority=p)
                 for i, p in enumerate(priorities)]
    return state, residents


def test_a_high_priority_pod_for_two_cards_preempts_exactly_two_of_the_lowest() -> None:
    state, residents = _full_node([10, 10, 5, 10, 5, 10, 10, 10])
    found = plan_preemption(state, _waiter("hi", 2, 1000), residents, {})
    assert isinstance(found, Preemption)
    assert found.node == "n0"
    assert sorted(v.pod for v in found.victims) == ["ns/r2", "ns/r4"]
    assert found.plan.node_name == "n0"
    # The state is as it was: every resident still holds its card.
    assert plan_preemption(state, _waiter("hi", 2, 1000), residents, {}) == found
    assert place(state, pod("other"), claim("other-c", count=1)).node_name is None


def test_equal_or_higher_priority_and_policy_never_preempt_nothing() -> None:
    state, residents = _full_node([100] * 4)
    assert plan_preemption(state, _waiter("same", 1, 100), residents, {}) == \
        "no pod of lower priority holds gateway devices"
    assert plan_preemption(state, _waiter("never", 1, 1000, preemptionPolicy="Never"),
                           residents, {}) == "its preemptionPolicy is Never"


def test_a_pod_too_large_for_any_node_preempts_nothing() -> None:
    state, residents = _full_node([0] * 4)
    assert plan_preemption(state, _waiter("huge", 5, 10), residents, {}) == (
        "it fits no node even without every pod of lower priority holding gateway devices "
        "there")


def test_a_victim_a_budget_protects_is_spared_when_another_will_do() -> None:
    state, residents = _full_node([0, 0])
    residents[0] = Resident(residents[0].pod, residents[0].claims, 0, budgets=("ns/keep",))
    found = plan_preemption(state, _waiter("hi", 1, 10), residents, {"ns/keep": 0})
    assert isinstance(found, Preemption)
    assert [v.pod for v in found.victims] == ["ns/r1"]


def test_shares_are_freed_as_memory_and_cores() -> None:
    state = cluster({"n0": [gpu(0, memory_gib=80)]})
    residents = [_placed(state, f"s{i}", claim(f"s{i}-c", capacity={
        "memory": "20Gi", "cores": "25"}), priority=i) for i in range(4)]
    found = plan_preemption(state, Waiter(pod("hi", priority=50), (claim("hi-c", capacity={
        "memory": "30Gi", "cores": "30"}),), 50), residents, {})
    assert isinstance(found, Preemption)
    # 30Gi and 30 cores need two shares to leave: the two of lowest priority.
    assert sorted(v.pod for v in found.victims) == ["ns/s0", "ns/s1"]


def test_the_node_with_the_lowest_victims_is_chosen() -> None:
    state = cluster({"n0": [gpu(0), gpu(1)], "n1": [gpu(0), gpu(1)]})
    residents = [_placed(state, "a", claim("a-c", count=2), priority=50),
                 _placed(state, "b", claim("b-c", count=2), priority=5)]
    found = plan_preemption(state, _waiter("hi", 2, 100), residents, {})
    assert isinstance(found, Preemption)
    assert [v.pod for v in found.victims] == ["ns/b"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(priorities=st.lists(st.integers(0, 3), min_size=2, max_size=6),
       priority=st.integers(0, 4), count=st.integers(1, 3))
def test_victims_are_strictly_lower_and_minimal(priorities: list[int], priority: int,
                                                count: int) -> None:
    state, residents = _full_node(priorities)
    waiter = _waiter("w", count, priority)
    found = plan_preemption(state, waiter, residents, {})
    if not isinstance(found, Preemption):
        return
    assert all(v.priority < priority for v in found.victims)
    by_uid = {r.pod["metadata"]["uid"]: r for r in residents}
    out = [state.take_out(v.uid, [c["metadata"]["uid"] for c in by_uid[v.uid].claims])
           for v in found.victims]
    try:
        # With every victim gone the pod fits...
        assert place_only(state, waiter).node_name == found.node
        # ... and with any one of them back, it does not: no victim is unnecessary.
        for taken in out:
            state.put_back(taken)
            assert place_only(state, waiter).node_name is None
            again = state.take_out(taken.pod_uid, list(taken.claims))
            assert again.claims.keys() == taken.claims.keys()
    finally:
        for taken in out:
            if taken.pod_uid not in state.pods:
                state.put_back(taken)


def place_only(state: ClusterState, waiter: Waiter) -> PodPlan:
    from dra_gateway.allocator.planner.plan import plan_pod

    return plan_pod(state, waiter.pod, list(waiter.claims))


def test_a_budget_allows_so_many_victims_and_no_more() -> None:
    state, residents = _full_node([0, 0, 0])
    kept = [Resident(r.pod, r.claims, 0, budgets=("ns/two",)) for r in residents[:2]]
    residents = [*kept, residents[2]]
    # Two cards wanted: one of the budget's pods may go (it allows one), the free one too.
    found = plan_preemption(state, _waiter("hi", 2, 10), residents, {"ns/two": 1})
    assert isinstance(found, Preemption)
    assert not any(v.protected for v in found.victims)
    assert sum("ns/two" in v.budgets for v in found.victims) == 1
    # Three cards wanted: two of the budget's pods must go, one more than it allows.
    found = plan_preemption(state, _waiter("all", 3, 10), residents, {"ns/two": 1})
    assert isinstance(found, Preemption)
    assert [v.protected for v in found.victims].count(True) == 1


def test_a_pod_sharing_its_claim_with_another_is_no_victim() -> None:
    state, residents = _full_node([0, 0])
    shared = residents[0]
    claim = {**shared.claims[0], "status": {**shared.claims[0]["status"], "reservedFor": [
        {"resource": "pods", "name": "r0", "uid": "uid-r0"},
        {"resource": "pods", "name": "other", "uid": "uid-other"}]}}
    residents[0] = Resident(shared.pod, (claim,), 0)
    found = plan_preemption(state, _waiter("hi", 1, 10), residents, {})
    assert isinstance(found, Preemption)
    assert [v.pod for v in found.victims] == ["ns/r1"]


def test_a_pod_whose_victims_are_still_leaving_is_not_preempted_for_again() -> None:
    from dra_gateway.allocator.eviction.inputs import Inputs
    from dra_gateway.allocator.eviction.preemption import find_preemptions

    state, residents = _full_node([0, 0])
    waiter = _waiter("hi", 1, 10)

    def inputs() -> Inputs:
        return Inputs(state, [waiter], list(residents), {}, {}, {})

    # Its first preemption's victims take longer than the hold to stop: not twice.
    assert find_preemptions(inputs(), {"uid-hi": {"uid-r0"}}) == []
    found = find_preemptions(inputs(), {})
    assert [v.pod for p in found for v in p.victims] in (["ns/r0"], ["ns/r1"])


def test_a_budget_that_forbids_every_victim_leaves_the_pod_waiting_naming_it() -> None:
    from dra_gateway.allocator.eviction.inputs import Inputs
    from dra_gateway.allocator.eviction.preemption import find_preemptions

    state, residents = _full_node([0, 0])
    residents = [Resident(r.pod, r.claims, 0, budgets=("ns/keep",)) for r in residents]
    blocked: dict[str, str] = {}
    found = find_preemptions(Inputs(state, [_waiter("hi", 1, 10)], residents,
                                    {"ns/keep": 0}, {}, {}), {}, blocked)
    assert found == []
    assert blocked == {"uid-hi": "preempting ns/r1 would break PodDisruptionBudget ns/keep (no "
                                 "disruption allowed now); the pod waits, and preemption is "
                                 "tried again once the budget allows one"}

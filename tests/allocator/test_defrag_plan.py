"""The defragmentation planner: which few placed pods to move so that waiting pods fit."""

from __future__ import annotations

from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_gateway.allocator.planner import ClusterState, PodPlan
from dra_gateway.allocator.planner.defrag import Limits, plan_defrag
from dra_gateway.allocator.planner.leaving import Resident, Waiter

from .planner_support import claim, cluster, gpu, node, place, pod, resource_slice

GI = 1 << 30


def _share(name: str, gib: int, cores: int) -> dict[str, Any]:
    return claim(name, capacity={"memory": f"{gib}Gi", "cores": str(cores)})


def _placed(state: ClusterState, name: str, c: dict[str, Any] | None, *, cpu: str = "1",
            priority: int = 0, fixed: str | None = None, budgets: tuple[str, ...] = (),
            ) -> Resident:
    p = pod(name, cpu=cpu)
    claims = [c] if c is not None else []
    plan: PodPlan = place(state, p, *claims)
    assert plan.node_name is not None, plan.reason
    bound = {**p, "spec": {**p["spec"], "nodeName": plan.node_name}}
    allocated = tuple({**x, "status": {"allocation": plan.allocations[x["metadata"]["uid"]]}}
                      for x in claims)
    return Resident(bound, allocated, priority=priority, fixed=fixed, budgets=budgets)


def test_two_whole_cards_freed_by_moving_two_shares() -> None:
    # n1's eight cards each hold one share; n2 (added after) has one card, room for shares
    state = cluster({"n1": [gpu(i) for i in range(8)]}, strategy="spread")
    residents = [_placed(state, f"s{i}", _share(f"c{i}", 4, 10)) for i in range(8)]
    assert {r.pod["spec"]["nodeName"] for r in residents} == {"n1"}
    state.set_node(node("n2"))
    state.set_slice(resource_slice("n2", [gpu(0)]))
    waiter = Waiter(pod("big", cpu="1"), (claim("big-c", count=2),))
    result = plan_defrag(state, [waiter], residents, Limits(max_moves=4))
    assert len(result.helped) == 1, result.not_helped
    helped = result.helped[0]
    assert helped.placement.node == "n1"
    assert len(helped.placement.devices) == 2
    assert len(helped.moves) == 2
    freed = set(helped.placement.devices)
    for move in helped.moves:
        assert move.source.node == "n1"
        assert set(move.source.devices) <= freed
        assert not {(move.target.node, d) for d in move.target.devices} & {
            ("n1", d) for d in freed}


def test_fits_without_moves_is_a_retry() -> None:
    state = cluster({"n1": [gpu(i) for i in range(2)]})
    waiter = Waiter(pod("w"), (claim("w-c", count=1),))
    result = plan_defrag(state, [waiter], [])
    assert [h.moves for h in result.helped] == [()]


def _eight_shares_and_room(gib: int = 4) -> tuple[ClusterState, list[Resident]]:
    """n1: eight 16 GiB cards, one share on each; n2: one free card (room for the shares)."""
    state = cluster({"n1": [gpu(i) for i in range(8)]}, strategy="spread")
    residents = [_placed(state, f"s{i}", _share(f"c{i}", gib, 10)) for i in range(8)]
    state.set_node(node("n2"))
    state.set_slice(resource_slice("n2", [gpu(0)]))
    return state, residents


def _two_cards() -> Waiter:
    return Waiter(pod("big"), (claim("big-c", count=2),))


def test_pods_that_may_not_move_stay() -> None:
    state, residents = _eight_shares_and_room()
    residents = [r if r.pod["metadata"]["name"] in ("s6", "s7")
                 else Resident(r.pod, r.claims, fixed="annotated dra-gateway.io/defrag: never")
                 for r in residents]
    result = plan_defrag(state, [_two_cards()], residents)
    assert len(result.helped) == 1
    assert sorted(m.pod for m in result.helped[0].moves) == ["ns/s6", "ns/s7"]


def test_nothing_moves_for_a_pod_of_lower_priority() -> None:
    state, residents = _eight_shares_and_room()
    residents = [Resident(r.pod, r.claims, priority=100) for r in residents]
    result = plan_defrag(state, [_two_cards()], residents)
    assert result.helped == []
    assert "no node could make room" in result.not_helped[0].reason
    higher = Waiter(_two_cards().pod, _two_cards().claims, priority=100)
    assert len(plan_defrag(state, [higher], residents).helped) == 1


def test_disruption_budgets_are_spent_as_moves_are_planned() -> None:
    state, residents = _eight_shares_and_room()
    # One disruption left for the budget that covers s0..s5; s6 and s7 are not covered.
    residents = [Resident(r.pod, r.claims, budgets=("pdb-a",))
                 if r.pod["metadata"]["name"] not in ("s6", "s7") else r for r in residents]
    result = plan_defrag(state, [_two_cards()], residents, Limits(budgets={"pdb-a": 1}))
    moved = [m for h in result.helped for m in h.moves]
    assert len(moved) == 2
    assert sum(1 for m in moved if m.budgets == ("pdb-a",)) <= 1


def test_a_pod_moves_once_and_the_moves_cap_holds() -> None:
    state, residents = _eight_shares_and_room()
    waiters = [Waiter(pod(f"big{i}"), (claim(f"big{i}-c", count=2),)) for i in range(3)]
    result = plan_defrag(state, waiters, residents, Limits(max_moves=3))
    moved = [m.uid for h in result.helped for m in h.moves]
    assert len(moved) == len(set(moved)) <= 3
    assert len(result.helped) == 1  # the second needs two more moves: one is left
    assert "no moves left" in result.not_helped[0].reason or "make room" in \
        result.not_helped[0].reason


def test_a_failed_trial_leaves_the_state_as_it_was() -> None:
    # Shares of 12 GiB: no two on one card, and n2's one card takes only one of the two that
    # would have to leave.
    state, residents = _eight_shares_and_room(12)
    before = {k: (dict(u.consumed), u.holders) for k, u in state.usage.items()}
    pods_before = dict(state.pods)
    result = plan_defrag(state, [_two_cards()], residents)
    assert result.helped == []
    assert {k: (dict(u.consumed), u.holders) for k, u in state.usage.items()} == before
    assert state.pods == pods_before


# --- properties -----------------------------------------------------------------------------

resident_spec = st.tuples(
    st.one_of(st.tuples(st.just("share"), st.integers(1, 10), st.integers(5, 60)),
              st.tuples(st.just("whole"), st.integers(1, 2))),
    st.booleans(),  # fixed
    st.integers(0, 2),  # priority
)
waiter_spec = st.tuples(
    st.one_of(st.tuples(st.just("whole"), st.integers(1, 3)),
              st.tuples(st.just("share"), st.integers(8, 16), st.integers(10, 100))),
    st.integers(0, 2),
)


def _claim_of(name: str, spec: tuple[Any, ...]) -> dict[str, Any]:
    if spec[0] == "whole":
        return claim(name, count=spec[1])
    return _share(name, spec[1], spec[2])


def _check_capacity(state: ClusterState, allocated: dict[str, dict[str, Any]]) -> None:
    """Every card within its capacity, and a card held whole held by one claim, counted from
    the allocations alone in a fresh ledger."""
    ledger = cluster({n: [gpu(i) for i in range(len(state.node_devices[n]))]
                      for n in state.node_devices})
    for uid, allocation in allocated.items():
        ledger.set_claim({"metadata": {"uid": uid, "namespace": "ns", "name": uid},
                          "status": {"allocation": allocation}})
    for key, usage in ledger.usage.items():
        device = ledger.devices[key]
        for name, amount in usage.consumed.items():
            assert amount <= device.capacity[name], (key, name)
        assert not usage.exclusive or usage.holders == 1, key


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cards=st.lists(st.integers(2, 4), min_size=2, max_size=3),
       residents_=st.lists(resident_spec, min_size=2, max_size=12),
       waiters_=st.lists(waiter_spec, min_size=1, max_size=4),
       max_moves=st.integers(0, 6))
def test_plans_applied_in_order_never_overcommit_or_move_what_may_not_move(
    cards: list[int], residents_: list[tuple[Any, ...]], waiters_: list[tuple[Any, ...]],
    max_moves: int,
) -> None:
    state = cluster({f"n{i}": [gpu(j) for j in range(n)] for i, n in enumerate(cards)},
                    strategy="spread")
    residents: list[Resident] = []
    for i, (spec, fixed, priority) in enumerate(residents_):
        c = _claim_of(f"r{i}", spec)
        p = pod(f"r{i}", cpu="1")
        plan = place(state, p, c)
        if plan.node_name is None:
            continue
        residents.append(Resident(
            {**p, "spec": {**p["spec"], "nodeName": plan.node_name}},
            ({**c, "status": {"allocation": plan.allocations[c["metadata"]["uid"]]}},),
            priority=priority, fixed="never" if fixed else None))
    waiters = [Waiter(pod(f"w{i}", cpu="1"), (_claim_of(f"w{i}", spec),), priority=priority)
               for i, (spec, priority) in enumerate(waiters_)]
    by_uid = {r.pod["metadata"]["uid"]: r for r in residents}
    allocated = {r.claims[0]["metadata"]["uid"]: r.claims[0]["status"]["allocation"]
                 for r in residents}
    result = plan_defrag(state, waiters, residents, Limits(max_moves=max_moves))
    moved: list[str] = []
    for help_ in result.helped:
        waiter = next(w for w in waiters if w.pod["metadata"]["uid"] == help_.uid)
        for move in help_.moves:
            resident = by_uid[move.uid]
            assert resident.fixed is None
            assert resident.priority <= waiter.priority
            moved.append(move.uid)
            claim_uid = resident.claims[0]["metadata"]["uid"]
            allocated[claim_uid] = move.plan.allocations[claim_uid]
        waiter_claim = waiter.claims[0]["metadata"]["uid"]
        allocated[waiter_claim] = help_.plan.allocations[waiter_claim]
        _check_capacity(state, allocated)  # after each pod helped, its moves done
    assert len(moved) == len(set(moved)) <= max_moves
    assert len(result.helped) + len(result.not_helped) == len(waiters)

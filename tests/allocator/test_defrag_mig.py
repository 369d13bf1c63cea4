"""Defragmentation and preemption on MIG cards cut on demand (issue 47): a waiting 7g (or
whole-card) pod on a node whose cards all hold small instances is helped by moving the fewest of
them to a card with room; a pod of higher priority preempts only the instances on the slices it
takes; counters counted as the planner counts them, in every layout."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gateway.allocator.planner import ClusterState, PodPlan
from dra_gateway.allocator.planner.defrag import Limits, plan_defrag
from dra_gateway.allocator.planner.leaving import Resident, Waiter
from dra_gateway.allocator.planner.preemption import Preemption, plan_preemption
from dra_gateway.kube import names
from dra_gateway.node_plugin.facts import MigFacts

from .planner_support import node, place, pod
from .test_planner_counters import LAYOUTS, card, mig_slices, profile_claim, whole_claim


def _placed(state: ClusterState, name: str, profile: str) -> Resident:
    c = profile_claim(f"{name}-c", profile)
    p = pod(name)
    plan: PodPlan = place(state, p, c)
    assert plan.node_name is not None, plan.reason
    bound = {**p, "spec": {**p["spec"], "nodeName": plan.node_name}}
    return Resident(bound, ({**c, "status": {"allocation": plan.allocations[
        c["metadata"]["uid"]]}},))


def _device(resident: Resident) -> str:
    (result,) = resident.claims[0]["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def _add_node(state: ClusterState, name: str, layout: str) -> None:
    """A node whose one card holds an administrator's 3g at slices 0-3: room for small
    instances, none for a 7g or the whole card."""
    three_g = MigFacts(uuid="MIG-by-hand", profile="3g.40gb", memory=40 << 30, profile_id=9,
                       placement_start=0, placement_size=4)
    state.set_node(node(name))
    for slice_ in mig_slices(name, [card(0, hand_made=[three_g])], layout):
        state.set_slice(slice_)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("big", ["7g.80gb", "whole"])
def test_one_small_instance_moves_to_free_a_card_for_a_big_one(layout: str, big: str) -> None:
    """n1's card 0 is full of 1g instances (its compute slices), card 1 holds one; n2's card
    has room for small ones only. The big pod waits; moving the one 1g of card 1 to n2 frees
    card 1 for it."""
    from .test_planner_counters import mig_cluster

    state = mig_cluster(layout, {"n1": [card(0), card(1)]})
    residents = [_placed(state, f"s{i}", "1g.10gb") for i in range(8)]
    on_card = [_device(r).split("-")[1] for r in residents]
    assert sorted(on_card) == ["0"] * 7 + ["1"], on_card  # packed: card 0 first
    _add_node(state, "n2", layout)
    wanted: dict[str, Any] = (whole_claim("big-c") if big == "whole"
                              else profile_claim("big-c", big))
    waiter = Waiter(pod("big"), (wanted,))
    result = plan_defrag(state, [waiter], residents, Limits(max_moves=4))
    assert len(result.helped) == 1, result.not_helped
    (helped,) = result.helped
    assert helped.placement.node == "n1"
    (device,) = helped.placement.devices
    assert device.startswith("gpu-1")
    (move,) = helped.moves
    assert move.source.node == "n1"
    assert [d.split("-")[1] for d in move.source.devices] == ["1"]
    assert move.target.node == "n2"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_nothing_moves_where_no_card_has_room_for_the_small_ones(layout: str) -> None:
    from .test_planner_counters import mig_cluster

    state = mig_cluster(layout, {"n1": [card(0), card(1)]})
    residents = [_placed(state, f"s{i}", "1g.10gb") for i in range(14)]  # both cards full
    waiter = Waiter(pod("big"), (profile_claim("big-c", "7g.80gb"),))
    result = plan_defrag(state, [waiter], residents, Limits(max_moves=8))
    assert result.helped == []
    assert names.MIG_CLASS  # the class the small ones and the big one share


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_high_priority_3g_preempts_only_the_small_instances_on_its_slices(layout: str) -> None:
    """One card: a 3g.40gb takes memory slices 0-3 or 4-7. Six low-priority 1g instances
    spread over both halves; a high-priority 3g preempts exactly the holders of the half it
    takes (the fewer), not all six, counted by counters."""
    from .test_planner_counters import mig_cluster

    state = mig_cluster(layout, {"n1": [card(0)]})
    residents = []
    for i in range(6):
        c = profile_claim(f"low{i}-c", "1g.10gb")
        p = pod(f"low{i}", priority=1)
        plan: PodPlan = place(state, p, c)
        assert plan.node_name is not None, plan.reason
        residents.append(Resident({**p, "spec": {**p["spec"], "nodeName": "n1"}},
                                  ({**c, "status": {"allocation": plan.allocations[
                                      c["metadata"]["uid"]]}},), priority=1))
    start_of = {f"ns/{r.pod['metadata']['name']}": int(_device(r).rsplit("-", 1)[1])
                for r in residents}
    halves = {half: {name for name, start in start_of.items() if start // 4 == half}
              for half in (0, 1)}
    waiter = Waiter(pod("hi", priority=100), (profile_claim("hi-c", "3g.40gb"),), 100)
    found = plan_preemption(state, waiter, residents, {})
    assert isinstance(found, Preemption), found
    (result,) = found.plan.allocations["uid-hi-c"]["devices"]["results"]
    half = int(result["device"].rsplit("-", 1)[1]) // 4
    assert {v.pod for v in found.victims} == halves[half], (start_of, result["device"])
    assert len(halves[half]) <= len(halves[1 - half])

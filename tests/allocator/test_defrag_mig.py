"""Defragmentation of MIG cards cut on demand (issue 47): a waiting 7g (or whole-card) pod on a
node whose cards all hold small instances is helped by moving the fewest of them to a card with
room, counters counted as the planner counts them, in every layout."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gateway.allocator.planner import ClusterState, PodPlan
from dra_gateway.allocator.planner.defrag import Limits, plan_defrag
from dra_gateway.allocator.planner.leaving import Resident, Waiter
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

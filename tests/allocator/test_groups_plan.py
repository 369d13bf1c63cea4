"""All or nothing in the planner (allocator/planner/groups.py): a group is placed whole or not
at all, the state is left as found, and two groups that cannot both fit never both hold
devices."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_gateway.allocator.planner import ClusterState, PlannerSettings, plan_pod
from dra_gateway.allocator.planner.groups import (
    domain_nodes,
    model_selector,
    narrow_to_model,
    plan_group,
    plan_models,
)
from dra_gateway.kube import names

from .planner_support import (
    claim,
    cluster,
    device_class,
    gpu,
    node,
    place,
    pod,
    resource_slice,
)


def _members(job: str, sizes: list[int]) -> list[tuple[dict, list[dict]]]:  # type: ignore[type-arg]
    return [(pod(f"{job}{i}"), [claim(f"{job}{i}c", count=n)]) for i, n in enumerate(sizes)]


def test_a_group_that_does_not_fit_whole_is_not_placed_and_leaves_the_state() -> None:
    state = cluster({"n0": [gpu(i) for i in range(4)]})
    found = plan_group(state, _members("a", [2, 2, 2]))
    assert not found.placed
    assert found.fitted == 2
    assert "request main needs 2 device(s)" in (found.reason or "")
    # Nothing is held: a pod for all four cards still fits.
    assert place(state, pod("all"), claim("allc", count=4)).node_name == "n0"


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(groups=st.lists(st.lists(st.integers(1, 4), min_size=1, max_size=4), min_size=1,
                       max_size=5),
       cards=st.integers(2, 8))
def test_groups_are_never_partly_placed_and_never_overbook(groups: list[list[int]],
                                                           cards: int) -> None:
    """Groups arrive one after the other; each is planned together and, when placed, all its
    members are assumed. No group ends partly placed, and no card is held twice."""
    state = cluster({"n0": [gpu(i) for i in range(cards)], "n1": [gpu(i) for i in range(2)]})
    held: list[str] = []
    for index, sizes in enumerate(groups):
        members = _members(f"g{index}-", sizes)
        found = plan_group(state, members)
        if found.placed:
            assert len(found.plans) == len(members)
            for (p, _), plan in zip(members, found.plans, strict=True):
                state.assume(p, plan)
                held += [f"{plan.node_name}/{r['device']}" for a in plan.allocations.values()
                         for r in a["devices"]["results"]]
        else:
            assert found.fitted < len(members)
        assert len(held) == len(set(held))
        assert sum(1 for d in held if d.startswith("n0/")) <= cards
        # A group placed or not: the state holds exactly the placed groups' cards (a group
        # not placed left nothing behind).
        in_use = [f"{n}/{d.key[2]}" for n in ("n0", "n1") for d in state.node_devices[n]
                  if state.device_usage(d.key).holders]
        assert sorted(in_use) == sorted(held)


# One model per group ---------------------------------------------------------------------------

def _models(state, found) -> set[str]:  # type: ignore[no-untyped-def]
    return {m for plan in found.plans for m in plan_models(state, plan) if m is not None}


def test_a_group_with_room_only_across_two_models_waits_and_says_which_lacks_room() -> None:
    # Two cards of each model: three 1-card members fit only across both.
    state = cluster({"h": [gpu(i, product="H100") for i in range(2)],
                     "a": [gpu(i, product="A100") for i in range(2)]})
    members = _members("j", [1, 1, 1])
    assert plan_group(state, members).placed  # without one model per group: mixed
    found = plan_group(state, members, same_model=True)
    assert not found.placed
    assert found.fitted == 2
    assert "no model has room for all" in (found.reason or "")
    assert "A100: 2 of 3 fit" in (found.reason or "")
    assert "H100: 2 of 3 fit" in (found.reason or "")
    # Left as found: four single cards still fit.
    assert all(place(state, pod(f"x{i}"), claim(f"x{i}c")).node_name for i in range(4))


def test_a_group_lands_on_the_one_model_with_room_for_all() -> None:
    # The first-fit plan would spread the members over both models; the H100 node has room
    # for all three.
    state = cluster({"a": [gpu(0, product="A100")],
                     "h": [gpu(i, product="H100") for i in range(3)]})
    members = _members("j", [1, 1, 1])
    assert _models(state, plan_group(state, members)) == {"A100", "H100"}
    found = plan_group(state, members, same_model=True)
    assert found.placed
    assert found.model == "H100"
    assert _models(state, found) == {"H100"}
    assert {plan.node_name for plan in found.plans} == {"h"}


def test_members_join_the_model_the_placed_members_hold() -> None:
    state = cluster({"a": [gpu(i, product="A100") for i in range(4)],
                     "h": [gpu(i, product="H100") for i in range(4)]})
    found = plan_group(state, _members("j", [1]), same_model=True, model="H100")
    assert found.placed
    assert _models(state, found) == {"H100"}
    refused = plan_group(state, _members("k", [4, 1]), same_model=True, model="H100")
    assert not refused.placed
    assert "placed members hold cards of model H100" in (refused.reason or "")


def test_the_narrowed_claim_is_a_copy_and_the_selector_never_errors() -> None:
    original = claim("c")
    before = json.dumps(original, sort_keys=True)
    narrowed = narrow_to_model(original, 'H100 "SXM"')
    assert json.dumps(original, sort_keys=True) == before
    (selector,) = narrowed["spec"]["devices"]["requests"][0]["exactly"]["selectors"]
    assert selector["cel"]["expression"] == model_selector('H100 "SXM"')
    # A card without a productName is not of the model, and no CEL error stops the search.
    bare = gpu(0, product="H100")
    del bare["attributes"]["productName"]
    state = cluster({"n": [bare, gpu(1, product='H100 "SXM"')]})
    found = plan_group(state, [(pod("p"), [original])], same_model=True, model='H100 "SXM"')
    assert found.placed
    assert [r["device"] for a in found.plans[0].allocations.values()
            for r in a["devices"]["results"]] == ["gpu-1"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(1, 3), min_size=1, max_size=4),
       models=st.lists(st.sampled_from(["A100", "H100", "L4"]), min_size=1, max_size=4))
def test_members_of_a_placed_group_share_a_model(sizes: list[int], models: list[str]) -> None:
    state = cluster({f"n{i}": [gpu(c, product=m) for c in range(3)]
                     for i, m in enumerate(models)})
    found = plan_group(state, _members("g", sizes), same_model=True)
    if found.placed:
        assert len(_models(state, found)) == 1
    else:
        # Never waiting while one model has room for them all.
        for model in set(models):
            assert not plan_group(state, _members("g", sizes), same_model=True,
                                  model=model).placed


# Members close together ------------------------------------------------------------------------

def _racked(strategy: str = "spread", domains: tuple[str, ...] = ()) -> ClusterState:
    """Four 4-card nodes in two racks (r1: n1, n2; r2: n3, n4)."""
    state = ClusterState(PlannerSettings(default_strategy=strategy, group_domains=domains))
    state.set_device_class(device_class(names.GPU_CLASS, "gpu"))
    for index, rack in ((1, "r1"), (2, "r1"), (3, "r2"), (4, "r2")):
        name = f"n{index}"
        state.set_node(node(name, labels={"example.com/rack": rack}))
        state.set_slice(resource_slice(name, [gpu(i) for i in range(4)]))
    return state


def _nodes(found) -> list[str]:  # type: ignore[no-untyped-def]
    return [plan.node_name for plan in found.plans]


def test_members_go_to_the_nodes_the_group_already_uses() -> None:
    # Spread would put each member on a node of its own; the group keeps to the fewest.
    state = _racked()
    found = plan_group(state, _members("j", [2, 2, 1]))
    assert found.placed
    assert len(set(_nodes(found))) == 2, _nodes(found)
    assert _nodes(found)[0] == _nodes(found)[1]


def test_members_past_a_full_node_stay_in_its_rack() -> None:
    state = _racked(domains=("example.com/rack",))
    found = plan_group(state, _members("j", [4, 4]))
    assert found.placed
    racks = {state.nodes[n].labels["example.com/rack"] for n in _nodes(found)}
    assert len(racks) == 1, _nodes(found)


def test_a_required_domain_waits_rather_than_spread() -> None:
    state = _racked()
    # Three cards left in each rack once two 3-card pods and one 2-card pod hold the rest.
    for name, nodes_ in (("x1", ["n1"]), ("x2", ["n2"]), ("x3", ["n3"]), ("x4", ["n4"])):
        held = plan_pod(state, pod(name), [claim(f"{name}c", count=3 if name != "x4" else 2)],
                        nodes=nodes_)
        assert held.node_name == nodes_[0]
        state.assume(pod(name), held)
    members = _members("j", [1, 1, 1])
    assert plan_group(state, members).placed  # across racks, when free to spread
    found = plan_group(state, members, domain="example.com/rack")
    assert found.placed  # r2 has three free cards (n3: 1, n4: 2)
    assert {state.nodes[n].labels["example.com/rack"] for n in _nodes(found)} == {"r2"}
    refused = plan_group(state, _members("k", [1, 1, 1, 1]), domain="example.com/rack")
    assert not refused.placed
    assert "must share the node label example.com/rack, and no value has room for all" in \
        (refused.reason or "")
    assert plan_group(state, members, domain="example.com/row").reason == (
        "its members must share the node label example.com/row, and no node has it")


def test_members_placed_later_keep_to_the_domain_the_group_holds() -> None:
    state = _racked()
    found = plan_group(state, _members("j", [2, 2]), domain="example.com/rack")
    assert found.placed
    placed = []
    for (p, claims), plan in zip(_members("j", [2, 2]), found.plans, strict=True):
        state.assume(p, plan)
        (c,) = claims
        placed.append({**c, "status": {"allocation": plan.allocations[c["metadata"]["uid"]]}})
    rack = state.nodes[found.plans[0].node_name or ""].labels["example.com/rack"]
    nodes = domain_nodes(state, placed, "example.com/rack")
    assert nodes == sorted(n for n, info in state.nodes.items()
                           if info.labels["example.com/rack"] == rack)
    assert domain_nodes(state, [], "example.com/rack") is None
    assert domain_nodes(state, placed, "example.com/row") is None  # no node has it

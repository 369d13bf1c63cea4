"""Multi-card requests on aligned cards (allocator/planner/topology.py): the fewest NVLink
islands, then NUMA nodes, then PCIe roots the node's free cards allow, as a preference the
search falls back from; off, the strategy's order alone."""

from __future__ import annotations

from itertools import combinations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_gateway.allocator.planner import ClusterState, plan_pod
from dra_gateway.allocator.planner.topology import span

from .planner_support import claim, cluster, devices_of, gpu, place, pod


def _pcie_node(*, island: bool = False) -> list[dict]:  # type: ignore[type-arg]
    """Eight cards: NUMA node 0 holds cards 0-3, node 1 cards 4-7; each pair of cards
    (0-1, 2-3, 4-5, 6-7) shares a PCIe root; with `island`, NVLink joins each NUMA half."""
    return [gpu(i, numa=i // 4, pcie_root=f"pci0000:{i // 2:02x}",
                island=(i // 4) * 4 if island else None, shared=False) for i in range(8)]


def _take(state: ClusterState, *cards: int) -> None:
    """Hold `cards` with one-card pods pinned by name."""
    for index in cards:
        c = claim(f"hold{index}c", requests=[{"name": "main", "exactly": {
            "deviceClassName": "gpu.dra-gateway.io", "count": 1, "selectors": [
                {"cel": {"expression": f'device.attributes["gpu.dra-gateway.io"].index == '
                                       f'{index}'}}]}}])
        assert place(state, pod(f"hold{index}"), c).node_name == "n"


def _cards(plan_devices: list[str]) -> set[int]:
    return {int(d.split("-")[1]) for d in plan_devices}


def test_two_cards_go_to_one_pcie_root_where_first_fit_would_split_them() -> None:
    for topology, expected in ((True, {2, 3}), (False, {1, 2})):
        state = cluster({"n": _pcie_node()}, topology=topology)
        _take(state, 0, 4, 6)
        c = claim("two", count=2)
        plan = place(state, pod("p"), c)
        assert _cards(devices_of(plan, c)) == expected, topology


def test_four_cards_go_to_the_numa_node_that_holds_them_all() -> None:
    for topology, expected in ((True, {4, 5, 6, 7}), (False, {0, 2, 3, 4})):
        state = cluster({"n": _pcie_node()}, topology=topology)
        _take(state, 1)
        c = claim("four", count=4)
        plan = place(state, pod("p"), c)
        assert _cards(devices_of(plan, c)) == expected, topology


def test_best_fit_keeps_a_whole_pcie_root_for_a_later_pair() -> None:
    # Free: card 1 alone on its root, 2-3 on theirs, and NUMA node 1 whole.
    state = cluster({"n": _pcie_node()})
    _take(state, 0)
    c = claim("three", count=3)
    plan = place(state, pod("p"), c)
    # Three cards fit NUMA node 0 (1, 2, 3: two roots) or node 1 (two roots of four free): the
    # smaller domain is taken, node 1 stays whole.
    assert _cards(devices_of(plan, c)) == {1, 2, 3}
    pair = claim("pair", count=2)
    assert _cards(devices_of(place(state, pod("q"), pair), pair)) == {4, 5}


def test_nvlink_islands_come_before_numa_nodes_and_pcie_roots() -> None:
    # Islands across the NUMA halves: cards 0, 1, 4, 5 are one island, 2, 3, 6, 7 another.
    devices = [gpu(i, numa=i // 4, pcie_root=f"pci0000:{i // 2:02x}",
                   island=0 if i in (0, 1, 4, 5) else 2, shared=False) for i in range(8)]
    state = cluster({"n": devices})
    _take(state, 0, 2)
    c = claim("three", count=3)
    plan = place(state, pod("p"), c)
    chosen = _cards(devices_of(plan, c))
    assert chosen in ({1, 4, 5}, {3, 6, 7}), chosen


def test_a_constraint_still_decides_and_the_preference_falls_back() -> None:
    # The preferred pair (0, 1) shares a NUMA node; the claim asks for distinct ones.
    state = cluster({"n": _pcie_node()})
    c = claim("apart", requests=[{"name": "main", "exactly": {
        "deviceClassName": "gpu.dra-gateway.io", "count": 2}}], constraints=[
        {"requests": ["main"], "distinctAttribute": "gpu.dra-gateway.io/numaNode"}])
    plan = place(state, pod("p"), c)
    chosen = _cards(devices_of(plan, c))
    assert len({i // 4 for i in chosen}) == 2, chosen


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(held=st.sets(st.integers(0, 7), max_size=6), need=st.integers(2, 4))
def test_the_request_spans_the_fewest_domains_the_free_cards_allow(held: set[int],
                                                                   need: int) -> None:
    state = cluster({"n": _pcie_node(island=True)})
    _take(state, *sorted(held))
    free = [i for i in range(8) if i not in held]
    if len(free) < need:
        return
    c = claim("req", count=need)
    plan = place(state, pod("p"), c)
    chosen = sorted(_cards(devices_of(plan, c)))
    devices = state.node_devices["n"]
    position = {d.name: n for n, d in enumerate(devices)}

    def spread(cards: list[int]) -> tuple[int, ...]:
        return span(devices, [position[f"gpu-{i}"] for i in cards])

    best = min(spread(list(combo)) for combo in combinations(free, need))
    got = spread(chosen)
    assert got[:2] == best[:2], (held, need, chosen)  # islands and NUMA nodes: always fewest
    if best[0] == 1:  # the request fits one island: PCIe roots fewest too
        assert got == best, (held, need, chosen)


def test_a_node_with_the_cards_together_is_preferred_to_one_where_they_spread() -> None:
    for strategy in ("default", "binpack", "spread"):
        state = cluster({"a": _pcie_node(), "b": _pcie_node()}, strategy=strategy)
        # a: one free card on each NUMA node; b: the pair 6-7 free on one PCIe root.
        for node, held in (("a", (1, 2, 3, 5, 6, 7)), ("b", (0, 1, 2, 3, 4, 5))):
            for index in held:
                c = claim(f"{node}{index}c", requests=[{"name": "main", "exactly": {
                    "deviceClassName": "gpu.dra-gateway.io", "count": 1, "selectors": [
                        {"cel": {"expression": 'device.attributes["gpu.dra-gateway.io"].index'
                                               f' == {index}'}}]}}])
                p = pod(f"{node}{index}")
                held_plan = plan_pod(state, p, [c], nodes=[node])
                assert held_plan.node_name == node
                state.assume(p, held_plan)
        c = claim("pair", count=2)
        plan = place(state, pod("p"), c)
        assert (plan.node_name, _cards(devices_of(plan, c))) == ("b", {6, 7}), strategy


def test_every_input_of_a_search_is_in_its_memo_key() -> None:
    """Two searches of one node class that differ in one input (here the topology preference)
    are memoised apart: the memo key is the named inputs themselves (planner/inputs.py)."""
    from dataclasses import replace

    from dra_gateway.allocator.planner.inputs import PodInputs, SearchInputs
    from dra_gateway.allocator.planner.visit import PodVisit

    state = cluster({"n": _pcie_node()})
    _take(state, 0, 4, 6)
    c = claim("two", count=2)
    key, demand = state.demand(c["spec"])
    state.refresh_groups()
    group_key = state.node_group["n"]
    outcomes = {}
    for topology in (True, False):
        search = SearchInputs(claims=(key,), strategy="first-fit", workload=0, card_rules=None,
                              topology=topology, budget=state.settings.search_budget)
        visit = PodVisit(state, PodInputs(search, 1000, 1 << 30, ""), [("two", demand)], ())
        outcomes[topology] = visit.search_node(group_key, "n")
    picked = {t: sorted(state.node_devices["n"][p.device].name for p in o.picks)
              for t, o in outcomes.items()}
    assert picked == {True: ["gpu-2", "gpu-3"], False: ["gpu-1", "gpu-2"]}
    assert replace(search, topology=True) != search  # an input changed is another key
    assert len([k for k in state.memo if isinstance(k[2], SearchInputs)]) >= 2

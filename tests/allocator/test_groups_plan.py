"""All or nothing in the planner (allocator/planner/groups.py): a group is placed whole or not
at all, the state is left as found, and two groups that cannot both fit never both hold
devices."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_gateway.allocator.planner.groups import plan_group

from .planner_support import claim, cluster, gpu, place, pod


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

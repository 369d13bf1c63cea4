"""The trial core of preemption, reclaim and defrag (allocator/planner/trial.py): the pods left
out are minimal, given in the order of the reprieves, and `undo` leaves the state as it was."""

from __future__ import annotations

import random

from hypothesis import given
from hypothesis import strategies as st

from dra_gateway.allocator.planner.allocation import PodPlan
from dra_gateway.allocator.planner.ledger import TakenOut
from dra_gateway.allocator.planner.trial import Trial

PODS = [f"p{i}" for i in range(8)]


class _World:
    """Pods holding room: the waiting pod fits when at least `need` room is free."""

    def __init__(self, sizes: dict[str, int], need: int) -> None:
        self.sizes = sizes
        self.need = need
        self.placed = set(sizes)
        self.plans = 0

    def take_out(self, uid: str) -> TakenOut:
        self.placed.remove(uid)
        return TakenOut(uid, None, {})

    def put_back(self, taken: TakenOut) -> None:
        self.placed.add(taken.pod_uid)

    def plan(self) -> PodPlan | None:
        self.plans += 1
        free = sum(size for uid, size in self.sizes.items() if uid not in self.placed)
        return PodPlan(node_name="n1") if free >= self.need else None


@given(st.lists(st.integers(1, 5), min_size=1, max_size=len(PODS)), st.integers(1, 12),
       st.randoms(use_true_random=False))
def test_the_pods_left_out_are_minimal_and_undo_restores_the_state(
        sizes: list[int], need: int, rng: random.Random) -> None:
    world = _World(dict(zip(PODS, sizes, strict=False)), need)
    trial = Trial(world.take_out, world.put_back)
    for uid in world.sizes:
        trial.take_out(uid)
    placed = world.plan()
    if placed is None:
        trial.undo()
        assert world.placed == set(world.sizes)
        return
    order = sorted(world.sizes)
    rng.shuffle(order)
    plan, leaving = trial.reprieve(order, world.plan, placed)
    assert plan is not None
    assert leaving == [uid for uid in order if uid in leaving]  # the reprieves' order
    assert set(trial.out) == set(leaving) == set(world.sizes) - world.placed
    assert world.plan() is not None  # it fits without them
    for uid in leaving:  # and without any one of them back it does not
        trial.put_back(uid)
        assert world.plan() is None
        trial.take_out(uid)
    trial.undo()
    assert world.placed == set(world.sizes)
    assert trial.out == {}


def test_a_pod_given_its_reprieve_first_stays_back_when_the_pod_fits_without_it() -> None:
    world = _World({"a": 2, "b": 2, "c": 2}, need=4)
    trial = Trial(world.take_out, world.put_back)
    for uid in "abc":
        trial.take_out(uid)
    _, leaving = trial.reprieve(["b", "a", "c"], world.plan, PodPlan(node_name="n1"))
    assert leaving == ["a", "c"]  # b went back first and the pod still fit without a and c

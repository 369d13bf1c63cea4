"""Defragmentation: the fewest moves of placed pods that let waiting pods be placed.

`plan_defrag(state, waiters, residents, limits)` helps waiting pods one at a time, in the order
given (callers put higher priority and longer waits first):

1. a waiter that fits as the cluster is now is placed without moves (what a retry would do);
2. otherwise each node is estimated from its cards alone: a card nobody holds costs nothing, a
   card whose holders may all move costs their number, a card with a holder that may not move
   cannot be freed; a waiter's whole cards take the cheapest cards of the node, each of its
   shares the card that frees enough with the fewest holders leaving. Nodes are then tried
   cheapest first, with the real planner: the estimate only orders the trials, it decides
   nothing;
3. a trial takes the chosen holders out of the state, asks `plan_pod` whether the waiter fits
   on that node, puts back every holder it can do without, reserves the waiter's devices, and
   then places each holder that left, largest first, wherever the planner puts it (the freed
   devices are taken: a moved pod never lands on them), directly or by making room for it in
   turn (`Limits.depth`, two levels by default). Where the node is short of CPU or memory,
   pods holding none of its GPUs leave too. A trial that cannot place every moved pod again is
   undone exactly.

Who may move is the caller's word (`Resident.fixed`: owned by no controller that re-creates it,
annotated `dra-gateway.io/defrag: never`, moved recently); the plan adds the rest: a pod never
moves to make room for a pod of lower priority than its own, never moves twice in one plan, and
never beyond what its PodDisruptionBudgets allow (`Limits.budgets`, disruptions left per budget,
spent as moves are planned).

The state ends as if the plan had been carried out: waiters and moved pods assumed where the
plan puts them. Pure: no I/O, no clock, no logging.

`model.py` holds the values in and out, `estimate.py` the estimate of a node from its cards,
`rooms.py` the trials (`RoomMaker`); this module drives them pod by pod.
"""

from __future__ import annotations

from collections.abc import Sequence

from dra_gateway.allocator.planner import kubefit
from dra_gateway.allocator.planner.defrag.estimate import label
from dra_gateway.allocator.planner.defrag.model import (
    DefragPlan,
    Help,
    Limits,
    Move,
    NotHelped,
    Placement,
)
from dra_gateway.allocator.planner.defrag.rooms import RoomMaker
from dra_gateway.allocator.planner.leaving import Resident, Waiter
from dra_gateway.allocator.planner.state import ClusterState
from dra_gateway.kube import objects


def plan_defrag(state: ClusterState, waiters: Sequence[Waiter], residents: Sequence[Resident],
                limits: Limits | None = None) -> DefragPlan:
    """Help `waiters` in their order; see the module docstring. The state ends as if the plan
    had been carried out."""
    planner = RoomMaker(state, residents, limits or Limits())
    result = DefragPlan()
    hopeless: set[tuple[object, ...]] = set()
    for waiter in waiters:
        shape = _shape(state, waiter)
        uid = objects.uid(waiter.pod)
        if shape in hopeless:
            result.not_helped.append(NotHelped(
                label(waiter.pod), uid, "a pod asking for the same could not be helped"))
            continue
        outcome = planner.help(waiter)
        if isinstance(outcome, str):
            if planner.moves_left > 0:
                hopeless.add(shape)
            result.not_helped.append(NotHelped(label(waiter.pod), uid, outcome))
            continue
        planner.placed_waiter(outcome, waiter)
        result.helped.append(outcome)
    return result


def _shape(state: ClusterState, waiter: Waiter) -> tuple[object, ...]:
    spec = waiter.pod.get("spec") or {}
    return (tuple(state.demand(c.get("spec") or {})[0] for c in waiter.claims),
            kubefit.pod_requests(waiter.pod), waiter.priority, objects.namespace(waiter.pod),
            repr(spec.get("nodeSelector")), repr(spec.get("affinity")),
            repr(spec.get("tolerations")))


__all__ = ["DefragPlan", "Help", "Limits", "Move", "NotHelped", "Placement", "plan_defrag"]

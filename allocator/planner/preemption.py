"""Preemption for GPU claims: the pods of lower priority whose devices let a waiting pod in.

kube-scheduler preempts for extended resources; once a pod's GPUs are DRA claims it preempts
for nothing (upstream DRA cannot preempt a claim), so the gateway, which places them, does it
as kube-scheduler does (its `selectVictimsOnNode` and `pickOneNodeForPreemption`):

1. a pod whose `preemptionPolicy` is `Never`, or of priority no higher than every placed pod,
   preempts nothing;
2. on each node where pods of strictly lower priority hold gateway devices (whole cards or
   shares: freeing memory and cores on a card counts) and enough devices are free or held by
   them alone (those whose candidates rank lowest first, at most `NODES_TRIED` nodes, as
   kube-scheduler bounds its candidate nodes), those pods are taken out of the state
   and the waiting pod is planned on that node; where it fits, each of them is put back in
   turn, those whose PodDisruptionBudget has no disruption left first, then the highest
   priority, then the oldest, and stays back when the pod still fits: the victims left are
   minimal (putting any one back leaves the pod unplaceable there);
3. of the nodes where it fits, the one with the fewest victims a budget protects, then the
   lowest highest-priority victim, then the smallest sum of victims' priorities, then the
   fewest victims.

A pod of a namespace whose GPUQuota lends to a cohort (`spec.min`, `spec.cohort`) never
preempts, by priority, the pods of another namespace of the cohort that runs within its own
guarantee: those are the lender's, not spare room.

`plan_reclaim` takes a lent guarantee back, as Kueue's reclaim within a cohort does: a pod
within its quota's guarantee that waits because the cohort lent it (or for room that borrowed
pods hold) preempts pods of the cohort's namespaces that borrow, whatever their priority:
those a budget allows first, then the lowest priority, then the newest, each while its
namespace still borrows, until the pod is placed within its guarantee; then each victim is put
back in turn (the highest priority, then the oldest, first) where the pod still fits without
it, so that the victims left are minimal.

The state ends as it started. Pure: no I/O, no clock, no logging.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_gateway.allocator.planner.allocation import PodPlan
from dra_gateway.allocator.planner.leaving import (
    Resident,
    Waiter,
    preemptible,
    protected,
    reclaimable,
)
from dra_gateway.allocator.planner.plan import plan_pod
from dra_gateway.allocator.planner.state import ClusterState
from dra_gateway.allocator.planner.trial import Trial
from dra_gateway.kube import objects

__all__ = ["MAX_RECLAIMED", "NODES_TRIED", "Preemption", "Victim", "plan_preemption",
           "plan_reclaim"]

# Nodes tried per waiting pod, those whose candidates rank lowest first.
NODES_TRIED = 16
# Borrowed pods taken out, at most, to take one guarantee back.
MAX_RECLAIMED = 64


@dataclass(frozen=True, slots=True)
class Victim:
    pod: str  # namespace/name
    uid: str
    priority: int
    budgets: tuple[str, ...]  # its PodDisruptionBudgets
    protected: bool  # one of them allows no disruption now


@dataclass(frozen=True, slots=True)
class Preemption:
    """Where a waiting pod goes once its victims have left, and who they are."""

    pod: str
    uid: str
    priority: int
    node: str
    plan: PodPlan
    victims: tuple[Victim, ...]
    # A reclaim: the cohort whose borrowers give the pod's guarantee back (None: priority).
    cohort: str | None = None

    def key(self) -> tuple[int, int, int, int]:
        """kube-scheduler's order of candidate nodes (smallest first)."""
        priorities = [v.priority for v in self.victims]
        return (sum(v.protected for v in self.victims), max(priorities, default=0),
                sum(priorities), len(priorities))


def _label(pod: Mapping[str, object]) -> str:
    return "/".join(objects.namespace_name(pod))


def plan_preemption(state: ClusterState, waiter: Waiter, residents: Sequence[Resident],
                    budgets: Mapping[str, int]) -> Preemption | str:
    """The preemption that places `waiter`, or why there is none (see the module)."""
    pod = waiter.pod
    if objects.spec(pod).get("preemptionPolicy") == "Never":
        return "its preemptionPolicy is Never"
    # Namespaces of its cohorts that run within their guarantee: theirs is not spare room.
    peers = state.policies.ledger.cohort_peers(objects.namespace(pod))
    by_node: dict[str, list[Resident]] = {}
    for resident in residents:
        if preemptible(resident, waiter.priority, peers):
            by_node.setdefault(objects.spec(resident.pod)["nodeName"], []).append(resident)
    if not by_node:
        return "no pod of lower priority holds gateway devices"
    # Only nodes with as many devices free or held by candidates alone as the pod asks for
    # can place it, and those whose candidates rank lowest are tried first, at most
    # NODES_TRIED of them: a trial is a planning per candidate.
    needed = _devices_asked(waiter.claims)
    eligible = [node for node in by_node
                if _freeable(state, node, by_node[node]) >= needed]
    eligible.sort(key=lambda n: (max(r.priority for r in by_node[n]), len(by_node[n]), n))
    best: Preemption | None = None
    for node in eligible[:NODES_TRIED]:
        found = _on_node(state, waiter, node, by_node[node], budgets)
        if found is not None and (best is None or found.key() < best.key()):
            best = found
    if best is None:
        return ("it fits no node even without every pod of lower priority holding gateway "
                "devices there")
    return best


def plan_reclaim(state: ClusterState, waiter: Waiter, residents: Sequence[Resident],
                 budgets: Mapping[str, int]) -> Preemption | str:
    """The borrowed pods of its cohort whose leaving places `waiter` within its guarantee,
    or why there are none (see the module)."""
    pod = waiter.pod
    namespace = objects.namespace(pod)
    ledger = state.policies.ledger
    cohorts = sorted({q.cohort for q in ledger.quotas(namespace) if q.cohort and q.min})
    borrowers = {ns for ns, borrowing in ledger.cohort_peers(namespace).items() if borrowing}
    if not borrowers:
        return "no other namespace of its cohort borrows"

    candidates = [r for r in residents if reclaimable(r, borrowers)]
    # Those a budget allows first, then the lowest priority, then the newest.
    candidates.sort(key=lambda r: (str(objects.meta(r.pod).get("creationTimestamp") or ""),
                                   _label(r.pod)), reverse=True)
    candidates.sort(key=lambda r: (protected(r, budgets), r.priority))
    by_uid = {objects.uid(r.pod): r for r in candidates}
    trial = _trial(state, candidates)

    def plan() -> PodPlan | None:
        """Its plan, when it is placed within its guarantee."""
        found = plan_pod(state, pod, list(waiter.claims))
        if found.node_name is None or ledger.borrows(namespace, list(found.charges.values())):
            return None
        return found

    try:
        placed: PodPlan | None = None
        taken: list[str] = []
        for resident in candidates[:MAX_RECLAIMED]:
            if not ledger.cohort_peers(namespace).get(objects.namespace(resident.pod)):
                continue  # its namespace no longer borrows: what it holds is its own
            trial.take_out(objects.uid(resident.pod))
            taken.append(objects.uid(resident.pod))
            placed = plan()
            if placed is not None:
                break
        if placed is None:
            return ("the pods borrowing from its cohort do not free room for it within its "
                    "guarantee")
        # Reprieve: the highest priority, then the oldest, back first.
        placed, leaving = trial.reprieve(reversed(taken), plan, placed)
        victims = [by_uid[uid] for uid in taken if uid in set(leaving)]
        return Preemption(_label(pod), objects.uid(pod), waiter.priority,
                          placed.node_name or "", placed, _marked(victims, budgets),
                          cohort=",".join(cohorts))
    finally:
        trial.undo()


def _trial(state: ClusterState, residents: Sequence[Resident]) -> Trial:
    """A trial on `state` that takes out any of `residents` by pod uid."""
    claims = {objects.uid(r.pod): [objects.uid(c) for c in r.claims] for r in residents}
    return Trial(lambda uid: state.take_out(uid, claims[uid]), state.put_back)


def _marked(victims: Sequence[Resident], budgets: Mapping[str, int]) -> tuple[Victim, ...]:
    """The victims, each protected when a budget of it allows no disruption now or none is
    left once the victims before it are counted (the Eviction API would refuse it), counted
    as kube-scheduler counts them."""
    left = dict(budgets)
    marked: list[Victim] = []
    for r in victims:
        over = any(left.get(b, 0) <= 0 for b in r.budgets)
        for b in r.budgets:
            left[b] = left.get(b, 0) - 1
        marked.append(Victim(_label(r.pod), objects.uid(r.pod), r.priority, r.budgets, over))
    return tuple(marked)


def _devices_asked(claims: Sequence[Mapping[str, Any]]) -> int:
    """The devices the claims ask for at the least (each request's count; a prioritized list's
    smallest)."""
    total = 0
    for claim in claims:
        for request in (objects.spec(claim).get("devices") or {}).get("requests") or ():
            choices = [request["exactly"]] if isinstance(request.get("exactly"), Mapping) \
                else [c for c in request.get("firstAvailable") or () if isinstance(c, Mapping)]
            counts = [c.get("count", 1) if c.get("allocationMode", "ExactCount") == "ExactCount"
                      else 1 for c in choices]
            total += min((c for c in counts if isinstance(c, int)), default=1)
    return total


def _freeable(state: ClusterState, node: str, candidates: Sequence[Resident]) -> int:
    """The node's devices the pod may get once `candidates` leave, at the most: those free,
    held by one of them, or shared and not held whole (a share may fit beside others)."""
    held: set[tuple[str, str, str]] = set()
    for resident in candidates:
        for claim in resident.claims:
            record = state.claims.get(objects.uid(claim))
            held.update(record.uses if record is not None else ())
    count = 0
    for device in state.node_devices.get(node, ()):
        usage = state.device_usage(device.key)
        if usage.holders == 0 or device.key in held or (device.shareable
                                                         and not usage.exclusive):
            count += 1
    return count


def _on_node(state: ClusterState, waiter: Waiter, node: str, candidates: Sequence[Resident],
             budgets: Mapping[str, int]) -> Preemption | None:
    def plan() -> PodPlan | None:
        found = plan_pod(state, waiter.pod, list(waiter.claims), nodes=(node,))
        return found if found.node_name is not None else None

    trial = _trial(state, candidates)
    for resident in candidates:
        trial.take_out(objects.uid(resident.pod))
    try:
        placed = plan()
        if placed is None:
            return None
        # Reprieve: the protected first, then the highest priority, then the oldest.
        order = sorted(candidates, key=lambda r: (
            not protected(r, budgets), -r.priority,
            str(objects.meta(r.pod).get("creationTimestamp") or ""), _label(r.pod)))
        by_uid = {objects.uid(r.pod): r for r in order}
        placed, leaving = trial.reprieve(by_uid, plan, placed)
        return Preemption(_label(waiter.pod), objects.uid(waiter.pod), waiter.priority, node,
                          placed, _marked([by_uid[uid] for uid in leaving], budgets))
    finally:
        trial.undo()

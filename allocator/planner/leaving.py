"""Who may be made to leave, and why not: the one home of the rules that preemption, cohort
reclaim and defragmentation follow before they evict a pod. A new rule about who may be
evicted is written here, with its test (tests/allocator/test_leaving.py).

- **Budgets**, for all three: a pod one of whose PodDisruptionBudgets allows no disruption now
  is *protected* (`protected`, `blocked_by_budget`). Defrag never moves it; preemption and
  reclaim take it last and count it against a node, as kube-scheduler does; and the Eviction
  API has the last word for all. A budget allows nothing while the disruption controller has
  not seen its latest spec (`disruptions_allowed`).
- **Shared claims**, for preemption and reclaim: a pod whose claim another pod also uses frees
  nothing by leaving (`shares_a_claim`).
- **Preemption** (`preemptible`): a placed pod holding gateway devices, of strictly lower
  priority than the waiting pod, not from a namespace of the waiting pod's cohort that runs
  within its own guarantee.
- **Reclaim** (`reclaimable`): a placed pod holding gateway devices, of a namespace that
  borrows from the cohort whose guarantee is taken back, whatever its priority.
- **Defragmentation** (`why_fixed`, `movable`): a pod moves only when a controller re-creates it
  elsewhere (ReplicaSet, StatefulSet, Job, or any controller with `dra-gateway.io/defrag:
  allow`), it is not annotated `dra-gateway.io/defrag: never`, neither it nor, after it was
  moved, its controller's replacement was moved within the window, its priority is no higher
  than the pod it makes room for, and its budgets allow it.

`dra-gateway.io/defrag: never` binds defragmentation only, by design: defrag moves pods for
packing, at the gateway's own initiative, so a pod may opt out; preemption acts for a pod of
higher priority, as kube-scheduler does, and kube-scheduler knows no such opt-out. A pod is
kept from preemption the Kubernetes way, by its PriorityClass and its PodDisruptionBudget. The
drain of failed devices (allocator/eviction/drain.py) follows none of these: its pods cannot
run where they are; the Eviction API still applies their budgets.

Pure: plain values in, verdicts out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from dra_gateway.kube import names, objects


@dataclass(frozen=True, slots=True)
class Resident:
    """A placed pod: bound, or planned and assumed, with its allocated claims."""

    pod: Mapping[str, Any]
    claims: tuple[Mapping[str, Any], ...]
    priority: int = 0
    fixed: str | None = None  # why it may not move; None: it may
    budgets: tuple[str, ...] = ()  # the PodDisruptionBudgets that select it


@dataclass(frozen=True, slots=True)
class Waiter:
    """A pod waiting for devices, with its claims (not allocated)."""

    pod: Mapping[str, Any]
    claims: tuple[Mapping[str, Any], ...]
    priority: int = 0



# Controllers that make a new pod when one of theirs is evicted.
RECREATING = frozenset({"ReplicaSet", "StatefulSet", "Job"})


class MovedRecord(Protocol):
    """A pod defrag moved (the `moved.` records of its ConfigMap)."""

    @property
    def pod_uid(self) -> str: ...
    @property
    def owner_uid(self) -> str | None: ...
    @property
    def at(self) -> datetime: ...


def disruptions_allowed(budget: Mapping[str, Any]) -> int:
    """What a PodDisruptionBudget allows now; none while the disruption controller has not
    seen its latest spec (its status may count a budget that no longer holds)."""
    status = objects.status(budget)
    generation = objects.meta(budget).get("generation")
    if generation is not None and status.get("observedGeneration") != generation:
        return 0
    return int(status.get("disruptionsAllowed") or 0)


def blocked_by_budget(resident: Resident, budgets: Mapping[str, int]) -> str | None:
    """Why the pod may not leave now because of its budgets; None when they allow it."""
    for budget in resident.budgets:
        if budgets.get(budget, 0) <= 0:
            return f"its PodDisruptionBudget {budget} allows no disruption now"
    return None


def protected(resident: Resident, budgets: Mapping[str, int]) -> bool:
    """A budget of the pod allows no disruption now."""
    return blocked_by_budget(resident, budgets) is not None


def shares_a_claim(resident: Resident) -> bool:
    """A claim of the pod is reserved for another pod too: evicting it frees nothing."""
    uid = objects.uid(resident.pod)
    return any(objects.reserved_pod_uids(c) - {uid} for c in resident.claims)


def _placed_with_devices(resident: Resident) -> bool:
    return bool(resident.claims) and isinstance(objects.spec(resident.pod).get("nodeName"), str) \
        and bool(objects.spec(resident.pod).get("nodeName")) and not shares_a_claim(resident)


def preemptible(resident: Resident, priority: int, peers: Mapping[str, bool]) -> bool:
    """Whether the pod may be preempted for a pod of `priority`; `peers` maps the namespaces
    of the waiting pod's cohorts to whether they borrow (those within their guarantee keep
    their pods)."""
    return _placed_with_devices(resident) and resident.priority < priority \
        and peers.get(objects.namespace(resident.pod), True)


def reclaimable(resident: Resident, borrowers: set[str]) -> bool:
    """Whether the pod may leave to give back a guarantee its namespace borrowed."""
    return _placed_with_devices(resident) and objects.namespace(resident.pod) in borrowers


def controller_of(pod: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The owner reference that controls the pod, if any."""
    for ref in objects.owner_references(pod or {}):
        if ref.get("controller"):
            return ref
    return None


def why_fixed(pod: Mapping[str, Any], moved: Iterable[MovedRecord], now: datetime,
              window_seconds: float) -> str | None:
    """Why defrag may not move a placed pod; None when it may."""
    word = objects.annotations(pod).get(names.ANNOTATION_DEFRAG, "")
    if word == "never":
        return f"annotated {names.ANNOTATION_DEFRAG}: never"
    owner = controller_of(pod)
    kind = str((owner or {}).get("kind") or "")
    if word != "allow":
        if owner is None:
            return "no controller re-creates it (a bare pod)"
        if kind == "DaemonSet":
            return "a DaemonSet's pod comes back on the same node"
        if kind == "Node":
            return "a static pod"
        if kind not in RECREATING:
            return (f"its controller {kind} {owner.get('name')} is not one dra-gateway knows to "
                    f"re-create it; annotate the pod {names.ANNOTATION_DEFRAG}: allow if it does")
    uid = objects.uid(pod)
    created = objects.parse_time(objects.meta(pod).get("creationTimestamp"))
    owner_uid = str((owner or {}).get("uid") or "") or None
    for record in moved:
        if (now - record.at).total_seconds() > window_seconds:
            continue
        if record.pod_uid == uid:
            return f"moved at {record.at:%H:%M:%S}, within the window"
        if owner_uid and record.owner_uid == owner_uid and created is not None \
                and created >= record.at:
            # Which new pod replaced the one moved cannot be told: none of its controller's
            # pods made since moves again within the window.
            return (f"made by {kind} {(owner or {}).get('name')} after it lost a pod to a move "
                    f"at {record.at:%H:%M:%S}, within the window")
    return None


def movable(resident: Resident, priority: int, budgets: Mapping[str, int]) -> bool:
    """Whether defrag may move the pod to make room for a pod of `priority`."""
    return resident.fixed is None and resident.priority <= priority \
        and not protected(resident, budgets)


__all__ = ["RECREATING", "MovedRecord", "blocked_by_budget", "controller_of",
           "disruptions_allowed", "movable", "preemptible", "protected", "reclaimable",
           "shares_a_claim", "why_fixed"]

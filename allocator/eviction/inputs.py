"""The cluster's objects as the defrag planner's inputs. Pure: objects in, inputs out.

- The planner state is fed as the allocator feeds its own (slices, classes, nodes, live pods,
  claims, the GPU policies), and the holds still in force are assumed, so a plan never hands
  out devices already promised.
- Pods that wait: pods carrying the gateway's scheduling gate, not being deleted, whose claims
  all exist, and not already held for; highest priority first, then the longest waiting.
- Pods placed: bound, live pods on nodes with gateway devices, with their allocated claims,
  why each may not move (planner/leaving.py, the rules of who may leave), and their
  PodDisruptionBudgets, with the disruptions each allows now: the plans spend them, and the
  Eviction API has the last word.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from dra_gateway.allocator.claims import claims_for
from dra_gateway.allocator.eviction.holds import Records
from dra_gateway.allocator.legacypods import LegacyPods
from dra_gateway.allocator.planner import ClusterState, PlannerSettings
from dra_gateway.allocator.planner.leaving import (
    Resident,
    Waiter,
    controller_of,
    disruptions_allowed,
    why_fixed,
)
from dra_gateway.gpu.groups import group_key
from dra_gateway.kube import objects
from dra_gateway.kube.cluster.port import Object
from dra_gateway.kube.nodeselectors import label_selector_matches
from dra_gateway.policy.catalog import Catalog
from dra_gateway.policy.legacyusage import still_counted


@dataclass(slots=True)
class Snapshot:
    """What was read of the cluster, at `now`."""

    now: datetime
    nodes: Sequence[Object] = ()
    slices: Sequence[Object] = ()
    classes: Sequence[Object] = ()
    pods: Sequence[Object] = ()
    claims: Sequence[Object] = ()
    budgets: Sequence[Object] = ()  # PodDisruptionBudgets
    catalog: Catalog | None = None
    records: Records = field(default_factory=Records)
    consumable_capacity: bool = True
    strategy: str = "default"
    # What pods a legacy device plugin serves cost their namespaces' quotas (the allocator's
    # reader, its rules loaded once); None: they are not counted.
    legacy: LegacyPods | None = None


@dataclass(slots=True)
class Inputs:
    state: ClusterState
    waiters: list[Waiter]
    residents: list[Resident]
    budgets: dict[str, int]  # namespace/name -> disruptions allowed now
    waiting_since: dict[str, datetime]  # waiter uid -> when it was created
    pods: dict[str, Object]  # every live pod by uid


def controller_uid(pod: Object | None) -> str | None:
    """The uid of what controls the pod (its ReplicaSet, StatefulSet...), if anything."""
    return str((controller_of(pod) or {}).get("uid") or "") or None


def _budgets_of(pod: Object, budgets: Iterable[Object]) -> tuple[str, ...]:
    ns = objects.namespace(pod)
    labels = objects.labels(pod)
    return tuple("/".join(objects.namespace_name(b)) for b in budgets
                 if objects.namespace(b) == ns
                 and label_selector_matches(objects.spec(b).get("selector"), labels))


def build(snapshot: Snapshot, *, window_seconds: float = 3600.0) -> Inputs:
    state = ClusterState(PlannerSettings(default_strategy=snapshot.strategy,
                                         consumable_capacity=snapshot.consumable_capacity))
    live = {objects.uid(p): p for p in snapshot.pods
            if not objects.is_finished(p) and not objects.is_deleting(p)}
    state.load(catalog=snapshot.catalog, classes=snapshot.classes, nodes=snapshot.nodes,
               slices=snapshot.slices, claims=snapshot.claims, pods=live.values())
    card_memory = state.smallest_card_memory()
    if snapshot.legacy is not None:
        # A pod a legacy plugin serves counts against its namespace's quotas here too, being
        # deleted included until its grace period is over (as the allocator counts it).
        for pod in snapshot.pods:
            if still_counted(pod, snapshot.now):
                state.set_legacy_pod(objects.uid(pod), objects.namespace(pod),
                                     snapshot.legacy.charges(pod, card_memory=card_memory))
    by_name = {objects.namespace_name(c): c for c in snapshot.claims}

    def lookup(namespace: str, name: str) -> Object | None:
        return by_name.get((namespace, name))

    holds = snapshot.records.live_holds(snapshot.now)
    waiters: list[tuple[tuple[Any, ...], Waiter]] = []
    residents: list[Resident] = []
    since: dict[str, datetime] = {}
    budgets = {"/".join(objects.namespace_name(b)): disruptions_allowed(b)
               for b in snapshot.budgets}
    for uid, pod in live.items():
        claims, missing = claims_for(pod, lookup)
        gateway = [c for c in claims if objects.is_gateway_claim(c)]
        if objects.is_gated(pod):
            if objects.other_gates(pod):
                continue  # another queue holds it: nothing moves, nobody is preempted, for it
            if group_key(pod) is not None:
                # A pod group's member fits only with its group (all or nothing): room made
                # for it alone would be room for nothing. Groups are not moved or preempted
                # for yet.
                continue
            hold = holds.get(uid)
            if hold is not None:
                state.assume(pod, hold.plan())  # promised: nobody else plans onto it
                continue
            unallocated = [c for c in gateway if not objects.is_allocated(c)]
            if missing or not unallocated:
                continue
            created = objects.parse_time(objects.meta(pod).get("creationTimestamp")) or snapshot.now
            since[uid] = created
            priority = objects.pod_priority(pod)
            waiters.append(((-priority, created, objects.namespace_name(pod)),
                            Waiter(pod, tuple(unallocated), priority)))
            continue
        node = objects.spec(pod).get("nodeName")
        if not node or node not in state.node_devices:
            continue
        residents.append(Resident(
            pod, tuple(c for c in gateway if objects.is_allocated(c)), objects.pod_priority(pod),
            why_fixed(pod, snapshot.records.moved, snapshot.now, window_seconds),
            _budgets_of(pod, snapshot.budgets)))
    waiters.sort(key=lambda entry: entry[0])
    return Inputs(state, [w for _, w in waiters], residents, budgets, since, live)


__all__ = ["Inputs", "Snapshot", "build", "controller_uid"]

"""The planner state as the allocator controller keeps it, and one plan at a time in a thread.

The controller's informer handlers change the planner's `ClusterState` on the event loop,
through the methods named for what the mirrors saw (`set_slice`, `remove_pod`...), and a change
of the API's feature mode replaces it with one filled from the mirrors' contents (`rebuild`,
`MirrorContents`); a plan runs in a worker thread (`plan`), one at a time, so that the loop
keeps renewing the Lease and serving watches however long it takes. While it runs, the loop's
changes are held and applied in order when it returns: the plan sees the state as it was when
it started, as when it ran on the loop (a rebuilt state is filled at once, the running plan
keeping the one it started with). Each plan may spend at most `plan_cost_budget` on CEL selectors
(kube.cel.cost_budget): a pod whose selectors cost more is not placed, with that reason. The
plans whose writes are in flight (from `writing` to `written`) hold their node and devices in
the state (assumed) so that concurrent workers never hand out the same share; a pod placed but
not yet bound holds its CPU and memory (`refresh_placement`). Devices a defrag plan freed for a
pod (`set_holds`, from the `dra-gateway-defrag` ConfigMap) are held in the state for that pod:
no other pod is planned onto them, and that pod is planned on the held node first.

This module must not make placement decisions (the planner does), read the API or write to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_gateway.allocator.claims import ClaimLookup
from dra_gateway.allocator.eviction.holds import Hold
from dra_gateway.allocator.planner import ClusterState, PlannerSettings, PodPlan, plan_pod
from dra_gateway.allocator.planner.groups import GroupPlan, Member, group_model, plan_group
from dra_gateway.allocator.settings import ControllerSettings
from dra_gateway.kube import cel, objects
from dra_gateway.kube.cluster.port import Object
from dra_gateway.kube.objects import is_allocated, is_finished, is_gateway_claim
from dra_gateway.policy.amounts import DeviceCharge
from dra_gateway.policy.catalog import Catalog

_NO_PLAN = PodPlan(node_name=None, allocations={}, annotations={}, reason=None)


@dataclass(frozen=True)
class MirrorContents:
    """What the mirrors hold, for `Planning.rebuild` to fill a fresh planner state with (each
    read once, in the order of the fields)."""

    catalog: Catalog | None  # the policies; None while their mirrors have not synced
    classes: Iterable[Object]  # DeviceClasses
    nodes: Iterable[Object]
    slices: Iterable[Object]  # ResourceSlices
    claims: Iterable[Object]  # ResourceClaims
    pods: Iterable[Object]  # live pods


class Planning:
    def __init__(self, settings: ControllerSettings, *, claims: ClaimLookup,
                 consumable_capacity: bool) -> None:
        self.settings = settings
        self.claims = claims  # the claims' mirror: where a placed pod's claims put it
        self.state = self._new_state(consumable_capacity)
        self._writing: dict[str, PodPlan] = {}  # pod uid -> plan being written
        self._planning = asyncio.Lock()  # one plan at a time, as when plans ran on the loop
        # Changes to the planner state made while a plan runs in its thread, in order.
        self._held_changes: list[Callable[[], None]] | None = None
        # Defrag holds in the state (pod uid -> hold), and pods whose hold has served (used,
        # placed or gone), kept while the records still name it, so it is not taken again.
        self.holds: dict[str, Hold] = {}
        self._used_holds: set[str] = set()

    def _new_state(self, consumable_capacity: bool) -> ClusterState:
        """An empty planner state under the controller's settings and the API's feature mode."""
        return ClusterState(PlannerSettings(default_strategy=self.settings.strategy,
                                            group_domains=self.settings.group_domains,
                                            consumable_capacity=consumable_capacity))

    def rebuild(self, consumable_capacity: bool, mirrors: MirrorContents, *,
                legacy_charges: Callable[[Object], Sequence[DeviceCharge]],
                pod_of: Callable[[str], Object | None]) -> None:
        """A fresh planner state (the API's feature mode changed) filled from what the mirrors
        hold, at once: a plan running in its thread keeps the state it started with. Each pod
        is charged `legacy_charges(pod)` (read once the slices are in), counted where it is
        placed but not yet bound (`refresh_placement`, after the running plan if any), and the
        plans still being written hold their room again (`pod_of`: a pod by uid, None when the
        mirror no longer has it)."""
        self.state = state = self._new_state(consumable_capacity)
        state.load(catalog=mirrors.catalog, classes=mirrors.classes, nodes=mirrors.nodes,
                   slices=mirrors.slices, claims=mirrors.claims, pods=mirrors.pods)
        for obj in mirrors.pods:
            state.set_legacy_pod(objects.uid(obj), objects.namespace(obj), legacy_charges(obj))
            # Placed-but-unbound pods, and plans still being written, hold capacity too.
            self.refresh_placement(obj)
        self._assume_writing(pod_of)

    async def plan(self, pod: Object, gateway: list[Object], *,
                   nodes: Sequence[str] | None = None) -> PodPlan:
        """plan_pod in a worker thread on the live state, the loop's changes held meanwhile
        (`nodes`: the only nodes it may use, as a pod group's required domain leaves them).

        The thread cannot be interrupted; if the term ends while it runs, the changes stay held
        (this controller is being thrown away) and the thread finishes on its own.
        """
        async with self._planning:
            self._held_changes = []
            state, strategy = self.state, self.settings.strategy
            budget = self.settings.plan_cost_budget
            uid = objects.uid(pod)
            hold = self.holds.get(uid)

            def planned() -> PodPlan:
                try:
                    with cel.cost_budget(budget):
                        if hold is None:
                            return plan_pod(state, pod, gateway, strategy=strategy,
                                            nodes=nodes)
                        # Its own hold is no obstacle: the held node first, then anywhere; if
                        # neither (the moved pods have not left yet), the hold stays.
                        state.forget(pod, hold.plan())
                        plan = plan_pod(state, pod, gateway, strategy=strategy,
                                        nodes=(hold.node,))
                        if plan.node_name is None:
                            plan = plan_pod(state, pod, gateway, strategy=strategy)
                        if plan.node_name is None:
                            state.assume(pod, hold.plan())
                        return plan
                except cel.CostBudgetExceeded as exc:
                    if hold is not None:
                        state.assume(pod, hold.plan())
                    return PodPlan(node_name=None, allocations={}, annotations={},
                                   reason=f"{exc}; simplify the claim's selectors")

            plan = await asyncio.to_thread(planned)
            if hold is not None and plan.node_name is not None:
                del self.holds[uid]  # used: the plan's own assumption replaces it
                self._used_holds.add(uid)
            held, self._held_changes = self._held_changes, None
            for change in held:
                change()
        return plan

    async def plan_group(self, members: Sequence[Member], *, same_model: bool = False,
                         placed: Sequence[Object] = (), domain: str | None = None) -> GroupPlan:
        """plan_group in a worker thread on the live state, as `plan` runs plan_pod: the
        members' plans, none of them assumed (the caller assumes them all, or none). With
        `same_model`, on the model of the `placed` members' claims, if any."""
        async with self._planning:
            self._held_changes = []
            state, strategy = self.state, self.settings.strategy
            budget = self.settings.plan_cost_budget

            def planned() -> GroupPlan:
                try:
                    with cel.cost_budget(budget):
                        model = group_model(state, placed) if same_model else None
                        return plan_group(state, members, strategy=strategy,
                                          same_model=same_model, model=model, domain=domain)
                except cel.CostBudgetExceeded as exc:
                    return GroupPlan((), 0, f"{exc}; simplify the claims' selectors")

            try:
                return await asyncio.to_thread(planned)
            finally:
                held, self._held_changes = self._held_changes, None
                for change in held:
                    change()

    def set_holds(self, holds: Mapping[str, Hold],
                  pod_of: Callable[[str, Hold], Object | None]) -> list[str]:
        """Hold in the state the devices of the holds in force (pod uid -> hold) and let go of
        the others; a hold its pod has used, whose pod is no longer gated, or whose pod was
        seen gone, is not taken again. Returns the uids of the pods newly held for (to plan
        them again)."""
        added: list[str] = []
        for uid, old in list(self.holds.items()):
            if holds.get(uid) != old:
                del self.holds[uid]
                self._change(self.state.forget, pod_of(uid, old) or _stub(uid, old), old.plan())
        for uid, hold in holds.items():
            if uid in self.holds or uid in self._used_holds:
                continue
            pod = pod_of(uid, hold)
            if pod is not None and not objects.is_gated(pod):
                continue
            self.holds[uid] = hold
            self._change(self.state.assume, pod or _stub(uid, hold), hold.plan())
            added.append(uid)
        self._used_holds &= set(holds)
        return added

    def drop_hold(self, pod: Object) -> None:
        """The pod is gone or placed: its hold, if any, frees its devices, for good (the
        records keep it until it expires or its writer drops it; a gone pod's hold would
        otherwise be taken again at every look at them, its pod being unknown then)."""
        uid = objects.uid(pod)
        hold = self.holds.pop(uid, None)
        if hold is not None:
            self._used_holds.add(uid)
            self._change(self.state.forget, pod, hold.plan())

    # The plans being written ---------------------------------------------------------------

    def writing(self, pod: Object, plan: PodPlan) -> None:
        """The plan's writes start: it holds its node and devices in the state (assumed), and
        its claims are busy for the other pods' plans (`busy_claims`), until `written`."""
        self._change(self.state.assume, pod, plan)
        self._writing[objects.uid(pod)] = plan

    def written(self, pod: Object, plan: PodPlan) -> None:
        """The plan's writes are over, landed or not: its assumption gives way to what the
        claims' mirror shows."""
        del self._writing[objects.uid(pod)]
        self._change(self.state.forget, pod, plan)

    def _assume_writing(self, pod_of: Callable[[str], Object | None]) -> None:
        """A rebuilt state: the plans still being written hold their room in it again
        (`pod_of`: a pod by uid, None when the mirror no longer has it)."""
        for uid, plan in self._writing.items():
            pod = pod_of(uid)
            if pod is not None:
                self.state.assume(pod, plan)

    # What the mirrors saw, applied now or after the running plan ---------------------------

    def set_policies(self, catalog: Catalog) -> None:
        self._change(self.state.set_policies, catalog)

    def set_slice(self, obj: Object) -> None:
        self._change(self.state.set_slice, obj)

    def remove_slice(self, name: str) -> None:
        self._change(self.state.remove_slice, name)

    def set_device_class(self, obj: Object) -> None:
        self._change(self.state.set_device_class, obj)

    def remove_device_class(self, name: str) -> None:
        self._change(self.state.remove_device_class, name)

    def set_node(self, obj: Object) -> None:
        self._change(self.state.set_node, obj)

    def remove_node(self, name: str) -> None:
        self._change(self.state.remove_node, name)

    def set_pod(self, obj: Object) -> None:
        self._change(self.state.set_pod, obj)

    def remove_pod(self, uid: str) -> None:
        self._change(self.state.remove_pod, uid)

    def set_legacy_pod(self, uid: str, namespace: str,
                       charges: Sequence[DeviceCharge]) -> None:
        self._change(self.state.set_legacy_pod, uid, namespace, charges)

    def set_claim(self, obj: Object) -> None:
        self._change(self.state.set_claim, obj)

    def remove_claim(self, uid: str) -> None:
        self._change(self.state.remove_claim, uid)

    def _change(self, method: Callable[..., None], *args: Any) -> None:
        """Apply a change to the planner state now, or after the plan running in its thread."""
        if self._held_changes is None:
            method(*args)
        else:
            self._held_changes.append(lambda: method(*args))

    def charges_legacy(self, pod_uid: str) -> bool:
        """Whether the state charges the pod devices a legacy device plugin serves (as applied
        so far: a change held while a plan runs is not in it yet)."""
        return pod_uid in self.state.ledger.legacy

    def busy_claims(self, pod_uid: str) -> set[str]:
        """Uids of the claims that plans of other pods than this one are writing."""
        return {uid for other, plan in self._writing.items() if other != pod_uid
                for uid in plan.allocations}

    def refresh_placement(self, pod: Object) -> None:
        """Count the CPU and memory of a pod that is placed but not yet bound.

        The planner counts bound pods itself; between our allocation and the scheduler's
        binding the pod's node is known only from its claims' node selectors (or from the plan
        being written). Derived from the API each time, so a new leader counts it too.
        """
        self._change(self.state.forget, pod, _NO_PLAN)  # drops only an assumed pod record
        hold = self.holds.get(objects.uid(pod))
        if hold is not None:
            # A pod held for keeps its CPU and memory on the held node too.
            self._change(self.state.assume, pod, hold.plan())
            return
        spec = pod.get("spec") or {}
        if spec.get("nodeName") or is_finished(pod):
            return
        writing = self._writing.get(objects.uid(pod))
        node = writing.node_name if writing is not None else self._placed_on(pod)
        if node:
            self._change(self.state.assume, pod, PodPlan(node_name=node, allocations={},
                                                        annotations={}, reason=None))

    def _placed_on(self, pod: Object) -> str | None:
        ns = objects.namespace(pod)
        for claim_name in sorted(objects.claim_names_of(pod)):
            claim = self.claims(ns, claim_name)
            if claim is None or not is_allocated(claim) or not is_gateway_claim(claim):
                continue
            node = objects.allocation_node(claim["status"]["allocation"])
            if node:
                return node
        return None


def _stub(uid: str, hold: Hold) -> Object:
    """The pod a hold is for, before the pods' mirror has it: its uid and namespace."""
    return {"metadata": {"uid": uid, "namespace": hold.pod.partition("/")[0],
                         "name": hold.pod.partition("/")[2]}}


__all__ = ["MirrorContents", "Planning"]

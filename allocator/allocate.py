"""The allocator controller's work on one gated pod: plan its claims, write them, remove the gate.

A pod carrying the gateway's scheduling gate waits until every claim it names exists; its
unallocated gateway-class claims are then planned jointly (`Planning.plan`), each gets the
allocator's finalizer (and, in the fallback world, the planner's share annotations) before its
`status.allocation` is written through the `/status` subresource (`writes.write_allocation`);
only when every gateway claim of the pod is allocated is the gate removed, with a JSON patch
that tests the gate's index and the pod's uid. A plan holds its room in the state while its
writes are in flight (`Planning.writing`, then `written`), and the writes are applied to the
claims' mirror as soon as they succeed (`mirrorwrites`).

A pod that does not fit is left gated and says why: a Warning Event, the pending-pods metric,
and the pod condition when a GPUQuota holds it back (`conditions.py`); a partial allocation
that pins it to a node where the rest no longer fits is released so that all of its claims are
planned together. `unplaceable.py` decides when it is planned again.

This is `ClaimReleaser`'s counterpart for pods (a worker's sync of a `PodKey`); it must not make
placement decisions (the planner does) nor talk to Kubernetes other than through the cluster
port.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from dra_gateway.allocator.claims import claims_for
from dra_gateway.allocator.conditions import (
    GATES_CONDITION,
    GATES_REMOVED,
    OTHER_GATES,
    PLACED,
    pod_condition,
    set_pod_condition,
)
from dra_gateway.allocator.events import EventRecorder
from dra_gateway.allocator.groups import (
    GROUP_CONDITION,
    GROUP_DOES_NOT_FIT,
    GROUP_INCOMPLETE,
    GROUP_INVALID,
    GROUP_PLACED,
    Members,
    Ready,
    chosen,
    incomplete_message,
    invalid_message,
    members_of,
    no_fit_message,
)
from dra_gateway.allocator.metrics import Metrics, PendingPods, Stats
from dra_gateway.allocator.mirrorwrites import observe_write, observe_writes
from dra_gateway.allocator.planner import PodPlan
from dra_gateway.allocator.planner.groups import domain_nodes, group_model, narrow_to_model
from dra_gateway.allocator.planning import Planning
from dra_gateway.allocator.release import ClaimReleaser
from dra_gateway.allocator.unplaceable import Unplaceable
from dra_gateway.allocator.work import (
    MAX_WRITE_ATTEMPTS,
    Fence,
    PodKey,
    SyncResult,
    Write,
    unfenced,
)
from dra_gateway.allocator.writes import (
    Replan,
    gate_index,
    remove_gate,
    still_allocated,
    write_allocation,
)
from dra_gateway.gpu.groups import GroupError, PodGroup, PodGroupLookup, group_of
from dra_gateway.kube import objects
from dra_gateway.kube.cluster.port import Cluster, Conflict, Invalid, NotFound, Object
from dra_gateway.kube.objects import (
    controller_owner_uid,
    has_finalizer,
    is_allocated,
    is_gated,
    is_gateway_claim,
    reserved_only_for,
)
from dra_gateway.kube.resources import PODS
from dra_gateway.kube.runtime.informer import Informer

log = logging.getLogger(__name__)


class PodAllocator:
    def __init__(self, cluster: Cluster, *, pods: Informer, claims: Informer,
                 planning: Planning, unplaceable: Unplaceable, pending: PendingPods,
                 events: EventRecorder, releaser: ClaimReleaser, stats: Stats, metrics: Metrics,
                 fence: Fence = unfenced, podgroups: PodGroupLookup | None = None) -> None:
        self.cluster = cluster
        self.pods = pods
        self.claims = claims
        self.planning = planning
        self.unplaceable = unplaceable
        self.pending = pending
        self.events = events
        self.releaser = releaser  # lets go of a partial allocation to plan the pod again
        self.stats = stats
        self.metrics = metrics
        self.fence = fence  # called before each write: a former leader must not allocate
        self.podgroups = podgroups  # the objects sizing pod groups (gpu.groups.PodGroupLookup)
        # One placement of a pod group at a time (group key -> lock), so that two members'
        # syncs never plan the same group twice.
        self._group_locks: dict[tuple[str, str, str], tuple[asyncio.Lock, int]] = {}

    async def sync_pod(self, key: PodKey) -> SyncResult:
        pod = self.pods.get(key.namespace, key.name)
        if pod is None or objects.uid(pod) != key.uid or not is_gated(pod) or objects.is_deleting(
                pod):
            self.unplaceable.discard(key)
            return "done"
        others = objects.other_gates(pod)
        if others:
            # Another admission system (Kueue, KAI...) still holds the pod: its devices are
            # allocated once the gateway's gate is the last one, so queued work holds none.
            self.unplaceable.discard(key)
            await set_pod_condition(
                self.cluster, pod, held=True, reason=OTHER_GATES, kind=GATES_CONDITION,
                message=f"waiting for the scheduling gate(s) {', '.join(others)} to be "
                        f"removed: the gateway allocates this pod's devices once its own gate "
                        f"is the last one left")
            return "done"
        await set_pod_condition(self.cluster, pod, held=False, reason=GATES_REMOVED,
                                  kind=GATES_CONDITION,
                                  message="no other scheduling gate holds the pod")
        claims, waiting = claims_for(pod, self.claims.get)
        if waiting:
            # The claim controller has not created them yet: their arrival requeues the pod.
            log.debug("waiting for claims", extra={"pod": str(key), "waitingFor": waiting})
            return "wait"
        gateway = [c for c in claims if is_gateway_claim(c)]
        pending = [c for c in gateway if not is_allocated(c)]
        # Claims this sync allocated: uid -> the resourceVersion the API answered the write
        # with, which is as good as reading the claim back before the gate goes.
        written: dict[str, str] = {}
        group = group_of(pod, self.podgroups) if pending else None
        if isinstance(group, GroupError):
            self.unplaceable.discard(key)
            await set_pod_condition(self.cluster, pod, held=True, reason=GROUP_INVALID,
                                      kind=GROUP_CONDITION, message=invalid_message(group))
            return "done"  # its annotations' change requeues it
        if pending:
            try:
                if group is not None:
                    grouped = await self._allocate_group(key, pod, group, written)
                    if isinstance(grouped, Members):  # the group is whole: placed as it comes
                        narrowed, nodes = self._as_its_group(grouped, gateway)
                        outcome = await self._allocate(key, pod, narrowed, pending, written,
                                                       nodes=nodes)
                    else:
                        outcome = grouped
                else:
                    outcome = await self._allocate(key, pod, gateway, pending, written)
            except Replan as why:
                log.info("planning again", extra={"pod": str(key), "why": str(why)})
                return "retry"
            if outcome != "done":
                return outcome
        return await self._ungate(key, written)

    async def _allocate(self, key: PodKey, pod: Object, gateway: list[Object],
                        pending: list[Object], written: dict[str, str], *,
                        nodes: Sequence[str] | None = None) -> SyncResult:
        # A claim shared with another pod whose plan is being written: planning it again
        # would replace that plan's reservation in the state and free its device for others.
        # Its write lands (or fails) soon, and the claim's change requeues this pod.
        busy = self.planning.busy_claims(key.uid)
        if any(objects.uid(c) in busy for c in pending):
            log.debug("a claim of the pod is being allocated for another pod",
                      extra={"pod": str(key)})
            return "retry"
        started = time.perf_counter()
        self.stats.plans += 1  # counted as it starts: it runs in a thread, others meanwhile
        self.unplaceable.planning(key)  # events meanwhile count from the plan's outcome
        try:
            plan = await self.planning.plan(pod, gateway, nodes=nodes)
        except BaseException:
            self.unplaceable.settle(key)
            raise
        self.metrics.plan_seconds.observe(time.perf_counter() - started)
        if plan.node_name is None:
            return await self._not_placed(key, pod, gateway, plan.reason, plan.quota_reason)
        self.unplaceable.discard(key)
        self.pending.drop(key.uid)
        missing = [c for c in pending if objects.uid(c) not in plan.allocations]
        if missing:
            names_missing = ", ".join(objects.name(c) for c in missing)
            raise RuntimeError(f"the planner placed pod {key} on {plan.node_name} without "
                               f"allocating claims {names_missing}")
        self.planning.writing(pod, plan)
        await self._write(pod, pending, plan, written)
        return "done"

    async def _write(self, pod: Object, pending: list[Object], plan: PodPlan,
                     written: dict[str, str]) -> None:
        """Write a plan being written (`Planning.writing`): each claim's allocation, then the
        assumption gives way to what was written."""
        key = PodKey(objects.namespace(pod), objects.name(pod), objects.uid(pod))
        writes: list[Write] = []
        try:
            for claim in sorted(pending, key=lambda c: objects.name(c)):
                uid = objects.uid(claim)
                await write_allocation(self.cluster, claim, allocation=plan.allocations[uid],
                                       annotations=plan.annotations.get(uid) or {}, pod=pod,
                                       writes=writes, stats=self.stats, metrics=self.metrics,
                                       fence=self.fence)
        finally:
            # No await between these: the assumption becomes the written truth atomically.
            self.planning.written(pod, plan)
            observe_writes(self.claims, writes)
            written.update((objects.uid(c), objects.resource_version(c))
                           for _, c in writes if is_allocated(c))
            live = self.pods.get(key.namespace, key.name)
            if live is not None and objects.uid(live) == key.uid:
                self.planning.refresh_placement(live)
        log.info("allocated", extra={"pod": str(key), "node": plan.node_name,
                                     "claims": [objects.name(c) for c in pending]})
        if plan.charges:
            # Later pods of the namespace may have waited behind this one for its quota.
            self.unplaceable.capacity_changed()
        await self._clear_quota_condition(pod, f"placed on {plan.node_name} within its "
                                          "GPUQuotas")

    async def _allocate_group(self, key: PodKey, pod: Object, group: PodGroup,
                              written: dict[str, str]) -> SyncResult | Members:
        """All or nothing (allocator/groups.py): plan the members the group still needs
        together and write them all, or none; its members when the group is whole already."""
        lock, users = self._group_locks.get(group.key, (asyncio.Lock(), 0))
        self._group_locks[group.key] = (lock, users + 1)
        try:
            async with lock:
                return await self._place_group(key, pod, group, written)
        finally:
            lock, users = self._group_locks[group.key]
            if users > 1:
                self._group_locks[group.key] = (lock, users - 1)
            else:
                del self._group_locks[group.key]  # nobody else waits for it

    async def _place_group(self, key: PodKey, pod: Object, group: PodGroup,
                           written: dict[str, str]) -> SyncResult | Members:
        members = members_of(group, self.pods.by_index, self.claims.get)
        if not any(objects.uid(r.pod) == key.uid for r in members.ready):
            # Changed while it waited for the lock (another member's sync placed it with the
            # group, say): look again from the start, never with the claims read before.
            return "retry"
        if members.needed == 0:
            return members
        if len(members.ready) < members.needed:
            self.unplaceable.discard(key)
            message = incomplete_message(members)
            await self._say_group(members.ready, held=True, reason=GROUP_INCOMPLETE,
                                  message=message)
            await self.events.record_failure(pod, message, reason=GROUP_INCOMPLETE)
            return "wait"  # a member's arrival plans the group, this one included
        together = chosen(members, key.uid)
        busy = self.planning.busy_claims(key.uid)
        if any(objects.uid(c) in busy for r in together for c in r.pending):
            return "retry"
        started = time.perf_counter()
        self.stats.plans += 1
        self.unplaceable.planning(key)
        try:
            planned = await self.planning.plan_group(
                [(r.pod, r.gateway) for r in together], same_model=group.same_model,
                placed=members.placed_claims, domain=group.domain)
        except BaseException:
            self.unplaceable.settle(key)
            raise
        self.metrics.plan_seconds.observe(time.perf_counter() - started)
        if not planned.placed:
            message = no_fit_message(group, planned.fitted, len(together), planned.reason)
            self.stats.failures += 1
            self.metrics.allocation_failures.inc()
            self.unplaceable.failed(key)
            self.pending.set(key.uid, planned.quota_reason or "Unschedulable")
            self.metrics.group_plans.labels(group.source, "does-not-fit").inc()
            await self._say_group(together, held=True, reason=GROUP_DOES_NOT_FIT,
                                  message=message)
            await self.events.record_failure(pod, message, reason=GROUP_DOES_NOT_FIT)
            return "retry"
        self.unplaceable.discard(key)
        # Every member's plan assumed before the first write: no other plan takes their room.
        for ready, plan in zip(together, planned.plans, strict=True):
            self.pending.drop(objects.uid(ready.pod))
            self.planning.writing(ready.pod, plan)
        log.info("placing a pod group together", extra={
            "group": group.label, "source": group.source, "members": [
                objects.name(r.pod) for r in together]})
        for index, (ready, plan) in enumerate(zip(together, planned.plans, strict=True)):
            try:
                await self._write(ready.pod, ready.pending, plan,
                                  written if objects.uid(ready.pod) == key.uid else {})
            except BaseException:
                for rest, rest_plan in list(zip(together, planned.plans, strict=True))[
                        index + 1:]:
                    self.planning.written(rest.pod, rest_plan)
                raise
        self.metrics.group_plans.labels(group.source, "placed").inc()
        await self._say_group(together, held=False, reason=GROUP_PLACED,
                              message=f"pod group {group.label} ({group.why}): its "
                                      f"{group.size} members hold their devices together")
        # Members past the size, waiting meanwhile, are placed as they come from now on.
        planned_uids = {objects.uid(r.pod) for r in together}
        for ready in members.ready:
            if objects.uid(ready.pod) not in planned_uids:
                self.unplaceable.wake(PodKey(*objects.namespace_name(ready.pod),
                                             objects.uid(ready.pod)))
        return "done"

    def _as_its_group(self, members: Members,
                      gateway: list[Object]) -> tuple[list[Object], list[str] | None]:
        """A member past the group's size, to plan as its group's placed members are: on
        their model (its claims narrowed to it, for the planner only) and, with a required
        domain, on the nodes of their domain."""
        group = members.group
        state = self.planning.state
        model = group_model(state, members.placed_claims) if group.same_model else None
        narrowed = gateway if model is None else [narrow_to_model(c, model) for c in gateway]
        nodes = domain_nodes(state, members.placed_claims, group.domain) if group.domain \
            else None
        return narrowed, nodes

    async def _say_group(self, members: Sequence[Ready], *, held: bool, reason: str,
                         message: str) -> None:
        for ready in members:
            await set_pod_condition(self.cluster, ready.pod, held=held, reason=reason,
                                      kind=GROUP_CONDITION, message=message)

    async def _not_placed(self, key: PodKey, pod: Object, gateway: list[Object],
                          why: str | None, quota_reason: str | None) -> SyncResult:
        """The plan found no node: let go of a partial allocation, or say why the pod waits."""
        self.stats.failures += 1
        self.metrics.allocation_failures.inc()
        # The worker requeues it after its backoff; events may bring that forward to the
        # retry interval, no further.
        self.unplaceable.failed(key)
        reason = why or "no node can hold every claim of the pod"
        # The pod is gated, so no scheduler binds it: its own reservation (written with the
        # allocation) does not keep a claim, another consumer's does.
        held = [c for c in gateway
                if is_allocated(c) and has_finalizer(c) and controller_owner_uid(c) == key.uid
                and reserved_only_for(c, key.uid)]
        if held:
            # Part of the pod was allocated earlier (a crash or a conflict between two
            # claims' writes) and now pins the rest to a node where it no longer fits.
            # Nothing uses those claims while the pod is gated: let go and plan them all
            # together.
            log.info("releasing a partial allocation to plan the pod's claims together",
                     extra={"pod": str(key), "reason": reason,
                            "claims": [objects.name(c) for c in held]})
            for claim in held:
                await self.releaser.release(claim, replanning=key.uid)
            return "retry"
        log.info("pod cannot be placed", extra={"pod": str(key), "reason": reason})
        if quota_reason is not None:
            # Held back by a GPUQuota: the pod says so (condition) and so does an Event.
            self.pending.set(key.uid, quota_reason)
            await set_pod_condition(self.cluster, pod, held=True,
                                      reason=quota_reason, message=reason)
            await self.events.record_failure(pod, reason, reason=quota_reason)
            return "retry"
        self.pending.set(key.uid, "Unschedulable")
        await self._clear_quota_condition(pod, "within its GPUQuotas, waiting for room: "
                                          f"{reason}")
        await self.events.record_failure(pod, reason)
        return "retry"

    async def _clear_quota_condition(self, pod: Object, message: str) -> None:
        condition = pod_condition(pod)
        if condition is not None and condition.get("status") == "True":
            await set_pod_condition(self.cluster, pod, held=False, reason=PLACED,
                                      message=message)

    async def _ungate(self, key: PodKey, written: dict[str, str]) -> SyncResult:
        pod = self.pods.get(key.namespace, key.name)
        for _attempt in range(MAX_WRITE_ATTEMPTS):
            if pod is None or objects.uid(pod) != key.uid:
                return "done"
            claims, waiting = claims_for(pod, self.claims.get)
            gateway = [c for c in claims if is_gateway_claim(c)]
            if waiting or any(not is_allocated(c) for c in gateway):
                return "retry"  # something changed since planning: go round again
            index = gate_index(pod)
            if index is None:
                return "done"
            # The gate cannot be put back: confirm with the API, not the mirror, that every
            # allocation is still there (a claim may have been wiped a moment ago). A claim
            # this sync wrote, unchanged since in the mirror, was confirmed by the write's
            # answer: reading it again would cost the pod a round trip and tell nothing more.
            unconfirmed = [c for c in gateway
                           if written.get(objects.uid(c)) != objects.resource_version(c)]
            if unconfirmed and not await still_allocated(self.cluster, unconfirmed):
                return "retry"
            try:
                ungated = await remove_gate(self.cluster, key, pod, index, fence=self.fence)
            except NotFound:
                return "done"
            except (Conflict, Invalid):
                # The gate list moved (another gate removed) or the pod was replaced: reread.
                self.stats.conflicts += 1
                try:
                    pod = await self.cluster.get(PODS, key.name, namespace=key.namespace)
                except NotFound:
                    return "done"
                continue
            # The mirror shows the pod ungated now, not when its watch event comes: the
            # syncs our claim writes queued meanwhile end there instead of removing the gate
            # again (a read of every claim and a patch the API refuses).
            observe_write(self.pods, objects.resource_version(pod), ungated)
            self.metrics.pods_allocated.inc()
            self.unplaceable.discard(key)
            self.pending.drop(key.uid)
            log.info("scheduling gate removed", extra={
                "pod": str(key), "claims": [objects.name(c) for c in gateway]})
            return "done"
        raise Conflict(f"pod {key} kept changing while its scheduling gate was being removed")


__all__ = ["PodAllocator"]

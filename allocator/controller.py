"""The allocator controller: gated pods in, claim allocations and ungated pods out.

It mirrors ResourceClaims, ResourceSlices, DeviceClasses, Nodes and live Pods with informers,
feeds them into the planner's `ClusterState`, and works through a queue of pods and claims:

- a pod carrying the gateway's scheduling gate waits until every claim it names exists;
  its unallocated gateway-class claims are then planned jointly (`plan_pod`), each gets the
  allocator's finalizer (and, in the fallback world, the planner's share annotations) before
  its `status.allocation` is written through the `/status` subresource; only when every
  gateway claim of the pod is allocated is the gate removed, with a JSON patch that tests the
  gate's index and the pod's uid;
- a claim carrying the finalizer is handed to `release.ClaimReleaser` once a pod that owned
  or used it is gone or finished (`index.ClaimIndex` knows which pods those are).

Every write is optimistic (resourceVersion) and a conflict rereads and retries: an allocation
found already set is accepted as it is, since the API allows it only to be cleared. Every write
of an allocation, a gate removal or a release first calls the `fence` (the leader elector's
`check_leading`): a replica that stalled past its renew deadline writes nothing.

Planning runs in a worker thread (`_plan`), one plan at a time, so that the event loop keeps
renewing the Lease and serving watches however long a plan takes; while it runs, the loop's
changes to the planner state are held (`_change`) and applied in order when it returns, so the
plan sees the state as it was when it started, as when it ran on the loop. Each plan may spend
at most `plan_cost_budget` on CEL selectors (kube.cel.cost_budget): a pod whose selectors cost
more is not placed, with that reason, and the others are planned meanwhile. A plan is
`assume`d in the state while its writes are in flight so that concurrent workers never hand
out the same share, and the writes are applied to the local mirror as soon as they succeed.
Nothing is kept anywhere but in the API: a new leader rebuilds everything from a list.
Around it: `process.py` (flags, signals, leadership terms), `settings.py`, `work.py` (keys,
outcomes), `index.py` (which pods use which claims), `claims.py` (a pod's claims from the
mirror), `writes.py` (a claim's allocation, the gate's removal), `release.py`, `unplaceable.py`
(when a pod that did not fit is planned again), `events.py` (Warning Events), `policies.py`
(GPUQuota status; the policies reach the planner through kube/runtime's `PolicyMirror`) and
`conditions.py` (the pod condition of a pod a quota holds back).

What stays in this class (informer handlers, workers, the API's feature mode, and the pod's
plan-write-ungate path) all reads and changes the same mirrors, planner state and in-flight
plans, atomically between two awaits; split further, each part would take the whole controller
as a parameter.

This module must not make placement decisions (the planner does) nor talk to Kubernetes other
than through the cluster port.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from dra_gateway.allocator.claims import claims_for
from dra_gateway.allocator.conditions import PLACED, quota_condition, set_quota_condition
from dra_gateway.allocator.events import COMPONENT, EventRecorder
from dra_gateway.allocator.index import ClaimIndex
from dra_gateway.allocator.metrics import Metrics, PendingPods, Stats
from dra_gateway.allocator.planner import ClusterState, PlannerSettings, PodPlan, plan_pod
from dra_gateway.allocator.quotastatus import QuotaStatusWriter
from dra_gateway.allocator.release import ClaimReleaser
from dra_gateway.allocator.settings import ControllerSettings
from dra_gateway.allocator.unplaceable import Unplaceable
from dra_gateway.allocator.work import (
    MAX_WRITE_ATTEMPTS,
    ClaimKey,
    Fence,
    Outcome,
    PodKey,
    WorkKey,
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
from dra_gateway.kube import cel, names, objects
from dra_gateway.kube.cluster.features import (
    detect_consumable_capacity,
    slices_show_consumable_capacity,
)
from dra_gateway.kube.cluster.port import (
    ApiError,
    Cluster,
    Conflict,
    Invalid,
    NotFound,
    Object,
)
from dra_gateway.kube.objects import (
    controller_owner_uid,
    has_finalizer,
    is_allocated,
    is_finished,
    is_gated,
    is_gateway_claim,
)
from dra_gateway.kube.resources import (
    DEVICE_CLASSES,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from dra_gateway.kube.runtime.informer import Change, Informer
from dra_gateway.kube.runtime.leader import LeadershipLost
from dra_gateway.kube.runtime.policymirror import PolicyMirror
from dra_gateway.kube.runtime.workqueue import WorkQueue
from dra_gateway.policy.keeper import CatalogKeeper

log = logging.getLogger(__name__)

# Pods that still exist and may still run: finished pods drop out of the watch (DELETED).
LIVE_PODS_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"


_NO_PLAN = PodPlan(node_name=None, allocations={}, annotations={}, reason=None)


def _node_fit(node: Object) -> tuple[Any, ...]:
    """What placement may read of a Node: labels, spec (taints, unschedulable), resources."""
    status = node.get("status") or {}
    return (objects.meta(node).get("labels"), node.get("spec"), status.get("allocatable"),
            status.get("capacity"))


# The controller ---------------------------------------------------------------------------------

class Controller:
    """One leader's worth of allocation work; build a new one for each term of leadership."""

    def __init__(self, cluster: Cluster, settings: ControllerSettings | None = None, *,
                 metrics: Metrics | None = None, fence: Fence = unfenced) -> None:
        self.cluster = cluster
        self.fence = fence
        self.settings = settings or ControllerSettings()
        self.metrics = metrics or Metrics()
        self.stats = Stats()
        self.queue: WorkQueue[WorkKey] = WorkQueue(base_delay=self.settings.base_delay,
                                                   max_delay=self.settings.max_delay)
        self.consumable_capacity: bool | None = self.settings.consumable_capacity
        self.state = ClusterState(PlannerSettings(default_strategy=self.settings.strategy,
                                                  consumable_capacity=bool(
                                                      self.consumable_capacity)))
        timeout = self.settings.watch_timeout
        self.claims = Informer(cluster, RESOURCE_CLAIMS, self._on_claim, watch_timeout=timeout)
        self.slices = Informer(cluster, RESOURCE_SLICES, self._on_slice, watch_timeout=timeout)
        self.classes = Informer(cluster, DEVICE_CLASSES, self._on_class, watch_timeout=timeout)
        self.nodes = Informer(cluster, NODES, self._on_node, watch_timeout=timeout)
        self.pods = Informer(cluster, PODS, self._on_pod, field_selector=LIVE_PODS_SELECTOR,
                             watch_timeout=timeout)
        self.policy_mirror = PolicyMirror(cluster, CatalogKeeper(usage=False),
                                          on_change=self._on_policies, watch_timeout=timeout)
        # Policies first: a pod planned before its namespace's quotas are known could pass them.
        self.informers = (*self.policy_mirror.informers, self.classes, self.nodes, self.slices,
                          self.claims, self.pods)
        self.quota_status = QuotaStatusWriter(cluster, self.policy_mirror.quotas,
                                              metrics=self.metrics,
                                              interval=self.settings.quota_status_interval,
                                              policies=lambda: self.state.policies)
        self.pending = PendingPods(self.metrics.pending_pods)
        self.index = ClaimIndex()
        self.unplaceable = Unplaceable(self.queue,
                                       debounce=self.settings.retry_unplaceable_after,
                                       retry_interval=self.settings.unplaceable_retry_interval)
        self.events = EventRecorder(cluster, instance=self.settings.identity or COMPONENT,
                                    interval=self.settings.event_interval)
        self.releaser = ClaimReleaser(cluster, claims=self.claims, pods=self.pods,
                                      index=self.index, stats=self.stats, metrics=self.metrics,
                                      observe=self._observe_writes, fence=fence)
        self._inflight: dict[str, PodPlan] = {}  # pod uid -> plan being written
        self._planning = asyncio.Lock()  # one plan at a time, as when plans ran on the loop
        # Changes to the planner state made while a plan runs in its thread, in order.
        self._held_changes: list[Callable[[], None]] | None = None
        self._detected = asyncio.Event()
        self.ready = asyncio.Event()  # informers synced, workers running

    # Running -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Detect the API's features, sync every informer, then work until cancelled."""
        await self._detect()
        tasks: list[asyncio.Task[None]] = []
        try:
            for informer in self.informers:
                tasks.append(asyncio.create_task(informer.run(),
                                                 name=f"informer-{informer.rt.plural}"))
            # Planning before every mirror is complete could hand out what is already taken.
            synced = asyncio.ensure_future(self._all_synced())
            try:
                await asyncio.wait({synced, *tasks}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                synced.cancel()
                await asyncio.gather(synced, return_exceptions=True)
            for task in tasks:
                if task.done():
                    task.result()  # an informer stopped: only a bug does that, surface it
            log.info("caches synced", extra={
                "claims": len(self.claims.store), "slices": len(self.slices.store),
                "nodes": len(self.nodes.store), "pods": len(self.pods.store),
                "deviceClasses": len(self.classes.store)})
            self.state.set_policies(self.policy_mirror.catalog())
            for n in range(max(1, self.settings.workers)):
                tasks.append(asyncio.create_task(self._worker(), name=f"allocator-worker-{n}"))
            tasks.append(asyncio.create_task(self._resync(), name="allocator-resync"))
            tasks.append(asyncio.create_task(self.quota_status.run(), name="quota-status"))
            self.quota_status.changed()
            self.ready.set()
            await asyncio.gather(*tasks)
        finally:
            self.queue.shutdown()
            self.unplaceable.close()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _all_synced(self) -> None:
        for informer in self.informers:
            await informer.synced.wait()

    async def _detect(self) -> None:
        if self.consumable_capacity is None:
            try:
                verdict, how = await detect_consumable_capacity(self.cluster)
            except ApiError as err:
                verdict, how = None, f"detection failed: {err.message}"
            except (OSError, TimeoutError) as err:
                # The API is briefly unreachable as the term starts: the informers retry on
                # their own, and the first published slice tells the mode just as well.
                verdict, how = None, f"detection failed: {err!r}"
            if verdict is not None:
                self._set_capacity_mode(verdict, how)
            else:
                log.warning("cannot tell yet whether the API server keeps consumable capacity; "
                            "recording shares in annotations until a published slice shows it",
                            extra={"how": how})
        else:
            self._set_capacity_mode(self.consumable_capacity, "forced by settings")

    def _set_capacity_mode(self, enabled: bool, how: str) -> None:
        changed = self.consumable_capacity != enabled or not self._detected.is_set()
        self.consumable_capacity = enabled
        self._detected.set()
        self.metrics.consumable_capacity.set(1 if enabled else 0)
        if changed:
            log.info("consumable capacity %s", "on: shares are native (shareID, "
                     "consumedCapacity)" if enabled else "off: shares are recorded in claim "
                     "annotations and gateway config", extra={"consumableCapacity": enabled,
                                                              "detectedBy": how})
        if self.state.settings.consumable_capacity != enabled:
            self._rebuild_state()

    def _rebuild_state(self) -> None:
        """A fresh planner state from the mirrors (after the feature mode changed)."""
        self.state = ClusterState(PlannerSettings(default_strategy=self.settings.strategy,
                                                  consumable_capacity=bool(
                                                      self.consumable_capacity)))
        if all(i.synced.is_set() for i in self.policy_mirror.informers):
            self.state.set_policies(self.policy_mirror.catalog())
        for obj in self.classes.values():
            self.state.set_device_class(obj)
        for obj in self.nodes.values():
            self.state.set_node(obj)
        for obj in self.slices.values():
            self.state.set_slice(obj)
        for obj in self.claims.values():
            self.state.set_claim(obj)
        for obj in self.pods.values():
            self.state.set_pod(obj)
            # Placed-but-unbound pods, and plans still being written, hold capacity too.
            self._refresh_placement(obj)
        for uid, plan in self._inflight.items():
            where = self.index.pod_location(uid)
            pod = self.pods.get(*where) if where else None
            if pod is not None:
                self.state.assume(pod, plan)

    async def _worker(self) -> None:
        while True:
            key = await self.queue.get()
            try:
                if isinstance(key, PodKey):
                    outcome = await self._sync_pod(key)
                else:
                    outcome = await self.releaser.sync_claim(key)
            except asyncio.CancelledError:
                self.queue.done(key)
                raise
            except LeadershipLost as err:
                # The term is ending (the elector cancels the work): write nothing more.
                log.warning("not writing: leadership is not current", extra={
                    "key": str(key), "error": str(err)})
                outcome = "retry"
            except Conflict as err:
                self.stats.conflicts += 1
                self.metrics.conflicts.inc()
                log.info("write conflict, retrying", extra={"key": str(key),
                                                            "error": err.message})
                outcome = "retry"
            except ApiError as err:
                self.stats.errors += 1
                log.warning("API call failed, retrying", extra={
                    "key": str(key), "code": err.code, "reason": err.reason,
                    "error": err.message})
                outcome = "retry"
            except (OSError, TimeoutError) as err:
                self.stats.errors += 1
                log.warning("API unreachable, retrying", extra={"key": str(key),
                                                                "error": str(err)})
                outcome = "retry"
            except Exception:
                # A bug must not stop the other keys: log it loudly and back off this one.
                self.stats.errors += 1
                log.exception("unexpected failure handling key", extra={"key": str(key)})
                outcome = "retry"
            if outcome == "retry":
                delay = self.queue.add_rate_limited(key)
                log.debug("requeued", extra={"key": str(key), "delay": delay})
            elif outcome == "done":
                self.queue.forget(key)
            self.queue.done(key)
            self.metrics.queue_depth.set(len(self.queue))

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_period)
            self._enqueue_everything()

    def _enqueue_everything(self) -> None:
        for pod in list(self.pods.values()):
            if is_gated(pod):
                self.unplaceable.wake(self._pod_key(pod))
        for claim in list(self.claims.values()):
            if has_finalizer(claim):
                self.queue.add(self._claim_key(claim))

    # Informer handlers (synchronous: each runs atomically on the loop) -----------------------

    def _on_policies(self, catalog: Any) -> None:
        self._change(self.state.set_policies, catalog)
        self.quota_status.changed()
        self.unplaceable.capacity_changed()

    def _on_slice(self, change: Change, obj: Object, old: Object | None) -> None:
        if change == "deleted":
            self._change(self.state.remove_slice, objects.name(obj))
        else:
            if not self._detected.is_set() and (obj.get("spec") or {}).get(
                    "driver") == names.DRIVER:
                verdict = slices_show_consumable_capacity([obj])
                if verdict is not None:
                    self._set_capacity_mode(verdict, "published slices")
            self._change(self.state.set_slice, obj)
        self.unplaceable.capacity_changed()

    def _on_class(self, change: Change, obj: Object, old: Object | None) -> None:
        if change == "deleted":
            self._change(self.state.remove_device_class, objects.name(obj))
        else:
            self._change(self.state.set_device_class, obj)
        self.unplaceable.capacity_changed()

    def _on_node(self, change: Change, obj: Object, old: Object | None) -> None:
        if change == "modified" and old is not None and _node_fit(old) == _node_fit(obj):
            # Heartbeats, conditions, images: nothing the planner reads. Retrying every
            # unplaceable pod on each would bypass their backoff for as long as nodes report.
            return
        if change == "deleted":
            self._change(self.state.remove_node, objects.name(obj))
        else:
            self._change(self.state.set_node, obj)
        self.unplaceable.capacity_changed()

    def _on_pod(self, change: Change, obj: Object, old: Object | None) -> None:
        uid = objects.uid(obj)
        ns, name = objects.namespace_name(obj)
        if change == "deleted":
            self._change(self.state.remove_pod, uid)
            self.events.forget(uid)
            self.pending.drop(uid)
            self.unplaceable.discard(PodKey(ns, name, uid))
            held = self.index.claims_of(uid)
            self.index.remove_pod(uid)
            self._release_claims(held)
            self.unplaceable.capacity_changed()
            return
        self._change(self.state.set_pod, obj)
        self.index.set_pod(obj)
        self._refresh_placement(obj)
        key = PodKey(ns, name, uid)
        if is_gated(obj) and not objects.is_deleting(obj):
            self.unplaceable.wake(key)
        else:
            self.unplaceable.discard(key)
        if is_finished(obj):
            self._release_claims(self.index.claims_of(uid))

    def _on_claim(self, change: Change, obj: Object, old: Object | None) -> None:
        key = ClaimKey(*objects.namespace_name(obj))
        if change == "deleted":
            self.index.remove_claim(key)
            self._change(self.state.remove_claim, objects.uid(obj))
        else:
            self.index.set_claim(obj)
            self._change(self.state.set_claim, obj)
            if has_finalizer(obj):
                self.queue.add(key)
        was_allocated = old is not None and is_allocated(old)
        if was_allocated and (change == "deleted" or not is_allocated(obj)):
            self.unplaceable.capacity_changed()
        if was_allocated or is_allocated(obj):
            self.quota_status.changed()
        # Gated pods waiting for this claim (to appear, or to be planned again), and the
        # CPU and memory of unbound pods placed through it.
        for uid in self.index.users_of(obj):
            where = self.index.pod_location(uid)
            if where is None:
                continue
            pod = self.pods.get(*where)
            if pod is None:
                continue
            self._refresh_placement(pod)
            if is_gated(pod):
                self.unplaceable.wake(PodKey(where[0], where[1], uid))

    def _refresh_placement(self, pod: Object) -> None:
        """Count the CPU and memory of a pod that is placed but not yet bound.

        The planner counts bound pods itself; between our allocation and the scheduler's
        binding the pod's node is known only from its claims' node selectors (or from the plan
        being written). Derived from the API each time, so a new leader counts it too.
        """
        self._change(self.state.forget, pod, _NO_PLAN)  # drops only an assumed pod record
        spec = pod.get("spec") or {}
        if spec.get("nodeName") or is_finished(pod):
            return
        inflight = self._inflight.get(objects.uid(pod))
        node = inflight.node_name if inflight is not None else self._placed_on(pod)
        if node:
            self._change(self.state.assume, pod, PodPlan(node_name=node, allocations={},
                                                         annotations={}, reason=None))

    def _placed_on(self, pod: Object) -> str | None:
        ns = objects.namespace(pod)
        for claim_name in sorted(objects.claim_names_of(pod)):
            claim = self.claims.get(ns, claim_name)
            if claim is None or not is_allocated(claim) or not is_gateway_claim(claim):
                continue
            node = objects.allocation_node(claim["status"]["allocation"])
            if node:
                return node
        return None

    def _release_claims(self, keys: Iterable[ClaimKey]) -> None:
        """Queue a release check for every claim a gone or finished pod used."""
        for key in keys:
            claim = self.claims.get(key.namespace, key.name)
            if claim is not None and has_finalizer(claim):
                self.queue.add(key)

    def outstanding(self) -> set[WorkKey]:
        """Keys with work left, other than pods waiting for room: empty once caught up.

        Pods that do not fit come back on their backoff for as long as they wait; they are
        not work the controller owes the cluster, so they are left out.
        """
        return {key for key in self.queue.pending() if key not in self.unplaceable}

    # Pods: plan, write, ungate ---------------------------------------------------------------

    async def _sync_pod(self, key: PodKey) -> Outcome:
        pod = self.pods.get(key.namespace, key.name)
        if pod is None or objects.uid(pod) != key.uid or not is_gated(pod) or objects.is_deleting(
                pod):
            self.unplaceable.discard(key)
            return "done"
        claims, waiting = claims_for(pod, self.claims.get)
        if waiting:
            # The claim controller has not created them yet: their arrival requeues the pod.
            log.debug("waiting for claims", extra={"pod": str(key), "waitingFor": waiting})
            return "wait"
        gateway = [c for c in claims if is_gateway_claim(c)]
        pending = [c for c in gateway if not is_allocated(c)]
        if pending:
            try:
                outcome = await self._allocate(key, pod, gateway, pending)
            except Replan as why:
                log.info("planning again", extra={"pod": str(key), "why": str(why)})
                return "retry"
            if outcome != "done":
                return outcome
        return await self._ungate(key)

    async def _allocate(self, key: PodKey, pod: Object, gateway: list[Object],
                        pending: list[Object]) -> Outcome:
        # A claim shared with another pod whose plan is being written: planning it again
        # would replace that plan's reservation in the state and free its device for others.
        # Its write lands (or fails) soon, and the claim's change requeues this pod.
        busy = {uid for other, plan in self._inflight.items() if other != key.uid
                for uid in plan.allocations}
        if any(objects.uid(c) in busy for c in pending):
            log.debug("a claim of the pod is being allocated for another pod",
                      extra={"pod": str(key)})
            return "retry"
        started = time.perf_counter()
        self.stats.plans += 1  # counted as it starts: it runs in a thread, others meanwhile
        self.unplaceable.planning(key)  # events meanwhile count from the plan's outcome
        try:
            plan = await self._plan(pod, gateway)
        except BaseException:
            self.unplaceable.settle(key)
            raise
        self.metrics.plan_seconds.observe(time.perf_counter() - started)
        if plan.node_name is None:
            self.stats.failures += 1
            self.metrics.allocation_failures.inc()
            # The worker requeues it after its backoff; events may bring that forward to the
            # retry interval, no further.
            self.unplaceable.failed(key)
            reason = plan.reason or "no node can hold every claim of the pod"
            held = [c for c in gateway
                    if is_allocated(c) and has_finalizer(c) and controller_owner_uid(c) == key.uid
                    and not (c.get("status") or {}).get("reservedFor")]
            if held:
                # Part of the pod was allocated earlier (a crash or a conflict between two
                # claims' writes) and now pins the rest to a node where it no longer fits.
                # Nothing uses those claims while the pod is gated: let go and plan them all
                # together.
                log.info("releasing a partial allocation to plan the pod's claims together",
                         extra={"pod": str(key), "reason": reason,
                                "claims": [objects.name(c) for c in held]})
                for claim in held:
                    await self.releaser.release(claim, replanning=True)
                return "retry"
            log.info("pod cannot be placed", extra={"pod": str(key), "reason": reason})
            if plan.quota_reason is not None:
                # Held back by a GPUQuota: the pod says so (condition) and so does an Event.
                self.pending.set(key.uid, plan.quota_reason)
                await set_quota_condition(self.cluster, pod, held=True,
                                          reason=plan.quota_reason, message=reason)
                await self.events.record_failure(pod, reason, reason=plan.quota_reason)
                return "retry"
            self.pending.set(key.uid, "Unschedulable")
            await self._clear_quota_condition(pod, "within its GPUQuotas, waiting for room: "
                                              f"{reason}")
            await self.events.record_failure(pod, reason)
            return "retry"
        self.unplaceable.discard(key)
        self.pending.drop(key.uid)
        missing = [c for c in pending if objects.uid(c) not in plan.allocations]
        if missing:
            names_missing = ", ".join(objects.name(c) for c in missing)
            raise RuntimeError(f"the planner placed pod {key} on {plan.node_name} without "
                               f"allocating claims {names_missing}")
        writes: list[Write] = []
        self._change(self.state.assume, pod, plan)
        self._inflight[key.uid] = plan
        try:
            for claim in sorted(pending, key=lambda c: objects.name(c)):
                uid = objects.uid(claim)
                await write_allocation(self.cluster, claim, allocation=plan.allocations[uid],
                                       annotations=plan.annotations.get(uid) or {},
                                       writes=writes, stats=self.stats, metrics=self.metrics,
                                       fence=self.fence)
        finally:
            # No await between these: the assumption becomes the written truth atomically.
            del self._inflight[key.uid]
            self._change(self.state.forget, pod, plan)
            self._observe_claims(writes)
            live = self.pods.get(key.namespace, key.name)
            if live is not None and objects.uid(live) == key.uid:
                self._refresh_placement(live)
        log.info("allocated", extra={"pod": str(key), "node": plan.node_name,
                                     "claims": [objects.name(c) for c in pending]})
        if plan.charges:
            # Later pods of the namespace may have waited behind this one for its quota.
            self.unplaceable.capacity_changed()
        await self._clear_quota_condition(pod, f"placed on {plan.node_name} within its "
                                          "GPUQuotas")
        return "done"

    async def _plan(self, pod: Object, gateway: list[Object]) -> PodPlan:
        """plan_pod in a worker thread on the live state, the loop's changes held meanwhile.

        The thread cannot be interrupted; if the term ends while it runs, the changes stay held
        (this controller is being thrown away) and the thread finishes on its own.
        """
        async with self._planning:
            self._held_changes = []
            state, strategy = self.state, self.settings.strategy
            budget = self.settings.plan_cost_budget

            def planned() -> PodPlan:
                try:
                    with cel.cost_budget(budget):
                        return plan_pod(state, pod, gateway, strategy=strategy)
                except cel.CostBudgetExceeded as exc:
                    return PodPlan(node_name=None, allocations={}, annotations={},
                                   reason=f"{exc}; simplify the claim's selectors")

            plan = await asyncio.to_thread(planned)
            held, self._held_changes = self._held_changes, None
            for change in held:
                change()
        return plan

    def _change(self, method: Callable[..., None], *args: Any) -> None:
        """Apply a change to the planner state now, or after the plan running in its thread."""
        if self._held_changes is None:
            method(*args)
        else:
            self._held_changes.append(lambda: method(*args))

    async def _clear_quota_condition(self, pod: Object, message: str) -> None:
        condition = quota_condition(pod)
        if condition is not None and condition.get("status") == "True":
            await set_quota_condition(self.cluster, pod, held=False, reason=PLACED,
                                      message=message)

    def _observe_claims(self, writes: Sequence[Write]) -> None:
        """Apply our own writes to the mirror unless the watch already brought them (or later)."""
        for base_rv, written in writes:
            stored = self.claims.get(*objects.namespace_name(written))
            if (stored is not None and objects.resource_version(stored) == base_rv
                    and objects.uid(stored) == objects.uid(written)):
                self.claims.observe_write(written)

    def _observe_writes(self, writes: Sequence[Write]) -> None:
        """A release wrote claims: mirror the writes, and capacity may have freed up."""
        self._observe_claims(writes)
        if writes:
            self.unplaceable.capacity_changed()

    async def _ungate(self, key: PodKey) -> Outcome:
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
            # allocation is still there (a claim may have been wiped a moment ago).
            if not await still_allocated(self.cluster, gateway):
                return "retry"
            try:
                await remove_gate(self.cluster, key, pod, index, fence=self.fence)
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
            self.metrics.pods_allocated.inc()
            self.unplaceable.discard(key)
            self.pending.drop(key.uid)
            log.info("scheduling gate removed", extra={
                "pod": str(key), "claims": [objects.name(c) for c in gateway]})
            return "done"
        raise Conflict(f"pod {key} kept changing while its scheduling gate was being removed")

    # Helpers ---------------------------------------------------------------------------------

    @staticmethod
    def _pod_key(pod: Object) -> PodKey:
        return PodKey(*objects.namespace_name(pod), objects.uid(pod))

    @staticmethod
    def _claim_key(claim: Object) -> ClaimKey:
        return ClaimKey(*objects.namespace_name(claim))


__all__ = [
    "ClaimKey",
    "Controller",
    "ControllerSettings",
    "PodKey",
]

"""The allocator controller: gated pods in, claim allocations and ungated pods out.

It mirrors ResourceClaims, ResourceSlices, DeviceClasses, Nodes and live Pods with informers,
feeds them into the planner's `ClusterState`, and works through a queue of pods and claims:

- a pod carrying the gateway's scheduling gate is planned, its claims written and its gate
  removed by `allocate.PodAllocator` once every claim it names exists;
- a claim carrying the finalizer is handed to `release.ClaimReleaser` once a pod that owned
  or used it is gone or finished (`index.py`'s indexes of the pods' and claims' mirrors
  know which pods those are).

Every write is optimistic (resourceVersion) and a conflict rereads and retries: an allocation
found already set is accepted as it is, since the API allows it only to be cleared. Every write
of an allocation, a gate removal or a release first calls the `fence` (the leader elector's
`check_leading`): a replica that stalled past its renew deadline writes nothing. Nothing is kept
anywhere but in the API: a new leader rebuilds everything from a list.

What stays in this class: building the parts and running them for one term, the API's feature
mode (consumable capacity: native shares, or shares recorded in annotations), and the informer
handlers, which keep the planner state and the queue in step with the mirrors, atomically
between two awaits. Around it: `process.py` (flags, signals, leadership terms),
`settings.py`, `work.py` (keys, what a sync answers), `workers.py` (a worker: a key's sync, its
failures, its requeue), `planning.py` (the planner state, changed between plans, and the plans
that run in a thread or are being written), `allocate.py` (a gated pod: plan, write, ungate),
`mirrorwrites.py` (our own writes into the mirrors), `index.py` (which pods use which claims:
the mirrors' indexes),
`claims.py` (a pod's claims from the mirror), `writes.py` (a claim's allocation, the gate's
removal), `release.py`, `unplaceable.py` (when a pod that did not fit is planned again),
`events.py` (Warning Events), `invalidclaims.py` (others' claims the API refuses from 1.38,
named), `quotastatus.py` (GPUQuota status; the policies reach the planner
through kube/runtime's `PolicyMirror`) and `conditions.py` (the pod condition of a pod a quota
holds back).

This module must not make placement decisions (the planner does) nor talk to Kubernetes other
than through the cluster port.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any

from dra_gateway.allocator.allocate import PodAllocator
from dra_gateway.allocator.events import COMPONENT, EventRecorder
from dra_gateway.allocator.eviction import holds as holdfmt
from dra_gateway.allocator.eviction.defrag import DefragMode
from dra_gateway.allocator.eviction.drain import DrainMode
from dra_gateway.allocator.eviction.inputs import Snapshot
from dra_gateway.allocator.eviction.preemption import PreemptionMode
from dra_gateway.allocator.groups import GROUP_INDEX, HOLDER_INDEX, group_index, holder_index
from dra_gateway.allocator.index import (
    CLAIM_INDEXERS,
    POD_INDEXERS,
    claims_of,
    pod_by_uid,
    users_of,
)
from dra_gateway.allocator.invalidclaims import InvalidClaims
from dra_gateway.allocator.legacypods import LegacyPods
from dra_gateway.allocator.metrics import Metrics, PendingPods, Stats
from dra_gateway.allocator.planner import ClusterState
from dra_gateway.allocator.planning import MirrorContents, Planning
from dra_gateway.allocator.quotastatus import QuotaStatusWriter
from dra_gateway.allocator.release import ClaimReleaser
from dra_gateway.allocator.settings import ControllerSettings
from dra_gateway.allocator.unplaceable import Unplaceable
from dra_gateway.allocator.work import (
    ClaimKey,
    Fence,
    PodKey,
    SyncResult,
    WorkKey,
    unfenced,
)
from dra_gateway.allocator.workers import run_worker
from dra_gateway.gpu.groups import PODGROUP_TYPES
from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.features import (
    detect_consumable_capacity,
    slices_show_consumable_capacity,
)
from dra_gateway.kube.cluster.port import ApiError, Cluster, Object
from dra_gateway.kube.device_taints import TaintRules
from dra_gateway.kube.objects import has_finalizer, is_allocated, is_finished, is_gated
from dra_gateway.kube.resources import (
    CONFIG_MAPS,
    DEVICE_CLASSES,
    DEVICE_TAINT_RULES,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    ResourceType,
)
from dra_gateway.kube.runtime.informer import Change, Informer
from dra_gateway.kube.runtime.policymirror import PolicyMirror
from dra_gateway.kube.runtime.workqueue import WorkQueue
from dra_gateway.policy.amounts import DeviceCharge
from dra_gateway.policy.keeper import CatalogKeeper
from dra_gateway.policy.legacyusage import still_counted

log = logging.getLogger(__name__)

# Pods that still exist and may still run: finished pods drop out of the watch (DELETED).
LIVE_PODS_SELECTOR = "status.phase!=Succeeded,status.phase!=Failed"


def _node_fit(node: Object) -> tuple[Any, ...]:
    """What placement may read of a Node: labels, spec (taints, unschedulable), resources."""
    status = node.get("status") or {}
    return (objects.meta(node).get("labels"), node.get("spec"), status.get("allocatable"),
            status.get("capacity"))


def _podgroups_missing(source: str, rt: ResourceType) -> Callable[[], None]:
    def missing() -> None:
        log.info("the API server does not serve this type of the objects sizing pod groups "
                 "(not installed): pods that name one wait until it is served and exists",
                 extra={"resource": f"{rt.plural}.{rt.group}", "scheduler": source})
    return missing


def _taint_rules_missing() -> None:
    log.info("the API server does not serve DeviceTaintRules (before Kubernetes 1.37): devices "
             "are tainted by their drivers' slices only")


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
                                                   max_delay=self.settings.max_delay,
                                                   order=self._work_order)
        self.consumable_capacity: bool | None = self.settings.consumable_capacity
        timeout = self.settings.watch_timeout
        self.claims = Informer(cluster, RESOURCE_CLAIMS, self._on_claim, watch_timeout=timeout,
                               indexers=CLAIM_INDEXERS)
        self.slices = Informer(cluster, RESOURCE_SLICES, self._on_slice, watch_timeout=timeout)
        # An administrator's device taints (served from 1.37): added to the slices' devices
        # before the planner sees them, as kube-scheduler adds them.
        self.taint_rules = TaintRules()
        self.taint_rule_mirror = Informer(
            cluster, DEVICE_TAINT_RULES, self._on_taint_rule, when_missing="empty",
            missing=_taint_rules_missing, watch_timeout=timeout, max_backoff=120.0,
            rbac_fix="grant the allocator list and watch on devicetaintrules.resource.k8s.io "
                     "(the chart's allocator ClusterRole)")
        self.classes = Informer(cluster, DEVICE_CLASSES, self._on_class, watch_timeout=timeout)
        self.nodes = Informer(cluster, NODES, self._on_node, watch_timeout=timeout)
        self.pods = Informer(cluster, PODS, self._on_pod, field_selector=LIVE_PODS_SELECTOR,
                             watch_timeout=timeout,
                             indexers={GROUP_INDEX: group_index, HOLDER_INDEX: holder_index,
                                       **POD_INDEXERS})
        # The objects sizing the groups pods name (gpu/groups.py: upstream's PodGroups and
        # Workloads, Volcano's and the coscheduling plugin's PodGroups, JobSets, Kubeflow's
        # jobs), per version served. Where a type is not served its mirror stays empty and
        # lists again now and then.
        self.podgroups = {(source, rt): Informer(cluster, rt, self._on_podgroup(source),
                                                 when_missing="empty",
                                                 missing=_podgroups_missing(source, rt),
                                                 watch_timeout=timeout, max_backoff=120.0)
                          for source, types in PODGROUP_TYPES.items() for rt in types}
        self.planning = Planning(self.settings, claims=self.claims.get,
                                 consumable_capacity=bool(self.consumable_capacity))
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
        self.legacy = LegacyPods()
        self._card_memory = 0  # the smallest card's memory the legacy charges were made with
        self.unplaceable = Unplaceable(self.queue,
                                       debounce=self.settings.retry_unplaceable_after,
                                       retry_interval=self.settings.unplaceable_retry_interval)
        self.events = EventRecorder(cluster, instance=self.settings.identity or COMPONENT,
                                    interval=self.settings.event_interval)
        self.invalid_claims = InvalidClaims(self.events, self.metrics.invalid_claims)
        self.releaser = ClaimReleaser(cluster, claims=self.claims, pods=self.pods,
                                      unplaceable=self.unplaceable,
                                      stats=self.stats, metrics=self.metrics, fence=fence)
        self.allocator = PodAllocator(cluster, pods=self.pods, claims=self.claims,
                                      planning=self.planning, unplaceable=self.unplaceable,
                                      pending=self.pending, events=self.events,
                                      releaser=self.releaser, stats=self.stats,
                                      metrics=self.metrics, fence=fence,
                                      podgroups=self._podgroup)
        # Defrag's ConfigMap: devices held for pods, pods moved (allocator/eviction/holds.py).
        self.records = Informer(cluster, CONFIG_MAPS, self._on_records,
                                namespace=self.settings.namespace,
                                field_selector=f"metadata.name={holdfmt.CONFIG_MAP}",
                                watch_timeout=timeout, what="defrag records",
                                rbac_fix="grant the allocator get, list and watch on configmaps "
                                         "in its namespace (the chart's allocator Role)")
        self._records: holdfmt.Records = holdfmt.Records()
        self._detected = asyncio.Event()
        self.ready = asyncio.Event()  # informers synced, workers running

    @property
    def state(self) -> ClusterState:
        """The planner's view of the cluster, as the mirrors have fed it."""
        return self.planning.state

    # Running -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Detect the API's features, sync every informer, then work until cancelled."""
        await self._detect()
        tasks: list[asyncio.Task[None]] = []
        try:
            for informer in (*self.informers, *self.podgroups.values(), self.taint_rule_mirror):
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
            # The objects sizing pod groups, briefly: an allocator without the RBAC for some of
            # them (an older chart's) still works, and a member planned before its PodGroup is
            # seen waits and is planned again once it is (`_on_podgroup`).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10.0):
                    await asyncio.gather(*(i.synced.wait() for i in self.podgroups.values()))
            self.planning.set_policies(self.policy_mirror.catalog())
            # Pods listed before the DeviceClasses and slices were charged without them.
            self._recharge_legacy_pods()
            # Holds before the first plan, so a new leader does not hand out devices freed for
            # a waiting pod; an allocator without the RBAC for them still works, without.
            tasks.append(asyncio.create_task(self.records.run(), name="informer-defrag"))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(10.0):
                    await self.records.synced.wait()
            tasks.append(asyncio.create_task(self._expire_holds(), name="defrag-holds"))
            if self.settings.defrag:
                mode = DefragMode(self.cluster, self.settings, snapshot=self.snapshot,
                                  metrics=self.metrics, fence=self.fence)
                tasks.append(asyncio.create_task(mode.run(), name="defrag"))
            if self.settings.preemption:
                preemption = PreemptionMode(self.cluster, self.settings,
                                            snapshot=self.snapshot, metrics=self.metrics,
                                            fence=self.fence)
                tasks.append(asyncio.create_task(preemption.run(), name="preemption"))
            if self.settings.health_eviction:
                drain = DrainMode(self.cluster, self.settings, snapshot=self.snapshot,
                                  metrics=self.metrics, fence=self.fence,
                                  nodes=self.nodes.values)
                tasks.append(asyncio.create_task(drain.run(), name="health-eviction"))
            for n in range(max(1, self.settings.workers)):
                worker = run_worker(self.queue, self._sync, stats=self.stats,
                                    metrics=self.metrics)
                tasks.append(asyncio.create_task(worker, name=f"allocator-worker-{n}"))
            tasks.append(asyncio.create_task(self._resync(), name="allocator-resync"))
            tasks.append(asyncio.create_task(self.quota_status.run(), name="quota-status"))
            tasks.append(asyncio.create_task(self.invalid_claims.run(), name="invalid-claims"))
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
        # The DeviceTaintRules too, without a deadline: planning before they are known gives
        # out devices an administrator took out of service. Where the API does not serve them
        # the mirror is synced (empty) by the first list's 404.
        for informer in (*self.informers, self.taint_rule_mirror):
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
        policies = self.policy_mirror
        mirrors = MirrorContents(catalog=policies.catalog() if policies.synced else None,
                                 classes=self.classes.values(), nodes=self.nodes.values(),
                                 slices=self._slices(), claims=self.claims.values(),
                                 pods=self.pods.values())
        self.planning.rebuild(bool(self.consumable_capacity), mirrors,
                              legacy_charges=self._legacy_charges, pod_of=self._pod_of)

    def _work_order(self, key: WorkKey) -> tuple[object, ...]:
        """Releases first (they free devices), then pods by priority, then age: a burst of
        low-priority pods never holds a high-priority one back in the queue."""
        if isinstance(key, ClaimKey):
            return (0,)
        pod = self.pods.get(key.namespace, key.name)
        return (1, *objects.service_order(pod)) if pod is not None else (1, 0, "", key.name)

    async def _sync(self, key: WorkKey) -> SyncResult:
        if isinstance(key, PodKey):
            return await self.allocator.sync_pod(key)
        return await self.releaser.sync_claim(key)

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self.settings.resync_period)
            self._enqueue_everything()

    def _enqueue_everything(self) -> None:
        for pod in list(self.pods.values()):
            if is_gated(pod):
                self.unplaceable.wake(self._pod_key(pod))
            elif objects.is_deleting(pod) and self.planning.charges_legacy(objects.uid(pod)):
                self._set_legacy_pod(pod)  # its grace period may be over
        for claim in list(self.claims.values()):
            if has_finalizer(claim):
                self.queue.add(self._claim_key(claim))

    # Informer handlers (synchronous: each runs atomically on the loop) -----------------------

    def _on_policies(self, catalog: Any) -> None:
        self.planning.set_policies(catalog)
        self.quota_status.changed()
        self.unplaceable.capacity_changed()

    def _on_slice(self, change: Change, obj: Object, old: Object | None) -> None:
        if change == "deleted":
            self.planning.remove_slice(objects.name(obj))
        else:
            if not self._detected.is_set() and (obj.get("spec") or {}).get(
                    "driver") == names.DRIVER:
                verdict = slices_show_consumable_capacity([obj])
                if verdict is not None:
                    self._set_capacity_mode(verdict, "published slices")
            self.planning.set_slice(self.taint_rules.apply(obj))
        if self.state.smallest_card_memory() != self._card_memory:
            self._recharge_legacy_pods()  # a whole legacy card is charged at the smallest
        self.unplaceable.capacity_changed()

    def _slices(self) -> list[Object]:
        """The slices as the planner sees them: with the DeviceTaintRules' taints."""
        return [self.taint_rules.apply(obj) for obj in self.slices.values()]

    def _on_taint_rule(self, change: Change, obj: Object, old: Object | None) -> None:
        changed = (self.taint_rules.remove(objects.name(obj)) if change == "deleted"
                   else self.taint_rules.set(obj))
        if not changed:
            return
        # Rare (an administrator's change): every slice again, with the taints as they are now.
        for piece in self._slices():
            self.planning.set_slice(piece)
        self.unplaceable.capacity_changed()

    def _on_class(self, change: Change, obj: Object, old: Object | None) -> None:
        if change == "deleted":
            self.planning.remove_device_class(objects.name(obj))
        else:
            self.planning.set_device_class(obj)
        self.legacy.set_device_classes(self.classes.values())
        self._recharge_legacy_pods()  # what kube-scheduler serves changed: charge again
        self.unplaceable.capacity_changed()

    def _on_node(self, change: Change, obj: Object, old: Object | None) -> None:
        if change == "modified" and old is not None and _node_fit(old) == _node_fit(obj):
            # Heartbeats, conditions, images: nothing the planner reads. Retrying every
            # unplaceable pod on each would bypass their backoff for as long as nodes report.
            return
        if change == "deleted":
            self.planning.remove_node(objects.name(obj))
        else:
            self.planning.set_node(obj)
        self.unplaceable.capacity_changed()

    def _on_pod(self, change: Change, obj: Object, old: Object | None) -> None:
        uid = objects.uid(obj)
        ns, name = objects.namespace_name(obj)
        if change == "deleted":
            self.planning.drop_hold(obj)
            if self.planning.charges_legacy(uid):
                self.quota_status.changed()
            self.planning.remove_pod(uid)
            self.events.forget(uid)
            self.pending.drop(uid)
            self.unplaceable.discard(PodKey(ns, name, uid))
            # Gone from the mirror: the claims it named are read from its last stored state.
            self._release_claims(claims_of(self.claims, uid, old))
            self.unplaceable.capacity_changed()
            return
        if not is_gated(obj):
            self.planning.drop_hold(obj)  # placed: the hold, if any, has served
        self.planning.set_pod(obj)
        self._set_legacy_pod(obj)
        self.planning.refresh_placement(obj)
        key = PodKey(ns, name, uid)
        if is_gated(obj) and not objects.is_deleting(obj):
            self.unplaceable.wake(key)
        else:
            self.unplaceable.discard(key)
        if is_finished(obj):
            self._release_claims(claims_of(self.claims, uid, obj))

    def _podgroup(self, source: str, namespace: str, name: str) -> Object | None:
        """The object sizing a group (a PodGroup, a Workload), from the first version served
        that holds it."""
        for rt in PODGROUP_TYPES[source]:
            found = self.podgroups[(source, rt)].get(namespace, name)
            if found is not None:
                return found
        return None

    def _on_podgroup(self, source: str) -> Callable[[Change, Object, Object | None], None]:
        def changed(change: Change, obj: Object, old: Object | None) -> None:
            # A PodGroup (or Workload) created, resized or deleted: the gated members of the
            # groups it sizes are planned again.
            key = (objects.namespace(obj), source, objects.name(obj))
            for pod in self.pods.by_index(HOLDER_INDEX, key):
                if is_gated(pod) and not objects.is_deleting(pod):
                    self.unplaceable.wake(self._pod_key(pod))
        return changed

    def _recharge_legacy_pods(self) -> None:
        """Charge every live pod again: the DeviceClasses (what kube-scheduler serves) or the
        smallest card published (what a whole legacy card costs) changed, or the mirrors
        have just synced, whichever came first."""
        self._card_memory = self.state.smallest_card_memory()
        for pod in self.pods.values():
            self._set_legacy_pod(pod)

    def _legacy_charges(self, obj: Object) -> tuple[DeviceCharge, ...]:
        # A pod being deleted keeps its legacy card until its containers stop: it counts until
        # its grace period is over (as a ResourceQuota counts it; `_resync` looks again).
        if not still_counted(obj, datetime.now(UTC)):
            return ()
        return self.legacy.charges(obj, card_memory=self.state.smallest_card_memory())

    def _set_legacy_pod(self, obj: Object) -> None:
        """Charge a pod a legacy device plugin serves to its namespace's quotas (or stop)."""
        uid = objects.uid(obj)
        charges = self._legacy_charges(obj)
        if not charges and not self.planning.charges_legacy(uid):
            return
        self.planning.set_legacy_pod(uid, objects.namespace(obj), charges)
        self.quota_status.changed()
        if not charges:
            self.unplaceable.capacity_changed()  # its quota is free for the pods that wait

    def _on_records(self, change: Change, obj: Object, old: Object | None) -> None:
        self._records = holdfmt.read(None if change == "deleted" else obj)
        for problem in self._records.problems:
            log.warning("defrag record ignored", extra={"problem": problem})
        self._apply_holds()

    def _apply_holds(self) -> None:
        def pod_of(uid: str, hold: holdfmt.Hold) -> Object | None:
            ns, _, name = hold.pod.partition("/")
            pod = self.pods.get(ns, name)
            return pod if pod is not None and objects.uid(pod) == uid else None

        live = self._records.live_holds(datetime.now(UTC))
        for uid in self.planning.set_holds(live, pod_of):
            ns, _, name = live[uid].pod.partition("/")
            self.unplaceable.wake(PodKey(ns, name, uid))

    def snapshot(self) -> Snapshot:
        """The mirrors as defrag reads a cluster (PodDisruptionBudgets are read when needed)."""
        return Snapshot(now=datetime.now(UTC), nodes=list(self.nodes.values()),
                        slices=self._slices(), classes=list(self.classes.values()),
                        pods=list(self.pods.values()), claims=list(self.claims.values()),
                        catalog=self.policy_mirror.catalog(), records=self._records,
                        consumable_capacity=bool(self.consumable_capacity),
                        strategy=self.settings.strategy, legacy=self.legacy)

    async def _expire_holds(self) -> None:
        while True:
            await asyncio.sleep(self.settings.holds_check_interval)
            self._apply_holds()

    def _on_claim(self, change: Change, obj: Object, old: Object | None) -> None:
        key = ClaimKey(*objects.namespace_name(obj))
        if change == "deleted":
            self.planning.remove_claim(objects.uid(obj))
            self.invalid_claims.gone(objects.uid(obj))
        else:
            self.planning.set_claim(obj)
            self.invalid_claims.seen(obj)
            if has_finalizer(obj):
                self.queue.add(key)
        was_allocated = old is not None and is_allocated(old)
        if was_allocated and (change == "deleted" or not is_allocated(obj)):
            self.unplaceable.capacity_changed()
        if was_allocated or is_allocated(obj):
            self.quota_status.changed()
        # Gated pods waiting for this claim (to appear, or to be planned again), and the
        # CPU and memory of unbound pods placed through it.
        for pod in users_of(self.pods, obj):
            self.planning.refresh_placement(pod)
            if is_gated(pod):
                self.unplaceable.wake(self._pod_key(pod))

    # Releases -------------------------------------------------------------------------------

    def _release_claims(self, keys: Iterable[ClaimKey]) -> None:
        """Queue a release check for every claim a gone or finished pod used."""
        for key in keys:
            claim = self.claims.get(key.namespace, key.name)
            if claim is not None and has_finalizer(claim):
                self.queue.add(key)

    # Helpers ---------------------------------------------------------------------------------

    def _pod_of(self, uid: str) -> Object | None:
        """A pod by uid, from the pods' mirror (its uid index)."""
        return pod_by_uid(self.pods, uid)

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

"""The allocator's Lease, watched from the webhook, and a Warning Event on each pod left gated
while no allocator leads.

The webhook's replicas always run; the allocator's may all be gone (a broken image, the
Deployment scaled to zero, RBAC refusing the Lease), and then pods that use a gateway-class claim
wait gated by dra-gateway.io/allocation without a word. `GatedPodEvents` mirrors the Lease (a
list and a watch by name in the gateway's namespace: the chart's Role grants that one name) and,
only while the Lease has lacked a valid holder for at least the threshold, the pods bound to no
node (field selector `spec.nodeName=`, cluster-wide), of which it keeps the gated ones. Every
`interval` it asks `gatedpods.due_events` which pods get an Event now and posts them; another
replica having posted the same one first shows as AlreadyExists. Outside an outage it holds the
Lease alone and lists no pod.

Events are advice to people: a post that fails is logged and tried again on the next rounds, a
few times, then dropped. Nothing here affects readiness or admission; what gets an Event is
`gatedpods`' decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Callable
from datetime import UTC, datetime

from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.port import AlreadyExists, ApiError, Cluster, Object
from dra_gateway.kube.resources import EVENTS, LEASES, PODS
from dra_gateway.webhook.gatedpods import (
    DueEvent,
    GatedPod,
    LeaseRecord,
    due_events,
    event_object,
    gated_pod,
    lease_record,
    span,
    vacancy,
)
from dra_gateway.webhook.metrics import Metrics
from dra_gateway.webhook.mirroring import mirror

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 3  # posts of one Event before it is dropped
MAX_PER_ROUND = 100  # Events posted per round; the rest wait for the next


def default_interval(threshold: float) -> float:
    """How often the pods are looked at: a quarter of the threshold, within 0.05 s and 5 s."""
    return min(5.0, max(0.05, threshold / 4))


def _now() -> datetime:
    return datetime.now(UTC)


class GatedPodEvents:
    """Events on pods gated for at least `threshold` seconds while the Lease has had no valid
    holder for as long; run `run()` in a task, cancel it to stop. `lease` is None until the
    Lease was first listed."""

    def __init__(self, cluster: Cluster, metrics: Metrics, *, namespace: str, threshold: float,
                 lease_name: str = names.ALLOCATOR_LEASE, retry_delay: float = 1.0,
                 interval: float | None = None, instance: str | None = None,
                 clock: Callable[[], datetime] = _now) -> None:
        if threshold <= 0:
            raise ValueError("the threshold of gated-pod Events must be above 0 (0 turns the "
                             "Events off: do not run this watch)")
        self._cluster = cluster
        self._metrics = metrics
        self._namespace = namespace
        self._lease_name = lease_name
        self._threshold = threshold
        self._retry_delay = retry_delay
        self._interval = interval if interval is not None else default_interval(threshold)
        self._instance = instance or socket.gethostname()
        self._clock = clock
        self.lease: LeaseRecord | None = None
        self._pods: dict[str, GatedPod] = {}  # uid -> pod
        self._pods_synced = False
        self._pod_watch: asyncio.Task[None] | None = None
        self._posted: set[str] = set()  # Event names posted (or found) in this outage
        self._attempts: dict[str, int] = {}
        self._outage: str | None = None  # the outage already logged

    @property
    def watching_pods(self) -> bool:
        return self._pod_watch is not None and not self._pod_watch.done()

    async def run(self) -> None:
        lease_watch = asyncio.create_task(self._mirror_lease(), name="allocator-lease")
        try:
            while True:
                try:
                    await self.step()
                except Exception:
                    log.exception("gated-pod Events: a round failed; trying again")
                await asyncio.sleep(self._interval)
        finally:
            lease_watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lease_watch
            await self._stop_pods()

    async def step(self) -> None:
        """One round: follow the outage, and post the Events now due."""
        lease = self.lease
        if lease is None:
            return  # the Lease not listed yet
        now = self._clock()
        vacant = vacancy(lease, now)
        vacant_s = 0.0 if vacant is None else (now - vacant.since).total_seconds()
        self._metrics.allocator_lease_vacant.set(max(0.0, vacant_s))
        if vacant is None or vacant_s < self._threshold:
            await self._stop_pods()
            if vacant is None:
                if self._outage is not None:
                    log.info("the allocator's Lease has a holder again",
                             extra={"lease": lease.ref, "holder": lease.holder})
                self._outage = None
                self._posted.clear()
                self._attempts.clear()
            return
        if self._outage != vacant.outage:
            self._outage = vacant.outage
            log.warning("no allocator leads: pods gated by %s wait; posting an Event on each "
                        "gated for %s or more", names.SCHEDULING_GATE, span(self._threshold),
                        extra={"lease": lease.ref, "vacantFor": span(vacant_s),
                               "lastHolder": lease.last_holder})
        self._start_pods()
        if not self._pods_synced:
            return
        due = due_events(lease, self._pods.values(), now=now, threshold_s=self._threshold,
                         posted=self._posted)
        for item in due[:MAX_PER_ROUND]:
            await self._post(item, now)

    # ---- posting ---------------------------------------------------------------------------

    async def _post(self, due: DueEvent, now: datetime) -> None:
        pod = due.pod
        where = {"pod": f"{pod.namespace}/{pod.name}", "event": due.name}
        try:
            await self._cluster.create(EVENTS, event_object(due, now=now,
                                                            instance=self._instance),
                                       namespace=pod.namespace)
            result = "created"
            log.info("posted AllocatorUnavailable on a gated pod", extra=where)
        except AlreadyExists:
            result = "exists"
            log.info("AllocatorUnavailable already posted on a gated pod (by another replica)",
                     extra=where)
        except ApiError as exc:
            self._metrics.gated_pod_events.labels("failed").inc()
            attempts = self._attempts.get(due.name, 0) + 1
            if attempts < MAX_ATTEMPTS:
                self._attempts[due.name] = attempts
                log.warning("could not post AllocatorUnavailable on a gated pod; trying again",
                            extra={**where, "reason": exc.reason, "error": exc.message})
                return
            log.warning("could not post AllocatorUnavailable on a gated pod; giving up",
                        extra={**where, "attempts": attempts, "reason": exc.reason,
                               "error": exc.message})
            self._attempts.pop(due.name, None)
            self._posted.add(due.name)
            return
        self._metrics.gated_pod_events.labels(result).inc()
        self._attempts.pop(due.name, None)
        self._posted.add(due.name)

    # ---- the Lease -------------------------------------------------------------------------

    async def _mirror_lease(self) -> None:
        rbac_fix = (f"grant the webhook's ServiceAccount list and watch on the Lease "
                    f"{self._lease_name} (coordination.k8s.io) in namespace {self._namespace}, "
                    "or start the webhook with --gated-event-after 0")
        await mirror(self._cluster, LEASES, what="allocator Lease",
                     retry_delay=self._retry_delay, namespace=self._namespace,
                     field_selector=f"metadata.name={self._lease_name}",
                     listed=self._lease_listed, changed=self._observe,
                     deleted=lambda _: self._observe(None), rbac_fix=rbac_fix)

    def _lease_listed(self, items: list[Object]) -> None:
        found = [i for i in items if objects.name(i) == self._lease_name]
        self._observe(found[0] if found else None)

    def _observe(self, lease: Object | None) -> None:
        self.lease = lease_record(lease, namespace=self._namespace, name=self._lease_name,
                                  now=self._clock(), previous=self.lease)

    # ---- the pods, during an outage --------------------------------------------------------

    def _start_pods(self) -> None:
        if self.watching_pods:
            return
        self._pods = {}
        self._pods_synced = False
        rbac_fix = ("grant the webhook's ServiceAccount list and watch on pods (cluster-wide), "
                    "or start the webhook with --gated-event-after 0")
        self._pod_watch = asyncio.create_task(mirror(
            self._cluster, PODS, what="gated pods", retry_delay=self._retry_delay,
            field_selector="spec.nodeName=", listed=self._pods_listed, changed=self._pod_changed,
            deleted=self._pod_deleted, rbac_fix=rbac_fix), name="gated-pods")

    async def _stop_pods(self) -> None:
        task, self._pod_watch = self._pod_watch, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._pods = {}
        self._pods_synced = False

    def _pods_listed(self, items: list[Object]) -> None:
        self._pods = {p.uid: p for p in map(gated_pod, items) if p is not None}
        self._pods_synced = True

    def _pod_changed(self, obj: Object) -> None:
        pod = gated_pod(obj)
        if pod is None:
            self._pods.pop(objects.uid(obj), None)
        else:
            self._pods[pod.uid] = pod

    def _pod_deleted(self, obj: Object) -> None:
        self._pods.pop(objects.uid(obj), None)

"""Releasing a claim the allocator allocated, once no pod that owns or uses it is left.

A claim carrying the allocator's finalizer is released (allocation, reservedFor and device
status cleared through `/status`, then the finalizer and the shares annotation removed) once
every pod that owns or uses it is gone or finished. That is confirmed by reading the pod from
the API rather than trusting `reservedFor`, which the allocation reserves for its pod before
the pod runs. Writes are optimistic; a conflict rereads the claim and checks again that it is
still free.

This module must not allocate or plan; it applies each write it made to the claims' mirror
(`mirrorwrites`) and, when it wrote any, tells the pods waiting for room (`Unplaceable`).
"""

from __future__ import annotations

import copy
import logging

from dra_gateway.allocator.index import pods_naming
from dra_gateway.allocator.metrics import Metrics, Stats
from dra_gateway.allocator.mirrorwrites import observe_writes
from dra_gateway.allocator.unplaceable import Unplaceable
from dra_gateway.allocator.work import (
    MAX_WRITE_ATTEMPTS,
    ClaimKey,
    Fence,
    SyncResult,
    Write,
    unfenced,
)
from dra_gateway.allocator.writes import claim_metadata_patch
from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.port import Cluster, Conflict, NotFound, Object
from dra_gateway.kube.resources import PODS, RESOURCE_CLAIMS
from dra_gateway.kube.runtime.informer import Informer

log = logging.getLogger(__name__)

class ClaimReleaser:
    def __init__(self, cluster: Cluster, *, claims: Informer, pods: Informer,
                 unplaceable: Unplaceable, stats: Stats, metrics: Metrics,
                 fence: Fence = unfenced) -> None:
        self.cluster = cluster
        self.claims = claims
        self.pods = pods
        self.stats = stats
        self.metrics = metrics
        self.unplaceable = unplaceable  # the pods waiting for room, told when a release wrote
        self.fence = fence  # called before each write: a former leader must not release

    async def sync_claim(self, key: ClaimKey) -> SyncResult:
        claim = self.claims.get(key.namespace, key.name)
        if claim is None or not objects.has_finalizer(claim):
            return "done"
        if await self.in_use(claim):
            return "done"
        await self.release(claim)
        return "done"

    async def in_use(self, claim: Object) -> bool:
        """Is any pod that owns or uses the claim still there and not finished?"""
        ns = objects.namespace(claim)
        # uid -> name when known: the pods in the mirror that name the claim, then the claim's
        # own references (the pods' mirror may not have those pods, or no longer).
        candidates: dict[str, str | None] = {
            objects.uid(pod): objects.name(pod)
            for pod in pods_naming(self.pods, ClaimKey(*objects.namespace_name(claim)))}
        for reserved in objects.status(claim).get("reservedFor") or []:
            if reserved.get("resource") == "pods" and reserved.get("uid"):
                candidates[str(reserved["uid"])] = str(reserved.get("name") or "") or None
        owner_uid = objects.controller_owner_uid(claim)
        for ref in objects.owner_references(claim):
            if ref.get("uid") == owner_uid:
                candidates[str(owner_uid)] = str(ref.get("name") or "") or None
        for uid, pod_name in candidates.items():
            if pod_name is None:
                continue  # a uid we cannot look up by name was never a pod we saw
            live = self.pods.get(ns, pod_name)
            if live is not None and objects.uid(live) == uid:
                return True
            # Not in the mirror: confirm with the API before releasing anything.
            try:
                pod = await self.cluster.get(PODS, pod_name, namespace=ns)
            except NotFound:
                continue
            if objects.uid(pod) == uid and not objects.is_finished(pod):
                return True
        return False

    async def release(self, claim: Object, *, replanning: str | None = None) -> None:
        """Clear the claim's allocation, then drop the finalizer (and the shares annotation).

        `replanning`: the uid of a gated pod whose partial allocation the controller lets go
        of; a claim another consumer has reserved meanwhile is kept (the pod's own
        reservation, written with the allocation, is not a use).
        """
        ns, name = objects.namespace_name(claim)
        current = claim
        writes: list[Write] = []
        try:
            for _attempt in range(MAX_WRITE_ATTEMPTS):
                try:
                    if objects.is_allocated(current) or objects.status(current).get(
                            "reservedFor"):
                        updated = copy.deepcopy(current)
                        status = dict(updated.get("status") or {})
                        # reservedFor and device status are only valid with an allocation.
                        for stale in ("allocation", "reservedFor", "devices"):
                            status.pop(stale, None)
                        updated["status"] = status
                        base = objects.resource_version(current)
                        self.fence()
                        current = await self.cluster.update(RESOURCE_CLAIMS, updated,
                                                            namespace=ns, subresource="status")
                        writes.append((base, current))
                        self.stats.claims_released += 1
                        self.metrics.claims_released.inc()
                    base = objects.resource_version(current)
                    self.fence()
                    current = await self.cluster.patch(RESOURCE_CLAIMS, name, claim_metadata_patch(
                        current, keep_finalizer=False,
                        annotations={names.ANNOTATION_SHARES: None}), namespace=ns)
                    writes.append((base, current))
                    log.info("released", extra={"claim": f"{ns}/{name}"})
                    return
                except Conflict:
                    self.stats.conflicts += 1
                    self.metrics.conflicts.inc()
                    current = await self.cluster.get(RESOURCE_CLAIMS, name, namespace=ns)
                    if not objects.has_finalizer(current):
                        return
                    if replanning is not None:
                        if not objects.reserved_only_for(current, replanning):
                            return  # someone else uses it after all: keep it
                    elif await self.in_use(current):
                        return  # a pod picked the claim up meanwhile
        except NotFound:
            return
        finally:
            self._observe(writes)
        raise Conflict(f"ResourceClaim {ns}/{name} kept changing while being released")

    def _observe(self, writes: list[Write]) -> None:
        """Every write made, also when a release fails: into the claims' mirror, and capacity
        may have freed up for the pods waiting for room."""
        observe_writes(self.claims, writes)
        if writes:
            self.unplaceable.capacity_changed()


__all__ = ["ClaimReleaser"]

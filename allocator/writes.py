"""The allocator's writes of a plan: one claim's allocation, and the pod's gate removal.

A claim first gets the allocator's finalizer (and the planner's annotations) through the main
resource, then `status.allocation` through `/status`, reserved for the pod it was planned for
(`status.reservedFor`, in the same write): kube-scheduler's PreBind finds the claim reserved
and binds the pod without a write of its own, as it does for a claim it allocated itself. A
conflict rereads and tries again, and a claim deleted, replaced or allocated by someone else
meanwhile raises `Replan`. The gate is removed with a JSON patch that tests the pod's uid and
the gate's index, so that it never removes another gate or touches a recreated pod.

These functions write what they are given: they must not plan, and they leave the controller's
mirror and bookkeeping to the caller (every write made is appended to `writes`). Each write is
preceded by a call of the `fence`, which raises when this replica may no longer lead.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from dra_gateway.allocator.events import now
from dra_gateway.allocator.metrics import Metrics, Stats
from dra_gateway.allocator.work import MAX_WRITE_ATTEMPTS, Fence, PodKey, Write, unfenced
from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.port import Cluster, Conflict, NotFound, Object
from dra_gateway.kube.resources import PODS, RESOURCE_CLAIMS


class Replan(Exception):
    """The world changed under a plan (claim allocated elsewhere, deleted): plan again."""


def claim_metadata_patch(claim: Object, *, keep_finalizer: bool,
                         annotations: Mapping[str, str | None] | None = None) -> dict[str, Any]:
    """A merge patch of a claim's metadata alone: the gateway's finalizer kept (added) or
    dropped, `annotations` set (None removes one), fenced by the claim's resourceVersion (a
    Conflict when it changed meanwhile).

    Never a PUT of the whole claim: that sends its opaque config parameters re-encoded, and the
    API server, which compares them byte for byte, refuses the "change" of the immutable spec
    whenever their writer spaced or ordered the JSON otherwise (Python's json.dumps does).
    """
    present = list(objects.meta(claim).get("finalizers") or [])
    if keep_finalizer:
        finalizers = present if names.FINALIZER in present else [*present, names.FINALIZER]
    else:
        finalizers = [f for f in present if f != names.FINALIZER]
    meta: dict[str, Any] = {"resourceVersion": objects.resource_version(claim),
                            "finalizers": finalizers}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"metadata": meta}


async def write_allocation(cluster: Cluster, claim: Object, *, allocation: Mapping[str, Any],
                           annotations: Mapping[str, str], pod: Object, writes: list[Write],
                           stats: Stats, metrics: Metrics, fence: Fence = unfenced) -> None:
    """Finalizer and annotations, then status.allocation reserved for `pod`; conflicts reread
    and retry."""
    uid = objects.uid(claim)
    ns, name = objects.namespace_name(claim)
    # With binding conditions on (beta from 1.36) kube-scheduler fills a missing
    # allocationTimestamp at PreBind, and the API server refuses that change to an existing
    # allocation: the pod would never bind. Servers with the gates off drop the field.
    allocation = {**allocation, "allocationTimestamp": now()}
    current = claim
    for _attempt in range(MAX_WRITE_ATTEMPTS):
        if objects.uid(current) != uid or objects.is_deleting(current):
            raise Replan(f"ResourceClaim {ns}/{name} was deleted or replaced")
        if objects.is_allocated(current):
            # Allocation is immutable once set: accept whoever wrote it.
            raise Replan(f"ResourceClaim {ns}/{name} was allocated meanwhile")
        try:
            have = objects.annotations(current)
            if not objects.has_finalizer(current) or any(have.get(k) != v
                                                         for k, v in annotations.items()):
                base = objects.resource_version(current)
                fence()
                current = await cluster.patch(RESOURCE_CLAIMS, name, claim_metadata_patch(
                    current, keep_finalizer=True, annotations=annotations), namespace=ns)
                writes.append((base, current))
            updated = copy.deepcopy(current)
            # An unallocated claim has no reservations (the API refuses them without an
            # allocation): the pod is the first.
            updated["status"] = {**(updated.get("status") or {}), "allocation": allocation,
                                 "reservedFor": [{"resource": "pods", "name": objects.name(pod),
                                                  "uid": objects.uid(pod)}]}
            base = objects.resource_version(current)
            fence()
            current = await cluster.update(RESOURCE_CLAIMS, updated, namespace=ns,
                                           subresource="status")
            writes.append((base, current))
            stats.claims_allocated += 1
            metrics.claims_allocated.inc()
            return
        except Conflict:
            stats.conflicts += 1
            metrics.conflicts.inc()
            try:
                current = await cluster.get(RESOURCE_CLAIMS, name, namespace=ns)
            except NotFound as err:
                raise Replan(f"ResourceClaim {ns}/{name} was deleted") from err
        except NotFound as err:
            raise Replan(f"ResourceClaim {ns}/{name} was deleted") from err
    raise Conflict(f"ResourceClaim {ns}/{name} kept changing: gave up after "
                   f"{MAX_WRITE_ATTEMPTS} attempts")


def gate_index(pod: Object) -> int | None:
    """Where the gateway's gate sits in the pod's scheduling gates, if it does."""
    gates = objects.spec(pod).get("schedulingGates") or []
    return next((i for i, g in enumerate(gates) if g.get("name") == names.SCHEDULING_GATE),
                None)


async def still_allocated(cluster: Cluster, claims: Iterable[Object]) -> bool:
    """Every claim is still allocated, as the API (not the mirror) says."""
    for claim in claims:
        ns, name = objects.namespace_name(claim)
        try:
            fresh = await cluster.get(RESOURCE_CLAIMS, name, namespace=ns)
        except NotFound:
            return False
        if not objects.is_allocated(fresh) or objects.uid(fresh) != objects.uid(claim):
            return False
    return True


async def remove_gate(cluster: Cluster, key: PodKey, pod: Object, index: int, *,
                      fence: Fence = unfenced) -> Object:
    """Remove the gate at `index` if it is still there on the same pod; the pod as the API
    answered the patch.

    Raises NotFound when the pod is gone, Conflict or Invalid when the gate list moved or the
    pod was replaced.
    """
    gates = objects.spec(pod).get("schedulingGates") or []
    patch = [
        {"op": "test", "path": "/metadata/uid", "value": key.uid},
        {"op": "test", "path": f"/spec/schedulingGates/{index}", "value": gates[index]},
        {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
    ]
    fence()
    return await cluster.patch(PODS, key.name, patch, namespace=key.namespace,
                               patch_type="json")


__all__ = ["Replan", "gate_index", "remove_gate", "still_allocated", "write_allocation"]

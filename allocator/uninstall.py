"""`dra-gateway allocator --release-all`: let go of every claim before the gateway goes away.

The allocator puts its finalizer on each claim it allocates and removes it on release. Once the
chart is uninstalled nobody removes it, and a claim carrying it can never be deleted, nor can its
namespace. The chart's pre-delete hook runs this command with the allocator's ServiceAccount
after the allocator itself is gone (or standing by):

- a claim no live pod owns, uses or names has its allocation, reservedFor and device status
  cleared through `/status` (its devices go back to the pool, as the allocator's release does);
- every claim then loses the finalizer and the informational shares annotation. A claim a
  running pod still uses keeps its allocation: the pod runs on those devices, and the claim
  controller deletes a generated claim once its pod is gone.

Pods still behind the scheduling gate are left gated and counted: removing the gate would let
kube-scheduler allocate gateway devices with no allocator to apply the gateway's policies.

One list of claims and one of pods, then one or two writes per claim, each retried on a
conflict against a fresh read. It must not plan or allocate.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.port import Cluster, Conflict, NotFound, Object
from dra_gateway.kube.resources import PODS, RESOURCE_CLAIMS

log = logging.getLogger(__name__)

_ATTEMPTS = 5


@dataclass
class ReleaseSummary:
    """What --release-all did, for its one-line report and its tests."""

    released: list[str] = field(default_factory=list)  # allocation cleared, finalizer removed
    kept: list[str] = field(default_factory=list)  # in use: finalizer removed, allocation kept
    gated_pods: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)

    def text(self) -> str:
        out = (f"released {len(self.released)} claims no pod uses (allocation cleared, "
               f"finalizer {names.FINALIZER} removed); removed the finalizer from "
               f"{len(self.kept)} claims running pods still use (allocation kept)")
        if self.gated_pods:
            out += (f"; {len(self.gated_pods)} pods stay behind the scheduling gate "
                    f"{names.SCHEDULING_GATE} (delete them, or reinstall the gateway): "
                    + ", ".join(self.gated_pods[:10])
                    + (", ..." if len(self.gated_pods) > 10 else ""))
        if self.failed:
            out += f"; {len(self.failed)} claims kept changing, run it again: " \
                + ", ".join(self.failed)
        return out


def _users(pods: Iterable[Object]) -> tuple[set[str], set[tuple[str, str]]]:
    """UIDs of live pods, and (namespace, claim) pairs live pods name."""
    uids: set[str] = set()
    named: set[tuple[str, str]] = set()
    for pod in pods:
        if objects.is_finished(pod):
            continue
        uids.add(objects.uid(pod))
        ns = objects.namespace(pod)
        spec = pod.get("spec") or {}
        status = pod.get("status") or {}
        for entry in [*(spec.get("resourceClaims") or ()),
                      *(status.get("resourceClaimStatuses") or ())]:
            claim = entry.get("resourceClaimName") if isinstance(entry, dict) else None
            if isinstance(claim, str) and claim:
                named.add((ns, claim))
    return uids, named


def in_use(claim: Object, uids: set[str], named: set[tuple[str, str]]) -> bool:
    """Whether a live pod owns, reserves or names the claim."""
    if objects.namespace_name(claim) in named:
        return True
    reserved = {str(r.get("uid")) for r in objects.status(claim).get("reservedFor") or ()
                if isinstance(r, dict)}
    owners = {str(r.get("uid")) for r in objects.owner_references(claim)
              if r.get("kind") == "Pod"}
    return bool((reserved | owners) & uids)


async def _let_go(cluster: Cluster, claim: Object, *, clear: bool) -> bool:
    """Clear the allocation (with `clear`), then drop the finalizer; False when it kept
    conflicting. A claim gone meanwhile counts as done."""
    ns, name = objects.namespace_name(claim)
    current = claim
    for _ in range(_ATTEMPTS):
        try:
            if clear and (objects.is_allocated(current)
                          or objects.status(current).get("reservedFor")):
                updated = copy.deepcopy(current)
                status = dict(updated.get("status") or {})
                for stale in ("allocation", "reservedFor", "devices"):
                    status.pop(stale, None)
                updated["status"] = status
                current = await cluster.update(RESOURCE_CLAIMS, updated, namespace=ns,
                                               subresource="status")
            updated = copy.deepcopy(current)
            meta = updated["metadata"]
            meta["finalizers"] = [f for f in meta.get("finalizers") or ()
                                  if f != names.FINALIZER]
            annotations = dict(meta.get("annotations") or {})
            if annotations.pop(names.ANNOTATION_SHARES, None) is not None:
                meta["annotations"] = annotations
            await cluster.update(RESOURCE_CLAIMS, updated, namespace=ns)
            return True
        except Conflict:
            try:
                current = await cluster.get(RESOURCE_CLAIMS, name, namespace=ns)
            except NotFound:
                return True
            if not objects.has_finalizer(current):
                return True
        except NotFound:
            return True
    return False


async def release_all(cluster: Cluster) -> ReleaseSummary:
    """Release every claim carrying the allocator's finalizer (see the module docstring)."""
    summary = ReleaseSummary()
    pods = (await cluster.list(PODS)).items
    uids, named = _users(pods)
    for pod in pods:
        gates = (pod.get("spec") or {}).get("schedulingGates") or ()
        if any(isinstance(g, dict) and g.get("name") == names.SCHEDULING_GATE for g in gates):
            summary.gated_pods.append("/".join(objects.namespace_name(pod)))
    claims = (await cluster.list(RESOURCE_CLAIMS)).items
    for claim in sorted(claims, key=objects.namespace_name):
        if not objects.has_finalizer(claim):
            continue
        key = "/".join(objects.namespace_name(claim))
        used = in_use(claim, uids, named)
        if await _let_go(cluster, claim, clear=not used):
            (summary.kept if used else summary.released).append(key)
            log.info("claim let go", extra={"claim": key, "allocationKept": used})
        else:
            summary.failed.append(key)
    return summary

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

Every pod that still runs on a gateway claim (one carrying the finalizer or naming a gateway
class, allocated and in use) is named with its claims and node: those pods keep running and
keep their devices after the uninstall, and the administrator who removes the gateway must
know which workloads still sit on cards it placed (they are the ones to drain before the
cards are handed to another driver). The list is the same on every run, the first or a later
one by hand after the finalizers are gone, because it is read from the claims, not from what
this run changed.

One list of pods and two of claims (before the writes, and after them for the report), one
or two writes per claim, each retried on a conflict against a fresh read. It must not plan or
allocate.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from dra_gateway.allocator.writes import claim_metadata_patch
from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.port import Cluster, Conflict, NotFound, Object
from dra_gateway.kube.resources import PODS, RESOURCE_CLAIMS

log = logging.getLogger(__name__)

_ATTEMPTS = 5


@dataclass(frozen=True)
class PodOnClaims:
    """A live pod that still uses allocated gateway claims, which keep their allocations."""

    pod: str  # namespace/name
    claims: tuple[str, ...]  # namespace/name, sorted
    node: str  # where the pod is bound, "" while it is not

    def text(self) -> str:
        where = f" on node {self.node}" if self.node else ""
        return f"{self.pod}{where}: {', '.join(self.claims)}"


@dataclass
class ReleaseSummary:
    """What --release-all did, for its report and its tests."""

    released: list[str] = field(default_factory=list)  # allocation cleared, finalizer removed
    kept: list[str] = field(default_factory=list)  # in use: finalizer removed, allocation kept
    gated_pods: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    running: list[PodOnClaims] = field(default_factory=list)  # sorted by pod

    def text(self) -> str:
        """The one-line summary."""
        out = (f"released {len(self.released)} claims no pod uses (allocation cleared, "
               f"finalizer {names.FINALIZER} removed); removed the finalizer from "
               f"{len(self.kept)} claims running pods still use (allocation kept)")
        if self.running:
            out += (f"; {len(self.running)} pods still run on gateway claims, which keep their "
                    f"devices after the uninstall (one line each below)")
        if self.gated_pods:
            out += (f"; {len(self.gated_pods)} pods stay behind the scheduling gate "
                    f"{names.SCHEDULING_GATE} (delete them, or reinstall the gateway): "
                    + ", ".join(self.gated_pods[:10])
                    + (", ..." if len(self.gated_pods) > 10 else ""))
        if self.failed:
            out += f"; {len(self.failed)} claims kept changing, run it again: " \
                + ", ".join(self.failed)
        return out

    def lines(self) -> list[str]:
        """The summary, then a line per pod still running on gateway claims, with what to do:
        the report the chart's pre-delete Job leaves in its log."""
        out = [self.text()]
        if self.running:
            out.append("pods still running on gateway claims (NAMESPACE/POD on node NODE: "
                       "CLAIMS); they keep their devices until they end, and a claim a pod "
                       "names itself (resourceClaimName) keeps them until it is deleted:")
            out += [f"  {pod.text()}" for pod in self.running]
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


def _running_on_claims(pods: Iterable[Object], claims: Iterable[Object]) -> list[PodOnClaims]:
    """Each live pod that owns, reserves or names an allocated gateway claim, with those
    claims. A gateway claim: one with the allocator's finalizer, or one a gateway class names
    (allocated by the scheduler, or already let go by an earlier run)."""
    by_uid: dict[str, Object] = {}
    by_claim: dict[tuple[str, str], list[Object]] = {}
    for pod in pods:
        if objects.is_finished(pod):
            continue
        by_uid[objects.uid(pod)] = pod
        for claim_name in objects.claim_names_of(pod):
            by_claim.setdefault((objects.namespace(pod), claim_name), []).append(pod)
    held: dict[str, tuple[Object, set[str]]] = {}
    for claim in claims:
        if not objects.is_allocated(claim) or not (
                objects.has_finalizer(claim) or objects.is_gateway_claim(claim)):
            continue
        users = [by_uid[u] for u in objects.owner_and_reserved(claim) if u in by_uid]
        users += by_claim.get(objects.namespace_name(claim), [])
        for pod in users:
            key = "/".join(objects.namespace_name(pod))
            held.setdefault(key, (pod, set()))[1].add("/".join(objects.namespace_name(claim)))
    return [PodOnClaims(key, tuple(sorted(claim_keys)),
                        str(objects.spec(pod).get("nodeName") or ""))
            for key, (pod, claim_keys) in sorted(held.items())]


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
            await cluster.patch(RESOURCE_CLAIMS, name, claim_metadata_patch(
                current, keep_finalizer=False, annotations={names.ANNOTATION_SHARES: None}),
                namespace=ns)
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
    # Read again: the allocations this run cleared are no longer held.
    claims = (await cluster.list(RESOURCE_CLAIMS)).items
    summary.running = _running_on_claims(pods, claims)
    for running in summary.running:
        log.info("pod still runs on gateway claims",
                 extra={"pod": running.pod, "node": running.node,
                        "claims": list(running.claims)})
    return summary

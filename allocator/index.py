"""Which pods use which claims: indexes of the allocator's pod and claim mirrors, and lookups.

Three relations, each an index an informer keeps with its store (updated before the handler
hears of the change, rebuilt with every relist), so that none is kept by hand:

- `POD_UID` (pods): a pod under its uid, so that a uid (an owner reference, a `reservedFor`
  entry, a plan being written) finds the pod;
- `CLAIM_NAMED` (pods): a pod under each claim it names in `spec.resourceClaims` or its claim
  statuses (a `ClaimKey` in the pod's namespace), so that a claim's change wakes its pods;
- `HELD_BY` (claims): a claim under the uid of the pod that owns it (controller reference)
  and of each pod in its `reservedFor`, so that a pod's end queues the claims it held even
  when it never named them. The claim names a pod gone from the pods' mirror until the claim
  itself changes, so the relation outlives the pod, as the claims' mirror keeps it.

A deleted pod has left the pods' mirror and its indexes: the claims it named are read from
its last stored state, which the informer hands to the handler as `old`.

This module reads the mirrors it is given; it writes nothing and takes no decisions.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping

from dra_gateway.allocator.work import ClaimKey
from dra_gateway.kube import objects
from dra_gateway.kube.cluster.port import Object
from dra_gateway.kube.runtime.informer import IndexFunc, Informer

POD_UID = "pod-uid"
CLAIM_NAMED = "claim-named"
HELD_BY = "held-by-pod"


def pod_uid(pod: Object) -> Iterable[Hashable]:
    """The pods' mirror's index: a pod under its uid."""
    return (objects.uid(pod),)


def claims_named(pod: Object) -> Iterable[Hashable]:
    """The pods' mirror's index: a pod under each claim it names."""
    return names_of(pod)


def held_by(claim: Object) -> Iterable[Hashable]:
    """The claims' mirror's index: a claim under the uids of its owner and reserved pods."""
    return objects.owner_and_reserved(claim)


POD_INDEXERS: Mapping[str, IndexFunc] = {POD_UID: pod_uid, CLAIM_NAMED: claims_named}
CLAIM_INDEXERS: Mapping[str, IndexFunc] = {HELD_BY: held_by}


def names_of(pod: Object) -> set[ClaimKey]:
    """The claims a pod names (in its own namespace)."""
    ns = objects.namespace(pod)
    return {ClaimKey(ns, claim) for claim in objects.claim_names_of(pod)}


def pod_by_uid(pods: Informer, uid: str) -> Object | None:
    """The pod with this uid in the pods' mirror, or None."""
    found = pods.by_index(POD_UID, uid)
    return found[0] if found else None


def pods_naming(pods: Informer, key: ClaimKey) -> list[Object]:
    """The pods in the mirror that name a claim."""
    return pods.by_index(CLAIM_NAMED, key)


def users_of(pods: Informer, claim: Object) -> list[Object]:
    """The pods in the mirror that name, own or reserve a claim (owner and reservedFor as the
    object given says now), each once."""
    found = {objects.uid(pod): pod
             for pod in pods_naming(pods, ClaimKey(*objects.namespace_name(claim)))}
    for uid in objects.owner_and_reserved(claim):
        if uid not in found:
            pod = pod_by_uid(pods, uid)
            if pod is not None:
                found[uid] = pod
    return list(found.values())


def claims_of(claims: Informer, uid: str, pod: Object | None) -> set[ClaimKey]:
    """The claims a pod names, owns or is reserved in: those its state `pod` names (the last
    stored one for a deleted pod; None when unknown) and those in the claims' mirror that name
    the uid as their owner or in their reservedFor."""
    named = names_of(pod) if pod is not None and objects.uid(pod) == uid else set()
    return named | {ClaimKey(*objects.namespace_name(claim))
                    for claim in claims.by_index(HELD_BY, uid)}


__all__ = [
    "CLAIM_INDEXERS",
    "CLAIM_NAMED",
    "HELD_BY",
    "POD_INDEXERS",
    "POD_UID",
    "claims_named",
    "claims_of",
    "held_by",
    "names_of",
    "pod_by_uid",
    "pod_uid",
    "pods_naming",
    "users_of",
]

"""A gated pod's claims as the controller's mirror has them, and what the pod still waits for.

Pure: it reads the pod and looks claims up through the function it is given. It must not
write, plan, or decide what the controller does with a pod that waits.
"""

from __future__ import annotations

from collections.abc import Callable

from dra_gateway.kube import objects
from dra_gateway.kube.cluster.port import Object

ClaimLookup = Callable[[str, str], Object | None]
"""(namespace, name) -> the claim, or None when the mirror does not have it."""


def claims_for(pod: Object, lookup: ClaimLookup) -> tuple[list[Object], list[str]]:
    """The pod's claims, and what is still missing (as messages naming the pod's claim)."""
    ns = objects.namespace(pod)
    statuses = {str(s.get("name")): s.get("resourceClaimName")
                for s in objects.status(pod).get("resourceClaimStatuses") or []}
    claims: list[Object] = []
    waiting: list[str] = []
    for ref in objects.spec(pod).get("resourceClaims") or []:
        pod_claim = str(ref.get("name") or "")
        claim_name = ref.get("resourceClaimName")
        from_template = not claim_name
        if from_template:
            if pod_claim not in statuses:
                waiting.append(f"{pod_claim}: claim from template "
                               f"{ref.get('resourceClaimTemplateName')} not created yet")
                continue
            claim_name = statuses[pod_claim]
            if not claim_name:
                continue  # the claim controller decided no claim is needed
        claim = lookup(ns, str(claim_name))
        if claim is None:
            waiting.append(f"{pod_claim}: ResourceClaim {ns}/{claim_name} not found")
            continue
        if from_template and objects.controller_owner_uid(claim) != objects.uid(pod):
            waiting.append(f"{pod_claim}: ResourceClaim {ns}/{claim_name} is not owned by "
                           "this pod")
            continue
        if objects.is_deleting(claim):
            waiting.append(f"{pod_claim}: ResourceClaim {ns}/{claim_name} is being deleted")
            continue
        claims.append(claim)
    return claims, waiting


__all__ = ["ClaimLookup", "claims_for"]

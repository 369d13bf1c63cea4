"""Small typed views of raw Kubernetes objects, and the predicates the gateway reads them by.

Objects stay the plain JSON dicts the API server sends (hot paths pass them along unchanged);
these functions are the one place that knows where a field sits and what an absent or
malformed one means: `uid(obj)` instead of `(obj.get("metadata") or {}).get("uid")` in every
component. Every accessor tolerates a missing or mistyped parent and answers with the empty
value (`""`, `{}`, `[]`), as the API does for an unset field.

This module only reads: it must not modify, copy or validate an object, do I/O, or know the
cluster port (the pure translator and planner import it).
"""

# No `from __future__ import annotations`: it would shadow the accessor `annotations` below.
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any, Final, Literal

from dra_gateway.kube import names

RawObject = Mapping[str, Any]
_EMPTY: Mapping[str, Any] = {}


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else _EMPTY


# Metadata ---------------------------------------------------------------------------------------

def meta(obj: RawObject) -> Mapping[str, Any]:
    """`metadata`, or an empty mapping when it is missing or not an object."""
    return _mapping(obj.get("metadata"))


def name(obj: RawObject) -> str:
    return str(meta(obj).get("name") or "")


def namespace(obj: RawObject) -> str:
    """The namespace, "" for a cluster-scoped object (or one not yet defaulted)."""
    return str(meta(obj).get("namespace") or "")


def namespace_name(obj: RawObject) -> tuple[str, str]:
    m = meta(obj)
    return str(m.get("namespace") or ""), str(m.get("name") or "")


def uid(obj: RawObject) -> str:
    return str(meta(obj).get("uid") or "")


_UID: Final = re.compile(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-"
                         r"[0-9a-fA-F]{12}")


def is_uid(text: str) -> bool:
    """An object UID in RFC 4122 form, as the API server assigns them (safe in file names)."""
    return isinstance(text, str) and _UID.fullmatch(text) is not None


def resource_version(obj: RawObject) -> str:
    return str(meta(obj).get("resourceVersion") or "")


def annotations(obj: RawObject) -> Mapping[str, str]:
    return _mapping(meta(obj).get("annotations"))


def labels(obj: RawObject) -> Mapping[str, str]:
    return _mapping(meta(obj).get("labels"))


def finalizers(obj: RawObject) -> list[str]:
    found = meta(obj).get("finalizers")
    return list(found) if isinstance(found, list) else []


def owner_references(obj: RawObject) -> list[Mapping[str, Any]]:
    refs = meta(obj).get("ownerReferences")
    return [r for r in refs if isinstance(r, Mapping)] if isinstance(refs, list) else []


def is_deleting(obj: RawObject) -> bool:
    """Deletion has begun (`deletionTimestamp` is set): finalizers are all that hold it."""
    return bool(meta(obj).get("deletionTimestamp"))


# Spec and status --------------------------------------------------------------------------------

def spec(obj: RawObject) -> Mapping[str, Any]:
    return _mapping(obj.get("spec"))


def status(obj: RawObject) -> Mapping[str, Any]:
    return _mapping(obj.get("status"))


# Predicates the gateway's components agree on ---------------------------------------------------

def has_finalizer(obj: RawObject, finalizer: str = names.FINALIZER) -> bool:
    return finalizer in finalizers(obj)


def controller_owner_uid(obj: RawObject) -> str | None:
    """The uid of the Pod that controls the object (a claim made from a template), if any."""
    for ref in owner_references(obj):
        if ref.get("controller") and ref.get("kind") == "Pod" and ref.get("apiVersion") == "v1":
            return str(ref.get("uid") or "") or None
    return None


def pod_priority(pod: RawObject) -> int:
    """`spec.priority`, which the API server fills in from the pod's PriorityClass (0 without
    one, as the scheduler reads it)."""
    value = spec(pod).get("priority")
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def service_order(pod: RawObject) -> tuple[int, str, str]:
    """The order waiting pods are served in, as kube-scheduler's queue sorts them: highest
    priority first, then oldest (creationTimestamp, RFC 3339 in UTC, sorts as text)."""
    return (-pod_priority(pod), str(meta(pod).get("creationTimestamp") or ""), name(pod))


_LABEL_PREFIX: Final = re.compile(
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL_NAME: Final = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")


def is_label_key(text: str) -> bool:
    """A label key as the API server takes it: `name` or `prefix/name` (a DNS subdomain of at
    most 253 characters, a name of at most 63)."""
    prefix, slash, name = text.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _LABEL_PREFIX.match(prefix)):
        return False
    return bool(_LABEL_NAME.match(name))


def is_gated(pod: RawObject) -> bool:
    """The pod carries the gateway's scheduling gate."""
    gates = spec(pod).get("schedulingGates") or []
    return any(g.get("name") == names.SCHEDULING_GATE for g in gates)


def other_gates(pod: RawObject) -> list[str]:
    """The pod's scheduling gates other than the gateway's (Kueue's kueue.x-k8s.io/admission,
    KAI's, any other admission system holding the pod back)."""
    return [str(g.get("name")) for g in spec(pod).get("schedulingGates") or ()
            if isinstance(g, Mapping) and g.get("name") != names.SCHEDULING_GATE]


def waits_for_gateway(pod: RawObject) -> bool:
    """The gateway's gate is the last one left: the pod waits for the gateway alone."""
    return is_gated(pod) and not other_gates(pod)


def parse_time(value: Any) -> datetime | None:
    """A metav1.Time or MicroTime (RFC 3339) as written in an object or a record, or None when
    unset or unreadable (a time without a zone is read as UTC)."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return None
    return moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)


def stamp(moment: datetime) -> str:
    """A metav1.Time: UTC, to the second."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


FINISHED_PHASES = frozenset({"Succeeded", "Failed"})


def is_finished(pod: RawObject) -> bool:
    """The pod has succeeded or failed: it will not run again."""
    return status(pod).get("phase") in FINISHED_PHASES


# What an entry of a pod's spec.resourceClaims is made from: a template or a claim, by name.
ClaimSource = tuple[Literal["template", "claim"], str]
# The kind of object each source names.
CLAIM_SOURCE_KINDS: Final = {"template": "ResourceClaimTemplate", "claim": "ResourceClaim"}


def claim_source(entry: Any) -> ClaimSource | None:
    """What an entry of a pod's spec.resourceClaims is made from: its resourceClaimTemplateName
    first, then its resourceClaimName; None for an entry naming neither (or not an object).
    The translator and the webhook both read a pod's own claims by this one rule."""
    if not isinstance(entry, dict):
        return None
    template = entry.get("resourceClaimTemplateName")
    if isinstance(template, str):
        return "template", template
    claim = entry.get("resourceClaimName")
    if isinstance(claim, str):
        return "claim", claim
    return None


def claim_names_of(pod: RawObject) -> set[str]:
    """Names of the claims a pod refers to, directly or through its claim statuses."""
    found: set[str] = set()
    for ref in spec(pod).get("resourceClaims") or []:
        if ref.get("resourceClaimName"):
            found.add(str(ref["resourceClaimName"]))
    for entry in status(pod).get("resourceClaimStatuses") or []:
        if entry.get("resourceClaimName"):
            found.add(str(entry["resourceClaimName"]))
    return found


def is_allocated(claim: RawObject) -> bool:
    return bool(status(claim).get("allocation"))


def reserved_only_for(claim: RawObject, pod_uid: str) -> bool:
    """Whether no consumer but the pod (or none) has the claim reserved."""
    return all(r.get("uid") == pod_uid for r in status(claim).get("reservedFor") or ())


def request_classes(claim: RawObject) -> set[str]:
    """Device classes named by a claim's requests (exactly and firstAvailable)."""
    classes: set[str] = set()
    for request in _mapping(spec(claim).get("devices")).get("requests") or []:
        exactly = request.get("exactly") or {}
        if exactly.get("deviceClassName"):
            classes.add(exactly["deviceClassName"])
        for sub in request.get("firstAvailable") or []:
            if sub.get("deviceClassName"):
                classes.add(sub["deviceClassName"])
    return classes


def is_gateway_claim(claim: RawObject) -> bool:
    """A claim the allocator serves: one of its requests names a gateway device class."""
    return bool(request_classes(claim) & names.GATEWAY_CLASSES)


def reserved_pod_uids(claim: RawObject) -> set[str]:
    """Uids of the pods in a claim's `status.reservedFor`."""
    return {str(r["uid"]) for r in status(claim).get("reservedFor") or []
            if r.get("resource") == "pods" and r.get("uid")}


def owner_and_reserved(claim: RawObject) -> set[str]:
    """Uids of the pods that own a claim or are in its `reservedFor`."""
    uids = reserved_pod_uids(claim)
    owner = controller_owner_uid(claim)
    if owner:
        uids.add(owner)
    return uids


def allocation_node(allocation: RawObject) -> str | None:
    """The node a node-local allocation names (`matchFields metadata.name In [node]`)."""
    for term in _mapping(allocation.get("nodeSelector")).get("nodeSelectorTerms") or []:
        for requirement in term.get("matchFields") or []:
            if (requirement.get("key") == "metadata.name" and requirement.get("operator") == "In"
                    and len(requirement.get("values") or []) == 1):
                return str(requirement["values"][0])
    return None


__all__ = [
    "FINISHED_PHASES",
    "RawObject",
    "allocation_node",
    "annotations",
    "claim_names_of",
    "controller_owner_uid",
    "finalizers",
    "has_finalizer",
    "is_allocated",
    "is_deleting",
    "is_finished",
    "is_gated",
    "is_gateway_claim",
    "is_uid",
    "labels",
    "meta",
    "name",
    "namespace",
    "namespace_name",
    "owner_and_reserved",
    "owner_references",
    "request_classes",
    "reserved_only_for",
    "reserved_pod_uids",
    "resource_version",
    "spec",
    "status",
    "uid",
]

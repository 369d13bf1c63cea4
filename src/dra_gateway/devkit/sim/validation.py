"""What the API server checks and resets on a write, for the handful of rules the components
depend on: object names (RFC 1123), immutable fields and the ResourceClaim `reservedFor` rules,
scheduling gates that may only be removed, finalizers on an object being deleted, and the status
a new object starts with (a gated pod's PodScheduled condition says SchedulingGated).

Each check returns the `FieldError`s it found (empty when the write is valid) for the store to
raise as one Invalid; nothing here raises or stores anything.
"""

from __future__ import annotations

import re

from dra_gateway.devkit.sim.errors import FieldError, render
from dra_gateway.kube.cluster.port import Object
from dra_gateway.kube.resources import NAMESPACES, PODS, RESOURCE_CLAIMS, ResourceType

_MAX_RESERVED_FOR = 256  # ResourceClaimReservedForMaxSize
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def validate_name(rt: ResourceType, name: str) -> list[FieldError]:
    """A namespace name must be an RFC 1123 label, any other name an RFC 1123 subdomain."""
    pattern = _DNS_LABEL if rt is NAMESPACES else _DNS_SUBDOMAIN
    limit = 63 if rt is NAMESPACES else 253
    if len(name) > limit or not pattern.match(name):
        what = "RFC 1123 label" if rt is NAMESPACES else "RFC 1123 subdomain"
        chars = "'-'" if rt is NAMESPACES else "'-' or '.'"
        return [FieldError("metadata.name", "Invalid",
                           f"a lowercase {what} must consist of lower case alphanumeric "
                           f"characters, {chars}, must start "
                           f"and end with an alphanumeric character and be at most {limit} "
                           "characters", name)]
    return []


def validate_update(rt: ResourceType, old: Object, new: Object,
                    subresource: str | None) -> list[FieldError]:
    """What the API server refuses in an update (or a status update) from `old` to `new`."""
    errors: list[FieldError] = []
    old_meta, new_meta = old["metadata"], new["metadata"]
    if old_meta.get("deletionTimestamp"):
        added = [f for f in new_meta.get("finalizers") or []
                 if f not in (old_meta.get("finalizers") or [])]
        if added:
            errors.append(FieldError(
                "metadata.finalizers", "Forbidden",
                f"no new finalizers can be added if the object is being deleted, found new "
                f"finalizers {render(added)}"))
    if rt is RESOURCE_CLAIMS:
        if subresource is None and new.get("spec") != old.get("spec"):
            errors.append(FieldError("spec", "Invalid", "field is immutable", new.get("spec")))
        old_status, new_status = old.get("status") or {}, new.get("status") or {}
        old_alloc, new_alloc = old_status.get("allocation"), new_status.get("allocation")
        if old_alloc is not None and new_alloc is not None and old_alloc != new_alloc:
            errors.append(FieldError("status.allocation", "Invalid", "field is immutable",
                                     new_alloc))
        reserved = new_status.get("reservedFor") or []
        if reserved and new_alloc is None:
            errors.append(FieldError("status.reservedFor", "Forbidden",
                                     "may not be specified when `allocated` is not set"))
        if len(reserved) > _MAX_RESERVED_FOR:
            errors.append(FieldError("status.reservedFor", "Invalid",
                                     f"must have at most {_MAX_RESERVED_FOR} items",
                                     len(reserved)))
        if old["metadata"].get("deletionTimestamp"):
            before = {r.get("uid") for r in old_status.get("reservedFor") or []}
            if any(r.get("uid") not in before for r in reserved):
                errors.append(FieldError("status.reservedFor", "Forbidden",
                                         "new entries may not be added while "
                                         "`deletionTimestamp` is set"))
    if rt is PODS and subresource is None:
        old_spec, new_spec = old.get("spec") or {}, new.get("spec") or {}
        old_gates = {g.get("name") for g in old_spec.get("schedulingGates") or []}
        for i, gate in enumerate(new_spec.get("schedulingGates") or []):
            if gate.get("name") not in old_gates:
                errors.append(FieldError(
                    f"spec.schedulingGates[{i}].name", "Forbidden",
                    f"only deletion is allowed, but found new scheduling gate "
                    f"'{gate.get('name')}'"))
        if old_spec.get("resourceClaims") != new_spec.get("resourceClaims"):
            errors.append(FieldError("spec.resourceClaims", "Invalid", "field is immutable",
                                     new_spec.get("resourceClaims")))
    return errors


def prepare_create_status(rt: ResourceType, obj: Object) -> None:
    """Drop client-set status where the API server does (pods start Pending, claims empty)."""
    if rt is PODS:
        obj["status"] = {"phase": "Pending"}
        if (obj.get("spec") or {}).get("schedulingGates"):
            # As the API server's pod strategy does on create (applySchedulingGatedCondition):
            # kubectl's STATUS column reads SchedulingGated from it.
            obj["status"]["conditions"] = [{
                "type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
                "message": "Scheduling is blocked due to non-empty scheduling gates"}]
    elif rt is RESOURCE_CLAIMS:
        obj.pop("status", None)
    elif rt is NAMESPACES:
        obj["status"] = {"phase": "Active"}

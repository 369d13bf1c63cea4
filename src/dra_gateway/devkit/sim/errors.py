"""The API server's refusals, worded as it words them: NotFound, AlreadyExists, Conflict and
Invalid with its field causes, each carrying the `metav1.Status` a real API server would send.

The in-memory cluster raises these so that a component meets the same messages, reasons and
`details` on the simulator as on a real cluster (tests assert them word for word). This module
only builds errors: it must not decide when a write is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import orjson

from dra_gateway.kube.cluster.port import AlreadyExists, ApiError, Conflict, Invalid, NotFound
from dra_gateway.kube.resources import ResourceType


def resource_name(rt: ResourceType) -> str:
    """`pods` or `resourceclaims.resource.k8s.io`, as API server messages name a resource."""
    return f"{rt.plural}.{rt.group}" if rt.group else rt.plural


def kind_name(rt: ResourceType) -> str:
    """`Pod` or `ResourceClaim.resource.k8s.io`, as Invalid messages name a kind."""
    return f"{rt.kind}.{rt.group}" if rt.group else rt.kind


def not_found(rt: ResourceType, name: str) -> NotFound:
    message = f'{resource_name(rt)} "{name}" not found'
    return NotFound(message, status=_status(NotFound, message, rt, name))


def already_exists(rt: ResourceType, name: str) -> AlreadyExists:
    message = f'{resource_name(rt)} "{name}" already exists'
    return AlreadyExists(message, status=_status(AlreadyExists, message, rt, name))


def conflict(rt: ResourceType, name: str, why: str | None = None) -> Conflict:
    why = why or ("the object has been modified; please apply your changes to the latest "
                  "version and try again")
    message = f'Operation cannot be fulfilled on {resource_name(rt)} "{name}": {why}'
    return Conflict(message, status=_status(Conflict, message, rt, name))


@dataclass(frozen=True, slots=True)
class FieldError:
    """One cause of an Invalid response, worded like apimachinery's field.Error."""

    field: str
    kind: Literal["Invalid", "Forbidden", "Required", "Duplicate", "NotSupported", "TooLong",
                  "TooMany"]
    detail: str
    value: Any = None

    def __str__(self) -> str:
        if self.kind == "Invalid":
            return f"{self.field}: Invalid value: {render(self.value)}: {self.detail}"
        if self.kind == "Required":
            return f"{self.field}: Required value" + (f": {self.detail}" if self.detail else "")
        if self.kind == "NotSupported":
            return f"{self.field}: Unsupported value: {render(self.value)}: {self.detail}"
        if self.kind == "Duplicate":
            return f"{self.field}: Duplicate value: {render(self.value)}"
        if self.kind == "TooLong":
            return f"{self.field}: Too long: {self.detail}"
        if self.kind == "TooMany":
            return f"{self.field}: Too many: {render(self.value)}: {self.detail}"
        return f"{self.field}: {self.kind}: {self.detail}"

    @property
    def reason(self) -> str:
        return {"Invalid": "FieldValueInvalid", "Forbidden": "FieldValueForbidden",
                "Required": "FieldValueRequired", "Duplicate": "FieldValueDuplicate",
                "NotSupported": "FieldValueNotSupported", "TooLong": "FieldValueTooLong",
                "TooMany": "FieldValueTooMany"}[self.kind]


def render(value: Any) -> str:
    """A value as field errors quote it (JSON, keys sorted)."""
    if isinstance(value, str):
        return orjson.dumps(value).decode()
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def invalid(rt: ResourceType, name: str, errors: list[FieldError]) -> Invalid:
    joined = str(errors[0]) if len(errors) == 1 else "[" + ", ".join(map(str, errors)) + "]"
    message = f'{kind_name(rt)} "{name}" is invalid: {joined}'
    status = _status(Invalid, message, rt, name)
    status["details"]["causes"] = [
        {"reason": e.reason, "message": str(e).split(": ", 1)[1], "field": e.field}
        for e in errors
    ]
    return Invalid(message, status=status)


def _status(cls: type[ApiError], message: str, rt: ResourceType, name: str) -> dict[str, Any]:
    details: dict[str, Any] = {"name": name, "kind": rt.plural}
    if rt.group:
        details["group"] = rt.group
    if cls is Invalid:
        details["kind"] = rt.kind
    return {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
            "message": message, "reason": cls.reason, "details": details, "code": cls.code}

"""The protocol every component uses to read and write Kubernetes, and its error types.

Objects cross the port as plain JSON-shaped dicts (what the API server sends), so hot paths
never pay for model conversion. Errors wrap the Kubernetes `Status`: callers see the HTTP code,
the reason (`NotFound`, `AlreadyExists`, `Conflict`, `Expired`, `Invalid`) and the message.
This module must not import a client library.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

from dra_gateway.kube.resources import ResourceType

Object = dict[str, Any]
PatchType = Literal["json", "merge", "strategic"]
EventType = Literal["ADDED", "MODIFIED", "DELETED", "BOOKMARK"]
# The API group versions a server serves: group ("" for the core group) to its versions.
ServedVersions = dict[str, list[str]]


class ApiError(Exception):
    """A Kubernetes API failure: `code` and `reason` as in a metav1.Status."""

    code: int = 500
    reason: str = "InternalError"

    def __init__(self, message: str, *, code: int | None = None, reason: str | None = None,
                 status: Mapping[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        if reason is not None:
            self.reason = reason
        self.status: dict[str, Any] = dict(status) if status else self.to_status()

    def to_status(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Status",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }

    @staticmethod
    def from_status(status: Mapping[str, Any], *, code: int | None = None) -> ApiError:
        """The error subclass matching a Status body (falls back on the HTTP code)."""
        reason = str(status.get("reason") or "")
        status_code = int(status.get("code") or code or 500)
        message = str(status.get("message") or reason or f"HTTP {status_code}")
        for cls in (NotFound, AlreadyExists, Conflict, Expired, Invalid, BadRequest, Forbidden,
                    TooManyRequests):
            if reason == cls.reason:
                return cls(message, status=status)
        by_code: dict[int, type[ApiError]] = {404: NotFound, 410: Expired, 422: Invalid,
                                               400: BadRequest, 403: Forbidden,
                                               429: TooManyRequests}
        if status_code in by_code:
            return by_code[status_code](message, status=status)
        if status_code == 409:
            return Conflict(message, status=status)
        return ApiError(message, code=status_code, reason=reason or "InternalError",
                        status=status)


class NotFound(ApiError):
    code = 404
    reason = "NotFound"


class AlreadyExists(ApiError):
    code = 409
    reason = "AlreadyExists"


class Conflict(ApiError):
    """Optimistic concurrency failed: the object changed since the resourceVersion sent."""

    code = 409
    reason = "Conflict"


class Expired(ApiError):
    """A watch or list continued from a resourceVersion the server no longer has: relist."""

    code = 410
    reason = "Expired"


class Invalid(ApiError):
    code = 422
    reason = "Invalid"


class BadRequest(ApiError):
    code = 400
    reason = "BadRequest"


class TooManyRequests(ApiError):
    """429: for an eviction, a PodDisruptionBudget allows no disruption now."""

    code = 429
    reason = "TooManyRequests"


class Forbidden(ApiError):
    code = 403
    reason = "Forbidden"


class NotKubernetes(ApiError):
    """The endpoint answers, but not as a Kubernetes API server (or one without an API group the
    command needs): said with what it answered instead."""

    reason = "NotKubernetes"


@dataclass(frozen=True, slots=True)
class ObjectList:
    items: list[Object]
    resource_version: str


@dataclass(frozen=True, slots=True)
class WatchEvent:
    type: EventType
    object: Object = field(repr=False)


class Cluster(Protocol):
    """Everything the project reads and writes in Kubernetes.

    `namespace` is required for namespaced types on get/create/update/patch/delete and optional
    on list/watch (None = all namespaces). Selectors use Kubernetes syntax
    (`a=b,c!=d,e in (x,y),!f`; field selectors `metadata.name=x,spec.nodeName=n`).
    `update` sends the object's `metadata.resourceVersion`; a stale one raises Conflict.
    """

    async def get(self, rt: ResourceType, name: str, *, namespace: str | None = None) -> Object:
        ...

    async def list(self, rt: ResourceType, *, namespace: str | None = None,
                   label_selector: str | None = None,
                   field_selector: str | None = None) -> ObjectList:
        ...

    def watch(self, rt: ResourceType, *, namespace: str | None = None,
              resource_version: str | None = None, label_selector: str | None = None,
              field_selector: str | None = None,
              timeout_seconds: float | None = None) -> AsyncIterator[WatchEvent]:
        """Events after `resource_version`, in order; raises Expired when it is too old."""
        ...

    async def create(self, rt: ResourceType, obj: Object, *, namespace: str | None = None,
                     dry_run: bool = False) -> Object:
        ...

    async def update(self, rt: ResourceType, obj: Object, *, namespace: str | None = None,
                     subresource: str | None = None) -> Object:
        """Replace the object (or its `status` with subresource="status")."""
        ...

    async def patch(self, rt: ResourceType, name: str, patch: Any, *,
                    namespace: str | None = None, patch_type: PatchType = "merge",
                    subresource: str | None = None) -> Object:
        ...

    async def delete(self, rt: ResourceType, name: str, *, namespace: str | None = None,
                     resource_version: str | None = None) -> Object | None:
        """Delete; with finalizers present the object is returned carrying deletionTimestamp.

        `resource_version` is a precondition: a different current one raises Conflict.
        """
        ...

    async def evict(self, name: str, *, namespace: str, uid: str | None = None) -> None:
        """Evict a pod through the Eviction API (policy/v1): PodDisruptionBudgets decide, a
        refusal raises TooManyRequests. `uid` is a precondition: another pod of the same name
        raises Conflict."""
        ...

    async def server_time(self) -> datetime:
        """The API server's clock, as the `Date` header of its answer to a cheap request: UTC,
        truncated to the second (an HTTP date carries no fraction). A time that decides an
        outcome on the cluster (a clear, a hold) is the cluster's, never the caller's machine's:
        `kube.cluster.clock` reads a finer one from this."""
        ...

    async def close(self) -> None:
        ...


@runtime_checkable
class Discovery(Protocol):
    """What an API server says about itself, for commands that check a cluster for a person
    (`dra-gateway preflight`). Apart from `Cluster`, which every component and stand-in
    implements: a cluster without it is one whose version and groups are not known."""

    async def server_version(self) -> Object:
        """GET /version: `gitVersion`, `major`, `minor`, ... (readable by every client)."""
        ...

    async def served_versions(self) -> ServedVersions:
        """The API group versions served (GET /api, /apis): group ("" for the core group) to
        its versions, the preferred first."""
        ...

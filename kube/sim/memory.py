"""An in-memory Kubernetes API with the semantics the project relies on.

`MemoryCluster` implements the `Cluster` port: one global, monotonically increasing
resourceVersion; uid, creationTimestamp and generation; AlreadyExists, NotFound and Conflict
worded as the API server words them; generateName; the `/status` subresource; JSON, merge and
(simplified) strategic-merge patches; finalizers and deletionTimestamp; label and field
selectors; watches that replay a bounded history in order and expire with 410; dry run; the
handful of validations the components depend on; and owner-reference garbage collection.

It backs the tests, the benchmarks and, served by `server.py`, the embedded default. It must not
do I/O, and it must never hand out or keep a reference a caller could mutate: objects are copied
on the way in and on the way out. Every operation runs without awaiting between reading and
writing state, so concurrent asyncio callers see each write as atomic.

Deliberate simplifications, each documented where it happens:
- namespaces need not exist before objects are created in them, and deleting one leaves its
  contents alone;
- pods are deleted at once (there is no kubelet to honour a grace period);
- a strategic merge patch merges lists by key only for the fields listed in `_MERGE_KEYS`
  (by field name, whatever the type) and unions `finalizers`; other lists are replaced;
- garbage collection runs synchronously when an owner is deleted; dependents whose owners never
  existed are left alone.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

import jsonpatch  # type: ignore[import-untyped,unused-ignore]
import orjson

from dra_gateway.kube.cluster.port import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Conflict,
    EventType,
    Expired,
    Invalid,
    NotFound,
    Object,
    ObjectList,
    PatchType,
    WatchEvent,
)
from dra_gateway.kube.resources import (
    NAMESPACES,
    PODS,
    RESOURCE_CLAIMS,
    ResourceType,
    by_kind,
)
from dra_gateway.kube.sim.selectors import (
    FieldSelector,
    LabelSelector,
    parse_field_selector,
    parse_label_selector,
)

Key = tuple[str, str]  # (namespace or "", name)

DEFAULT_HISTORY = 1000
# The alphabet and length Kubernetes uses for generateName suffixes (no vowels, no look-alikes).
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_SUFFIX_LENGTH = 5
_MAX_RESERVED_FOR = 256  # ResourceClaimReservedForMaxSize
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_RV_ON_CREATE = "resourceVersion should not be set on objects to be created"
# Set by the API server, never taken from a client's update.
_SYSTEM_METADATA = ("uid", "creationTimestamp", "deletionTimestamp",
                    "deletionGracePeriodSeconds", "generation", "resourceVersion")


def _now() -> datetime:
    return datetime.now(UTC)


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def copy_object(obj: Any) -> Any:
    """A deep copy of a JSON value (an orjson round trip: several times faster than deepcopy)."""
    try:
        return orjson.loads(orjson.dumps(obj))
    except TypeError as exc:
        raise BadRequest(f"the object is not valid JSON: {exc}") from None


def _copy(obj: Object) -> Object:
    copied: Object = copy_object(obj)
    return copied


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
    kind: Literal["Invalid", "Forbidden", "Required", "Duplicate", "NotSupported"]
    detail: str
    value: Any = None

    def __str__(self) -> str:
        if self.kind == "Invalid":
            return f"{self.field}: Invalid value: {_render(self.value)}: {self.detail}"
        if self.kind == "Required":
            return f"{self.field}: Required value" + (f": {self.detail}" if self.detail else "")
        return f"{self.field}: {self.kind}: {self.detail}"

    @property
    def reason(self) -> str:
        return {"Invalid": "FieldValueInvalid", "Forbidden": "FieldValueForbidden",
                "Required": "FieldValueRequired", "Duplicate": "FieldValueDuplicate",
                "NotSupported": "FieldValueNotSupported"}[self.kind]


def _render(value: Any) -> str:
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


# Patches ---------------------------------------------------------------------------------------

def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy_object(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# Lists a strategic merge patch merges by key, by field name. Field names are not unique across
# types in general, but they are for the types this project patches (pods, nodes, claims).
_MERGE_KEYS: dict[str, str] = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name",
    "env": "name", "volumes": "name", "volumeMounts": "mountPath", "ports": "containerPort",
    "resourceClaims": "name", "schedulingGates": "name", "imagePullSecrets": "name",
    "ownerReferences": "uid", "conditions": "type", "reservedFor": "uid",
    "resourceClaimStatuses": "name", "taints": "key",
}
# Primitive lists with patchStrategy=merge: the patch's items are added to the existing ones.
_MERGE_SETS = frozenset({"finalizers"})


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch limited to the list fields of `_MERGE_KEYS` and `_MERGE_SETS`.

    Supports the `$patch: delete|replace` directives and `$deleteFromPrimitiveList/<field>`;
    `$setElementOrder/<field>` and `$retainKeys` are accepted and ignored (order is kept as the
    merge produces it).
    """
    if not isinstance(patch, dict):
        return copy_object(patch)
    if patch.get("$patch") == "replace":
        return {k: copy_object(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result: dict[str, Any] = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            drop = set(value) if isinstance(value, list) else set()
            if isinstance(result.get(name), list):
                result[name] = [v for v in result[name] if v not in drop]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in _MERGE_KEYS and isinstance(result.get(key), list):
            result[key] = _merge_keyed_list(result[key], value, _MERGE_KEYS[key])
        elif isinstance(value, list) and key in _MERGE_SETS and isinstance(result.get(key), list):
            merged = list(result[key])
            merged.extend(v for v in value if v not in merged)
            result[key] = merged
        elif isinstance(value, dict):
            merged_value = strategic_merge_patch(result.get(key), value)
            if merged_value is None:
                result.pop(key, None)
            else:
                result[key] = merged_value
        else:
            result[key] = copy_object(value)
    return result


def _merge_keyed_list(current: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    merged = list(current)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise BadRequest(f"strategic merge patch: every item of a list merged by "
                             f"'{merge_key}' needs a '{merge_key}' (found {_render(item)})")
        position = next((i for i, have in enumerate(merged)
                         if isinstance(have, dict) and have.get(merge_key) == item[merge_key]),
                        None)
        if item.get("$patch") == "delete":
            if position is not None:
                del merged[position]
        elif position is None:
            merged.append({k: copy_object(v) for k, v in item.items() if k != "$patch"})
        else:
            merged[position] = strategic_merge_patch(merged[position], item)
    return merged


def apply_patch(obj: Object, patch: Any, patch_type: PatchType) -> Object:
    """The object after `patch`; BadRequest for a malformed patch, Invalid for a failed test."""
    if patch_type == "json":
        if not isinstance(patch, list):
            raise BadRequest("a JSON patch (RFC 6902) must be a list of operations, "
                             f"got {type(patch).__name__}")
        try:
            result = jsonpatch.JsonPatch(patch).apply(obj)
        except jsonpatch.JsonPatchTestFailed as exc:
            raise Invalid(f"the JSON patch test operation failed: {exc}") from None
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, KeyError,
                IndexError, TypeError, ValueError) as exc:
            raise BadRequest(f"the JSON patch (RFC 6902) cannot be applied: {exc}") from None
    elif patch_type in ("merge", "strategic"):
        if not isinstance(patch, dict):
            raise BadRequest(f"a {patch_type} patch must be a JSON object, "
                             f"got {type(patch).__name__}")
        merge = merge_patch if patch_type == "merge" else strategic_merge_patch
        result = merge(obj, patch)
    else:
        raise BadRequest(f"unsupported patch type {patch_type!r}: use json, merge or strategic")
    if not isinstance(result, dict):
        raise BadRequest("the patch does not leave a JSON object")
    return result


# Validation ------------------------------------------------------------------------------------

def _validate_name(rt: ResourceType, name: str) -> list[FieldError]:
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


def _validate_update(rt: ResourceType, old: Object, new: Object,
                     subresource: str | None) -> list[FieldError]:
    errors: list[FieldError] = []
    old_meta, new_meta = old["metadata"], new["metadata"]
    if old_meta.get("deletionTimestamp"):
        added = [f for f in new_meta.get("finalizers") or []
                 if f not in (old_meta.get("finalizers") or [])]
        if added:
            errors.append(FieldError(
                "metadata.finalizers", "Forbidden",
                f"no new finalizers can be added if the object is being deleted, found new "
                f"finalizers {_render(added)}"))
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


def _prepare_create_status(rt: ResourceType, obj: Object) -> None:
    """Drop client-set status where the API server does (pods start Pending, claims empty)."""
    if rt is PODS:
        obj["status"] = {"phase": "Pending"}
    elif rt is RESOURCE_CLAIMS:
        obj.pop("status", None)
    elif rt is NAMESPACES:
        obj["status"] = {"phase": "Active"}


def _spec_of(obj: Object) -> dict[str, Any]:
    """Everything generation counts: the object less metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


# Watches ---------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Event:
    rv: int
    type: EventType
    obj: Object  # stored state: never mutated, copied before it leaves
    old: Object | None  # the previous state, for selector transitions on MODIFIED


class _Expire:
    """Sentinel put in a watch queue by `expire_watches`."""


class _Close:
    """Sentinel put in a watch queue by `close`: the watch ends normally."""


@dataclass(eq=False)
class _Watch:
    rt: ResourceType
    queue: asyncio.Queue[_Event | _Expire | _Close] = field(default_factory=asyncio.Queue)


@dataclass(frozen=True, slots=True)
class _Filter:
    namespace: str | None
    labels: LabelSelector
    fields: FieldSelector

    def matches(self, obj: Object | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        return self.labels.matches(meta.get("labels")) and self.fields.matches(obj)

    def translate(self, event: _Event) -> tuple[EventType, Object] | None:
        """The event this watcher sees: objects moving in or out of the selection become
        ADDED or DELETED, as the API server's watch cache reports them."""
        now = self.matches(event.obj)
        if event.type == "MODIFIED":
            before = self.matches(event.old)
            if now and before:
                return "MODIFIED", event.obj
            if now:
                return "ADDED", event.obj
            if before:
                return "DELETED", event.obj
            return None
        return (event.type, event.obj) if now else None


class MemoryCluster:
    """The `Cluster` port in memory. See the module docstring for what it simplifies.

    `history` bounds the watch events retained per resource type; a watch from a
    resourceVersion older than the retained window raises Expired. `clock` gives timestamps.
    """

    def __init__(self, *, history: int = DEFAULT_HISTORY, garbage_collection: bool = True,
                 clock: Callable[[], datetime] = _now) -> None:
        if history < 1:
            raise ValueError(f"history must keep at least one event, got {history}")
        self._history_limit = history
        self._gc = garbage_collection
        self._clock = clock
        # Starts above 0: a list of an empty cluster must return a version a watch can resume
        # from, and "0" means "any version" to a watch.
        self._rv = 1
        self._store: dict[ResourceType, dict[Key, Object]] = {}
        self._history: dict[ResourceType, deque[_Event]] = {}
        self._compacted: dict[ResourceType, int] = {}  # newest rv no longer in history
        self._watches: set[_Watch] = set()
        self._by_uid: dict[str, tuple[ResourceType, Key]] = {}
        self._dependents: dict[str, set[tuple[ResourceType, Key]]] = {}

    # Test and tooling helpers ----------------------------------------------------------------

    @property
    def resource_version(self) -> str:
        """The newest resourceVersion handed out (a list's resourceVersion)."""
        return str(self._rv)

    @property
    def open_watches(self) -> int:
        return len(self._watches)

    def objects(self, rt: ResourceType) -> list[Object]:
        """A copy of every stored object of `rt`, ordered by namespace and name."""
        store = self._store.get(rt, {})
        return [copy_object(store[k]) for k in sorted(store)]

    def expire_watches(self, *, compact: bool = True) -> int:
        """End every open watch with Expired (410), as an API server restart or compaction does.

        With `compact`, history is dropped as well, so resuming from any resourceVersion
        older than the current one is Expired too and clients must relist. Returns how many
        watches were ended.
        """
        if compact:
            self.compact()
        ended = len(self._watches)
        for watch in self._watches:
            watch.queue.put_nowait(_Expire())
        return ended

    def compact(self) -> None:
        """Forget all retained watch history (as etcd compaction does)."""
        for rt in set(self._history) | set(self._store):
            self._history.pop(rt, None)
            self._compacted[rt] = self._rv

    async def load(self, objects: Iterable[Object], *,
                   default_namespace: str = "default") -> list[Object]:
        """Create each object, typed by its apiVersion and kind (seed manifests, fixtures).

        Namespaced objects without a namespace go to `default_namespace`, as kubectl does.
        """
        created = []
        for obj in objects:
            try:
                rt = by_kind(str(obj.get("apiVersion")), str(obj.get("kind")))
            except KeyError as exc:
                raise BadRequest(str(exc.args[0])) from None
            namespace = None
            if rt.namespaced and not (obj.get("metadata") or {}).get("namespace"):
                namespace = default_namespace
            meta = obj.get("metadata")
            if isinstance(meta, Mapping) and meta.get("resourceVersion"):
                # A manifest saved from a cluster (`kubectl get -o yaml`) carries one.
                obj = {**obj, "metadata": {k: v for k, v in meta.items()
                                           if k != "resourceVersion"}}
            created.append(await self.create(rt, obj, namespace=namespace))
        return created

    # The port ---------------------------------------------------------------------------------

    async def get(self, rt: ResourceType, name: str, *, namespace: str | None = None) -> Object:
        key = self._key(rt, name, namespace)
        obj = self._store.get(rt, {}).get(key)
        if obj is None:
            raise not_found(rt, name)
        return _copy(obj)

    async def list(self, rt: ResourceType, *, namespace: str | None = None,
                   label_selector: str | None = None,
                   field_selector: str | None = None) -> ObjectList:
        flt = _Filter(namespace if rt.namespaced else None,
                      parse_label_selector(label_selector),
                      parse_field_selector(field_selector, rt))
        store = self._store.get(rt, {})
        items = [copy_object(store[k]) for k in sorted(store) if flt.matches(store[k])]
        return ObjectList(items=items, resource_version=str(self._rv))

    def watch(self, rt: ResourceType, *, namespace: str | None = None,
              resource_version: str | None = None, label_selector: str | None = None,
              field_selector: str | None = None,
              timeout_seconds: float | None = None) -> AsyncIterator[WatchEvent]:
        """Events after `resource_version`, in order.

        Selectors are checked at once (BadRequest); the start point is checked when iteration
        begins (Expired if older than the retained history). Without a resourceVersion, or with
        "0", the watch starts with an ADDED event per existing object, as the API server does.
        The iterator ends after `timeout_seconds`, and raises Expired if `expire_watches` runs.
        """
        flt = _Filter(namespace if rt.namespaced else None,
                      parse_label_selector(label_selector),
                      parse_field_selector(field_selector, rt))
        start: int | None = None
        if resource_version not in (None, "", "0"):
            try:
                start = int(str(resource_version))
            except ValueError:
                raise BadRequest(f'invalid resourceVersion "{resource_version}": expected the '
                                 "resourceVersion of a list or an object") from None
            if start < 0:
                raise BadRequest(f'invalid resourceVersion "{resource_version}"')
        return self._watch(rt, flt, start, timeout_seconds)

    async def _watch(self, rt: ResourceType, flt: _Filter, start: int | None,
                     timeout_seconds: float | None) -> AsyncIterator[WatchEvent]:
        loop = asyncio.get_running_loop()
        deadline = None if timeout_seconds is None else loop.time() + timeout_seconds
        # Replay and registration happen without an await in between: nothing is missed.
        initial: list[tuple[EventType, Object]]
        if start is None:
            store = self._store.get(rt, {})
            initial = [("ADDED", store[k]) for k in sorted(store) if flt.matches(store[k])]
            last = self._rv
        else:
            compacted = self._compacted.get(rt, 0)
            if start < compacted:
                raise Expired(f"too old resource version: {start} ({compacted + 1})")
            initial = []
            for event in self._history.get(rt, ()):
                if event.rv > start:
                    seen = flt.translate(event)
                    if seen is not None:
                        initial.append(seen)
            last = max(start, self._rv)
        watch = _Watch(rt)
        self._watches.add(watch)
        try:
            for type_, obj in initial:
                yield WatchEvent(type_, copy_object(obj))
            while True:
                if deadline is None:
                    item = await watch.queue.get()
                else:
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        return
                    try:
                        async with asyncio.timeout(remaining):
                            item = await watch.queue.get()
                    except TimeoutError:
                        return
                if isinstance(item, _Close):
                    return
                if isinstance(item, _Expire):
                    raise Expired(f"too old resource version: {last} ({self._rv})")
                last = item.rv
                seen = flt.translate(item)
                if seen is not None:
                    yield WatchEvent(seen[0], copy_object(seen[1]))
        finally:
            self._watches.discard(watch)

    async def create(self, rt: ResourceType, obj: Object, *, namespace: str | None = None,
                     dry_run: bool = False) -> Object:
        new = self._incoming(rt, obj)
        meta = new["metadata"]
        ns = self._namespace(rt, meta, namespace)
        name = meta.get("name")
        if not name:
            prefix = meta.get("generateName")
            if not prefix:
                raise invalid(rt, "", [FieldError("metadata.name", "Required",
                                                  "name or generateName is required")])
            name = self._generate_name(rt, ns, str(prefix))
        if not isinstance(name, str):
            raise invalid(rt, str(name), [FieldError("metadata.name", "Invalid",
                                                     "must be a string", name)])
        errors = _validate_name(rt, name)
        if errors:
            raise invalid(rt, name, errors)
        if meta.get("resourceVersion") and not dry_run:
            # The API server's storage refuses it (before looking for the name), with a Status
            # that is not a typed error: a client creating an object it read back must clear
            # the version, or it works here and fails on a real cluster.
            raise ApiError(_RV_ON_CREATE, code=500, reason="", status={
                "apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
                "message": _RV_ON_CREATE, "code": 500})
        key = (ns, name)
        store = self._store.setdefault(rt, {})
        if key in store:
            raise already_exists(rt, name)
        for system in _SYSTEM_METADATA:
            meta.pop(system, None)
        meta["name"] = name
        if rt.namespaced:
            meta["namespace"] = ns
        meta["uid"] = str(uuid.uuid4())
        meta["creationTimestamp"] = _timestamp(self._clock())
        meta["generation"] = 1
        if rt.has_status:
            _prepare_create_status(rt, new)
        if dry_run:
            return new
        self._rv += 1
        meta["resourceVersion"] = str(self._rv)
        self._put(rt, key, new, None)
        self._emit(rt, "ADDED", new, None)
        return _copy(new)

    async def update(self, rt: ResourceType, obj: Object, *, namespace: str | None = None,
                     subresource: str | None = None) -> Object:
        new = self._incoming(rt, obj)
        return self._update(rt, new, namespace, subresource)

    async def patch(self, rt: ResourceType, name: str, patch: Any, *,
                    namespace: str | None = None, patch_type: PatchType = "merge",
                    subresource: str | None = None) -> Object:
        key = self._key(rt, name, namespace)
        self._check_subresource(rt, name, subresource)
        current = self._store.get(rt, {}).get(key)
        if current is None:
            raise not_found(rt, name)
        patched = apply_patch(copy_object(current), copy_object(patch), patch_type)
        patched = self._incoming(rt, patched)
        meta = patched["metadata"]
        if meta.get("name") != name or (rt.namespaced and meta.get("namespace") != key[0]):
            raise BadRequest(f'the patch of {resource_name(rt)} "{name}" may not change '
                             "metadata.name or metadata.namespace")
        return self._update(rt, patched, namespace, subresource)

    async def delete(self, rt: ResourceType, name: str, *, namespace: str | None = None,
                     resource_version: str | None = None) -> Object | None:
        key = self._key(rt, name, namespace)
        current = self._store.get(rt, {}).get(key)
        if current is None:
            raise not_found(rt, name)
        have = current["metadata"].get("resourceVersion")
        if resource_version and resource_version != have:
            raise conflict(rt, name, f"the ResourceVersion in the precondition "
                                     f"({resource_version}) does not match the ResourceVersion "
                                     f"in record ({have}). The object might have been modified")
        return _copy(self._delete(rt, key))

    async def close(self) -> None:
        """End every open watch normally; the stored objects stay readable."""
        for watch in self._watches:
            watch.queue.put_nowait(_Close())

    # Internals (no awaits below: each public call is atomic on the event loop) --------------

    def _key(self, rt: ResourceType, name: str, namespace: str | None) -> Key:
        if not name:
            raise BadRequest(f"a name is required to address a single {rt.kind}")
        if rt.namespaced:
            if not namespace:
                raise BadRequest(f'{resource_name(rt)} "{name}": a namespace is required for '
                                 f"namespaced {rt.kind} objects")
            return (namespace, name)
        return ("", name)

    def _incoming(self, rt: ResourceType, obj: Object) -> Object:
        if not isinstance(obj, Mapping):
            raise BadRequest(f"a {rt.kind} must be a JSON object, got {type(obj).__name__}")
        new: Object = copy_object(obj)
        api_version, kind = new.get("apiVersion"), new.get("kind")
        if api_version not in (None, "", rt.api_version):
            raise BadRequest(f"the API version in the data ({api_version}) does not match the "
                             f"expected API version ({rt.api_version})")
        if kind not in (None, "", rt.kind):
            raise BadRequest(f"the kind in the data ({kind}) does not match the expected kind "
                             f"({rt.kind})")
        new["apiVersion"], new["kind"] = rt.api_version, rt.kind
        meta = new.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise BadRequest(f"metadata of a {rt.kind} must be a JSON object")
        for field_name in ("labels", "annotations"):
            value = meta.get(field_name)
            if value is not None and (not isinstance(value, dict) or not all(
                    isinstance(v, str) for v in value.values())):
                raise invalid(rt, str(meta.get("name") or ""), [FieldError(
                    f"metadata.{field_name}", "Invalid", "must map strings to strings", value)])
        return new

    def _namespace(self, rt: ResourceType, meta: dict[str, Any], namespace: str | None) -> str:
        if not rt.namespaced:
            meta.pop("namespace", None)
            return ""
        in_object = meta.get("namespace")
        if namespace and in_object and in_object != namespace:
            raise BadRequest(f"the namespace of the provided object ({in_object}) does not "
                             f"match the namespace sent on the request ({namespace})")
        ns = namespace or in_object
        if not ns:
            raise BadRequest(f"a namespace is required for namespaced {rt.kind} objects: pass "
                             "namespace= or set metadata.namespace")
        return str(ns)

    def _generate_name(self, rt: ResourceType, ns: str, prefix: str) -> str:
        store = self._store.get(rt, {})
        for _ in range(8):
            suffix = "".join(secrets.choice(_SUFFIX_ALPHABET) for _ in range(_SUFFIX_LENGTH))
            name = prefix[: 63 - _SUFFIX_LENGTH] + suffix
            if (ns, name) not in store:
                return name
        raise already_exists(rt, prefix + "*")

    def _check_subresource(self, rt: ResourceType, name: str, subresource: str | None) -> None:
        if subresource is None:
            return
        if subresource != "status" or not rt.has_status:
            raise NotFound(f'{resource_name(rt)} "{name}" has no subresource "{subresource}"')

    def _update(self, rt: ResourceType, new: Object, namespace: str | None,
                subresource: str | None) -> Object:
        meta = new["metadata"]
        name = meta.get("name")
        if not name or not isinstance(name, str):
            raise invalid(rt, "", [FieldError("metadata.name", "Required",
                                              "name is required to update an object")])
        self._check_subresource(rt, name, subresource)
        ns = self._namespace(rt, meta, namespace)
        key = (ns, name)
        old = self._store.get(rt, {}).get(key)
        if old is None:
            raise not_found(rt, name)
        old_meta = old["metadata"]
        sent_rv = meta.get("resourceVersion")
        if sent_rv and sent_rv != old_meta.get("resourceVersion"):
            raise conflict(rt, name)
        if meta.get("uid") and meta["uid"] != old_meta["uid"]:
            raise conflict(rt, name, f"Precondition failed: UID in precondition: "
                                     f"{meta['uid']}, UID in object meta: {old_meta['uid']}")
        if subresource == "status":
            # Only status changes; everything else stays as stored.
            result = copy_object(old)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
        else:
            result = new
            for system in _SYSTEM_METADATA:
                if system in old_meta:
                    meta[system] = old_meta[system]
                else:
                    meta.pop(system, None)
            if rt.has_status:
                if "status" in old:
                    result["status"] = old["status"]
                else:
                    result.pop("status", None)
        errors = _validate_update(rt, old, result, subresource)
        if errors:
            raise invalid(rt, name, errors)
        result_meta = result["metadata"]
        result_meta["resourceVersion"] = old_meta["resourceVersion"]
        if result == old:
            return _copy(old)  # a no-op write changes nothing, not even resourceVersion
        if _spec_of(result) != _spec_of(old):
            result_meta["generation"] = int(old_meta.get("generation") or 0) + 1
        self._rv += 1
        result_meta["resourceVersion"] = str(self._rv)
        self._put(rt, key, result, old)
        self._emit(rt, "MODIFIED", result, old)
        if result_meta.get("deletionTimestamp") and not result_meta.get("finalizers"):
            # The last finalizer is gone: the pending deletion completes.
            return _copy(self._delete(rt, key))
        return _copy(result)

    def _delete(self, rt: ResourceType, key: Key) -> Object:
        current = self._store[rt][key]
        meta = current["metadata"]
        if meta.get("finalizers"):
            if meta.get("deletionTimestamp"):
                return current
            marked = _copy(current)
            marked_meta = marked["metadata"]
            marked_meta["deletionTimestamp"] = _timestamp(self._clock())
            marked_meta["deletionGracePeriodSeconds"] = 0
            marked_meta["generation"] = int(meta.get("generation") or 0) + 1
            self._rv += 1
            marked_meta["resourceVersion"] = str(self._rv)
            self._put(rt, key, marked, current)
            self._emit(rt, "MODIFIED", marked, current)
            return marked
        self._rv += 1
        gone = _copy(current)
        # Watchers see the deletion at its own resourceVersion, as the API server reports it.
        gone["metadata"]["resourceVersion"] = str(self._rv)
        self._put(rt, key, None, current)
        self._emit(rt, "DELETED", gone, None)
        if self._gc:
            self._collect(str(meta.get("uid")))
        return gone

    def _collect(self, owner_uid: str) -> None:
        """Delete dependents none of whose owners exist any more (background propagation)."""
        for rt, key in sorted(self._dependents.pop(owner_uid, set()),
                              key=lambda d: (d[0].plural, d[1])):
            dependent = self._store.get(rt, {}).get(key)
            if dependent is None:
                continue
            owners = [ref.get("uid") for ref in dependent["metadata"].get("ownerReferences") or []]
            if any(uid in self._by_uid for uid in owners):
                continue
            self._delete(rt, key)

    def _put(self, rt: ResourceType, key: Key, new: Object | None, old: Object | None) -> None:
        store = self._store.setdefault(rt, {})
        if old is not None:
            old_meta = old["metadata"]
            self._by_uid.pop(old_meta["uid"], None)
            for ref in old_meta.get("ownerReferences") or []:
                dependents = self._dependents.get(str(ref.get("uid")))
                if dependents is not None:
                    dependents.discard((rt, key))
                    if not dependents:
                        del self._dependents[str(ref.get("uid"))]
        if new is None:
            store.pop(key, None)
            return
        store[key] = new
        new_meta = new["metadata"]
        self._by_uid[new_meta["uid"]] = (rt, key)
        for ref in new_meta.get("ownerReferences") or []:
            if isinstance(ref, dict) and ref.get("uid"):
                self._dependents.setdefault(str(ref["uid"]), set()).add((rt, key))

    def _emit(self, rt: ResourceType, type_: EventType, obj: Object, old: Object | None) -> None:
        event = _Event(self._rv, type_, obj, old)
        history = self._history.get(rt)
        if history is None:
            history = self._history[rt] = deque()
        history.append(event)
        while len(history) > self._history_limit:
            self._compacted[rt] = history.popleft().rv
        for watch in self._watches:
            if watch.rt is rt or watch.rt == rt:
                watch.queue.put_nowait(event)


__all__ = [
    "DEFAULT_HISTORY",
    "FieldError",
    "MemoryCluster",
    "already_exists",
    "apply_patch",
    "conflict",
    "copy_object",
    "invalid",
    "kind_name",
    "merge_patch",
    "not_found",
    "resource_name",
    "strategic_merge_patch",
]


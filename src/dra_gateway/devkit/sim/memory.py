"""An in-memory Kubernetes API with the semantics the project relies on.

`MemoryCluster` implements the `Cluster` port: one global, monotonically increasing
resourceVersion; uid, creationTimestamp and generation; AlreadyExists, NotFound and Conflict
worded as the API server words them; generateName; the `/status` subresource; JSON, merge and
(simplified) strategic-merge patches; finalizers and deletionTimestamp; label and field
selectors; watches that replay a bounded history in order and expire with 410; dry run; the
handful of validations the components depend on; and owner-reference garbage collection.

It backs the tests, the benchmarks and, served by `server`, the embedded default. It must not
do I/O, and it must never hand out or keep a reference a caller could mutate: objects are copied
on the way in and on the way out. Every operation runs without awaiting between reading and
writing state, so concurrent asyncio callers see each write as atomic.

It words refusals through `errors`, applies patches through `patching`, checks writes through
`validation` and hands watchers what `watching` lets them see; it is the store and its
bookkeeping (versions, history, owners) only.

Deliberate simplifications, each documented where it happens:
- namespaces need not exist before objects are created in them, and deleting one leaves its
  contents alone;
- pods are deleted at once (there is no kubelet to honour a grace period);
- a strategic merge patch merges only some lists by key (see `patching`);
- garbage collection runs synchronously when an owner is deleted; dependents whose owners never
  existed are left alone.

Wording, patching, validation and watch filtering live apart (`errors`, `patching`,
`validation`, `watching`).
"""

from __future__ import annotations

import asyncio
import secrets
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from datetime import UTC, datetime
from typing import Any

from dra_gateway.devkit.sim.errors import (
    FieldError,
    already_exists,
    conflict,
    invalid,
    not_found,
    resource_name,
)
from dra_gateway.devkit.sim.patching import apply_patch, copy_object
from dra_gateway.devkit.sim.selectors import parse_field_selector, parse_label_selector
from dra_gateway.devkit.sim.validation import prepare_create_status, validate_name, validate_update
from dra_gateway.devkit.sim.watching import Close, Event, Expire, Filter, Watch
from dra_gateway.kube.cluster.port import (
    ApiError,
    BadRequest,
    EventType,
    Expired,
    NotFound,
    Object,
    ObjectList,
    PatchType,
    ServedVersions,
    WatchEvent,
)
from dra_gateway.kube.resources import ALL, PODS, ResourceType, by_kind

Key = tuple[str, str]  # (namespace or "", name)

DEFAULT_HISTORY = 1000
# The alphabet and length Kubernetes uses for generateName suffixes (no vowels, no look-alikes).
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_SUFFIX_LENGTH = 5
_RV_ON_CREATE = "resourceVersion should not be set on objects to be created"
# Set by the API server, never taken from a client's update.
_SYSTEM_METADATA = ("uid", "creationTimestamp", "deletionTimestamp",
                    "deletionGracePeriodSeconds", "generation", "resourceVersion")


def _now() -> datetime:
    return datetime.now(UTC)


def _timestamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _copy(obj: Object) -> Object:
    copied: Object = copy_object(obj)
    return copied


def _spec_of(obj: Object) -> dict[str, Any]:
    """Everything generation counts: the object less metadata and status."""
    return {k: v for k, v in obj.items() if k not in ("metadata", "status")}


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
        self._history: dict[ResourceType, deque[Event]] = {}
        self._compacted: dict[ResourceType, int] = {}  # newest rv no longer in history
        self._watches: set[Watch] = set()
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
            watch.queue.put_nowait(Expire())
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
        flt = Filter(namespace if rt.namespaced else None,
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
        flt = Filter(namespace if rt.namespaced else None,
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

    async def _watch(self, rt: ResourceType, flt: Filter, start: int | None,
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
        watch = Watch(rt)
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
                if isinstance(item, Close):
                    return
                if isinstance(item, Expire):
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
        errors = validate_name(rt, name)
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
            prepare_create_status(rt, new)
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
        if meta.get("uid") != current["metadata"].get("uid"):
            # A patch naming the uid it was written for reaches only that object: one made
            # since under the same name refuses it (a PUT's uid is a precondition instead).
            raise invalid(rt, name, [FieldError("metadata.uid", "Invalid", "field is immutable",
                                                meta.get("uid"))])
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

    async def evict(self, name: str, *, namespace: str, uid: str | None = None) -> None:
        """The simulator has no disruption controller: an eviction deletes the pod (what the
        Eviction API does when no PodDisruptionBudget selects it)."""
        key = self._key(PODS, name, namespace)
        current = self._store.get(PODS, {}).get(key)
        if current is None:
            raise not_found(PODS, name)
        if uid and current["metadata"].get("uid") != uid:
            raise conflict(PODS, name, f"the UID in the precondition ({uid}) does not match "
                                       f"the UID in record ({current['metadata'].get('uid')}). "
                                       "The object might have been deleted and then recreated")
        self._delete(PODS, key)

    async def server_time(self) -> datetime:
        """The `clock`, to the second, as an API server's Date header gives it."""
        return self._clock().astimezone(UTC).replace(microsecond=0)

    async def server_version(self) -> Object:
        """The version the simulator's HTTP front serves at /version."""
        from dra_gateway.devkit.sim.server import KUBERNETES_VERSION

        return dict(KUBERNETES_VERSION)

    async def served_versions(self) -> ServedVersions:
        """The group versions of the types the project names (kube/resources.py)."""
        served: ServedVersions = {}
        for rt in ALL:
            versions = served.setdefault(rt.group, [])
            if rt.version not in versions:
                versions.append(rt.version)
        return served

    async def close(self) -> None:
        """End every open watch normally; the stored objects stay readable."""
        for watch in self._watches:
            watch.queue.put_nowait(Close())

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
        errors = validate_update(rt, old, result, subresource)
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
        event = Event(self._rv, type_, obj, old)
        history = self._history.get(rt)
        if history is None:
            history = self._history[rt] = deque()
        history.append(event)
        while len(history) > self._history_limit:
            self._compacted[rt] = history.popleft().rv
        for watch in self._watches:
            if watch.rt is rt or watch.rt == rt:
                watch.queue.put_nowait(event)


__all__ = ["DEFAULT_HISTORY", "MemoryCluster"]

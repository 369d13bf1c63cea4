"""List+watch mirrors of one Kubernetes resource type, for every component.

An `Informer` lists one resource type through the cluster port, then watches from the list's
resourceVersion and keeps a local store of what the API server holds (`store`, keyed by
(namespace, name), with optional indexes). Every change reaches the handler as one call
(`added`, `modified`, `deleted`, with the previous stored state), in the order the server
produced it; bookmarks only move the watch position. A watch that ends after its own timeout
resumes from the last resourceVersion seen; a watch or list that fails, or a resume the server
answers with Expired (410), relists. A relist either reports the difference with the store
through the handler, so deletions missed while disconnected still arrive, or, for a caller that
rebuilds its own state from a full list, hands the whole list to `replaced`. Failures back off
exponentially with jitter (replicas must not relist in step), and so does a watch that closes
at once without an event.

A type the API may not serve (a CRD the chart installs, such as GPUQuota) answers its list with
404; `when_missing` says what that means: a failure like any other ("fail"), an empty list
tried again every `max_backoff` until the type appears ("empty"), or the end of the mirror
after the `missing` callback ("stop").

Callbacks are plain functions called on the event loop without awaiting anything else in
between, so what a handler does between two events is atomic with respect to other tasks; a
callback may also be a coroutine function, awaited before the next event. This module knows
nothing of what it mirrors: components bring that logic in their callbacks.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from typing import Literal

from dra_gateway.kube import objects
from dra_gateway.kube.cluster.port import ApiError, Cluster, Expired, NotFound, Object
from dra_gateway.kube.objects import resource_version as _rv
from dra_gateway.kube.objects import uid as _uid
from dra_gateway.kube.resources import ResourceType

log = logging.getLogger(__name__)

Change = Literal["added", "modified", "deleted"]
Handler = Callable[[Change, Object, Object | None], Awaitable[object] | None]
"""handler(change, obj, old): `old` is the previous stored state (None when added)."""
Replaced = Callable[[list[Object]], Awaitable[object] | None]
"""replaced(items): every full list, in the server's order, instead of its difference."""
Missing = Callable[[], Awaitable[object] | None]
Failed = Callable[[ApiError], None]
IndexFunc = Callable[[Object], Iterable[Hashable]]
"""The index values of one object (none: the object is not indexed)."""
WhenMissing = Literal["fail", "empty", "stop"]

Key = tuple[str, str]  # (namespace or "", name)
# A watch that ends sooner than this without a single event is treated as a failure.
_SHORT_WATCH_SECONDS = 1.0


def object_key(obj: Object) -> Key:
    return objects.namespace_name(obj)


class Informer:
    """One resource type mirrored from the API server (list, then watch; relist on Expired).

    `store` maps (namespace, name) to the newest object seen; `synced` is set once the first
    list has been delivered. Run it with `await informer.run()` in a task and cancel the task
    to stop it. `failed(exc)` hears of every list or watch the API refused, before the backoff;
    `rbac_fix` is logged with a 403. With `keep_going`, an error outside the port's (a
    callback's, a client's) is logged and relisted after backoff instead of ending `run`.
    With `keep=False` (a caller that keeps its own digest of the objects and takes full lists
    through `replaced`) the store stays empty and every change arrives without its previous
    state, as the watch names it (ADDED: added, MODIFIED: modified).
    """

    def __init__(self, cluster: Cluster, rt: ResourceType, handler: Handler | None = None, *,
                 replaced: Replaced | None = None, failed: Failed | None = None,
                 missing: Missing | None = None, when_missing: WhenMissing = "fail",
                 namespace: str | None = None, label_selector: str | None = None,
                 field_selector: str | None = None, watch_timeout: float = 300.0,
                 min_backoff: float = 0.2, max_backoff: float = 30.0,
                 what: str | None = None, rbac_fix: str | None = None,
                 keep_going: bool = False, keep: bool = True,
                 indexers: Mapping[str, IndexFunc] | None = None) -> None:
        self.cluster = cluster
        self.rt = rt
        self.handler: Handler = handler or _ignore
        self.replaced = replaced
        self.failed = failed
        self.missing = missing
        self.when_missing = when_missing
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.watch_timeout = watch_timeout
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self.what = what or rt.plural
        self.rbac_fix = rbac_fix
        self.keep_going = keep_going
        if not keep and (replaced is None or indexers):
            raise ValueError("an informer that keeps no store needs `replaced` and no indexes")
        self.keep = keep
        self.absent = False  # a type the API server does not serve (yet)
        self.store: dict[Key, Object] = {}
        self.synced = asyncio.Event()
        self.relists = 0  # how many times the store was rebuilt from a list (first one included)
        self._resource_version = ""
        # Objects whose own write was applied ahead of the watch: key -> that write's rv.
        self._ahead: dict[Key, str] = {}
        # What coroutine callbacks returned, awaited in order before the next event.
        self._pending: list[Awaitable[object]] = []
        self._indexers = dict(indexers or {})
        self._indexes: dict[str, dict[Hashable, dict[Key, Object]]] = {
            name: {} for name in self._indexers}

    def get(self, namespace: str | None, name: str) -> Object | None:
        return self.store.get((namespace or "", name))

    def values(self) -> Iterable[Object]:
        return self.store.values()

    def by_index(self, index: str, value: Hashable) -> list[Object]:
        """The stored objects whose `index` function yields `value`."""
        return list(self._indexes[index].get(value, {}).values())

    @property
    def resource_version(self) -> str:
        return self._resource_version

    async def run(self) -> None:
        failures = 0
        need_list = True
        while True:
            try:
                if need_list:
                    if not await self._list():
                        return  # a missing type, with when_missing="stop"
                    need_list = False
                    failures = 0
                if self.absent:
                    await asyncio.sleep(self.max_backoff)
                    need_list = True
                    continue
                started = time.monotonic()
                events = await self._watch()
                if events == 0 and time.monotonic() - started < _SHORT_WATCH_SECONDS:
                    # Closed at once, nothing delivered (a proxy or a server shedding load):
                    # like client-go's "very short watch", back off rather than spin on it.
                    failures += 1
                    delay = self._backoff(failures)
                    log.warning("%s watch closed at once, resuming after backoff", self.what,
                                extra={"resource": self.rt.plural,
                                       "retryInSeconds": round(delay, 3)})
                    await asyncio.sleep(delay)
                    continue
                # The watch ended on its own (server timeout): resume from where it was.
                failures = 0
            except asyncio.CancelledError:
                raise
            except Expired:
                log.info("%s watch expired, relisting", self.what,
                         extra={"resource": self.rt.plural, "namespace": self.namespace,
                                "resourceVersion": self._resource_version})
                need_list = True
            except ApiError as err:
                failures += 1
                need_list = True
                delay = self._backoff(failures)
                if self.failed is not None:
                    self.failed(err)
                extra: dict[str, object] = {
                    "resource": self.rt.plural, "namespace": self.namespace, "code": err.code,
                    "reason": err.reason, "error": err.message,
                    "retryInSeconds": round(delay, 3)}
                if self.rbac_fix and err.code == 403:
                    extra["fix"] = self.rbac_fix
                log.warning("%s list or watch failed, relisting after backoff", self.what,
                            extra=extra)
                await asyncio.sleep(delay)
            except (TimeoutError, OSError, ValueError) as err:
                # Connection drops and garbled streams: the store may have missed events.
                failures += 1
                need_list = True
                delay = self._backoff(failures)
                log.warning("%s watch stream broken, relisting after backoff", self.what,
                            extra={"resource": self.rt.plural, "error": str(err),
                                   "retryInSeconds": round(delay, 3)})
                await asyncio.sleep(delay)
            except Exception:
                if not self.keep_going:
                    raise
                failures += 1
                need_list = True
                delay = self._backoff(failures)
                log.exception("%s watch failed, relisting after backoff", self.what,
                              extra={"resource": self.rt.plural, "namespace": self.namespace,
                                     "retryInSeconds": round(delay, 3)})
                await asyncio.sleep(delay)
            finally:
                self._discard_pending()

    def _backoff(self, failures: int) -> float:
        base: float = min(self.max_backoff, self.min_backoff * 2.0 ** min(failures - 1, 30))
        return base * (0.5 + random.random() / 2)  # jitter: replicas must not relist in step

    async def _list(self) -> bool:
        """List and deliver; False when the type is missing and the mirror stops."""
        try:
            listed = await self.cluster.list(self.rt, namespace=self.namespace,
                                             label_selector=self.label_selector,
                                             field_selector=self.field_selector)
        except NotFound:
            if self.when_missing == "fail":
                raise
            if self.when_missing == "stop":
                if self.missing is not None:
                    await _awaited(self.missing())
                return False
            if not self.absent:
                if self.missing is not None:  # the caller says what it means
                    await _awaited(self.missing())
                else:
                    log.warning("the API server does not serve this resource; running without "
                                "it and listing again later", extra={"resource": self.rt.plural})
            self.absent = True
            await self._deliver([], "")
            return True
        self.absent = False
        await self._deliver(listed.items, listed.resource_version)
        return True

    async def _deliver(self, items: list[Object], resource_version: str) -> None:
        self._ahead.clear()  # the list is at least as new as any write of ours
        fresh = {object_key(obj): obj for obj in items} if self.keep else {}
        old_store = self.store
        self.store = fresh
        if self._indexers:
            self._reindex()
        if self.replaced is not None:
            await _awaited(self.replaced(list(items)))
        else:
            # Deliver the difference in one pass: handlers see a consistent store, the whole
            # list (a handler looking up another object must not miss an unchanged one).
            for key, old in old_store.items():
                if key not in fresh:
                    self._emit("deleted", old, old)
            for key in sorted(fresh):
                obj = fresh[key]
                previous = old_store.get(key)
                if previous is None:
                    self._emit("added", obj, None)
                elif _rv(previous) != _rv(obj) or _uid(previous) != _uid(obj):
                    if _uid(previous) != _uid(obj):
                        # Deleted and recreated while disconnected: two changes, not one.
                        self._emit("deleted", previous, previous)
                        self._emit("added", obj, None)
                    else:
                        self._emit("modified", obj, previous)
            await self._drain()
        self._resource_version = resource_version
        self.relists += 1
        self.synced.set()

    async def _watch(self) -> int:
        """Apply one watch's events until it ends; returns how many it delivered."""
        # Jitter the timeout so that many informers do not all reconnect at once.
        timeout = self.watch_timeout * (0.9 + random.random() / 5)
        stream = self.cluster.watch(self.rt, namespace=self.namespace,
                                    resource_version=self._resource_version,
                                    label_selector=self.label_selector,
                                    field_selector=self.field_selector,
                                    timeout_seconds=timeout)
        events = 0
        try:
            async for event in stream:
                events += 1
                self._apply(event.type, event.object)
                if self._pending:
                    await self._drain()
        finally:
            # Close the stream now, not when the garbage collector finds it: an open watch
            # holds a connection (and, in memory, a subscription).
            aclose = getattr(stream, "aclose", None)
            if aclose is not None:
                await aclose()
        return events

    def observe_write(self, obj: Object) -> None:
        """Apply the result of our own successful write before its watch event arrives.

        The caller checks that the store still holds the version the write was based on, so
        `obj` is exactly the next state the watch will report. The watch position is left
        alone: resuming from this object's resourceVersion could skip other objects' events.
        Until the watch reaches this version, its older events for the object are stale and
        do not roll the store back (two writes in a row would otherwise reappear one by one).
        Only for a handler that is a plain function: nothing here awaits.
        """
        key = object_key(obj)
        previous = self.store.get(key)
        if previous is not None and _rv(previous) == _rv(obj):
            return  # a write that changed nothing: no event will follow
        position = self._resource_version
        self._ahead.pop(key, None)  # this write is newer than any earlier one of ours
        self._apply("MODIFIED", obj)
        if self._pending:
            raise TypeError("observe_write needs a handler that is a plain function")
        self._resource_version = position
        self._ahead[key] = _rv(obj)

    def _apply(self, type_: str, obj: Object) -> None:
        rv = _rv(obj)
        if type_ == "BOOKMARK":
            if rv:
                self._resource_version = rv
            return
        if not self.keep:
            self._emit("deleted" if type_ == "DELETED" else
                       "added" if type_ == "ADDED" else "modified", obj, None)
            if rv:
                self._resource_version = rv
            return
        key = object_key(obj)
        previous = self.store.get(key)
        ahead = self._ahead.get(key)
        if ahead is not None:
            if (type_ != "DELETED" and previous is not None and _uid(previous) == _uid(obj)
                    and rv != ahead):
                # Older than the write we already applied: the watch is catching up.
                if rv:
                    self._resource_version = rv
                return
            del self._ahead[key]
        # The handler is called here rather than through `_emit`: this runs once per event of
        # every informer, and the extra call measured 10% of it.
        if type_ == "DELETED":
            self.store.pop(key, None)
            if self._indexers and previous is not None:
                self._unindex(key, previous)
            result = self.handler("deleted", obj, previous)
        else:
            self.store[key] = obj
            if self._indexers:
                if previous is not None:
                    self._unindex(key, previous)
                self._index(key, obj)
            if previous is None:
                result = self.handler("added", obj, None)
            elif _uid(previous) != _uid(obj):
                self._emit("deleted", previous, previous)
                result = self.handler("added", obj, None)
            else:
                result = self.handler("modified", obj, previous)
        if result is not None:
            self._pending.append(result)
        if rv:
            self._resource_version = rv

    def _emit(self, change: Change, obj: Object, old: Object | None) -> None:
        result = self.handler(change, obj, old)
        if result is not None:
            self._pending.append(result)

    async def _drain(self) -> None:
        pending, self._pending = self._pending, []
        for result in pending:
            await result

    def _discard_pending(self) -> None:
        # Left by an event that failed half-way: the relist delivers the state again.
        for result in self._pending:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        self._pending.clear()

    def _index(self, key: Key, obj: Object) -> None:
        for name, index in self._indexers.items():
            for value in index(obj):
                self._indexes[name].setdefault(value, {})[key] = obj

    def _unindex(self, key: Key, obj: Object) -> None:
        for name, index in self._indexers.items():
            entries = self._indexes[name]
            for value in index(obj):
                bucket = entries.get(value)
                if bucket is not None:
                    bucket.pop(key, None)
                    if not bucket:
                        del entries[value]

    def _reindex(self) -> None:
        self._indexes = {name: {} for name in self._indexers}
        for key, obj in self.store.items():
            self._index(key, obj)


def _ignore(change: Change, obj: Object, old: Object | None) -> None:
    return None


async def _awaited(result: Awaitable[object] | None) -> None:
    if result is not None:
        await result

"""List+watch caches of Kubernetes objects that feed the controller's handlers in order.

An `Informer` lists one resource type, then watches from the list's resourceVersion and keeps
a local store of what the API server holds. Every change reaches the handler as one call
(`added`, `modified`, `deleted`), in the order the server produced it. A watch that ends after
its own timeout resumes from the last resourceVersion seen; a watch or list that fails, or a
resume the server answers with Expired (410), relists and reports the difference with the
store, so deletions missed while disconnected still arrive.

An `optional` informer mirrors a type the API may not serve (a CRD the chart installs, such as
GPUQuota): a 404 on its list counts as an empty list, so the controller syncs and runs, and the
list is tried again every `max_backoff` until the type appears.

Handlers are plain functions called on the event loop without awaiting: everything a
handler does between two events is atomic with respect to the controller's workers. This
module must not decide anything about allocation: it only mirrors the API.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Iterable
from typing import Literal

from dra_gateway.kube import objects
from dra_gateway.kube.cluster.port import ApiError, Cluster, Expired, NotFound, Object
from dra_gateway.kube.objects import resource_version as _rv
from dra_gateway.kube.objects import uid as _uid
from dra_gateway.kube.resources import ResourceType

log = logging.getLogger(__name__)

Change = Literal["added", "modified", "deleted"]
Handler = Callable[[Change, Object, Object | None], None]
"""handler(change, obj, old): `old` is the previous stored state (None when added)."""

Key = tuple[str, str]  # (namespace or "", name)
# A watch that ends sooner than this without a single event is treated as a failure.
_SHORT_WATCH_SECONDS = 1.0


def object_key(obj: Object) -> Key:
    return objects.namespace_name(obj)


class Informer:
    """One resource type mirrored from the API server (list, then watch; relist on Expired).

    `store` maps (namespace, name) to the newest object seen; `synced` is set once the first
    list has been delivered to the handler. Run it with `await informer.run()` in a task and
    cancel the task to stop it.
    """

    def __init__(self, cluster: Cluster, rt: ResourceType, handler: Handler, *,
                 namespace: str | None = None, label_selector: str | None = None,
                 field_selector: str | None = None, watch_timeout: float = 300.0,
                 min_backoff: float = 0.2, max_backoff: float = 30.0,
                 optional: bool = False) -> None:
        self.cluster = cluster
        self.rt = rt
        self.handler = handler
        self.namespace = namespace
        self.label_selector = label_selector
        self.field_selector = field_selector
        self.watch_timeout = watch_timeout
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self.optional = optional
        self.absent = False  # an optional type the API server does not serve (yet)
        self.store: dict[Key, Object] = {}
        self.synced = asyncio.Event()
        self.relists = 0  # how many times the store was rebuilt from a list (first one included)
        self._resource_version = ""
        # Objects whose own write was applied ahead of the watch: key -> that write's rv.
        self._ahead: dict[Key, str] = {}

    def get(self, namespace: str | None, name: str) -> Object | None:
        return self.store.get((namespace or "", name))

    def values(self) -> Iterable[Object]:
        return self.store.values()

    @property
    def resource_version(self) -> str:
        return self._resource_version

    async def run(self) -> None:
        failures = 0
        need_list = True
        while True:
            try:
                if need_list:
                    await self._list()
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
                    log.warning("watch closed at once, resuming after backoff",
                                extra={"resource": self.rt.plural,
                                       "retryInSeconds": round(delay, 3)})
                    await asyncio.sleep(delay)
                    continue
                # The watch ended on its own (server timeout): resume from where it was.
                failures = 0
            except asyncio.CancelledError:
                raise
            except Expired:
                log.info("watch expired, relisting", extra={"resource": self.rt.plural,
                                                            "resourceVersion":
                                                                self._resource_version})
                need_list = True
            except ApiError as err:
                failures += 1
                need_list = True
                delay = self._backoff(failures)
                log.warning("list or watch failed, relisting after backoff",
                            extra={"resource": self.rt.plural, "code": err.code,
                                   "reason": err.reason, "error": err.message,
                                   "retryInSeconds": round(delay, 3)})
                await asyncio.sleep(delay)
            except (TimeoutError, OSError, ValueError) as err:
                # Connection drops and garbled streams: the store may have missed events.
                failures += 1
                need_list = True
                delay = self._backoff(failures)
                log.warning("watch stream broken, relisting after backoff",
                            extra={"resource": self.rt.plural, "error": str(err),
                                   "retryInSeconds": round(delay, 3)})
                await asyncio.sleep(delay)

    def _backoff(self, failures: int) -> float:
        base: float = min(self.max_backoff, self.min_backoff * 2.0 ** min(failures - 1, 30))
        return base * (0.5 + random.random() / 2)  # jitter: replicas must not relist in step

    async def _list(self) -> None:
        try:
            listed = await self.cluster.list(self.rt, namespace=self.namespace,
                                             label_selector=self.label_selector,
                                             field_selector=self.field_selector)
        except NotFound:
            if not self.optional:
                raise
            if not self.absent:
                log.warning("the API server does not serve this resource; running without it "
                            "and listing again later", extra={"resource": self.rt.plural})
            self.absent = True
            self._deliver({}, "")
            return
        self.absent = False
        self._deliver({object_key(obj): obj for obj in listed.items}, listed.resource_version)

    def _deliver(self, fresh: dict[Key, Object], resource_version: str) -> None:
        self._ahead.clear()  # the list is at least as new as any write of ours
        # Deliver the difference in one synchronous pass: handlers see a consistent store,
        # the whole list (a handler looking up another object must not miss an unchanged one).
        old_store = self.store
        self.store = fresh
        for key, old in old_store.items():
            if key not in fresh:
                self.handler("deleted", old, old)
        for key in sorted(fresh):
            obj = fresh[key]
            previous = old_store.get(key)
            if previous is None:
                self.handler("added", obj, None)
            elif _rv(previous) != _rv(obj) or _uid(previous) != _uid(obj):
                if _uid(previous) != _uid(obj):
                    # Deleted and recreated while disconnected: two changes, not one.
                    self.handler("deleted", previous, previous)
                    self.handler("added", obj, None)
                else:
                    self.handler("modified", obj, previous)
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
        """
        key = object_key(obj)
        previous = self.store.get(key)
        if previous is not None and _rv(previous) == _rv(obj):
            return  # a write that changed nothing: no event will follow
        position = self._resource_version
        self._ahead.pop(key, None)  # this write is newer than any earlier one of ours
        self._apply("MODIFIED", obj)
        self._resource_version = position
        self._ahead[key] = _rv(obj)

    def _apply(self, type_: str, obj: Object) -> None:
        rv = _rv(obj)
        if type_ == "BOOKMARK":
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
        if type_ == "DELETED":
            self.store.pop(key, None)
            self.handler("deleted", obj, previous)
        elif previous is None:
            self.store[key] = obj
            self.handler("added", obj, None)
        elif _uid(previous) != _uid(obj):
            self.store[key] = obj
            self.handler("deleted", previous, previous)
            self.handler("added", obj, None)
        else:
            self.store[key] = obj
            self.handler("modified", obj, previous)
        if rv:
            self._resource_version = rv

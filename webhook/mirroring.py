"""The webhook's way of mirroring the API: rules ConfigMaps, DeviceClasses, ResourceSlices, GPU
policies, and the allocator's Lease and gated pods.

`mirror` runs the runtime's `Informer` (list, watch, relist on expiry, backoff) with the
webhook's conventions: callers rebuild their state from every full list (`listed`) and take in
the watch's changes one object at a time (`changed`, `deleted`); a failure of anything but the
API keeps the mirror going; a missing resource type ends it after `missing`. The caller's
callbacks keep the mirrored state and say what a failure means for readiness; this module keeps
no state of its own and decides nothing about what it mirrors.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable

from dra_gateway.kube.cluster.port import ApiError, Cluster, Object
from dra_gateway.kube.resources import ResourceType
from dra_gateway.kube.runtime.informer import Change, Informer

MAX_RETRY_DELAY = 30.0

# A plain function or a coroutine function; what it returns is not read.
Callback = Callable[..., object]


async def mirror(cluster: Cluster, rt: ResourceType, *, what: str, retry_delay: float,
                 listed: Callback, changed: Callback, deleted: Callback,
                 failed: Callable[[ApiError], None] | None = None,
                 missing: Callback | None = None, namespace: str | None = None,
                 label_selector: str | None = None, field_selector: str | None = None,
                 rbac_fix: str | None = None) -> None:
    """Mirror `rt` until cancelled (or, with `missing`, until the API serves no such resource).

    `listed(items)` gets every full list, `changed(obj)` and `deleted(obj)` the watch's events;
    each may be a plain function or a coroutine function. `failed(exc)` hears of every refused
    list or watch; `missing()` is called once, instead of retrying, when the list answers 404.
    `rbac_fix` is logged with a 403.
    """
    def handler(change: Change, obj: Object, old: Object | None) -> Awaitable[object] | None:
        return _awaitable((deleted if change == "deleted" else changed)(obj))

    def replaced(items: list[Object]) -> Awaitable[object] | None:
        return _awaitable(listed(items))

    def gone(callback: Callback) -> Callable[[], Awaitable[object] | None]:
        return lambda: _awaitable(callback())

    # The webhook keeps its own digest of what it mirrors (profiles, selectors, rules): the
    # informer keeps no second copy of the objects.
    await Informer(cluster, rt, handler, replaced=replaced, failed=failed,
                   missing=None if missing is None else gone(missing),
                   when_missing="fail" if missing is None else "stop", namespace=namespace,
                   label_selector=label_selector, field_selector=field_selector,
                   min_backoff=retry_delay, max_backoff=MAX_RETRY_DELAY, what=what,
                   rbac_fix=rbac_fix, keep_going=True, keep=False).run()


def _awaitable(result: object) -> Awaitable[object] | None:
    return result if inspect.isawaitable(result) else None

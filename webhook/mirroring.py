"""One list-and-watch loop for the webhook's mirrors of the API: rules ConfigMaps, DeviceClasses,
GPU policies, and the allocator's Lease and gated pods.

`mirror` lists a resource through the cluster port, watches from the list's resourceVersion,
relists when the watch expires, and relists after a pause that doubles (up to half a minute)
while the API keeps failing. The caller's callbacks keep the mirrored state and say what a
failure means for readiness; this module keeps no state of its own and decides nothing about
what it mirrors.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Callable

from dra_gateway.kube import objects
from dra_gateway.kube.cluster.port import ApiError, Cluster, Expired, NotFound, Object
from dra_gateway.kube.resources import ResourceType

log = logging.getLogger(__name__)

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
    resource_version: str | None = None
    failures = 0
    while True:
        if failures:
            await asyncio.sleep(min(retry_delay * 2 ** (failures - 1), MAX_RETRY_DELAY))
        try:
            if resource_version is None:
                try:
                    items = await cluster.list(rt, namespace=namespace,
                                               label_selector=label_selector,
                                               field_selector=field_selector)
                except NotFound:
                    if missing is None:
                        raise
                    await _call(missing)
                    return
                await _call(listed, items.items)
                resource_version = items.resource_version
            failures = 0
            async for event in cluster.watch(rt, namespace=namespace,
                                             label_selector=label_selector,
                                             field_selector=field_selector,
                                             resource_version=resource_version):
                resource_version = objects.resource_version(event.object) or resource_version
                if event.type in ("ADDED", "MODIFIED"):
                    await _call(changed, event.object)
                elif event.type == "DELETED":
                    await _call(deleted, event.object)
        except Expired:
            log.info("%s watch expired, relisting", what, extra={"namespace": namespace})
            resource_version = None
        except ApiError as exc:
            resource_version = None
            failures += 1
            if failed is not None:
                failed(exc)
            extra = {"resource": rt.plural, "namespace": namespace, "reason": exc.reason,
                     "error": exc.message}
            if rbac_fix and exc.code == 403:
                extra["fix"] = rbac_fix
            log.warning("%s list or watch failed, relisting", what, extra=extra)
        except Exception:
            resource_version = None
            failures += 1
            log.exception("%s watch failed, relisting", what, extra={"namespace": namespace})


async def _call(callback: Callback, *args: Object | list[Object]) -> None:
    result = callback(*args)
    if inspect.isawaitable(result):
        await result

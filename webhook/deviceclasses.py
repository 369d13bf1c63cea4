"""The cluster's DeviceClasses, mirrored by a list and a watch, for what they declare.

A DeviceClass with `spec.extendedResourceName` (DRAExtendedResource: beta and on by default in
Kubernetes 1.36, GA in 1.37) makes kube-scheduler serve that legacy resource name itself; the
translator steps aside for such names (translator/extended.py). `DeviceClassWatch` keeps the
declarations current without an API call per review: it lists DeviceClasses through the cluster
port, watches from the list's resourceVersion, relists when the watch expires or fails (after a
pause that grows while the API keeps failing), and after every change publishes a fresh
`ExtendedResources` with a new `generation`, so cached admission decisions are dropped.

It logs each declaration as it appears or goes (a warning for a dra-gateway class: kube-scheduler
then allocates the gateway's devices itself, outside the allocator) and keeps the gauge of
declarations current. An API server without the DeviceClass API (404) counts as a cluster
without declarations; a refusal (403) keeps the webhook unready, with the RBAC fix in the log
and in /readyz. It also answers which selectors a class applies (`selectors`), for /validate's
allowed-models check. This module must not translate pods or answer reviews.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError, Cluster, Object
from dra_gateway.kube.resources import DEVICE_CLASSES
from dra_gateway.translator.extended import ExtendedResources
from dra_gateway.webhook.metrics import Metrics
from dra_gateway.webhook.mirroring import mirror

log = logging.getLogger(__name__)

_RBAC_FIX = ("grant the webhook's ServiceAccount list and watch on deviceclasses in API group "
             "resource.k8s.io, or start the webhook with --no-device-classes")


class DeviceClassWatch:
    """What the cluster's DeviceClasses declare; run `run()` in a task, cancel it to stop.

    `extended` and `generation` are read on the hot path (attribute reads, no I/O); `synced`
    turns true after the first complete list; `problem` says why it is not, for /readyz.
    """

    def __init__(self, cluster: Cluster, metrics: Metrics, *, retry_delay: float = 1.0) -> None:
        self._cluster = cluster
        self._metrics = metrics
        self._retry_delay = retry_delay
        self._classes: dict[str, Object] = {}
        self.extended = ExtendedResources()
        self.generation = 0
        self.synced = False
        self.problem: str | None = None
        self.on_change: Callable[[ExtendedResources], None] | None = None

    async def run(self) -> None:
        await mirror(self._cluster, DEVICE_CLASSES, what="DeviceClass",
                     retry_delay=self._retry_delay, listed=self._listed, changed=self._put,
                     deleted=self._drop, failed=self._failed, missing=self._missing,
                     rbac_fix=_RBAC_FIX)

    def selectors(self, name: str) -> tuple[str, ...] | None:
        """The CEL expressions of a DeviceClass's spec.selectors as mirrored now, or None when
        no such class is known (/validate's allowed-models check reads them)."""
        device_class = self._classes.get(name)
        if device_class is None:
            return None
        spec = device_class.get("spec")
        selectors = spec.get("selectors") if isinstance(spec, dict) else None
        out = []
        for selector in selectors if isinstance(selectors, list) else ():
            cel = selector.get("cel") if isinstance(selector, dict) else None
            expression = cel.get("expression") if isinstance(cel, dict) else None
            out.append(expression if isinstance(expression, str) else "")
        return tuple(out)

    def _listed(self, items: list[Object]) -> None:
        self._replace(items)
        self._synced()

    def _missing(self) -> None:
        # No resource.k8s.io/v1 DeviceClasses here: nothing can be declared.
        self._listed([])
        log.warning("the API server serves no DeviceClasses; legacy names are translated "
                    "without looking for extendedResourceName")

    def _failed(self, exc: ApiError) -> None:
        if not self.synced:
            fix = f"; {_RBAC_FIX}" if exc.code == 403 else ""
            self.problem = f"DeviceClasses not read yet ({exc.reason}{fix})"

    def _synced(self) -> None:
        self.synced = True
        self.problem = None

    # ---- the store ---------------------------------------------------------------------------

    def _replace(self, items: list[Object]) -> None:
        self._classes = {str(i["metadata"]["name"]): i for i in items}
        self._publish()

    def _put(self, obj: Object) -> None:
        self._classes[str(obj["metadata"]["name"])] = obj
        self._publish()

    def _drop(self, obj: Object) -> None:
        if self._classes.pop(str(obj["metadata"]["name"]), None) is not None:
            self._publish()

    def _publish(self) -> None:
        fresh = ExtendedResources.from_device_classes(self._classes.values())
        if fresh == self.extended:
            return  # a change to selectors or config: nothing the webhook reads
        before = _pairs(self.extended)
        after = _pairs(fresh)
        self.extended = fresh
        self.generation += 1
        for resource, device_class in sorted(after - before):
            self._metrics.extended_declarations.labels(resource, device_class).set(1)
            if device_class in names.GATEWAY_CLASSES:
                log.warning(
                    "a dra-gateway DeviceClass declares an extended resource name: kube-scheduler "
                    "allocates its devices for that name itself, outside the gateway's allocator "
                    "(whole devices, no shares); the webhook leaves the name alone unless a rule "
                    "says extendedResourceNames: translate",
                    extra={"deviceClass": device_class, "resource": resource})
            else:
                log.info("a DeviceClass declares an extended resource name: the webhook leaves "
                         "it to kube-scheduler unless a rule says extendedResourceNames: "
                         "translate", extra={"deviceClass": device_class, "resource": resource})
        for resource, device_class in sorted(before - after):
            self._metrics.extended_declarations.remove(resource, device_class)
            log.info("a DeviceClass no longer declares an extended resource name: the webhook "
                     "translates it again unless another class declares it",
                     extra={"deviceClass": device_class, "resource": resource})
        if self.on_change is not None:
            self.on_change(fresh)


def _pairs(extended: ExtendedResources) -> set[tuple[str, str]]:
    return {(resource, device_class) for resource, classes in extended.classes.items()
            for device_class in classes}

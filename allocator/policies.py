"""The GPU policies for the allocator controller: their mirrors, and GPUQuota status.

`PolicyMirror` lists and watches GPUQuotas, GPUSharingPolicies and Namespaces (their labels
select sharing policies and name tenants) with the controller's `Informer`s, and calls
`on_change` with a fresh `Catalog` when something the planner reads changed: a quota's spec, a
sharing policy, a namespace's labels. The allocator's own status writes and namespace
heartbeats change nothing it reads and are skipped. Without the CRDs (an API server the chart's
crds/ never reached) the mirrors are empty and the allocator runs without policies.

`QuotaStatusWriter` keeps `status.hard` and `status.used` of every GPUQuota current from the
planner's ledger, through the status subresource, at most once per interval (debounced: usage
changes with every allocation, and a write per event would double the allocator's writes), and
sets the quota gauges. It writes what the ledger says: it must not count usage itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from dra_gateway.allocator.metrics import Metrics
from dra_gateway.allocator.planner.policies import PlannerPolicies
from dra_gateway.kube import objects
from dra_gateway.kube.cluster.port import ApiError, Cluster, NotFound, Object
from dra_gateway.kube.resources import GPU_QUOTAS, GPU_SHARING_POLICIES, NAMESPACES
from dra_gateway.kube.runtime.informer import Change, Informer
from dra_gateway.policy.amounts import FIELDS
from dra_gateway.policy.catalog import Catalog

log = logging.getLogger(__name__)


class PolicyMirror:
    def __init__(self, cluster: Cluster, on_change: Callable[[Catalog], None], *,
                 watch_timeout: float) -> None:
        self.on_change = on_change
        self.quotas = Informer(cluster, GPU_QUOTAS, self._on_quota, watch_timeout=watch_timeout,
                               when_missing="empty")
        self.sharing = Informer(cluster, GPU_SHARING_POLICIES, self._on_sharing,
                                watch_timeout=watch_timeout, when_missing="empty")
        self.namespaces = Informer(cluster, NAMESPACES, self._on_namespace,
                                   watch_timeout=watch_timeout)
        self.informers = (self.quotas, self.sharing, self.namespaces)
        self._reported: set[str] = set()

    def catalog(self) -> Catalog:
        catalog = Catalog.build(quotas=self.quotas.values(), sharing=self.sharing.values(),
                                namespaces=self.namespaces.values())
        for error in catalog.errors:
            if error not in self._reported:
                log.warning("GPU policy left out: %s", error)
        self._reported = set(catalog.errors)
        return catalog

    def _changed(self) -> None:
        if all(i.synced.is_set() for i in self.informers):
            self.on_change(self.catalog())

    def _on_quota(self, change: Change, obj: Object, old: Object | None) -> None:
        if change == "modified" and old is not None and old.get("spec") == obj.get("spec"):
            return  # status (ours) or metadata: the planner reads neither
        self._changed()

    def _on_sharing(self, change: Change, obj: Object, old: Object | None) -> None:
        if change == "modified" and old is not None and old.get("spec") == obj.get("spec"):
            return
        self._changed()

    def _on_namespace(self, change: Change, obj: Object, old: Object | None) -> None:
        if change == "modified" and old is not None and \
                objects.labels(old) == objects.labels(obj):
            return
        self._changed()


def _status_patch(old: Any, new: dict[str, Any]) -> dict[str, Any]:
    """A merge patch from `old` status maps to `new`, clearing fields no longer limited."""
    patch: dict[str, Any] = {}
    old = old if isinstance(old, dict) else {}
    for part, values in new.items():
        before = old.get(part) if isinstance(old.get(part), dict) else {}
        patch[part] = {**{k: None for k in before if k not in values}, **values}
    return patch


class QuotaStatusWriter:
    def __init__(self, cluster: Cluster, quotas: Informer, *, metrics: Metrics,
                 interval: float, policies: Callable[[], PlannerPolicies]) -> None:
        self.cluster = cluster
        self.quotas = quotas
        self.metrics = metrics
        self.interval = interval
        self.policies = policies  # the planner's, which a feature-mode change replaces
        self.dirty = asyncio.Event()
        self._labels: set[tuple[str, str, str]] = set()

    def changed(self) -> None:
        """Usage or quotas may have changed: write what differs at the next interval."""
        self.dirty.set()

    async def run(self) -> None:
        while True:
            await self.dirty.wait()
            await asyncio.sleep(self.interval)
            self.dirty.clear()
            await self.write()

    async def write(self) -> None:
        ledger = self.policies().ledger
        labels: set[tuple[str, str, str]] = set()
        for quota in ledger.quotas():
            status = ledger.status(quota)
            hard, used = quota.hard_amounts(), ledger.used(quota)
            for resource in FIELDS:
                if resource in hard:
                    key = (quota.namespace, quota.name, resource)
                    labels.add(key)
                    self.metrics.quota_hard.labels(*key).set(hard[resource])
                    self.metrics.quota_used.labels(*key).set(used.get(resource))
            obj = self.quotas.get(quota.namespace, quota.name)
            if obj is None:
                continue
            current = obj.get("status") or {}
            if current.get("hard") == status["hard"] and current.get("used") == status["used"]:
                continue
            try:
                # The watch brings the write back; a repeat before it does is harmless.
                await self.cluster.patch(
                    GPU_QUOTAS, quota.name, {"status": _status_patch(current, status)},
                    namespace=quota.namespace, subresource="status")
            except NotFound:
                continue
            except (ApiError, OSError, TimeoutError) as err:
                # The next change writes it again; a failing write must not stop the writer.
                log.warning("could not write GPUQuota status", extra={
                    "quota": f"{quota.namespace}/{quota.name}", "error": str(err)})
                self.dirty.set()
                continue
        for key in self._labels - labels:
            self.metrics.quota_hard.remove(*key)
            self.metrics.quota_used.remove(*key)
        self._labels = labels


__all__ = ["PolicyMirror", "QuotaStatusWriter"]

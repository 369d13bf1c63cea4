"""GPUQuota status, written by the allocator controller from the planner's ledger.

The policies themselves reach the planner through the runtime's `PolicyMirror` fed to a
`CatalogKeeper` that leaves quotas' status out (the controller wires them): the allocator's own
status writes and namespace heartbeats change nothing the planner reads. Without the CRDs (an API
server the chart's crds/ never reached) the mirrors are empty and the allocator runs without
policies.

`QuotaStatusWriter` keeps `status.hard` and `status.used` (and, in a cohort, `status.min`,
`status.borrowed` and `status.lent`) of every GPUQuota current from the
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
from dra_gateway.kube.cluster.port import ApiError, Cluster, NotFound
from dra_gateway.kube.resources import GPU_QUOTAS
from dra_gateway.kube.runtime.informer import Informer
from dra_gateway.policy.amounts import FIELDS

log = logging.getLogger(__name__)


# The parts of the status the writer owns (`QuotaLedger.status`); those of a cohort go when the
# quota leaves it.
_PARTS = ("hard", "used", "min", "borrowed", "lent")


def _status_patch(old: Any, new: dict[str, Any]) -> dict[str, Any]:
    """A merge patch from `old` status maps to `new`, clearing fields no longer limited (and
    the cohort's parts of a quota no longer in one)."""
    patch: dict[str, Any] = {}
    old = old if isinstance(old, dict) else {}
    for part, values in new.items():
        before = old.get(part) if isinstance(old.get(part), dict) else {}
        patch[part] = {**{k: None for k in before if k not in values}, **values}
    for part in _PARTS:
        if part in old and part not in new:
            patch[part] = None
    return patch


def _current(old: Any, new: dict[str, Any]) -> bool:
    """Whether the status already says what `new` says."""
    old = old if isinstance(old, dict) else {}
    return all(old.get(part) == new.get(part) for part in _PARTS)


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
            minimum = quota.min_amounts() if quota.cohort else {}
            for resource in FIELDS:
                if resource in hard:
                    key = (quota.namespace, quota.name, resource)
                    labels.add(key)
                    self.metrics.quota_hard.labels(*key).set(hard[resource])
                    self.metrics.quota_used.labels(*key).set(used.get(resource))
                    self.metrics.quota_borrowed.labels(*key).set(
                        max(0, used.get(resource) - minimum[resource])
                        if resource in minimum else 0)
            obj = self.quotas.get(quota.namespace, quota.name)
            if obj is None:
                continue
            current = obj.get("status") or {}
            if _current(current, status):
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
            self.metrics.quota_borrowed.remove(*key)
        self._labels = labels


__all__ = ["QuotaStatusWriter"]

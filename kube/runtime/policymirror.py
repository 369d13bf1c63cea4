"""The objects GPU policies are made of, mirrored for the component that builds policies of them.

`PolicyMirror` runs one informer per kind (GPUQuotas, GPUSharingPolicies, and Namespaces, whose
labels select sharing policies and name tenants) and hands every full list and every change to
a `PolicyBuilder`, which says whether what it builds changed; once every kind is listed, each
such change reaches `on_change` with the builder's latest result. The allocator and the webhook
both give it `policy.keeper.CatalogKeeper` (the runtime must not import policy/, hence the
builder). A type the API server does not serve (the chart's CRDs not installed) counts as empty
and is listed again every `max_backoff` until it appears; a refused list keeps `synced` false,
with the RBAC fix in `problem` for readiness. This module knows nothing of what a policy means.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Generic, Protocol, TypeVar

from dra_gateway.kube.cluster.port import ApiError, Cluster, Object
from dra_gateway.kube.resources import (
    GPU_QUOTAS,
    GPU_SHARING_POLICIES,
    NAMESPACES,
    ResourceType,
)
from dra_gateway.kube.runtime.informer import Change, Informer

log = logging.getLogger(__name__)

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class PolicyBuilder(Protocol[T_co]):
    """What the mirror feeds: True from `replace` or `change` when `catalog` changed."""

    @property
    def catalog(self) -> T_co: ...

    def replace(self, kind: ResourceType, items: Sequence[Object]) -> bool: ...

    def change(self, kind: ResourceType, change: Change, obj: Object,
               old: Object | None) -> bool: ...


class PolicyMirror(Generic[T]):
    """The three kinds' informers (`quotas`, `sharing`, `namespaces`; `informers` in the order
    to sync), feeding `builder`. Run the informers (`run()` does) and cancel to stop."""

    def __init__(self, cluster: Cluster, builder: PolicyBuilder[T], *,
                 on_change: Callable[[T], None] | None = None, watch_timeout: float = 300.0,
                 min_backoff: float = 0.2, max_backoff: float = 30.0,
                 rbac_fix: str | None = None, keep_going: bool = False) -> None:
        self.builder = builder
        self.on_change = on_change
        self.rbac_fix = rbac_fix
        self._problems: dict[ResourceType, str] = {}

        def informer(kind: ResourceType, *, optional: bool) -> Informer:
            return Informer(
                cluster, kind, lambda change, obj, old: self._changed(kind, change, obj, old),
                replaced=lambda items: self._replaced(kind, items),
                failed=lambda exc: self._failed(kind, exc),
                missing=(lambda: self._missing(kind)) if optional else None,
                when_missing="empty" if optional else "fail", watch_timeout=watch_timeout,
                min_backoff=min_backoff, max_backoff=max_backoff, what=f"policy {kind.plural}",
                rbac_fix=rbac_fix, keep_going=keep_going)

        self.quotas = informer(GPU_QUOTAS, optional=True)
        self.sharing = informer(GPU_SHARING_POLICIES, optional=True)
        self.namespaces = informer(NAMESPACES, optional=False)
        self.informers = (self.quotas, self.sharing, self.namespaces)

    def catalog(self) -> T:
        return self.builder.catalog

    @property
    def synced(self) -> bool:
        return all(i.synced.is_set() for i in self.informers)

    @property
    def problem(self) -> str | None:
        """Why the mirror is not synced yet (None once it is)."""
        if self.synced:
            return None
        return "; ".join(self._problems.values()) or "GPU policies not read yet"

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for informer in self.informers:
                group.create_task(informer.run(), name=f"policies-{informer.rt.plural}")

    def _replaced(self, kind: ResourceType, items: list[Object]) -> None:
        self._problems.pop(kind, None)
        if self.builder.replace(kind, items):
            self._notify()

    def _changed(self, kind: ResourceType, change: Change, obj: Object,
                 old: Object | None) -> None:
        if self.builder.change(kind, change, obj, old):
            self._notify()

    def _notify(self) -> None:
        if self.on_change is not None and self.synced:
            self.on_change(self.builder.catalog)

    def _failed(self, kind: ResourceType, exc: ApiError) -> None:
        informer = {i.rt: i for i in self.informers}[kind]
        if not informer.synced.is_set():
            fix = f"; {self.rbac_fix}" if exc.code == 403 and self.rbac_fix else ""
            self._problems[kind] = f"{kind.plural} not read yet ({exc.reason}{fix})"

    def _missing(self, kind: ResourceType) -> None:
        log.warning("the API server serves no %s; install the chart's CRDs to use GPU policies",
                    kind.plural)

"""The Catalog of the GPU policies a mirror holds, kept current one change at a time.

`CatalogKeeper` takes what a mirror of GPUQuotas, GPUSharingPolicies and Namespaces reports (a
kind's full list, or one object's change) and keeps the `Catalog` that the allocator's planner
and the webhook's /validate read; it is the builder `kube.runtime.policymirror.PolicyMirror`
feeds. Only what a catalog reads counts as a change: a quota's or a sharing policy's spec, a
namespace's labels and, with `usage`, a quota's `status.used` (/validate charges requests
against it; the allocator counts usage in its own ledger and writes that status itself, so its
own writes must not rebuild its catalog). A quota's change is taken in alone, its compiled form
kept while its spec stays, and the sharing rules are combined again only when a sharing policy
or a namespace changes (a full build of hundreds of objects costs tens of milliseconds). A
policy that does not validate is logged once and left out. Pure: no I/O.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from dra_gateway.kube import objects
from dra_gateway.kube.resources import (
    GPU_QUOTAS,
    GPU_SHARING_POLICIES,
    NAMESPACES,
    ResourceType,
)
from dra_gateway.policy.admission import QuotaState
from dra_gateway.policy.catalog import Catalog, quota_state
from dra_gateway.policy.models import PolicyError

log = logging.getLogger(__name__)

KINDS: tuple[ResourceType, ...] = (GPU_QUOTAS, GPU_SHARING_POLICIES, NAMESPACES)

Key = tuple[str, str]  # (namespace or "", name)
Change = Literal["added", "modified", "deleted"]


def _key(obj: Mapping[str, Any]) -> Key:
    return objects.namespace_name(obj)


class CatalogKeeper:
    """The catalog of the policy objects seen so far; `catalog` is read as an attribute."""

    def __init__(self, *, usage: bool) -> None:
        self.usage = usage
        self.catalog = Catalog()
        self._objects: dict[ResourceType, dict[Key, Mapping[str, Any]]] = {
            kind: {} for kind in KINDS}
        # Each GPUQuota as the catalog holds it (or why it is left out), kept per object.
        self._quota_states: dict[Key, QuotaState] = {}
        self._quota_errors: dict[Key, str] = {}
        self._reported: set[str] = set()

    def replace(self, kind: ResourceType, items: Iterable[Mapping[str, Any]]) -> bool:
        """Take in a kind's full list; True when the catalog changed."""
        fresh = {_key(item): item for item in items}
        held = self._objects[kind]
        if fresh.keys() == held.keys() and all(
                self._read(kind, obj) == self._read(kind, held[key])
                for key, obj in fresh.items()):
            self._objects[kind] = fresh
            return False
        if kind is GPU_QUOTAS:
            for gone in set(self._quota_states) | set(self._quota_errors):
                if gone not in fresh:
                    self._quota_states.pop(gone, None)
                    self._quota_errors.pop(gone, None)
            for obj in fresh.values():
                self._quota(obj)
        self._objects[kind] = fresh
        self._publish(kind)
        return True

    def change(self, kind: ResourceType, change: Change, obj: Mapping[str, Any],
               old: Mapping[str, Any] | None = None) -> bool:
        """Take in one object's change; True when the catalog changed."""
        key = _key(obj)
        held = self._objects[kind]
        if change == "deleted":
            if held.pop(key, None) is None:
                return False
            if kind is GPU_QUOTAS:
                self._quota_states.pop(key, None)
                self._quota_errors.pop(key, None)
            self._publish(kind)
            return True
        previous = held.get(key)
        if previous is not None and self._read(kind, previous) == self._read(kind, obj):
            held[key] = obj
            return False  # status (ours) or metadata: nothing the catalog reads
        if kind is GPU_QUOTAS:
            self._quota(obj)
        held[key] = obj
        self._publish(kind)
        return True

    def _read(self, kind: ResourceType, obj: Mapping[str, Any]) -> Any:
        """What of an object the catalog reads."""
        if kind is NAMESPACES:
            return objects.labels(obj)
        if kind is GPU_QUOTAS and self.usage:
            return obj.get("spec"), (obj.get("status") or {}).get("used")
        return obj.get("spec")

    def _quota(self, obj: Mapping[str, Any]) -> None:
        """Take in one GPUQuota before it replaces the one held: a change that leaves its spec
        alone (a status write) keeps the compiled quota."""
        key = _key(obj)
        held = self._objects[GPU_QUOTAS].get(key)
        previous = self._quota_states.get(key) \
            if held is not None and held.get("spec") == obj.get("spec") else None
        try:
            self._quota_states[key] = quota_state(obj, previous)
            self._quota_errors.pop(key, None)
        except PolicyError as exc:
            self._quota_states.pop(key, None)
            self._quota_errors[key] = str(exc)

    def _publish(self, changed: ResourceType) -> None:
        catalog = self.catalog
        if changed is not GPU_QUOTAS:
            catalog = Catalog.build(sharing=self._objects[GPU_SHARING_POLICIES].values(),
                                    namespaces=self._objects[NAMESPACES].values())
        catalog = catalog.with_quotas(self._quota_states.values(), self._quota_errors.values())
        for error in catalog.errors:
            if error not in self._reported:
                log.warning("GPU policy left out: %s", error)
        self._reported = set(catalog.errors)
        self.catalog = catalog

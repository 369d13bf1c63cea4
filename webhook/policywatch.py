"""The cluster's GPU policies, mirrored by lists and watches, for /validate.

`PolicyWatch` keeps GPUQuotas, GPUSharingPolicies and Namespaces (their labels select sharing
policies) current without an API call per review, through the runtime's `PolicyMirror`
(list, watch, relist, backoff) and the `CatalogKeeper` the allocator uses too: after every change
that matters it publishes the keeper's fresh `Catalog` (pure, from dra_gateway.policy), which
reviews read as one attribute. The webhook's keeper reads each GPUQuota's `status.used`, which
/validate charges requests against. An API server without the CRDs (404: the chart's crds/ not
installed) counts as a cluster without policies; a refusal (403) keeps the webhook unready with
the RBAC fix in the log and in /readyz. Of its own it reports namespaces whose translation label
has an unknown value, and answers a namespace's labels as last seen. This module must not answer
reviews.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.port import Cluster, Object
from dra_gateway.kube.resources import NAMESPACES, ResourceType
from dra_gateway.kube.runtime.informer import Change
from dra_gateway.kube.runtime.policymirror import PolicyMirror
from dra_gateway.policy.catalog import Catalog
from dra_gateway.policy.keeper import CatalogKeeper

log = logging.getLogger(__name__)

_RBAC_FIX = ("grant the webhook's ServiceAccount list and watch on gpuquotas and "
             "gpusharingpolicies in API group dra-gateway.io and on namespaces, or start the "
             "webhook with --no-policies")


class PolicyWatch:
    """The policies in force; run `run()` in a task, cancel it to stop.

    `catalog` is read on the hot path (an attribute read, no I/O); `synced` turns true once every
    type was listed; `problem` says why it is not, for /readyz.
    """

    def __init__(self, cluster: Cluster, *, retry_delay: float = 1.0) -> None:
        self._keeper = CatalogKeeper(usage=True)
        # Errors other than the API's keep the mirror going, as every webhook mirror does.
        self._mirror = PolicyMirror(cluster, self, min_backoff=retry_delay, rbac_fix=_RBAC_FIX,
                                    keep_going=True)
        # Namespaces whose translation label has an unknown value, with the value reported.
        self._bad_labels: dict[str, str] = {}
        self.catalog = Catalog()
        self.generation = 0
        self.on_change: Callable[[Catalog], None] | None = None
        # Called with a namespace's name when it is deleted (the webhook's caches of it go).
        self.on_namespace_deleted: Callable[[str], None] | None = None

    @property
    def synced(self) -> bool:
        return self._mirror.synced

    @property
    def problem(self) -> str | None:
        return self._mirror.problem

    async def run(self) -> None:
        await self._mirror.run()

    def namespace_label(self, namespace: str, key: str) -> str | None:
        """The value of label `key` on `namespace` as last seen (None: no such label, or the
        namespace not seen)."""
        obj = self._mirror.namespaces.get(None, namespace)
        return objects.labels(obj).get(key) if obj is not None else None

    # What the mirror feeds (a PolicyBuilder): the keeper's catalog, published at every change.

    def replace(self, kind: ResourceType, items: Sequence[Object]) -> bool:
        if kind is NAMESPACES:
            for item in items:
                self._check_translation_label(item)
        return self._published(self._keeper.replace(kind, items))

    def change(self, kind: ResourceType, change: Change, obj: Object,
               old: Object | None) -> bool:
        if kind is NAMESPACES and change != "deleted":
            self._check_translation_label(obj)
        if kind is NAMESPACES and change == "deleted" and self.on_namespace_deleted is not None:
            self.on_namespace_deleted(objects.name(obj))
        return self._published(self._keeper.change(kind, change, obj, old))

    def _published(self, changed: bool) -> bool:
        if changed:
            self.catalog = self._keeper.catalog
            self.generation += 1
            if self.on_change is not None:
                self.on_change(self.catalog)
        return changed

    def _check_translation_label(self, namespace: Object) -> None:
        """Say, once per value, that a namespace's translation label reads as no mode: its pods
        are admitted unchanged, and its administrator should know why."""
        name = objects.name(namespace)
        value = objects.labels(namespace).get(names.TRANSLATION_LABEL)
        if value is None or value in names.TRANSLATION_MODES:
            self._bad_labels.pop(name, None)
            return
        if self._bad_labels.get(name) != value:
            self._bad_labels[name] = value
            log.warning("namespace translation label has an unknown value: its pods are "
                        "admitted unchanged, as in audit mode", extra={
                            "namespace": name, "label": names.TRANSLATION_LABEL,
                            "value": value, "fix": "set it to " + ", ".join(
                                names.TRANSLATION_MODES)})

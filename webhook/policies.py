"""The cluster's GPU policies, mirrored by lists and watches, for /validate.

`PolicyWatch` keeps GPUQuotas, GPUSharingPolicies and Namespaces (their labels select sharing
policies) current without an API call per review: for each type it lists through the cluster
port, watches from the list's resourceVersion and relists when the watch expires or fails (after
a pause that grows while the API keeps failing). After every change it publishes a fresh
`Catalog` (pure, from dra_gateway.policy), which reviews read as one attribute; a GPUQuota's
change (the allocator writes their status every few seconds) is taken in alone, its compiled
form kept while its spec stays, and the sharing rules are combined again only when a sharing
policy or a namespace changes (a full build costs tens of milliseconds of the event loop that
answers reviews). An API server
without the CRDs (404: the chart's crds/ not installed) counts as a cluster without policies; a
refusal (403) keeps the webhook unready with the RBAC fix in the log and in /readyz. A policy
that does not validate is logged once and left out. This module must not answer reviews.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.port import ApiError, Cluster, Object
from dra_gateway.kube.resources import (
    GPU_QUOTAS,
    GPU_SHARING_POLICIES,
    NAMESPACES,
    ResourceType,
)
from dra_gateway.policy.admission import QuotaState
from dra_gateway.policy.catalog import Catalog, quota_state
from dra_gateway.policy.models import PolicyError
from dra_gateway.webhook.mirroring import mirror

log = logging.getLogger(__name__)

WATCHED: tuple[ResourceType, ...] = (GPU_QUOTAS, GPU_SHARING_POLICIES, NAMESPACES)
_RBAC_FIX = ("grant the webhook's ServiceAccount list and watch on gpuquotas and "
             "gpusharingpolicies in API group dra-gateway.io and on namespaces, or start the "
             "webhook with --no-policies")


def _key(obj: Object) -> tuple[str, str]:
    return objects.namespace_name(obj)


class PolicyWatch:
    """The policies in force; run `run()` in a task, cancel it to stop.

    `catalog` is read on the hot path (an attribute read, no I/O); `synced` turns true once every
    type was listed; `problem` says why it is not, for /readyz.
    """

    def __init__(self, cluster: Cluster, *, retry_delay: float = 1.0) -> None:
        self._cluster = cluster
        self._retry_delay = retry_delay
        self._objects: dict[ResourceType, dict[tuple[str, str], Object]] = {
            rt: {} for rt in WATCHED}
        self._listed: set[ResourceType] = set()
        self._problems: dict[ResourceType, str] = {}
        self._reported: set[str] = set()
        # Each GPUQuota as the catalog holds it (or why it is left out), kept per object.
        self._quota_states: dict[tuple[str, str], QuotaState] = {}
        self._quota_errors: dict[tuple[str, str], str] = {}
        # Namespaces whose translation label has an unknown value, with the value reported.
        self._bad_labels: dict[str, str] = {}
        self.catalog = Catalog()
        self.generation = 0
        self.on_change: Callable[[Catalog], None] | None = None

    @property
    def synced(self) -> bool:
        return self._listed.issuperset(WATCHED)

    @property
    def problem(self) -> str | None:
        if self.synced:
            return None
        return "; ".join(self._problems.values()) or "GPU policies not read yet"

    async def run(self) -> None:
        async with asyncio.TaskGroup() as group:
            for rt in WATCHED:
                group.create_task(self._mirror(rt), name=f"policies-{rt.plural}")

    async def _mirror(self, rt: ResourceType) -> None:
        def missing() -> None:
            # The CRD is not installed: no policies of this kind.
            self._replace(rt, [])
            log.warning("the API server serves no %s; install the chart's CRDs to use GPU "
                        "policies", rt.plural)

        def failed(exc: ApiError) -> None:
            if rt not in self._listed:
                fix = f"; {_RBAC_FIX}" if exc.code == 403 else ""
                self._problems[rt] = f"{rt.plural} not read yet ({exc.reason}{fix})"

        await mirror(self._cluster, rt, what=f"policy {rt.plural}",
                     retry_delay=self._retry_delay,
                     listed=lambda items: self._replace(rt, items),
                     changed=lambda obj: self._changed(rt, obj),
                     deleted=lambda obj: self._deleted(rt, obj),
                     failed=failed, missing=missing, rbac_fix=_RBAC_FIX)

    def namespace_label(self, namespace: str, key: str) -> str | None:
        """The value of label `key` on `namespace` as last seen (None: no such label, or the
        namespace not seen)."""
        obj = self._objects[NAMESPACES].get(("", namespace))
        return objects.labels(obj).get(key) if obj is not None else None

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

    def _changed(self, rt: ResourceType, obj: Object) -> None:
        if rt is NAMESPACES:
            self._check_translation_label(obj)
        if rt is GPU_QUOTAS:
            self._quota(obj)
        self._objects[rt][_key(obj)] = obj
        self._publish(rt)

    def _deleted(self, rt: ResourceType, obj: Object) -> None:
        if self._objects[rt].pop(_key(obj), None) is None:
            return
        if rt is GPU_QUOTAS:
            self._quota_states.pop(_key(obj), None)
            self._quota_errors.pop(_key(obj), None)
        self._publish(rt)

    def _replace(self, rt: ResourceType, items: list[Object]) -> None:
        if rt is GPU_QUOTAS:
            listed = {_key(i) for i in items}
            for gone in set(self._quota_states) | set(self._quota_errors):
                if gone not in listed:
                    self._quota_states.pop(gone, None)
                    self._quota_errors.pop(gone, None)
            for item in items:
                self._quota(item)
        if rt is NAMESPACES:
            for item in items:
                self._check_translation_label(item)
        self._objects[rt] = {_key(i): i for i in items}
        self._listed.add(rt)
        self._problems.pop(rt, None)
        self._publish(rt)

    def _quota(self, obj: Object) -> None:
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
        self.generation += 1
        if self.on_change is not None:
            self.on_change(catalog)

"""The profiles of the gateway driver's devices, mirrored from its ResourceSlices, for /validate.

A GPUSharingPolicy's allowedModels depends on the card: /validate refuses at once a request
whose selectors match only cards of forbidden models, and needs to know which cards exist
for that. `DeviceProfileWatch` lists the ResourceSlices of the gateway's driver through the
cluster port (field selector spec.driver), watches from the list's resourceVersion and relists
when the watch expires or fails (webhook/mirroring.py). It keeps only the distinct device
profiles (dra_gateway.policy.profiles: devices alike but for their identity, a few per cluster
however many cards), counted per slice, and publishes a fresh `DeviceProfiles` with a new
generation only when a profile appears or the last device of one goes: node plugins republish
their slices (health, restarts) without making /validate evaluate selectors again.

An API server without the ResourceSlice API (404) counts as a cluster without cards; a refusal
(403) keeps the webhook unready, with the RBAC fix in the log and in /readyz. This module must
not answer reviews.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping
from typing import Any

from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.port import ApiError, Cluster, Object
from dra_gateway.kube.resources import RESOURCE_SLICES
from dra_gateway.policy.profiles import (
    DeviceProfile,
    DeviceProfiles,
    product_name,
    profile_device,
    profile_signature,
)
from dra_gateway.webhook.mirroring import mirror

log = logging.getLogger(__name__)

_RBAC_FIX = ("grant the webhook's ServiceAccount list and watch on resourceslices in API group "
             "resource.k8s.io, or start the webhook with --no-policies")


def _profiles_of(slice_: Mapping[str, Any]) -> dict[str, DeviceProfile]:
    """The profiles of one slice's devices, by signature."""
    spec = slice_.get("spec")
    if not isinstance(spec, Mapping):
        return {}
    driver = str(spec.get("driver") or "")
    devices = spec.get("devices")
    found: dict[str, DeviceProfile] = {}
    for device in devices if isinstance(devices, list) else ():
        if not isinstance(device, Mapping):
            continue
        signature = profile_signature(driver, device)
        if signature not in found:
            found[signature] = DeviceProfile(signature, driver, profile_device(driver, device),
                                             product_name(driver, device))
    return found


class DeviceProfileWatch:
    """The device profiles published now; run `run()` in a task, cancel it to stop.

    `profiles` is read on the hot path (an attribute read, no I/O); `synced` turns true after the
    first complete list; `problem` says why it is not, for /readyz.
    """

    def __init__(self, cluster: Cluster, *, retry_delay: float = 1.0) -> None:
        self._cluster = cluster
        self._retry_delay = retry_delay
        self._slices: dict[str, frozenset[str]] = {}  # slice name -> its profiles' signatures
        self._count: Counter[str] = Counter()  # signature -> slices holding it
        self._known: dict[str, DeviceProfile] = {}
        self.profiles = DeviceProfiles()
        self.synced = False
        self.problem: str | None = None

    async def run(self) -> None:
        await mirror(self._cluster, RESOURCE_SLICES, what="ResourceSlice",
                     retry_delay=self._retry_delay, listed=self._listed, changed=self._put,
                     deleted=self._drop, failed=self._failed, missing=self._missing,
                     field_selector=f"spec.driver={names.DRIVER}", rbac_fix=_RBAC_FIX)

    def _missing(self) -> None:
        # No resource.k8s.io/v1 here: no cards to judge models by; the allocator decides.
        self._listed([])
        log.warning("the API server serves no ResourceSlices; /validate leaves allowedModels "
                    "to the allocator")

    def _listed(self, items: list[Object]) -> None:
        before = set(self._count)
        self._slices.clear()
        self._count.clear()
        for item in items:
            self._add(item)
        self._publish(before)
        self.synced = True
        self.problem = None

    def _failed(self, exc: ApiError) -> None:
        if not self.synced:
            fix = f"; {_RBAC_FIX}" if exc.code == 403 else ""
            self.problem = f"ResourceSlices not read yet ({exc.reason}{fix})"

    def _put(self, obj: Object) -> None:
        before = set(self._count)
        self._remove(objects.name(obj))
        self._add(obj)
        self._publish(before)

    def _drop(self, obj: Object) -> None:
        before = set(self._count)
        self._remove(objects.name(obj))
        self._publish(before)

    def _add(self, obj: Object) -> None:
        found = _profiles_of(obj)
        for signature, profile in found.items():
            self._known.setdefault(signature, profile)
        self._slices[objects.name(obj)] = frozenset(found)
        self._count.update(found.keys())

    def _remove(self, name: str) -> None:
        for signature in self._slices.pop(name, frozenset()):
            self._count[signature] -= 1
            if self._count[signature] <= 0:
                del self._count[signature]

    def _publish(self, before: set[str]) -> None:
        after = set(self._count)
        for gone in before - after:
            self._known.pop(gone, None)
        if after == before and self.synced:
            return
        self.profiles = DeviceProfiles(
            profiles=tuple(self._known[s] for s in sorted(after)),
            generation=self.profiles.generation + 1)
        log.info("device profiles changed", extra={"profiles": len(after),
                                                    "added": len(after - before),
                                                    "removed": len(before - after)})

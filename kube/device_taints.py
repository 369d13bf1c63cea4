"""DeviceTaintRules applied to the devices of ResourceSlices, as kube-scheduler applies them.

An administrator taints devices without touching their driver's slices through a
DeviceTaintRule (`resource.k8s.io/v1`, on by default from Kubernetes 1.37): its
`spec.deviceSelector` names a driver, a pool and a device (each optional: an empty selector
selects every device, a missing one none), and its `spec.taint` is added to each selected
device's own `taints`. Schedulers then treat the device as if its driver had tainted it: a
NoSchedule or NoExecute taint keeps away every request that does not tolerate it, and
kube-controller-manager evicts the pods using a device with a NoExecute taint they do not
tolerate. A toleration without an effect tolerates every effect (kube-controller-manager's
eviction agrees from 1.38).

`TaintRules` holds the rules by name; `apply` returns a slice with the rules' taints added to its
devices (the same object when no rule selects any of them). Pure: no I/O.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_gateway.kube import objects


@dataclass(frozen=True, slots=True)
class _Rule:
    driver: str | None
    pool: str | None
    device: str | None
    taint: Mapping[str, Any]

    def selects(self, driver: str, pool: str, device: str) -> bool:
        return ((self.driver is None or self.driver == driver)
                and (self.pool is None or self.pool == pool)
                and (self.device is None or self.device == device))


def _rule(obj: Mapping[str, Any]) -> _Rule | None:
    spec = obj.get("spec") or {}
    selector = spec.get("deviceSelector")
    taint = spec.get("taint")
    if not isinstance(selector, Mapping) or not isinstance(taint, Mapping):
        return None  # without a selector a rule selects no device
    return _Rule(selector.get("driver") or None, selector.get("pool") or None,
                 selector.get("device") or None, dict(taint))


class TaintRules:
    """The cluster's DeviceTaintRules, by name."""

    def __init__(self, rules: Iterable[Mapping[str, Any]] = ()) -> None:
        self._rules: dict[str, _Rule] = {}
        for obj in rules:
            self.set(obj)

    def set(self, obj: Mapping[str, Any]) -> bool:
        """Record a rule (added or changed); True when what it taints changed."""
        name = objects.name(obj)
        rule = _rule(obj)
        old = self._rules.get(name)
        if rule is None:
            self._rules.pop(name, None)
        else:
            self._rules[name] = rule
        return old != rule

    def remove(self, name: str) -> bool:
        """Forget a deleted rule; True when it tainted anything."""
        return self._rules.pop(name, None) is not None

    def __len__(self) -> int:
        return len(self._rules)

    def taints_of(self, driver: str, pool: str, device: str) -> list[Mapping[str, Any]]:
        """The taints the rules add to one device, in the rules' name order."""
        return [rule.taint for _, rule in sorted(self._rules.items())
                if rule.selects(driver, pool, device)]

    def apply(self, resource_slice: dict[str, Any]) -> dict[str, Any]:
        """`resource_slice` with the rules' taints added to the devices they select."""
        if not self._rules:
            return resource_slice
        spec = resource_slice.get("spec") or {}
        driver = str(spec.get("driver") or "")
        pool = str((spec.get("pool") or {}).get("name") or "")
        added = {index: taints for index, device in enumerate(spec.get("devices") or ())
                 if (taints := self.taints_of(driver, pool, str(device.get("name") or "")))}
        if not added:
            return resource_slice
        tainted = copy.copy(resource_slice)
        devices = list(spec.get("devices") or ())
        for index, taints in added.items():
            device = dict(devices[index])
            device["taints"] = [*(device.get("taints") or ()), *taints]
            devices[index] = device
        tainted["spec"] = {**spec, "devices": devices}
        return tainted


__all__ = ["TaintRules"]

"""Pods left on legacy GPU names, as /validate charges them to their namespace's GPUQuotas.

A GPUQuota counts a namespace's translated pods and the pods a legacy device plugin serves
together (policy.legacyusage): /validate refuses a legacy pod that would take one past its hard
amounts. The quota's usage is the allocator's (its status, written every few seconds); a legacy
pod this replica admitted a moment ago may not be in it yet, so `RecentLegacyPods` keeps each
for `grace` seconds and /validate adds them on top. Once the allocator's status counts such a
pod, it is counted twice until its grace ends: near its limit, a namespace may see a legacy pod
refused that fits, for at most those seconds, never one admitted that does not (replicas do not
share what they admitted: two replicas admitting at once can each miss the other's pod).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dra_gateway.policy.amounts import DeviceCharge
from dra_gateway.policy.legacyusage import keeps_legacy_gpus, legacy_names, pod_charges
from dra_gateway.translator.extended import ExtendedResources, deferred_resources
from dra_gateway.translator.rules import RuleSet
from dra_gateway.translator.translate import translated_claim_specs


def legacy_charges(pod: dict[str, Any], rules: RuleSet, extended: ExtendedResources, *,
                   card_memory: int = 0) -> tuple[DeviceCharge, ...]:
    """What `pod` costs its namespace's quotas while a legacy plugin serves it, by the rules in
    force, a whole card at `card_memory` (the smallest card published, as the allocator reads
    it); () when it asks no legacy stack for GPUs."""
    if not keeps_legacy_gpus(pod):
        return ()
    skip = deferred_resources(legacy_names(pod), rules, extended)
    if skip and not keeps_legacy_gpus(pod, skip=skip):
        return ()
    return pod_charges(pod, translated_claim_specs(pod, rules, extended=extended),
                       card_memory=card_memory, skip=skip)


class RecentLegacyPods:
    """The legacy pods this replica admitted in the last `grace` seconds, per namespace."""

    def __init__(self, grace: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.grace = grace
        self._clock = clock
        self._pods: dict[str, dict[str, tuple[float, tuple[DeviceCharge, ...]]]] = {}

    def of(self, namespace: str) -> tuple[tuple[DeviceCharge, ...], ...]:
        pods = self._pods.get(namespace)
        if not pods:
            return ()
        now = self._clock()
        for uid in [uid for uid, (until, _) in pods.items() if until <= now]:
            del pods[uid]
        if not pods:
            del self._pods[namespace]
        return tuple(charges for _, charges in pods.values())

    def add(self, namespace: str, uid: str, charges: tuple[DeviceCharge, ...]) -> None:
        if charges and self.grace > 0:
            self._pods.setdefault(namespace, {})[uid] = (self._clock() + self.grace, charges)


__all__ = ["RecentLegacyPods", "legacy_charges"]

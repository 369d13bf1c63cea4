"""What pods a legacy device plugin serves cost their namespaces' GPUQuotas, for the planner.

A namespace moving to the gateway holds translated pods (their claims the planner counts) and
pods still on legacy names (created before it was enabled, audited, or opted out). The GPUQuota
is one ceiling over both (ARCHITECTURE.md, "Moving a live cluster"): each legacy pod is charged
what its translation by the built-in rules would cost (`policy.legacyusage`), for as long as it
lives. The built-in rules read every protocol in its documented unit; a site whose rules read a
name in another unit (gpushare memory in MiB, say) is charged in the protocol's.

Names a DeviceClass declares as its extended resource are kube-scheduler's (it allocates claims
for them, which the planner counts as claims), so they are not charged again here.
"""

from __future__ import annotations

from collections.abc import Iterable

from dra_gateway.kube.cluster.port import Object
from dra_gateway.policy.amounts import DeviceCharge
from dra_gateway.policy.legacyusage import keeps_legacy_gpus, legacy_names, pod_charges
from dra_gateway.translator.extended import ExtendedResources, deferred_resources
from dra_gateway.translator.rules import RuleSet, load_rules
from dra_gateway.translator.translate import translated_claim_specs


class LegacyPods:
    """Charges of pods left on legacy GPU names, by the built-in rules."""

    def __init__(self, rules: RuleSet | None = None) -> None:
        self.rules = rules if rules is not None else load_rules()
        self.extended = ExtendedResources()

    def set_device_classes(self, classes: Iterable[Object]) -> None:
        self.extended = ExtendedResources.from_device_classes(classes)

    def charges(self, pod: Object, *, card_memory: int) -> tuple[DeviceCharge, ...]:
        """What `pod` costs its namespace's quotas while a legacy plugin serves it; () when it
        asks no legacy stack for GPUs (a translated pod, a pod without GPUs)."""
        if not keeps_legacy_gpus(pod):
            return ()  # most pods: no legacy GPU name at all
        skip = deferred_resources(legacy_names(pod), self.rules, self.extended)
        if skip and not keeps_legacy_gpus(pod, skip=skip):
            return ()
        return pod_charges(pod, translated_claim_specs(pod, self.rules, extended=self.extended),
                           card_memory=card_memory, skip=skip)


__all__ = ["LegacyPods"]

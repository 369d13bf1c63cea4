"""Prometheus metrics of the allocator controller, in a registry owned by one controller.

A registry per instance (not the process-global default) so that tests and a restarted
controller start from zero; `Stats` are the same counts kept as plain numbers for tests and
logs. This module only counts; it takes no decisions.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest


@dataclass
class Stats:
    """What tests and logs want to know about a running controller."""

    plans: int = 0
    claims_allocated: int = 0
    claims_released: int = 0
    conflicts: int = 0
    failures: int = 0
    errors: int = 0
    started: float = field(default_factory=time.monotonic)


# A quota's namespace is `quota_namespace`, never `namespace`: Prometheus' Kubernetes
# discovery, as the Prometheus Operator configures it from the chart's PodMonitors, gives every
# scraped series the scraped pod's `namespace` (with `pod`, `container`, `endpoint`, `job`,
# `instance`, and `node` from the chart's relabeling). A metric's own label of one of those names
# is renamed `exported_namespace` on the way in, and every tenant's quota then reads as being in
# the gateway's namespace. honorLabels was rejected: it would drop the pod's own namespace from
# every other series the component exports.
QUOTA_LABELS = ("quota_namespace", "quota", "resource")


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.consumable_capacity = Gauge(
            "dra_gateway_allocator_consumable_capacity",
            "1 when the API server keeps allowMultipleAllocations (native shares), 0 in the "
            "fallback world where shares are recorded in annotations", registry=r)
        self.leader = Gauge("dra_gateway_allocator_leader",
                            "1 while this replica holds the allocator Lease", registry=r)
        self.pods_allocated = Counter(
            "dra_gateway_allocator_pods_allocated",
            "Pods whose gateway claims were all allocated and whose gate was removed",
            registry=r)
        self.claims_allocated = Counter(
            "dra_gateway_allocator_claims_allocated", "Claims given a status.allocation",
            registry=r)
        self.allocation_failures = Counter(
            "dra_gateway_allocator_allocation_failures",
            "Planning attempts that found no node for a pod", registry=r)
        self.claims_released = Counter(
            "dra_gateway_allocator_claims_released",
            "Claims whose allocation was cleared after their pod went", registry=r)
        self.conflicts = Counter(
            "dra_gateway_allocator_conflicts",
            "Writes refused because the object changed (retried)", registry=r)
        self.plan_seconds = Histogram(
            "dra_gateway_allocator_plan_seconds", "Time to plan one pod's claims",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            registry=r)
        self.invalid_claims = Gauge(
            "dra_gateway_allocator_invalid_claims",
            "Claims whose allocation, written by someone else, holds what the API refuses from "
            "Kubernetes 1.38 (a negative or unnamed consumedCapacity): counted as holding their "
            "devices whole", registry=r)
        self.queue_depth = Gauge("dra_gateway_allocator_queue_depth",
                                 "Keys waiting in the work queue", registry=r)
        self.quota_used = Gauge(
            "dra_gateway_allocator_quota_used",
            "GPUQuota usage counted by the allocator (memory in bytes, cores in percent of a "
            "card, devices, claims)", QUOTA_LABELS, registry=r)
        self.quota_hard = Gauge(
            "dra_gateway_allocator_quota_hard", "GPUQuota spec.hard, per limited resource",
            QUOTA_LABELS, registry=r)
        self.quota_borrowed = Gauge(
            "dra_gateway_allocator_quota_borrowed",
            "GPUQuota usage past spec.min, borrowed from its cohort, per guaranteed resource",
            QUOTA_LABELS, registry=r)
        self.defrag_moves = Counter(
            "dra_gateway_allocator_defrag_moves",
            "Pods the allocator's defrag moved (evicted) or tried to, by result (evicted, "
            "refused by a PodDisruptionBudget, failed)", ("result",), registry=r)
        self.preemptions = Counter(
            "dra_gateway_allocator_preemptions",
            "Pods of lower priority the allocator preempted (evicted) for a waiting pod, or "
            "tried to, by result (evicted, refused by a PodDisruptionBudget, failed)",
            ("result",), registry=r)
        self.group_plans = Counter(
            "dra_gateway_allocator_group_plans",
            "All-or-nothing plans of pod groups, by the convention that sized the group "
            "(dra-gateway, podgroup, workload, kueue, leaderworkerset, ...) and result "
            "(placed: every member holds its devices; does-not-fit: none was placed)",
            ("source", "result"), registry=r)
        self.health_evictions = Counter(
            "dra_gateway_allocator_health_evictions",
            "Pods the allocator evicted from devices that failed (fatal faults, where the API "
            "server keeps no device taints), or tried to, by result (evicted, refused by a "
            "PodDisruptionBudget, failed)", ("result",), registry=r)
        self.defrag_pods_helped = Counter(
            "dra_gateway_allocator_defrag_pods_helped",
            "Waiting pods placed after the allocator's defrag moved pods for them", registry=r)
        self.pending_pods = Gauge(
            "dra_gateway_allocator_pending_pods",
            "Gated pods the allocator could not place, by reason (QuotaExceeded, "
            "QueuedForQuota, Unschedulable)", ("reason",), registry=r)

    def end_term(self) -> None:
        """Leadership ended: the gauges only a leader keeps say nothing any more. A replica
        that lost the Lease must not go on exposing its last pending pods, quota usage and
        invalid claims (their alerts would fire from it for ever); the next term sets them
        afresh from the API."""
        self.leader.set(0)
        for gauge in (self.pending_pods, self.quota_used, self.quota_hard, self.quota_borrowed):
            gauge.clear()
        self.invalid_claims.set(0)
        self.queue_depth.set(0)

    def render(self) -> bytes:
        """The text exposition format, for a /metrics endpoint."""
        return generate_latest(self.registry)


class PendingPods:
    """Gated pods the allocator could not place, by reason, mirrored into a gauge."""

    def __init__(self, gauge: Gauge) -> None:
        self.gauge = gauge
        self._reasons: dict[str, str] = {}  # pod uid -> reason
        self._seen: set[str] = set()

    def set(self, uid: str, reason: str) -> None:
        if self._reasons.get(uid) != reason:
            self._reasons[uid] = reason
            self._publish()

    def drop(self, uid: str) -> None:
        if self._reasons.pop(uid, None) is not None:
            self._publish()

    def reason(self, uid: str) -> str | None:
        return self._reasons.get(uid)

    def _publish(self) -> None:
        counts: dict[str, int] = {}
        for reason in self._reasons.values():
            counts[reason] = counts.get(reason, 0) + 1
        self._seen.update(counts)
        for reason in self._seen:
            self.gauge.labels(reason).set(counts.get(reason, 0))

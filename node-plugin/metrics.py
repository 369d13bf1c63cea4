"""Prometheus metrics of the node plugin, on a registry the caller owns.

No module-level collectors: each plugin instance (and each test) gets its own registry, so two
plugins in one process never share counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        prefix = "dra_gateway_node_plugin"
        self.registered = Gauge(
            f"{prefix}_registered", "1 while the kubelet has registered the plugin (its last "
            "NotifyRegistrationStatus said so), 0 before or after it refused it",
            registry=self.registry)
        self.slice_writes = Counter(
            f"{prefix}_slice_writes", "ResourceSlice creates, updates and deletes",
            ["operation"], registry=self.registry)
        self.publish_errors = Counter(
            f"{prefix}_publish_errors", "failed attempts to reconcile the node's ResourceSlices",
            registry=self.registry)
        self.published_devices = Gauge(
            f"{prefix}_published_devices", "devices in the node's ResourceSlices",
            registry=self.registry)
        self.nvml_up = Gauge(
            f"{prefix}_nvml_up", "1 when the last NVML discovery or health check succeeded",
            registry=self.registry)
        self.unhealthy_devices = Gauge(
            f"{prefix}_unhealthy_devices", "devices marked unhealthy (XID errors, lost GPUs)",
            registry=self.registry)
        self.recoveries = Counter(
            f"{prefix}_device_recoveries", "devices healthy again after a fault, their taint "
            "lifted", registry=self.registry)
        self.xid_events = Counter(
            f"{prefix}_xid_events", "critical XID events seen, by XID", ["xid"],
            registry=self.registry)
        self.consumable_capacity = Gauge(
            f"{prefix}_consumable_capacity",
            "1 when shared cards are published with consumable capacity "
            "(allowMultipleAllocations, request policies), 0 when not", registry=self.registry)
        self.consumable_capacity_detected = Gauge(
            f"{prefix}_consumable_capacity_detected",
            "1 once the API server (or a flag) has settled the consumable-capacity mode, 0 while "
            "the plugin publishes its fallback and keeps asking", registry=self.registry)
        self.prepares = Counter(
            f"{prefix}_prepare_claims", "claims prepared, by result", ["result"],
            registry=self.registry)
        self.unprepares = Counter(
            f"{prefix}_unprepare_claims", "claims unprepared, by result", ["result"],
            registry=self.registry)
        self.migration_state = Gauge(
            f"{prefix}_migration_state",
            "1 for the node's state in the move from a legacy device plugin (Legacy, "
            "CuttingOver, DRA), 0 for the others", ["state"], registry=self.registry)
        self.legacy_held_cards = Gauge(
            f"{prefix}_legacy_held_cards",
            "cards withheld because a legacy device plugin offers them or legacy pods hold them",
            registry=self.registry)
        self.legacy_withheld_devices = Gauge(
            f"{prefix}_legacy_withheld_devices",
            "devices left out of the node's ResourceSlices for a legacy device plugin",
            registry=self.registry)
        self.pod_resources_up = Gauge(
            f"{prefix}_pod_resources_up",
            "1 when the last read of the kubelet's pod-resources API succeeded",
            registry=self.registry)

    def render(self) -> bytes:
        """The text exposition format, for a /metrics endpoint."""
        return generate_latest(self.registry)

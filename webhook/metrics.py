"""Prometheus metrics of one webhook app, in a registry the app owns.

A per-app registry (not prometheus_client's global one) lets several apps live in one process,
as tests and workers do, without colliding names or sharing counts. Children of labelled metrics
that the hot path touches are bound once, so an observation costs a dict lookup at most.

It must not decide anything; handlers and background tasks call it.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# Admission latency is dominated by JSON and TLS; the API server's own timeout is seconds.
_LATENCY_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0)

ENDPOINTS = ("mutate", "validate", "validate-rules")
# The label naming the endpoint that answered. Not `endpoint`: the Prometheus Operator gives
# every series scraped through a PodMonitor an `endpoint` label of its own (the scraped port's
# name), which would rename this one `exported_endpoint`.
ENDPOINT = "webhook_endpoint"


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.latency = Histogram(
            "dra_gateway_webhook_request_duration_seconds",
            "Time to answer an admission review, by endpoint.",
            [ENDPOINT], buckets=_LATENCY_BUCKETS, registry=r)
        self.reviews = Counter(
            "dra_gateway_webhook_reviews_total",
            "Admission reviews answered, by endpoint and outcome (allowed, patched, refused, "
            "error).", [ENDPOINT, "outcome"], registry=r)
        self.bad_requests = Counter(
            "dra_gateway_webhook_bad_requests_total",
            "Requests answered with HTTP 400, by endpoint.", [ENDPOINT], registry=r)
        self.translations = Counter(
            "dra_gateway_webhook_translations_total",
            "Pods translated, by rule applied.", ["rule"], registry=r)
        self.audit_translations = Counter(
            "dra_gateway_webhook_audit_translations_total",
            "Pods admitted unchanged in audit mode that a rule would translate, by rule.",
            ["rule"], registry=r)
        self.held_back = Counter(
            "dra_gateway_webhook_pods_held_back_total",
            "Pods asking for GPUs admitted with their legacy requests as they are, by mode: "
            "audit (their namespace, or their own annotation, says audit; a namespace label "
            "of unknown value counts as audit) or disabled (their annotation).", ["mode"],
            registry=r)
        self.refusals = Counter(
            "dra_gateway_webhook_refusals_total",
            "Pods refused, by endpoint and reason.", [ENDPOINT, "reason"], registry=r)
        self.rule_reloads = Counter(
            "dra_gateway_webhook_rule_reloads_total",
            "Rule sets loaded and put in force, by the kind of source that changed.",
            ["source"], registry=r)
        self.rule_reload_failures = Counter(
            "dra_gateway_webhook_rule_reload_failures_total",
            "Rule updates refused (the previous rules stayed in force), by kind of source.",
            ["source"], registry=r)
        self.rules_loaded = Gauge(
            "dra_gateway_webhook_rules_loaded",
            "Enabled translation rules in force.", registry=r)
        self.template_creates = Counter(
            "dra_gateway_webhook_template_creates_total",
            "ResourceClaimTemplate create calls, by result (created, exists, conflict: one under "
            "the name that is not the gateway's, failed).",
            ["result"], registry=r)
        self.plan_cache = Counter(
            "dra_gateway_webhook_plan_cache_total",
            "Translation plan lookups, by result (hit, miss).", ["result"], registry=r)
        self.config_reconciles = Counter(
            "dra_gateway_webhook_configuration_updates_total",
            "Webhook configurations updated to follow the rules, by result (updated, failed).",
            ["result"], registry=r)
        self.extended_resources = Counter(
            "dra_gateway_webhook_extended_resources_total",
            "Containers asking for a legacy resource that a DeviceClass declares as "
            "spec.extendedResourceName, by resource, the class kube-scheduler uses and action: "
            "deferred (left to kube-scheduler) or translated (a rule says "
            "extendedResourceNames: translate).", ["resource", "device_class", "action"],
            registry=r)
        self.untranslated = Counter(
            "dra_gateway_webhook_untranslated_resources_total",
            "Containers keeping a known legacy GPU resource because the rule that translates "
            "it is disabled (the pod is admitted with a warning naming the rule to enable), by "
            "resource and rule.", ["resource", "rule"], registry=r)
        self.extended_declarations = Gauge(
            "dra_gateway_webhook_device_class_extended_resources",
            "1 for each DeviceClass declaring a legacy resource name as "
            "spec.extendedResourceName (kube-scheduler serves that name itself).",
            ["resource", "device_class"], registry=r)
        self.internal_errors = Counter(
            "dra_gateway_webhook_internal_errors_total",
            "Reviews refused because of an unexpected error in a decision.", [ENDPOINT],
            registry=r)
        self.gated_pod_events = Counter(
            "dra_gateway_webhook_allocator_unavailable_events_total",
            "Warning Events AllocatorUnavailable on pods left gated while no allocator leads, by "
            "result (created; exists: another replica posted it first; failed: an attempt the "
            "API refused).", ["result"], registry=r)
        self.allocator_lease_vacant = Gauge(
            "dra_gateway_webhook_allocator_lease_vacant_seconds",
            "Seconds the allocator's Lease has had no valid holder, as this webhook sees it (0 "
            "while an allocator leads, and with --gated-event-after 0).", registry=r)
        # Bound children for the hot path.
        self.latency_of = {e: self.latency.labels(e) for e in ENDPOINTS}
        self.plan_hit = self.plan_cache.labels("hit")
        self.plan_miss = self.plan_cache.labels("miss")
        self._outcomes = {(e, o): self.reviews.labels(e, o) for e in ENDPOINTS
                          for o in ("allowed", "patched", "refused", "error")}

        self._translated: dict[str, Any] = {}

    def outcome(self, endpoint: str, outcome: str) -> None:
        self._outcomes[endpoint, outcome].inc()

    def translated(self, rule: str) -> None:
        """A pod translated by `rule` (its child bound on first use: `labels()` costs four
        times an increment)."""
        child = self._translated.get(rule)
        if child is None:
            child = self._translated[rule] = self.translations.labels(rule)
        child.inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

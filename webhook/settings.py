"""The webhook's settings: one small frozen value, built by the CLI or a test, passed explicitly.

It must not read the environment or files: the CLI does that and hands the result over.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dra_gateway.kube import names

MAX_BODY_BYTES = 3 * 1024 * 1024  # the API server caps admission requests at 3 MiB as well

MUTATING_CONFIGURATION = "dra-gateway"
VALIDATING_CONFIGURATION = "dra-gateway"
MUTATING_WEBHOOK = "mutate.dra-gateway.io"
VALIDATING_WEBHOOK = "validate.dra-gateway.io"
# The pod webhooks of namespaces that carry the translation label, by its value: each has a
# namespaceSelector of its own (webhook/config.py), named "<mode>.<the name above>"; the names
# above serve the namespaces without the label, as they did before the label existed.
POD_WEBHOOK_MODES = ("enabled", "audit", "unknown-mode")
# Where a pod may hold itself back from translation (--pod-opt-out).
POD_OPT_OUT_SCOPES = ("labelled", "everywhere")
RULES_WEBHOOK = "rules.dra-gateway.io"
CLAIMS_WEBHOOK = "claims.dra-gateway.io"


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    """What the webhook needs to know to serve.

    namespace: where the gateway runs: rule ConfigMaps are read there and it is excluded from
        admission (a webhook that admits its own pods can deadlock its own restart).
    rules_paths: rule files or folders (`--rules`), polled for changes.
    builtin_rules: load the translator's built-in rule sets first.
    watch_config_maps: read rules from ConfigMaps labelled dra-gateway.io/rules=true.
    watch_device_classes: watch DeviceClasses, and leave the legacy names they declare as
        spec.extendedResourceName to kube-scheduler (unless a rule takes the name back).
    watch_policies: watch GPUQuotas, GPUSharingPolicies and Namespaces, and refuse at /validate
        what those policies can never admit (and what a Refuse-mode quota refuses); also the
        gateway driver's ResourceSlices, for the models a request's selectors can reach.
    tls_dir: where tls.crt and tls.key live; readiness needs a certificate there.
    enforce: refuse pods whose legacy GPU requests escaped translation.
    template_timeout: seconds one admission may spend making its templates exist.
    review_deadline: seconds one review may take in all, API reads included; keep it below the
        configurations' timeoutSeconds (the API server gives up then, and a late answer is
        lost while the read goes on for the client's own 60 s).
    reconcile_webhooks: keep the webhook configurations' matchConditions (and caBundle, with
        ca_file) in line with the loaded rules.
    gated_event_after: seconds after which a pod still gated by dra-gateway.io/allocation gets a
        Warning Event AllocatorUnavailable while the allocator's Lease has had no valid holder
        for as long (0: no Events, and neither the Lease nor pods are watched).
    pod_opt_out: where a pod's own translation annotation may keep it legacy in an enabled
        namespace: `labelled` (namespaces labelled dra-gateway.io/pod-opt-out=allowed, as the
        policies' watch of Namespaces last saw them) or `everywhere`.
    legacy_grace: seconds a legacy pod admitted by this replica is counted against its
        GPUQuotas on top of their status, until the allocator has counted it there.
    """

    namespace: str = names.GATEWAY_NAMESPACE
    rules_paths: tuple[Path, ...] = ()
    builtin_rules: bool = True
    watch_config_maps: bool = True
    watch_device_classes: bool = True
    watch_policies: bool = True
    tls_dir: Path | None = None
    ca_file: Path | None = None
    enforce: bool = True
    template_timeout: float = 2.0
    review_deadline: float = 4.0
    template_cache_size: int = 8192
    template_cache_ttl: float = 300.0
    plan_cache_size: int = 2048
    rules_poll_interval: float = 2.0
    watch_retry_delay: float = 1.0
    reconcile_webhooks: bool = True
    gated_event_after: float = 120.0
    pod_opt_out: str = "labelled"
    legacy_grace: float = 10.0
    mutating_configuration: str = MUTATING_CONFIGURATION
    validating_configuration: str = VALIDATING_CONFIGURATION

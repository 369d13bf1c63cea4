"""What one webhook app's handlers and background tasks share, reached through a typed AppKey.

It holds no logic: `app` builds it and answers reviews with it, `background` runs its watches.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from dra_gateway.certs.tls import CertificateReloader
from dra_gateway.kube.cluster.port import Cluster
from dra_gateway.policy.profiles import ModelReach
from dra_gateway.webhook import mutation
from dra_gateway.webhook.allocatorwatch import GatedPodEvents
from dra_gateway.webhook.claimspecs import ClaimSpecCache
from dra_gateway.webhook.deviceclasses import DeviceClassWatch
from dra_gateway.webhook.deviceprofiles import DeviceProfileWatch
from dra_gateway.webhook.legacypods import RecentLegacyPods
from dra_gateway.webhook.metrics import Metrics
from dra_gateway.webhook.policywatch import PolicyWatch
from dra_gateway.webhook.rulestore import RuleStore
from dra_gateway.webhook.settings import WebhookSettings
from dra_gateway.webhook.templates import TemplateMaker
from dra_gateway.webhook.validation import Validator


@dataclass(slots=True)
class WebhookState:
    """Everything the handlers and background tasks share, owned by one app."""

    settings: WebhookSettings
    cluster: Cluster
    metrics: Metrics
    store: RuleStore
    claim_specs: ClaimSpecCache
    templates: TemplateMaker
    validator: Validator
    plans: mutation.PlanCache
    device_classes: DeviceClassWatch
    policies: PolicyWatch
    device_profiles: DeviceProfileWatch
    reach: ModelReach
    legacy: RecentLegacyPods
    tls: CertificateReloader | None = None
    gated_events: GatedPodEvents | None = None  # None with gated_event_after 0
    config_maps_synced: bool = False
    # (resource, device class, rule, action) already logged at INFO for this generation of the
    # DeviceClasses; later admissions log the same at DEBUG (one line per review costs more than
    # the review).
    extended_logged: set[tuple[str, str, str, str]] = field(default_factory=set)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)


STATE: web.AppKey[WebhookState] = web.AppKey("dra_gateway_webhook_state", WebhookState)

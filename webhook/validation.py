"""The /validate decision: checks that each look at a pod and say what is wrong with it.

A check is any object with a `name` and a `check(pod) -> Sequence[Refusal]` (a `PodCheck`;
"policy" is kept for the GPU policies); `Validator` runs
them in order and refuses the pod with every refusal found, so the user fixes them in one go.
Checks are pure: the facts they need from the cluster (which device classes the pod's claims
use) are resolved before they run and handed over in `PodUnderReview`. The built-in checks
keep the gateway's contract consistent (ARCHITECTURE.md, "Contracts between components");
`GpuPolicies` refuses what the cluster's GPUQuotas and GPUSharingPolicies can never admit
(dra_gateway.policy decides; the allocator enforces the rest), and `LegacyGpuQuota` a pod left
on legacy GPU names that would take a GPUQuota past its hard amounts (it counts both worlds).
`check_claim` does the same for a ResourceClaim or ResourceClaimTemplate of a gateway class
written natively (`ClaimUnderReview`).

Every message names the pod, the container or claim, the field, and the fix. This module must
not perform I/O.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from dra_gateway.kube import names
from dra_gateway.kube.quantity import QuantityError, parse_quantity
from dra_gateway.policy.admission import ModelLookup, check_admission, check_legacy
from dra_gateway.policy.amounts import DeviceCharge, RequestShape, requests_of
from dra_gateway.policy.catalog import Catalog
from dra_gateway.translator.containers import Found, PodContext, asks_for_devices_here
from dra_gateway.translator.extended import ExtendedResources, deferred_resources
from dra_gateway.translator.pods import node_labels
from dra_gateway.translator.rules import RuleSet
from dra_gateway.translator.shapes import TEMPLATE_PREFIX
from dra_gateway.translator.translate import CLAIM_NAME
from dra_gateway.webhook.reviews import Denial, display_name
from dra_gateway.webhook.translation import ENABLED, Held

REFUSED_CODE = 403


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why the webhook refuses a pod (a policy's own word on it is policy.admission.Violation)."""

    reason: str  # a short CamelCase word, counted in metrics
    message: str


@dataclass(frozen=True, slots=True)
class PodUnderReview:
    """A pod being created, with the facts the checks need about it.

    claim_classes[i] holds the device classes of spec.resourceClaims[i] (from its template or
    claim), or None when that object does not exist or could not be read. `extended` holds the
    legacy names the cluster's DeviceClasses declare as spec.extendedResourceName.
    claim_requests[i] holds the gateway-class requests of spec.resourceClaims[i] (None when
    unknown), and `policies` the GPU policies in force (empty when they are not watched);
    `models` says which models a request's selectors reach on the cluster's cards.
    """

    pod: Mapping[str, Any]
    namespace: str
    rules: RuleSet
    claim_classes: tuple[frozenset[str] | None, ...]
    enforce: bool
    extended: ExtendedResources = field(default_factory=ExtendedResources)
    claim_requests: tuple[tuple[RequestShape, ...] | None, ...] = ()
    policies: Catalog = field(default_factory=Catalog)
    models: ModelLookup | None = None
    # The mode the pod is admitted under (its namespace's and its own annotation's): legacy
    # requests are judged only where it is enabled.
    translation: Held = ENABLED
    # What the pod costs its namespace's GPUQuotas while a legacy device plugin serves it
    # (policy.legacyusage; empty when it asks no legacy stack for GPUs), and the charges of
    # the namespace's legacy pods this replica admitted a moment ago (not yet in the status).
    legacy_charges: tuple[DeviceCharge, ...] = ()
    legacy_recent: tuple[tuple[DeviceCharge, ...], ...] = ()

    @property
    def spec(self) -> Mapping[str, Any]:
        spec = self.pod.get("spec")
        return spec if isinstance(spec, dict) else {}

    @property
    def metadata(self) -> Mapping[str, Any]:
        meta = self.pod.get("metadata")
        return meta if isinstance(meta, dict) else {}

    @property
    def display_name(self) -> str:
        return display_name("pod", self.namespace, self.metadata)

    def claims(self) -> list[Mapping[str, Any]]:
        claims = self.spec.get("resourceClaims")
        return [c if isinstance(c, dict) else {} for c in claims] \
            if isinstance(claims, list) else []

    def gated(self) -> bool:
        gates = self.spec.get("schedulingGates")
        return isinstance(gates, list) and any(
            isinstance(g, dict) and g.get("name") == names.SCHEDULING_GATE for g in gates)


class PodCheck(Protocol):
    name: str

    def check(self, review: PodUnderReview) -> Sequence[Refusal]:
        ...


def _claim_field(index: int, claim: Mapping[str, Any]) -> tuple[str, str]:
    """(field path, "ResourceClaimTemplate x" or "ResourceClaim x") of a pod claim entry."""
    if claim.get("resourceClaimTemplateName"):
        return (f"spec.resourceClaims[{index}].resourceClaimTemplateName",
                f"ResourceClaimTemplate {claim['resourceClaimTemplateName']}")
    return (f"spec.resourceClaims[{index}].resourceClaimName",
            f"ResourceClaim {claim.get('resourceClaimName')}")


class TranslationConsistency:
    """The gate and the translation annotation only ever come with what they stand for."""

    name = "translation-consistency"

    def check(self, review: PodUnderReview) -> Sequence[Refusal]:
        out: list[Refusal] = []
        claims = review.claims()
        annotations = review.metadata.get("annotations")
        if isinstance(annotations, dict) and names.ANNOTATION_TRANSLATED in annotations:
            translated = any(
                c.get("name") == CLAIM_NAME
                and str(c.get("resourceClaimTemplateName") or "").startswith(TEMPLATE_PREFIX)
                for c in claims)
            if not translated:
                out.append(Refusal("TranslationMissing", (
                    f"{review.display_name} carries the annotation {names.ANNOTATION_TRANSLATED} "
                    f"(metadata.annotations) but no translation behind it: spec.resourceClaims has "
                    f"no claim {CLAIM_NAME!r} from a {TEMPLATE_PREFIX}* ResourceClaimTemplate; "
                    f"remove the annotation and let the dra-gateway webhook translate the pod")))
        if review.gated():
            gateway = any(classes and classes & names.GATEWAY_CLASSES
                          for classes in review.claim_classes)
            unknown = any(classes is None for classes in review.claim_classes)
            if not gateway and not unknown:
                out.append(Refusal("GateWithoutGatewayClaim", (
                    f"{review.display_name} carries the scheduling gate {names.SCHEDULING_GATE} "
                    f"(spec.schedulingGates) but none of its spec.resourceClaims uses a "
                    f"dra-gateway device class ({', '.join(sorted(names.GATEWAY_CLASSES))}), so "
                    f"nothing would ever lift the gate; remove the gate or request a dra-gateway "
                    f"device class")))
        return out


class GatedGatewayClaims:
    """A pod using a gateway-class claim waits for the allocator behind the gate."""

    name = "gateway-claims-gated"

    def check(self, review: PodUnderReview) -> Sequence[Refusal]:
        if review.gated():
            return ()
        out: list[Refusal] = []
        for index, (claim, classes) in enumerate(zip(review.claims(), review.claim_classes,
                                                     strict=True)):
            gateway = sorted((classes or frozenset()) & names.GATEWAY_CLASSES)
            if not gateway:
                continue
            path, what = _claim_field(index, claim)
            out.append(Refusal("UngatedGatewayClaim", (
                f"{review.display_name} uses {what} of device class {gateway[0]} ({path}) without "
                f"the scheduling gate {names.SCHEDULING_GATE}; add spec.schedulingGates: "
                f"[{{name: {names.SCHEDULING_GATE}}}] (the dra-gateway mutating webhook adds it "
                f"when it is enabled for namespace {review.namespace})")))
        return out


class LegacyRequestsTranslated:
    """While enforcing, no legacy GPU request may reach the scheduler untranslated."""

    name = "legacy-requests-translated"

    def check(self, review: PodUnderReview) -> Sequence[Refusal]:
        if not review.enforce or review.translation.mode != names.TRANSLATION_ENABLED \
                or review.translation.refusal is not None:
            # Audit mode and a pod's own opt-out keep legacy requests on purpose (`migrate
            # plan` counts them); an unreadable annotation is the one thing to fix.
            return ()
        out: list[Refusal] = []
        annotations = review.metadata.get("annotations")
        if isinstance(annotations, dict) and names.ANNOTATION_TRANSLATED in annotations:
            # The gateway translated this pod, then a later mutating webhook added the request.
            fix = ("it was added after dra-gateway translated the pod (by another mutating "
                   "webhook); have that webhook run before dra-gateway's, or request the GPU "
                   "with a ResourceClaim")
        else:
            fix = (f"enable the dra-gateway mutating webhook for namespace {review.namespace} "
                   "or request the GPU with a ResourceClaim")
        # Only what asks for devices: a hint the translator leaves alone on its own (HAMi's
        # nvidia.com/priority without a GPU request) reaches the scheduler harmlessly. Nor what
        # /mutate left to kube-scheduler because a DeviceClass declares it (with what its rule
        # reads beside it in the container): kube-scheduler serves those.
        rules = review.rules
        extended = review.extended
        annotations = review.metadata.get("annotations")
        context = PodContext(
            annotations=annotations if isinstance(annotations, dict) else {},
            node_selector=node_labels(review.spec), namespace=review.namespace, extended=None)
        for key in ("initContainers", "containers"):
            containers = review.spec.get(key)
            for index, container in enumerate(containers if isinstance(containers, list) else ()):
                resources = container.get("resources") if isinstance(container, dict) else None
                if not isinstance(resources, dict):
                    continue
                reported: set[str] = set()
                if extended:
                    reported.update(deferred_resources(
                        [r for part in ("limits", "requests")
                         if isinstance(resources.get(part), dict) for r in resources[part]],
                        review.rules, extended))
                legacy = [tuple(r for r in amounts if rules.is_legacy(r))
                          if isinstance(amounts := resources.get(part), dict) else ()
                          for part in ("limits", "requests")]
                found = Found(key, index, container, legacy[0], legacy[1])

                def asks(resource: str, found: Found = found) -> bool:
                    # What a rule that applies to this pod would have translated (a MIG rule
                    # needing a node label the pod does not select would not).
                    return rules.asks_for_devices(resource) and asks_for_devices_here(
                        resource, found=found, context=context, rules=rules)

                for part in ("limits", "requests"):
                    amounts = resources.get(part)
                    if not isinstance(amounts, dict):
                        continue
                    for resource, amount in amounts.items():
                        if resource in reported or not asks(resource) or _is_zero(amount):
                            continue
                        # One violation per resource, at limits when it is in both.
                        reported.add(resource)
                        out.append(Refusal("UntranslatedGpuRequest", (
                            f"{review.display_name}: container {container.get('name')!r} asks "
                            f"for {resource} (spec.{key}[{index}].resources.{part}"
                            f"[{json.dumps(resource)}]) but was not translated to a DRA claim; "
                            f"{fix}")))
        return out


def _is_zero(amount: Any) -> bool:
    """A zero amount asks for nothing: /mutate leaves it, and the scheduler ignores it (charts
    often carry `nvidia.com/gpu: 0` as a default). An unreadable amount is not zero."""
    try:
        return parse_quantity(amount).is_zero()
    except (QuantityError, TypeError):
        return False


class GpuPolicies:
    """What the namespace's GPUQuotas and GPUSharingPolicies can never admit, and Refuse-mode
    quotas over their usage; messages in ResourceQuota's style (dra_gateway.policy.admission)."""

    name = "gpu-policies"

    def check(self, review: PodUnderReview) -> Sequence[Refusal]:
        catalog = review.policies
        if catalog.empty:
            return ()
        entries = review.claims()
        claims: list[tuple[RequestShape, ...]] = []
        places: list[str] = []
        for index, shapes in enumerate(review.claim_requests):
            if not shapes:
                continue
            claims.append(shapes)
            entry = entries[index] if index < len(entries) else {}
            _, what = _claim_field(index, entry)
            inner = "spec.spec" if entry.get("resourceClaimTemplateName") else "spec"
            places.append(f"spec.resourceClaims[{index}] {what}: {inner}")
        if not claims:
            return ()
        # A Refuse quota's usage check counts the claims the pod's templates will create; a
        # ResourceClaim the pod names exists already: counted in the usage once allocated,
        # checked by the claims webhook when it was created.
        made = [shapes for entry, shapes in zip(review.claims(), review.claim_requests,
                                                strict=False)
                if shapes and entry.get("resourceClaimTemplateName")]
        found = check_admission(what=review.display_name, claims=claims,
                                quotas=catalog.quotas_for(review.namespace),
                                sharing=catalog.sharing_for(review.namespace), charged=made,
                                models=review.models, places=places)
        return [Refusal(v.reason, v.message) for v in found]


class LegacyGpuQuota:
    """A pod left on legacy GPU names counts against its namespace's GPUQuotas with the
    translated pods: refused when it would take one past its hard amounts."""

    name = "legacy-gpu-quota"

    def check(self, review: PodUnderReview) -> Sequence[Refusal]:
        if not review.legacy_charges:
            return ()
        quotas = review.policies.quotas_for(review.namespace)
        if not quotas:
            return ()
        found = check_legacy(what=review.display_name, charges=review.legacy_charges,
                             quotas=quotas, recent=review.legacy_recent)
        return [Refusal(v.reason, v.message) for v in found]


CLAIM_KINDS: Mapping[str, str] = {"resourceclaims": "ResourceClaim",
                                  "resourceclaimtemplates": "ResourceClaimTemplate"}


@dataclass(frozen=True, slots=True)
class ClaimUnderReview:
    """A ResourceClaim or ResourceClaimTemplate being created, and the GPU policies in force.

    `resource` is the review's resource ("resourceclaims" or "resourceclaimtemplates"). A
    claim's spec has the shape of a template's spec.spec.
    """

    resource: str
    obj: Mapping[str, Any]
    namespace: str
    policies: Catalog = field(default_factory=Catalog)
    models: ModelLookup | None = None

    @property
    def kind(self) -> str:
        return CLAIM_KINDS[self.resource]

    @property
    def metadata(self) -> Mapping[str, Any]:
        meta = self.obj.get("metadata")
        return meta if isinstance(meta, dict) else {}

    @property
    def display_name(self) -> str:
        return display_name(self.kind, self.namespace, self.metadata)

    @property
    def spec_path(self) -> str:
        return "spec.spec" if self.kind == "ResourceClaimTemplate" else "spec"

    def claim_spec(self) -> Mapping[str, Any]:
        spec = self.obj.get("spec")
        if isinstance(spec, dict) and self.kind == "ResourceClaimTemplate":
            spec = spec.get("spec")
        return spec if isinstance(spec, dict) else {}

    def checked_elsewhere(self) -> bool:
        """Made from something /validate already checked: a template the gateway's /mutate
        translated from a pod, or a claim the claim controller made for a pod from its
        template. The pod's own review covered it; checking again would refuse the gateway's
        own translation before the pod's message could say why, and a Refuse-mode quota would
        count the pod twice. The webhook configuration's matchConditions keep both away; this
        is for a configuration installed without them. A user who forges the marks only skips
        this early check: the pod that uses the object is checked at its creation."""
        meta = self.metadata
        if self.kind == "ResourceClaimTemplate":
            labels = meta.get("labels")
            return (str(meta.get("name") or "").startswith(TEMPLATE_PREFIX)
                    and isinstance(labels, dict)
                    and labels.get(names.LABEL_MANAGED_BY) == names.MANAGED_BY)
        owners = meta.get("ownerReferences")
        return isinstance(owners, list) and any(
            isinstance(o, dict) and o.get("kind") == "Pod" and o.get("apiVersion") == "v1"
            and o.get("controller") is True for o in owners)

    def request_fields(self) -> dict[str, str]:
        """Each request's name -> its field path (spec.devices.requests[0])."""
        devices = self.claim_spec().get("devices")
        requests = devices.get("requests") if isinstance(devices, dict) else None
        return {str(r.get("name")): f"{self.spec_path}.devices.requests[{i}]"
                for i, r in enumerate(requests if isinstance(requests, list) else ())
                if isinstance(r, dict)}


def check_claim(review: ClaimUnderReview) -> Verdict:
    """What the namespace's GPU policies can never admit in a natively written claim or
    template of a gateway class; a claim (which will hold what it asks) also meets Refuse-mode
    quotas over current usage, a template (which holds nothing until a pod uses it) does not."""
    catalog = review.policies
    if catalog.empty or review.checked_elsewhere():
        return Verdict(None, (), ())
    shapes = requests_of(review.claim_spec())
    if not shapes:
        return Verdict(None, (), ())
    found = check_admission(what=review.display_name, claims=[shapes],
                            quotas=catalog.quotas_for(review.namespace),
                            sharing=catalog.sharing_for(review.namespace),
                            fields=review.request_fields(),
                            over_usage=review.kind == "ResourceClaim", models=review.models)
    if not found:
        return Verdict(None, (), ())
    violations = tuple(Refusal(v.reason, v.message) for v in found)
    return Verdict(Denial(REFUSED_CODE, violations[0].reason,
                           "; ".join(v.message for v in violations)),
                   violations, tuple(GpuPolicies.name for _ in violations))


class TranslationAnnotation:
    """A pod's translation annotation takes one of the modes where the pod would be
    translated (elsewhere /mutate warns instead: audit mode changes nothing)."""

    name = "translation-annotation"

    def check(self, review: PodUnderReview) -> Sequence[Refusal]:
        refusal = review.translation.refusal
        return (Refusal("InvalidTranslationAnnotation", refusal),) if refusal else ()


DEFAULT_CHECKS: tuple[PodCheck, ...] = (
    TranslationAnnotation(), TranslationConsistency(), GatedGatewayClaims(),
    LegacyRequestsTranslated(), GpuPolicies(), LegacyGpuQuota())


@dataclass(frozen=True, slots=True)
class Verdict:
    denial: Denial | None
    violations: tuple[Refusal, ...]
    checks: tuple[str, ...]  # the name of the check that found each violation


class Validator:
    def __init__(self, checks: Sequence[PodCheck] = DEFAULT_CHECKS) -> None:
        self.checks = tuple(checks)

    def check(self, review: PodUnderReview) -> Verdict:
        violations: list[Refusal] = []
        by: list[str] = []
        for pod_check in self.checks:
            found = pod_check.check(review)
            violations.extend(found)
            by.extend(pod_check.name for _ in found)
        if not violations:
            return Verdict(None, (), ())
        message = "; ".join(v.message for v in violations)
        return Verdict(Denial(REFUSED_CODE, violations[0].reason, message), tuple(violations),
                       tuple(by))

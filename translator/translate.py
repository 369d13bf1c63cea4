"""`translate(pod, rules)`: the plan that turns a pod's legacy GPU requests into DRA claims.

The plan holds the ResourceClaimTemplate the pod needs (one per pod, one device request per
container, named by a hash of its whole spec so that identical requests share one template per
namespace), the RFC 6902 patch that points the pod at it, removes the translated legacy
resources, adds the gateway's scheduling gate and records what was translated in an annotation,
and what each container became, by which rule (`ContainerTranslation`): the one result the
webhook's answer and the explanation (`explaining.py`) are both built from.

Pure and deterministic: it reads the pod and the rules and returns data. It must not perform
I/O, log, or modify the pod it is given. Work is cached per request shape on the `RuleSet`, so
the usual admission (the same few shapes over and over) only walks the pod and builds the patch.
What each container becomes is decided in `containers.py`, the pod's template and annotation
per shape in `shapes.py`; this module finds the legacy requests and builds the patch.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from operator import itemgetter
from typing import Any, Final

import orjson

from dra_gateway.kube import names, objects
from dra_gateway.translator.containers import Found, PodContext, is_sidecar
from dra_gateway.translator.errors import Refusal, quote
from dra_gateway.translator.extended import ExtendedResources, ExtendedResourceUse
from dra_gateway.translator.pods import node_labels
from dra_gateway.translator.rules import RuleSet
from dra_gateway.translator.shapes import (
    MANAGED_LABELS,
    TEMPLATE_PREFIX,
    ContainerTranslation,
    ShapePlan,
    plan_shape,
)
from dra_gateway.translator.typos import UnknownResource, misspelt

__all__ = [
    "CLAIM_NAME",
    "ClassLookup",
    "TranslationPlan",
    "Untranslated",
    "escape_pointer",
    "translate",
    "translated_claim_specs",
]

# The pod-level claim name the gateway adds to spec.resourceClaims.
CLAIM_NAME: Final = "dra-gateway"

# Where a `Found` container sits: ("containers" or "initContainers", its index).
_PLACE: Final = itemgetter(0, 1)

# Looks up the device classes a claim or template named by the pod requests:
# (kind, namespace, name) -> class names, or None when unknown. kind is "ResourceClaimTemplate"
# or "ResourceClaim".
ClassLookup = Callable[[str, str, str], Collection[str] | None]


@dataclass(frozen=True, slots=True)
class Untranslated:
    """A legacy GPU resource a pod keeps because the rule that knows it is disabled."""

    container: str
    resource: str
    rule: str

    @property
    def reason(self) -> str:
        return (f"rule {self.rule} is disabled; enable it with an override naming the "
                f"DeviceClass that serves it (overrides: [{{rule: {self.rule}, enabled: true, "
                "className: <class>}])")


@dataclass(slots=True)
class TranslationPlan:
    """What to do with a pod: templates to ensure, a JSON patch, or a refusal; and what each
    container asking for legacy resources became."""

    templates: list[dict[str, Any]] = field(default_factory=list)
    patch: list[dict[str, Any]] = field(default_factory=list)
    refusal: Refusal | None = None
    warnings: list[str] = field(default_factory=list)
    rules_applied: list[str] = field(default_factory=list)
    # Resources that DeviceClasses declare as spec.extendedResourceName, per container: left
    # for kube-scheduler or translated anyway (see `translate`'s `extended`).
    extended: list[ExtendedResourceUse] = field(default_factory=list)
    # Known legacy GPU resources left in the pod because their rule is disabled (each also
    # has a warning): nothing is dropped without a word.
    untranslated: list[Untranslated] = field(default_factory=list)
    # Names no rule reads that look like typos of one (each also has a warning, `typos.py`).
    unknown: list[UnknownResource] = field(default_factory=list)
    # What each container asking for legacy resources became, by where it sits in the pod
    # ("containers" or "initContainers", its index); empty for a pod translated before.
    containers: dict[tuple[str, int], ContainerTranslation] = field(default_factory=dict)
    # Whether `patch` adds the scheduling gate.
    adds_gate: bool = False
    # The pod carries the `translated` annotation: it is not translated again.
    translated_before: bool = False
    # The patch when the pod's legacy requests are held back (audit mode, an opt-out): only
    # the gate, where the pod's own claims use a gateway class.
    held_patch: list[dict[str, Any]] = field(default_factory=list)
    # Planned with the namespace's shares served by MIG instances (`translate`'s `mig_shares`).
    mig_shares: bool = False

    @property
    def changed(self) -> bool:
        return bool(self.patch)


def escape_pointer(token: str) -> str:
    """A JSON Pointer reference token (RFC 6901): `~` as `~0`, `/` as `~1`."""
    return token.replace("~", "~0").replace("/", "~1")


def translate(pod: Mapping[str, Any], rules: RuleSet, *,
              class_lookup: ClassLookup | None = None,
              extended: ExtendedResources | None = None,
              mig_shares: bool = False) -> TranslationPlan:
    """The plan for one pod (a plain dict as the API serves it); the pod is not modified.

    A pod that carries the gateway's `translated` annotation is not translated again (it only
    gets the scheduling gate if it lacks one), which makes translation idempotent.
    `class_lookup`, when given, tells which device classes the pod's own claims and templates
    request, so that a pod using a gateway class natively is gated too; without it only
    references to `dra-gateway-*` templates are recognised as such.

    `extended` holds the legacy names the cluster's DeviceClasses declare as
    `spec.extendedResourceName`: kube-scheduler serves those itself. A container whose rule
    reads such a name is left as it is, every resource of that rule in it included (half a
    HAMi request cannot be translated), with a warning naming the resource and the class,
    unless the rule says `extendedResourceNames: translate`. `plan.extended` lists both cases.

    `mig_shares`: the pod's namespace has its shares served by MIG instances (a
    GPUSharingPolicy's `shares.servedBy: MIG`): a share a rule of the gateway's GPU class
    computes becomes a MIG instance that holds it (`migshares`).

    `plan.held_patch` is what leaving every legacy request as it is takes (a namespace in audit
    mode, a pod that opts out of translation): it only gates a pod whose own claims use a
    gateway class, the gate being what keeps such a pod from the scheduler, whoever wrote its
    claims.
    """
    spec = pod.get("spec") or {}
    namespace = objects.namespace(pod)
    annotations = objects.annotations(pod)
    if names.ANNOTATION_TRANSLATED in annotations:
        return _translated_before(spec, namespace, annotations[names.ANNOTATION_TRANSLATED],
                                  class_lookup)
    own_claims_gated = _references_gateway_class(spec, namespace, class_lookup)
    plan = TranslationPlan(mig_shares=mig_shares)
    if own_claims_gated:
        plan.held_patch = _gate(spec)
    found, untranslated, unknown = _legacy_requests(spec, rules, extended)
    if untranslated:
        _warn_untranslated(untranslated, plan)
    if unknown:
        plan.unknown.extend(unknown)
        plan.warnings.extend(item.warning for item in unknown)
    if not found:
        _add_gate(spec, plan, needed=own_claims_gated)
        return plan
    # Planned before any refusal of the pod, so that its explanation can say what each
    # container would have become.
    shape_plan = _cached_shape_plan(spec, found, rules=rules, namespace=namespace,
                                    annotations=annotations, extended=extended,
                                    mig_shares=mig_shares)
    plan.containers = dict(zip(map(_PLACE, found), shape_plan.containers, strict=True))
    twice = _name_used_twice(spec)
    if twice is not None:
        plan.refusal = _duplicate_name(twice)
        return plan
    plan.warnings.extend(shape_plan.warnings)
    plan.rules_applied.extend(shape_plan.rules_applied)
    plan.extended.extend(shape_plan.extended)
    if shape_plan.refusal is not None:
        plan.refusal = shape_plan.refusal
        return plan
    if shape_plan.template is None:
        _add_gate(spec, plan, needed=own_claims_gated)
        return plan
    plan.refusal = _claim_name_taken(spec, found)
    if plan.refusal is not None:
        return plan
    _add_template(pod, plan, template=shape_plan.template, shape_plan=shape_plan, found=found,
                  namespace=namespace)
    _add_gate(spec, plan, needed=shape_plan.gated or own_claims_gated)
    return plan


def translated_claim_specs(pod: Mapping[str, Any], rules: RuleSet, *,
                           extended: ExtendedResources | None = None
                           ) -> list[dict[str, Any]] | None:
    """The specs of the claims translating `pod` would make (each template's `spec.spec`), as
    a pod left on its legacy names is charged to its namespace's quotas; None when the rules
    refuse it. Not the specs of the claims and templates the pod names itself (the webhook's
    `claimspecs`)."""
    plan = translate(pod, rules, extended=extended or None)
    if plan.refusal is not None:
        return None
    return [template["spec"]["spec"] for template in plan.templates]


# --------------------------------------------------------------------------------------------
# The steps of `translate`.


def _translated_before(spec: Mapping[str, Any], namespace: str, annotation: Any,
                       class_lookup: ClassLookup | None) -> TranslationPlan:
    """Translated already (by an earlier admission, or by `dra-gateway translate` in a
    workload's pod template): only make sure the gate is there if it is needed."""
    plan = TranslationPlan(translated_before=True)
    _add_gate(spec, plan, needed=_recorded_gate(annotation) or _references_gateway_class(
        spec, namespace, class_lookup, by_name=False))
    plan.held_patch = [dict(op) for op in plan.patch]
    return plan


def _legacy_requests(spec: Mapping[str, Any], rules: RuleSet,
                     extended: ExtendedResources | None
                     ) -> tuple[list[Found], list[Untranslated], list[UnknownResource]]:
    """The containers asking for legacy resources, in the pod's order; the known legacy names
    they keep because the rule that reads them is disabled; and the names they keep that look
    like typos of a legacy name (not those a DeviceClass declares: kube-scheduler serves
    them)."""
    found: list[Found] = []
    untranslated: list[Untranslated] = []
    unknown: list[UnknownResource] = []
    is_legacy = rules.is_legacy
    disabled_rule = rules.disabled_rule if rules.disabled_resources else None
    for key in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(key) or ()):
            resources = container.get("resources")
            if not resources:
                continue
            limits = resources.get("limits") or {}
            requests = resources.get("requests") or {}
            in_limits = tuple(n for n in limits if is_legacy(n))
            in_requests = tuple(n for n in requests if is_legacy(n))
            if in_limits or in_requests:
                found.append(Found(key, index, container, in_limits, in_requests))
            if len(in_limits) + len(in_requests) == len(limits) + len(requests):
                continue  # every name it asks for is a legacy one
            for name in dict.fromkeys((*limits, *requests)):
                if is_legacy(name):
                    continue
                rule = disabled_rule(name) if disabled_rule is not None else None
                if rule is not None:
                    untranslated.append(Untranslated(container.get("name", ""), name, rule))
                    continue
                suggestion = misspelt(name, rules)
                if suggestion is not None and not (extended and extended.classes_of(name)):
                    unknown.append(UnknownResource(str(container.get("name", "")), name,
                                                   suggestion))
    return found, untranslated, unknown


def _warn_untranslated(untranslated: list[Untranslated], plan: TranslationPlan) -> None:
    """One warning per container and disabled rule, naming the resources and the fix."""
    plan.untranslated.extend(untranslated)
    by_rule: dict[tuple[str, str], list[str]] = {}
    for item in untranslated:
        by_rule.setdefault((item.container, item.rule), []).append(item.resource)
    for (container, rule), resources in by_rule.items():
        reason = Untranslated(container, resources[0], rule).reason
        plan.warnings.append(f"container {quote(container)}: {', '.join(resources)} left "
                             f"untranslated: {reason}")


def _cached_shape_plan(spec: Mapping[str, Any], found: Sequence[Found], *, rules: RuleSet,
                       namespace: str, annotations: Mapping[str, Any],
                       extended: ExtendedResources | None, mig_shares: bool) -> ShapePlan:
    """The plan of the pod's request shape (`shapes.plan_shape`), from the rule set's cache
    when a pod of the same shape was planned before."""
    node_selector = node_labels(spec) if rules.node_selector_order else {}
    shape = (
        namespace,
        mig_shares,
        tuple(
            (key, container.get("name", ""), is_sidecar(key, container),
             tuple((n, _key((container["resources"].get("limits") or {}).get(n))) for n in lim),
             tuple((n, _key((container["resources"].get("requests") or {}).get(n)))
                   for n in req))
            for key, _, container, lim, req in found
        ),
        tuple(_key(annotations.get(k)) for k in rules.annotation_order),
        tuple(_key(node_selector.get(k)) for k in rules.node_selector_order),
        # What DeviceClasses declare about this pod's names (the same rules serve clusters
        # whose classes change); nothing at all in the usual case.
        extended.relevant(n for _, _, _, lim, req in found for n in (*lim, *req))
        if extended else (),
    )
    shape_plan: ShapePlan | None = rules.cache.get(shape)
    if shape_plan is None:
        context = PodContext(annotations=annotations, node_selector=node_selector,
                             namespace=namespace, extended=extended if extended else None,
                             mig_shares=mig_shares)
        shape_plan = plan_shape(found, context=context, rules=rules)
        rules.remember(shape, shape_plan)
    return shape_plan


def _key(value: Any) -> Any:
    """`value` usable in a cache key; a malformed one (a list, a map) by its text."""
    return value if value is None or isinstance(value, (str, int, float)) else repr(value)


def _name_used_twice(spec: Mapping[str, Any]) -> str | None:
    seen: set[str] = set()
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or ():
            name = container.get("name", "")
            if name in seen:
                return str(name)
            seen.add(name)
    return None


def _duplicate_name(twice: str) -> Refusal:
    # Mutating admission runs before the API server validates the pod; the patch finds
    # containers by name, so it would remove and add in the wrong one.
    return Refusal(
        message=f"container name {quote(twice)} is used by more than one container; names "
                f"must be unique across containers and initContainers",
        container=twice, resource="", rule="")


def _claim_name_taken(spec: Mapping[str, Any], found: Sequence[Found]) -> Refusal | None:
    """The refusal of a pod naming a claim of its own as the gateway names its claim."""
    for claim in spec.get("resourceClaims") or ():
        if claim.get("name") == CLAIM_NAME:
            first = found[0]
            return Refusal(
                message=f"the pod already has a resource claim named {quote(CLAIM_NAME)} but no "
                        f"{names.ANNOTATION_TRANSLATED} annotation; rename that claim",
                container=first.name, resource=", ".join(first.legacy), rule="")
    return None


def _add_template(pod: Mapping[str, Any], plan: TranslationPlan, *, template: bytes,
                  shape_plan: ShapePlan, found: Sequence[Found], namespace: str) -> None:
    """The pod's template (`template`, the plan's JSON), in its namespace, and the patch that
    points the pod at it."""
    # A fresh object per plan: callers may change what they get without touching the cache.
    made = orjson.loads(template)
    if namespace:
        made["metadata"] = {"name": made["metadata"]["name"], "namespace": namespace,
                            "labels": dict(MANAGED_LABELS)}
    plan.templates.append(made)
    _build_patch(pod, found=found, shape_plan=shape_plan, template=made["metadata"]["name"],
                 patch=plan.patch)


def _recorded_gate(annotation: Any) -> bool:
    """Whether the translation recorded in the annotation needed the gate."""
    try:
        record = orjson.loads(annotation)
    except (orjson.JSONDecodeError, TypeError):
        return False
    return isinstance(record, dict) and record.get("gated") is True


def _references_gateway_class(spec: Mapping[str, Any], namespace: str,
                              class_lookup: ClassLookup | None, *, by_name: bool = True) -> bool:
    """Whether the pod's own claims use a gateway-allocated class.

    `class_lookup` answers where it knows the claim or template. Otherwise, with `by_name`, a
    `dra-gateway-*` template counts as one: most of the gateway's templates are, and a pod
    gated without need is only delayed until the allocator sees it, while one left ungated
    would be allocated by the scheduler behind the allocator's back.
    """
    for claim in spec.get("resourceClaims") or ():
        source = objects.claim_source(claim)
        if source is None:
            continue
        kind, ref = source
        classes = (class_lookup(objects.CLAIM_SOURCE_KINDS[kind], namespace, ref)
                   if class_lookup and ref else None)
        if classes is not None:
            if any(c in names.GATEWAY_CLASSES for c in classes):
                return True
        elif by_name and kind == "template" and ref.startswith(TEMPLATE_PREFIX):
            return True
    return False


def _gate(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The patch that adds the scheduling gate where it is missing."""
    gates = spec.get("schedulingGates")
    if gates is None:
        return [{"op": "add", "path": "/spec/schedulingGates",
                 "value": [{"name": names.SCHEDULING_GATE}]}]
    if not any(g.get("name") == names.SCHEDULING_GATE for g in gates):
        return [{"op": "add", "path": "/spec/schedulingGates/-",
                 "value": {"name": names.SCHEDULING_GATE}}]
    return []


def _add_gate(spec: Mapping[str, Any], plan: TranslationPlan, *, needed: bool) -> None:
    """Add the scheduling gate to the plan's patch where it is `needed` and missing."""
    if needed and (gate := _gate(spec)):
        plan.patch.extend(gate)
        plan.adds_gate = True


# --------------------------------------------------------------------------------------------
# The patch (depends on where things sit in this pod, so it is built every time).


def _build_patch(pod: Mapping[str, Any], *, found: Sequence[Found], shape_plan: ShapePlan,
                 template: str, patch: list[dict[str, Any]]) -> None:
    spec = pod.get("spec") or {}
    entry = {"name": CLAIM_NAME, "resourceClaimTemplateName": template}
    if spec.get("resourceClaims") is None:
        patch.append({"op": "add", "path": "/spec/resourceClaims", "value": [entry]})
    else:
        patch.append({"op": "add", "path": "/spec/resourceClaims/-", "value": entry})
    for item, container in zip(found, shape_plan.containers, strict=True):
        if container.request is not None:
            _patch_container(item, request=container.request, patch=patch)
    _patch_annotation(pod, shape_plan.annotation, patch=patch)


def _patch_container(item: Found, *, request: str, patch: list[dict[str, Any]]) -> None:
    """Point the container at its request and remove the legacy names it asked for."""
    base = f"/spec/{item.key}/{item.position}/resources"
    resources = item.container["resources"]
    claim = {"name": CLAIM_NAME, "request": request}
    if resources.get("claims") is None:
        patch.append({"op": "add", "path": f"{base}/claims", "value": [claim]})
    else:
        patch.append({"op": "add", "path": f"{base}/claims/-", "value": claim})
    for section, keys in (("limits", item.in_limits), ("requests", item.in_requests)):
        if not keys:
            continue
        current = resources.get(section) or {}
        if len(keys) == len(current):
            patch.append({"op": "remove", "path": f"{base}/{section}"})
        else:
            for resource in keys:
                patch.append({"op": "remove",
                              "path": f"{base}/{section}/{escape_pointer(resource)}"})


def _patch_annotation(pod: Mapping[str, Any], annotation: str, *,
                      patch: list[dict[str, Any]]) -> None:
    record = {names.ANNOTATION_TRANSLATED: annotation}
    metadata = pod.get("metadata")
    if not isinstance(metadata, dict):
        patch.append({"op": "add", "path": "/metadata", "value": {"annotations": record}})
    elif metadata.get("annotations") is None:
        patch.append({"op": "add", "path": "/metadata/annotations", "value": record})
    else:
        patch.append({"op": "add", "path": "/metadata/annotations/"
                      + escape_pointer(names.ANNOTATION_TRANSLATED), "value": annotation})

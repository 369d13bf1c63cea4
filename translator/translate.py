"""`translate(pod, rules)`: the plan that turns a pod's legacy GPU requests into DRA claims.

The plan holds the ResourceClaimTemplate the pod needs (one per pod, one device request per
container, named by a hash of its whole spec so that identical requests share one template per
namespace) and the RFC 6902 patch that points the pod at it, removes the translated legacy
resources, adds the gateway's scheduling gate and records what was translated in an annotation.

Pure and deterministic: it reads the pod and the rules and returns data. It must not perform
I/O, log, or modify the pod it is given. Work is cached per request shape on the `RuleSet`, so
the usual admission (the same few shapes over and over) only walks the pod and builds the patch.
What each container becomes is decided in `containers.py`; this module assembles the pod.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

import orjson

from dra_gateway.kube import names, objects
from dra_gateway.translator.containers import (
    ContainerPlan,
    Found,
    PodContext,
    Skipped,
    is_sidecar,
    plan_container,
)
from dra_gateway.translator.errors import Refusal, Refused, quote, refuse
from dra_gateway.translator.evaluation import MAX_DEVICES_PER_CLAIM
from dra_gateway.translator.extended import ExtendedResources, ExtendedResourceUse
from dra_gateway.translator.rules import RuleSet

__all__ = [
    "CLAIM_NAME",
    "TEMPLATE_PREFIX",
    "ClassLookup",
    "Refusal",
    "TranslationPlan",
    "Untranslated",
    "claim_specs",
    "escape_pointer",
    "template_name",
    "translate",
]

# The pod-level claim name the gateway adds to spec.resourceClaims.
CLAIM_NAME: Final = "dra-gateway"
TEMPLATE_PREFIX: Final = "dra-gateway-"
_HASH_LENGTH: Final = 10
_MANAGED: Final = {names.LABEL_MANAGED_BY: names.MANAGED_BY}

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
    """What to do with a pod: templates to ensure, a JSON patch, or a refusal."""

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

    @property
    def changed(self) -> bool:
        return bool(self.patch)


@dataclass(frozen=True, slots=True)
class _PodPlan:
    """The cached, position-independent part of a pod's translation."""

    template: bytes | None  # the ResourceClaimTemplate as JSON, without namespace
    request_of: Mapping[str, str]  # container name -> request name it refers to
    removed: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]  # limits, requests keys
    annotation: str
    gated: bool
    warnings: tuple[str, ...]
    rules_applied: tuple[str, ...]
    refusal: Refusal | None
    extended: tuple[ExtendedResourceUse, ...] = ()


class _Planned(NamedTuple):
    """A container the translation changes, with what it becomes."""

    found: Found
    plan: ContainerPlan


def escape_pointer(token: str) -> str:
    """A JSON Pointer reference token (RFC 6901): `~` as `~0`, `/` as `~1`."""
    return token.replace("~", "~0").replace("/", "~1")


def template_name(spec: Mapping[str, Any]) -> str:
    """`dra-gateway-` and the first hex digits of the SHA-256 of the spec's canonical JSON."""
    digest = hashlib.sha256(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return TEMPLATE_PREFIX + digest[:_HASH_LENGTH]


def translate(pod: Mapping[str, Any], rules: RuleSet, *,
              class_lookup: ClassLookup | None = None,
              extended: ExtendedResources | None = None,
              hold_legacy: bool = False) -> TranslationPlan:
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

    `hold_legacy` leaves every legacy request as it is (a namespace in audit mode, a pod that
    opts out of translation) and only gates a pod whose own claims use a gateway class: the
    gate is what keeps such a pod from the scheduler, whoever wrote its claims.
    """
    metadata = objects.meta(pod)
    annotations = objects.annotations(pod)
    spec = pod.get("spec") or {}
    namespace = objects.namespace(pod)
    if names.ANNOTATION_TRANSLATED in annotations:
        # Translated already (by an earlier admission, or by `dra-gateway translate` in a
        # workload's pod template): only make sure the gate is there if it is needed.
        plan = TranslationPlan()
        if _recorded_gate(annotations[names.ANNOTATION_TRANSLATED]) or \
                _references_gateway_class(spec, namespace, class_lookup, by_name=False):
            _add_gate(spec, plan.patch)
        return plan

    found: list[Found] = []
    untranslated: list[Untranslated] = []
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
            if (in_limits or in_requests) and not hold_legacy:
                found.append(Found(key, index, container, in_limits, in_requests))
            if disabled_rule is not None:
                for name in dict.fromkeys((*limits, *requests)):
                    rule = disabled_rule(name)
                    if rule is not None and not is_legacy(name):
                        untranslated.append(Untranslated(container.get("name", ""), name, rule))

    plan = TranslationPlan()
    if untranslated:
        _warn_untranslated(untranslated, plan)
    if not found:
        if _references_gateway_class(spec, namespace, class_lookup):
            _add_gate(spec, plan.patch)
        return plan
    twice = _name_used_twice(spec)
    if twice is not None:
        # Mutating admission runs before the API server validates the pod; the patch finds
        # containers by name, so it would remove and add in the wrong one.
        plan.refusal = Refusal(
            message=f"container name {quote(twice)} is used by more than one container; names "
                    f"must be unique across containers and initContainers",
            container=twice, resource="", rule="")
        return plan

    node_selector = spec.get("nodeSelector") or {}
    shape = (
        namespace,
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
    pod_plan: _PodPlan | None = rules.cache.get(shape)
    if pod_plan is None:
        context = PodContext(annotations=annotations, node_selector=node_selector,
                              namespace=namespace, extended=extended if extended else None)
        pod_plan = _plan_pod(found, context=context, rules=rules)
        rules.remember(shape, pod_plan)

    plan.warnings.extend(pod_plan.warnings)
    plan.rules_applied.extend(pod_plan.rules_applied)
    plan.extended.extend(pod_plan.extended)
    if pod_plan.refusal is not None:
        plan.refusal = pod_plan.refusal
        return plan
    if pod_plan.template is None:
        if _references_gateway_class(spec, namespace, class_lookup):
            _add_gate(spec, plan.patch)
        return plan
    for claim in spec.get("resourceClaims") or ():
        if claim.get("name") == CLAIM_NAME:
            first = found[0]
            plan.refusal = Refusal(
                message=f"the pod already has a resource claim named {quote(CLAIM_NAME)} but no "
                        f"{names.ANNOTATION_TRANSLATED} annotation; rename that claim",
                container=first.name, resource=", ".join(first.legacy), rule="")
            return plan

    # A fresh object per plan: callers may change what they get without touching the cache.
    template = orjson.loads(pod_plan.template)
    if namespace:
        template["metadata"] = {"name": template["metadata"]["name"], "namespace": namespace,
                                "labels": dict(_MANAGED)}
    plan.templates.append(template)
    _build_patch(spec, metadata=metadata, found=found, pod_plan=pod_plan,
                 template=template["metadata"]["name"], patch=plan.patch,
                 has_metadata=isinstance(pod.get("metadata"), dict))
    if pod_plan.gated or _references_gateway_class(spec, namespace, class_lookup):
        _add_gate(spec, plan.patch)
    return plan


def claim_specs(pod: Mapping[str, Any], rules: RuleSet, *,
                extended: ExtendedResources | None = None) -> list[dict[str, Any]] | None:
    """The specs of the claims translating `pod` would make (each template's `spec.spec`), as
    a pod left on its legacy names is charged to its namespace's quotas; None when the rules
    refuse it."""
    plan = translate(pod, rules, extended=extended or None)
    if plan.refusal is not None:
        return None
    return [template["spec"]["spec"] for template in plan.templates]


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


def _key(value: Any) -> Any:
    """`value` usable in a cache key; a malformed one (a list, a map) by its text."""
    return value if value is None or isinstance(value, (str, int, float)) else repr(value)


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
        template = claim.get("resourceClaimTemplateName")
        kind, ref = (("ResourceClaimTemplate", template) if template else
                     ("ResourceClaim", claim.get("resourceClaimName")))
        classes = class_lookup(kind, namespace, ref) if class_lookup and ref else None
        if classes is not None:
            if any(c in names.GATEWAY_CLASSES for c in classes):
                return True
        elif by_name and template and template.startswith(TEMPLATE_PREFIX):
            return True
    return False


def _add_gate(spec: Mapping[str, Any], patch: list[dict[str, Any]]) -> None:
    gates = spec.get("schedulingGates")
    if gates is None:
        patch.append({"op": "add", "path": "/spec/schedulingGates",
                      "value": [{"name": names.SCHEDULING_GATE}]})
    elif not any(g.get("name") == names.SCHEDULING_GATE for g in gates):
        patch.append({"op": "add", "path": "/spec/schedulingGates/-",
                      "value": {"name": names.SCHEDULING_GATE}})


# --------------------------------------------------------------------------------------------
# Planning (cached per shape).


def _plan_pod(found: list[Found], *, context: PodContext, rules: RuleSet) -> _PodPlan:
    per_container: list[_Planned] = []
    warnings: list[str] = []
    uses: list[ExtendedResourceUse] = []
    record: dict[str, dict[str, Any]] = {}
    removed: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    try:
        for item in found:
            name, in_limits, in_requests = item.name, item.in_limits, item.in_requests
            result = plan_container(item, context=context, rules=rules, warnings=warnings,
                                    uses=uses)
            if isinstance(result, Skipped):
                continue
            per_container.append(_Planned(item, result))
            resources = item.container["resources"]
            limits = resources.get("limits") or {}
            requests = resources.get("requests") or {}
            entry: dict[str, Any] = {"rule": result.rule}
            if in_limits:
                entry["limits"] = {n: str(limits[n]) for n in sorted(in_limits)}
            if in_requests:
                entry["requests"] = {n: str(requests[n]) for n in sorted(in_requests)}
            record[name] = entry
            removed[name] = (in_limits, in_requests)
    except Refused as refused:
        return _unchanged(warnings, refusal=refused.refusal)

    if not per_container:
        return _unchanged(warnings, extended=uses)

    request_of: dict[str, str] = {}
    requests_out: list[dict[str, Any]] = []
    configs: list[dict[str, Any]] = []
    constraints: list[dict[str, Any]] = []
    mains = [(planned.found.name, planned.plan) for planned in per_container
             if planned.found.key == "containers"]
    for planned in per_container:
        name, result = planned.found.name, planned.plan
        if planned.found.key == "initContainers" and not is_sidecar(planned.found.key,
                                                                     planned.found.container):
            # An init container runs before the others: the pod needs the larger of the two
            # (as the scheduler counts it), so it uses an app container's devices when those
            # cover its request instead of holding devices of its own.
            host = next((m for m, p in mains if _covers(p, result)), None)
            if host is not None:
                request_of[name] = host
                record[name]["request"] = host
                continue
        request_of[name] = name
        record[name]["request"] = name
        requests_out.append(result.request)
        if result.config is not None:
            configs.append(result.config)
        constraints.extend(result.constraints)

    total = sum(r["exactly"]["count"] for r in requests_out)
    if total > MAX_DEVICES_PER_CLAIM:
        counts = ", ".join(f"{r['name']}: {r['exactly']['count']}" for r in requests_out)
        # Requests are named after their containers: blame the one asking for the most.
        largest = max(requests_out, key=lambda r: r["exactly"]["count"])["name"]
        resource = ", ".join(sorted(set().union(*removed[largest])))
        too_many = refuse(f"the pod's containers ask for {total} devices in all ({counts}); "
                          f"a DRA claim holds at most {MAX_DEVICES_PER_CLAIM} devices, so it "
                          "could never be allocated; split the work over several pods",
                          container=largest, resource=resource, rule="")
        return _unchanged(warnings, refusal=too_many.refusal)

    devices: dict[str, Any] = {"requests": requests_out}
    if constraints:
        devices["constraints"] = constraints
    if configs:
        devices["config"] = configs
    template_spec = {"metadata": {"labels": dict(_MANAGED)}, "spec": {"devices": devices}}
    template = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": template_name(template_spec), "labels": dict(_MANAGED)},
        "spec": template_spec,
    }
    applied = tuple(sorted({planned.plan.rule for planned in per_container}))
    template_json = orjson.dumps(template)
    gated = any(planned.plan.gated for planned in per_container)
    annotation = orjson.dumps({"containers": record, "gated": gated},
                              option=orjson.OPT_SORT_KEYS).decode()
    for planned in per_container:
        warnings.extend(planned.plan.warnings)
    return _PodPlan(template=template_json, request_of=request_of, removed=removed,
                    annotation=annotation, gated=gated, warnings=tuple(warnings),
                    rules_applied=applied, refusal=None, extended=tuple(uses))


def _name_used_twice(spec: Mapping[str, Any]) -> str | None:
    seen: set[str] = set()
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or ():
            name = container.get("name", "")
            if name in seen:
                return str(name)
            seen.add(name)
    return None


def _unchanged(warnings: list[str], *, refusal: Refusal | None = None,
               extended: list[ExtendedResourceUse] | None = None) -> _PodPlan:
    """The plan of a pod left as it is: refused, or with nothing to translate."""
    return _PodPlan(template=None, request_of={}, removed={}, annotation="", gated=False,
                    warnings=tuple(warnings), rules_applied=(), refusal=refusal,
                    extended=tuple(extended or ()))


def _covers(main: ContainerPlan, init: ContainerPlan) -> bool:
    a, b = main.request["exactly"], init.request["exactly"]
    if a["count"] < b["count"]:
        return False
    same = all(a.get(k) == b.get(k) for k in ("deviceClassName", "selectors", "capacity"))
    main_params = main.config["opaque"]["parameters"] if main.config else None
    init_params = init.config["opaque"]["parameters"] if init.config else None
    return same and main_params == init_params and main.constraints == () == init.constraints


# --------------------------------------------------------------------------------------------
# The patch (depends on where things sit in this pod, so it is built every time).


def _build_patch(spec: Mapping[str, Any], *, metadata: Mapping[str, Any], found: list[Found],
                 pod_plan: _PodPlan, template: str, patch: list[dict[str, Any]],
                 has_metadata: bool) -> None:
    entry = {"name": CLAIM_NAME, "resourceClaimTemplateName": template}
    if spec.get("resourceClaims") is None:
        patch.append({"op": "add", "path": "/spec/resourceClaims", "value": [entry]})
    else:
        patch.append({"op": "add", "path": "/spec/resourceClaims/-", "value": entry})
    for key, index, container, _, _ in found:
        name = container.get("name", "")
        request = pod_plan.request_of.get(name)
        if request is None:
            continue
        base = f"/spec/{key}/{index}/resources"
        resources = container["resources"]
        claim = {"name": CLAIM_NAME, "request": request}
        if resources.get("claims") is None:
            patch.append({"op": "add", "path": f"{base}/claims", "value": [claim]})
        else:
            patch.append({"op": "add", "path": f"{base}/claims/-", "value": claim})
        in_limits, in_requests = pod_plan.removed[name]
        for section, keys in (("limits", in_limits), ("requests", in_requests)):
            if not keys:
                continue
            current = resources.get(section) or {}
            if len(keys) == len(current):
                patch.append({"op": "remove", "path": f"{base}/{section}"})
            else:
                for resource in keys:
                    patch.append({"op": "remove",
                                  "path": f"{base}/{section}/{escape_pointer(resource)}"})
    record = {names.ANNOTATION_TRANSLATED: pod_plan.annotation}
    if not has_metadata:
        patch.append({"op": "add", "path": "/metadata", "value": {"annotations": record}})
    elif metadata.get("annotations") is None:
        patch.append({"op": "add", "path": "/metadata/annotations", "value": record})
    else:
        patch.append({"op": "add", "path": "/metadata/annotations/"
                      + escape_pointer(names.ANNOTATION_TRANSLATED),
                      "value": pod_plan.annotation})

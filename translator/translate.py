"""`translate(pod, rules)`: the plan that turns a pod's legacy GPU requests into DRA claims.

The plan holds the ResourceClaimTemplate the pod needs (one per pod, one device request per
container, named by a hash of its whole spec so that identical requests share one template per
namespace) and the RFC 6902 patch that points the pod at it, removes the translated legacy
resources, adds the gateway's scheduling gate and records what was translated in an annotation.

Pure and deterministic: it reads the pod and the rules and returns data. It must not perform
I/O, log, or modify the pod it is given. Work is cached per request shape on the `RuleSet`, so
the usual admission (the same few shapes over and over) only walks the pod and builds the patch.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import orjson

from dra_gateway.kube import names
from dra_gateway.kube.cel import CelError, Expression
from dra_gateway.kube.models import ENFORCEMENTS, POLICY_NAMES, GpuShareConfig
from dra_gateway.kube.quantity import Quantity, QuantityError
from dra_gateway.translator.extended import ExtendedResources, ExtendedResourceUse
from dra_gateway.translator.rules import (
    CompiledRule,
    RuleSet,
    render_selector,
    selector_values,
)

__all__ = [
    "CLAIM_NAME",
    "TEMPLATE_PREFIX",
    "ClassLookup",
    "Refusal",
    "TranslationPlan",
    "escape_pointer",
    "template_name",
    "translate",
]

# The pod-level claim name the gateway adds to spec.resourceClaims.
CLAIM_NAME: Final = "dra-gateway"
TEMPLATE_PREFIX: Final = "dra-gateway-"
_HASH_LENGTH: Final = 10
_MANAGED: Final = {names.LABEL_MANAGED_BY: names.MANAGED_BY}
# resource.k8s.io/v1 AllocationResult.devices.results holds at most 32 devices: a claim that
# asks for more can never be allocated, by the gateway or by the scheduler.
MAX_DEVICES_PER_CLAIM: Final = 32
_INT64_MAX: Final = 2**63 - 1

# Looks up the device classes a claim or template named by the pod requests:
# (kind, namespace, name) -> class names, or None when unknown. kind is "ResourceClaimTemplate"
# or "ResourceClaim".
ClassLookup = Callable[[str, str, str], Collection[str] | None]


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request that cannot be honoured. `message` names the container, resource and rule."""

    message: str
    container: str
    resource: str
    rule: str


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

    @property
    def changed(self) -> bool:
        return bool(self.patch)


class _Refused(Exception):
    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


@dataclass(frozen=True, slots=True)
class _ContainerPlan:
    """What one container becomes; independent of where the container sits in the pod."""

    rule: str
    request: dict[str, Any]
    config: dict[str, Any] | None
    constraints: tuple[dict[str, Any], ...]
    gated: bool
    warnings: tuple[str, ...]


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


def escape_pointer(token: str) -> str:
    """A JSON Pointer reference token (RFC 6901): `~` as `~0`, `/` as `~1`."""
    return token.replace("~", "~0").replace("/", "~1")


def template_name(spec: Mapping[str, Any]) -> str:
    """`dra-gateway-` and the first hex digits of the SHA-256 of the spec's canonical JSON."""
    digest = hashlib.sha256(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return TEMPLATE_PREFIX + digest[:_HASH_LENGTH]


def translate(pod: Mapping[str, Any], rules: RuleSet, *,
              class_lookup: ClassLookup | None = None,
              extended: ExtendedResources | None = None) -> TranslationPlan:
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
    """
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    spec = pod.get("spec") or {}
    namespace = metadata.get("namespace") or ""
    if names.ANNOTATION_TRANSLATED in annotations:
        # Translated already (by an earlier admission, or by `dra-gateway translate` in a
        # workload's pod template): only make sure the gate is there if it is needed.
        plan = TranslationPlan()
        if _recorded_gate(annotations[names.ANNOTATION_TRANSLATED]) or \
                _references_gateway_class(spec, namespace, class_lookup, by_name=False):
            _add_gate(spec, plan.patch)
        return plan

    found: list[tuple[str, int, Mapping[str, Any], tuple[str, ...], tuple[str, ...]]] = []
    is_legacy = rules.is_legacy
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
                found.append((key, index, container, in_limits, in_requests))

    plan = TranslationPlan()
    if not found:
        if _references_gateway_class(spec, namespace, class_lookup):
            _add_gate(spec, plan.patch)
        return plan

    node_selector = spec.get("nodeSelector") or {}
    shape = (
        namespace,
        tuple(
            (key, container.get("name", ""), _is_sidecar(key, container),
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
        pod_plan = _plan_pod(found, annotations, node_selector, namespace, rules,
                             extended=extended if extended else None)
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
                message=f"the pod already has a resource claim named {_q(CLAIM_NAME)} but no "
                        f"{names.ANNOTATION_TRANSLATED} annotation; rename that claim",
                container=first[2].get("name", ""), resource=", ".join(first[3] or first[4]),
                rule="")
            return plan

    # A fresh object per plan: callers may change what they get without touching the cache.
    template = orjson.loads(pod_plan.template)
    if namespace:
        template["metadata"] = {"name": template["metadata"]["name"], "namespace": namespace,
                                "labels": dict(_MANAGED)}
    plan.templates.append(template)
    _build_patch(spec, metadata, found, pod_plan, template["metadata"]["name"], plan.patch,
                 has_metadata=isinstance(pod.get("metadata"), dict))
    if pod_plan.gated or _references_gateway_class(spec, namespace, class_lookup):
        _add_gate(spec, plan.patch)
    return plan


def _key(value: Any) -> Any:
    """`value` usable in a cache key; a malformed one (a list, a map) by its text."""
    return value if value is None or isinstance(value, (str, int, float)) else repr(value)


def _is_sidecar(key: str, container: Mapping[str, Any]) -> bool:
    return key == "initContainers" and container.get("restartPolicy") == "Always"


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


def _plan_pod(found: list[tuple[str, int, Mapping[str, Any], tuple[str, ...], tuple[str, ...]]],
              annotations: Mapping[str, str], node_selector: Mapping[str, str], namespace: str,
              rules: RuleSet, *, extended: ExtendedResources | None) -> _PodPlan:
    per_container: list[tuple[str, Mapping[str, Any], _ContainerPlan]] = []
    warnings: list[str] = []
    uses: list[ExtendedResourceUse] = []
    record: dict[str, dict[str, Any]] = {}
    removed: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {}
    try:
        for key, _, container, in_limits, in_requests in found:
            name = container.get("name", "")
            result = _plan_container(key, container, set(in_limits) | set(in_requests),
                                     annotations, node_selector, namespace, rules, warnings,
                                     extended=extended, uses=uses)
            if result is None:
                continue
            per_container.append((key, container, result))
            resources = container["resources"]
            limits = resources.get("limits") or {}
            requests = resources.get("requests") or {}
            entry: dict[str, Any] = {"rule": result.rule}
            if in_limits:
                entry["limits"] = {n: str(limits[n]) for n in sorted(in_limits)}
            if in_requests:
                entry["requests"] = {n: str(requests[n]) for n in sorted(in_requests)}
            record[name] = entry
            removed[name] = (in_limits, in_requests)
    except _Refused as refused:
        return _PodPlan(None, {}, {}, "", False, tuple(warnings), (), refused.refusal)

    if not per_container:
        return _PodPlan(None, {}, {}, "", False, tuple(warnings), (), None, tuple(uses))

    request_of: dict[str, str] = {}
    requests_out: list[dict[str, Any]] = []
    configs: list[dict[str, Any]] = []
    constraints: list[dict[str, Any]] = []
    mains = [(c.get("name", ""), p) for k, c, p in per_container if k == "containers"]
    for key, container, result in per_container:
        name = container.get("name", "")
        if key == "initContainers" and not _is_sidecar(key, container):
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
        too_many = _refuse(largest, resource, "",
                           f"the pod's containers ask for {total} devices in all ({counts}); "
                           f"a DRA claim holds at most {MAX_DEVICES_PER_CLAIM} devices, so it "
                           "could never be allocated; split the work over several pods")
        return _PodPlan(None, {}, {}, "", False, tuple(warnings), (), too_many.refusal)

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
    applied = tuple(sorted({p.rule for _, _, p in per_container}))
    template_json = orjson.dumps(template)
    gated = any(p.gated for _, _, p in per_container)
    annotation = orjson.dumps({"containers": record, "gated": gated},
                              option=orjson.OPT_SORT_KEYS).decode()
    for _, _, result in per_container:
        warnings.extend(result.warnings)
    return _PodPlan(template_json, request_of, removed, annotation, gated, tuple(warnings),
                    applied, None, tuple(uses))


def _covers(main: _ContainerPlan, init: _ContainerPlan) -> bool:
    a, b = main.request["exactly"], init.request["exactly"]
    if a["count"] < b["count"]:
        return False
    same = all(a.get(k) == b.get(k) for k in ("deviceClassName", "selectors", "capacity"))
    main_params = main.config["opaque"]["parameters"] if main.config else None
    init_params = init.config["opaque"]["parameters"] if init.config else None
    return same and main_params == init_params and main.constraints == () == init.constraints


def _refuse(container: str, resource: str, rule: str, message: str, *,
            name_rule: bool = True) -> _Refused:
    where = f" (rule {rule})" if rule and name_rule else ""
    return _Refused(Refusal(message=f"container {_q(container)}: {message}{where}",
                            container=container, resource=resource, rule=rule))


def _q(text: str) -> str:
    return orjson.dumps(text).decode()


def _whole_value(container: str, rule: str, resource: str, limit: Any, request: Any) -> int:
    """A legacy resource's value as a non-negative whole number (limits win, as upstream)."""
    raw = limit if limit is not None else request
    try:
        quantity = Quantity.parse(str(raw))
        if limit is not None and request is not None and \
                Quantity.parse(str(request)) != quantity:
            raise _refuse(container, resource, rule,
                          f"{resource} has limit {limit} but request {request}; extended "
                          "resources need equal values (or set only the limit)")
    except QuantityError as exc:
        raise _refuse(container, resource, rule, f"{resource}: {exc}") from None
    if quantity.sign() < 0:
        raise _refuse(container, resource, rule, f"{resource} is {raw}, a negative amount")
    if not quantity.is_integer():
        raise _refuse(container, resource, rule,
                      f"{resource} is {raw}, not a whole number; ask for whole units")
    return quantity.value()


def _plan_container(key: str, container: Mapping[str, Any], legacy: set[str],
                    annotations: Mapping[str, str], node_selector: Mapping[str, str],
                    namespace: str, rules: RuleSet, warnings: list[str], *,
                    extended: ExtendedResources | None,
                    uses: list[ExtendedResourceUse]) -> _ContainerPlan | None:
    name = container.get("name", "")
    resources = container["resources"]
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    ordered = sorted(legacy)

    candidates: dict[str, CompiledRule] = {}
    for resource in ordered:
        for rule in rules.rules_for(resource):
            candidates.setdefault(rule.name, rule)
    kind = "sidecar" if _is_sidecar(key, container) else (
        "initContainer" if key == "initContainers" else "container")
    triggered: list[tuple[CompiledRule, dict[str, Any]]] = []
    for rule in sorted(candidates.values(), key=lambda r: (-r.precedence, r.name)):
        mine = [n for n in ordered if rule.claims(n)]
        if not any(rule.triggered_by(n) for n in mine):
            continue
        if not _conditions_hold(rule, annotations, node_selector):
            continue
        activation = _activation(rule, name, kind, mine, limits, requests, annotations,
                                 node_selector, namespace)
        if rule.when is not None and _evaluate(rule, "match.when", rule.when, activation,
                                               name, mine) is not True:
            continue
        triggered.append((rule, activation))
    if not triggered:
        unmatched = ", ".join(ordered)
        warnings.append(f"container {_q(name)}: {unmatched} matched no enabled rule's trigger; "
                        "left unchanged")
        return None

    rule, activation = triggered[0]
    covered = [n for n in ordered if rule.claims(n)]
    leftover = [n for n in ordered if n not in covered]
    if leftover:
        owners = sorted(rules.rules_for(leftover[0]), key=lambda r: (
            leftover[0] not in r.triggers and not r.trigger_pattern, -r.precedence, r.name))
        other = owners[0].name
        raise _refuse(name, f"{covered[0]}, {leftover[0]}", rule.name,
                      f"{covered[0]} (rule {rule.name}) and {leftover[0]} (rule {other}) "
                      "cannot be combined in one container; ask for one protocol per "
                      "container", name_rule=False)
    amounts = activation["r"]
    if not any(amounts.get(n, amounts.get(f"{rule.pattern}*")) for n in covered
               if rules.asks_for_devices(n)):
        # Only zero amounts of what asks for cards (a hint such as a priority does not; a
        # resource that triggers another rule does, such as nvidia.com/gpu: 1 beside a zero
        # nvidia.com/gpucores): nothing to allocate, the container stays as it is.
        return None
    if extended and _defer(name, covered, rule, extended, warnings, uses):
        return None
    resource = ", ".join(covered)
    for index, (variable, expression) in enumerate(rule.variables):
        activation[variable] = _evaluate(rule, f"variables[{index}]", expression, activation,
                                         name, covered)
    flags = _evaluate_all(rule, rule.refusal_batch,
                          [(f"refuse[{i}].when", e) for i, (e, _) in enumerate(rule.refusals)],
                          activation, name, covered)
    for flag, (_, message) in zip(flags, rule.refusals, strict=True):
        if flag is True:
            raise _refuse(name, resource, rule.name, message)

    outputs = _evaluate_all(rule, rule.output_batch, [
        ("device.count", rule.count), ("device.memory", rule.memory),
        ("device.memoryPercent", rule.memory_percent), ("device.cores", rule.cores),
        ("device.enforcement", rule.enforcement), ("device.policy", rule.policy)],
        activation, name, covered)
    count, memory, percent, cores = (
        _whole(rule, what, value, name, covered) for what, value in
        zip(("count", "memory", "memoryPercent", "cores"), outputs[:4], strict=True))
    enforcement_value, policy_value = (
        _text(rule, what, value, name, covered) for what, value in
        zip(("enforcement", "policy"), outputs[4:], strict=True))
    if count < 1:
        raise _refuse(name, resource, rule.name,
                      f"{resource} gives a device count of {count}; at least 1 is needed")
    if count > MAX_DEVICES_PER_CLAIM:
        raise _refuse(name, resource, rule.name,
                      f"{resource} gives a device count of {count}; a DRA claim holds at most "
                      f"{MAX_DEVICES_PER_CLAIM} devices, so it could never be allocated; "
                      "split the work over several pods")
    for label, value in (("memory share", percent), ("compute share", cores)):
        if not 0 <= value <= names.CORES_PER_CARD:
            raise _refuse(name, resource, rule.name,
                          f"{resource} gives a {label} of {value}% of a card; a share is "
                          "1 to 100 per card (ask for more cards instead)")
    if memory < 0:
        raise _refuse(name, resource, rule.name, f"{resource} gives negative memory")
    if memory == 0 and percent in (0, 100) and cores in (0, 100):
        percent = cores = 0  # the whole memory and compute of a card is a whole card
    conditions = _evaluate_all(rule, rule.condition_batch, [
        *((f"device.selectors[{i}].when", sel.when) for i, sel in enumerate(rule.selectors)),
        *((f"device.constraints[{i}].when", con) for i, (_, con) in
          enumerate(rule.constraints))], activation, name, covered)

    exactly: dict[str, Any] = {"deviceClassName": rule.class_name,
                               "allocationMode": "ExactCount", "count": count}
    selectors = _selectors(rule, conditions[:len(rule.selectors)], activation, name, covered)
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": s}} for s in selectors]
    capacity: dict[str, str] = {}
    if memory:
        capacity[names.CAPACITY_MEMORY] = str(Quantity.from_bytes(memory))
    if cores:
        capacity[names.CAPACITY_CORES] = str(cores)
    if rule.gateway_class and (memory or percent or cores):
        # A share states every capacity of the card: one it leaves out is consumed at the
        # request policy's default, the whole card, and the share would hold the card alone.
        # The smallest amount accounts for it; the GpuShareConfig (which leaves it out) says
        # what is enforced.
        if not cores:
            capacity[names.CAPACITY_CORES] = "1"
        if not memory and not percent:
            capacity[names.CAPACITY_MEMORY] = str(Quantity.from_bytes(names.MEMORY_STEP))
    if capacity:
        exactly["capacity"] = {"requests": capacity}
    request = {"name": name, "exactly": exactly}

    own_warnings: list[str] = []
    config = None
    if rule.gateway_class:
        enforcement = enforcement_value or "none"
        if enforcement not in ENFORCEMENTS:
            raise _refuse(name, resource, rule.name,
                          f"enforcement {_q(enforcement)} is not one of {', '.join(ENFORCEMENTS)}")
        policy = policy_value or None
        if policy is not None and policy not in POLICY_NAMES:
            own_warnings.append(f"container {_q(name)}: policy {_q(policy)} is not one of "
                                f"{', '.join(POLICY_NAMES)}; the cluster default applies")
            policy = None
        share = GpuShareConfig.model_validate({
            "memory": memory or None, "memoryPercent": percent or None, "cores": cores or None,
            "enforcement": enforcement, "policy": policy})
        config = {"requests": [name],
                  "opaque": {"driver": names.DRIVER, "parameters": share.to_parameters()}}
    constraints = []
    if count > 1:
        for (attribute, _), holds in zip(rule.constraints, conditions[len(rule.selectors):],
                                         strict=True):
            if holds is True:
                constraints.append({"requests": [name],
                                    "matchAttribute": f"{rule.driver}/{attribute}"})
    return _ContainerPlan(rule.name, request, config, tuple(constraints), rule.gated,
                          tuple(own_warnings))


def _defer(container: str, covered: list[str], rule: CompiledRule,
           extended: ExtendedResources, warnings: list[str],
           uses: list[ExtendedResourceUse]) -> bool:
    """Whether the container is left to kube-scheduler: a DeviceClass declares one of the
    resources its rule reads as spec.extendedResourceName, and the rule does not take it back.

    The whole activation is deferred, companions included: kube-scheduler serves the declared
    name, and translating the rest (HAMi's nvidia.com/gpumem without its nvidia.com/gpu) would
    split one request between two allocators. A dra-gateway class declaring the name is no
    exception: the administrator chose to have kube-scheduler allocate those devices (whole,
    outside the gateway's allocator, which still counts them), and a per-pod translation would
    contradict the class for some pods only; the warning says so.
    """
    declared = [(n, extended.classes_of(n)[0]) for n in covered if extended.classes_of(n)]
    if not declared:
        return False
    action: Literal["deferred", "translated"] = (
        "deferred" if rule.extended_resource_names == "defer" else "translated")
    uses.extend(ExtendedResourceUse(container, n, device_class, rule.name, action,
                                    tuple(covered)) for n, device_class in declared)
    if action == "translated":
        return False
    resource, device_class = declared[0]
    own = " (a dra-gateway class: no shares)" if device_class in names.GATEWAY_CLASSES else ""
    warnings.append(
        f"container {_q(container)}: {', '.join(covered)} left to kube-scheduler: DeviceClass "
        f"{device_class}{own} declares {resource} (spec.extendedResourceName); "
        f"extendedResourceNames: translate on rule {rule.name} would translate it")
    return True


def _conditions_hold(rule: CompiledRule, annotations: Mapping[str, str],
                     node_selector: Mapping[str, str]) -> bool:
    for wanted, actual in ((rule.match_annotations, annotations),
                           (rule.match_node_selector, node_selector)):
        for key, value in wanted.items():
            if key not in actual or (value is not None and actual[key] != value):
                return False
    return True


def _activation(rule: CompiledRule, container: str, kind: str, mine: list[str],
                limits: Mapping[str, Any], requests: Mapping[str, Any],
                annotations: Mapping[str, str], node_selector: Mapping[str, str],
                namespace: str) -> dict[str, Any]:
    r = dict.fromkeys(rule.exact, 0)
    wildcard = ""
    pattern_names = []
    for resource in mine:
        value = _whole_value(container, rule.name, resource, limits.get(resource),
                             requests.get(resource))
        scaled = value * rule.exact.get(resource, rule.pattern_factor)
        if scaled > _INT64_MAX:
            # Expressions compute in CEL's 64-bit integers; no device has that much anyway.
            raise _refuse(container, resource, rule.name,
                          f"{resource} is {limits.get(resource, requests.get(resource))}, "
                          "more than any device offers")
        if resource in rule.exact:
            r[resource] = scaled
        else:
            pattern_names.append(resource)
            r[f"{rule.pattern}*"] = scaled
            wildcard = resource[len(rule.pattern or ""):]
    if rule.pattern is not None:
        r.setdefault(f"{rule.pattern}*", 0)
    if len(pattern_names) > 1:
        raise _refuse(container, ", ".join(pattern_names), rule.name,
                      f"{' and '.join(pattern_names)} cannot be combined in one container; "
                      "one container asks for one kind")
    keys = rule.annotations + tuple(rule.match_annotations)
    return {
        "r": r,
        "container": {"name": container, "kind": kind},
        "annotations": {k: annotations[k] for k in keys if k in annotations},
        "nodeSelector": {k: node_selector[k] for k in rule.node_selector + tuple(
            rule.match_node_selector) if k in node_selector},
        "namespace": namespace,
        "wildcard": wildcard,
    }


def _evaluate(rule: CompiledRule, what: str, expression: Any, activation: dict[str, Any],
              container: str, resources: list[str]) -> Any:
    try:
        return expression.evaluate(activation)
    except CelError as exc:
        raise _refuse(container, ", ".join(resources), rule.name,
                      f"{what} could not be computed from {', '.join(resources)}: {exc}") \
            from None


def _evaluate_all(rule: CompiledRule, batch: Expression | None,
                  singles: list[tuple[str, Expression | None]], activation: dict[str, Any],
                  container: str, resources: list[str]) -> list[Any]:
    """Values of `singles` (None where absent) through one batched evaluation.

    On an error the expressions are evaluated one by one so the refusal names the one that
    failed.
    """
    if batch is None:
        return []
    try:
        values = batch.evaluate(activation)
    except CelError:
        for what, expression in singles:
            if expression is not None:
                _evaluate(rule, what, expression, activation, container, resources)
        raise
    if not isinstance(values, list) or len(values) != len(singles):
        raise AssertionError(f"rule {rule.name}: batched expression gave {values!r}")
    return values


def _whole(rule: CompiledRule, what: str, value: Any, container: str,
           resources: list[str]) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _refuse(container, ", ".join(resources), rule.name,
                      f"device.{what} gave {value!r}, not a whole number")
    return value


def _text(rule: CompiledRule, what: str, value: Any, container: str,
          resources: list[str]) -> str:
    if not isinstance(value, str):
        raise _refuse(container, ", ".join(resources), rule.name,
                      f"device.{what} gave {value!r}, not a string")
    return value


def _selectors(rule: CompiledRule, enabled: list[Any], activation: dict[str, Any],
               container: str, resources: list[str]) -> list[str]:
    out = []
    for index, (selector, on) in enumerate(zip(rule.selectors, enabled, strict=True)):
        if on is not True:
            continue
        if selector.cel is not None:
            out.append(selector.cel)
            continue
        value = _evaluate(rule, f"device.selectors[{index}].values", selector.values,
                          activation, container, resources)
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _refuse(container, ", ".join(resources), rule.name,
                          f"device.selectors[{index}].values gave {value!r}, not strings")
        rendered = render_selector(selector, rule.driver, selector_values(selector, value))
        if rendered is not None:
            out.append(rendered)
    return out


# --------------------------------------------------------------------------------------------
# The patch (depends on where things sit in this pod, so it is built every time).


def _build_patch(spec: Mapping[str, Any], metadata: Mapping[str, Any],
                 found: list[tuple[str, int, Mapping[str, Any], tuple[str, ...],
                                   tuple[str, ...]]],
                 pod_plan: _PodPlan, template: str, patch: list[dict[str, Any]], *,
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

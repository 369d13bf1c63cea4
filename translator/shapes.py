"""Planning a pod's translation once per request shape: what each container asking for legacy
resources becomes, the ResourceClaimTemplate they share, and the annotation recording it.

`plan_shape` turns the containers `translate` found into a `ShapePlan`: per container a
`ContainerTranslation` (the rule, what the container became or why it stays or is refused, the
template request it uses), the template as JSON, the `translated` annotation's text, the
warnings and the refusal. `translate` caches it on the `RuleSet` per request shape, so it holds
nothing that depends on where a container sits in the pod: the patch is `translate`'s. The
`ContainerTranslation`s are the one record of the translation: the annotation is written from
them here, and `explaining.py` explains from them.

Pure: no I/O, no logging, and the pod is never modified.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import orjson

from dra_gateway.kube import names
from dra_gateway.translator.containers import (
    ContainerPlan,
    Found,
    PodContext,
    Skipped,
    is_sidecar,
    plan_container,
)
from dra_gateway.translator.errors import Refusal, Refused, refuse
from dra_gateway.translator.evaluation import MAX_DEVICES_PER_CLAIM
from dra_gateway.translator.extended import ExtendedResourceUse
from dra_gateway.translator.rules import RuleSet

__all__ = [
    "MANAGED_LABELS",
    "TEMPLATE_PREFIX",
    "ContainerTranslation",
    "ShapePlan",
    "plan_shape",
    "template_name",
]

TEMPLATE_PREFIX: Final = "dra-gateway-"
_HASH_LENGTH: Final = 10
MANAGED_LABELS: Final = {names.LABEL_MANAGED_BY: names.MANAGED_BY}


@dataclass(frozen=True, slots=True)
class ContainerTranslation:
    """What the translation made of one container asking for legacy resources, by which rule
    and into what: the record the pod's `translated` annotation, the webhook's answer and the
    explanation (`explaining.py`) are all built from."""

    name: str
    # What it becomes; why it stays as it is; or why the rules refuse it.
    result: ContainerPlan | Skipped | Refusal
    # The template request it uses: its own, or an app container's that covers this init
    # container's; None while it is not translated (skipped, refused, or the pod refused). A
    # request is named after its container, so "" is a request too (a container without a name).
    request: str | None = None
    # What planning it said besides the plan's own warnings (no rule applies, deferred).
    warnings: tuple[str, ...] = ()
    # The names it asks for that DeviceClasses declare (see `extended.py`).
    extended: tuple[ExtendedResourceUse, ...] = ()


@dataclass(frozen=True, slots=True)
class ShapePlan:
    """The cached, position-independent part of a pod's translation: the plan of its request
    shape. (The allocator's `PodPlan` and `plan_pod` are another idea: where a pod's claims
    are placed.)"""

    containers: tuple[ContainerTranslation, ...]  # one per found container, in its order
    template: bytes | None  # the ResourceClaimTemplate as JSON, without namespace
    annotation: str
    gated: bool
    warnings: tuple[str, ...]
    rules_applied: tuple[str, ...]
    refusal: Refusal | None
    extended: tuple[ExtendedResourceUse, ...] = ()


@dataclass(frozen=True, slots=True)
class _DeviceRequests:
    """The template's device requests, configs and constraints, and what each container uses."""

    containers: tuple[ContainerTranslation, ...]  # with `request` filled in where translated
    requests: list[dict[str, Any]]
    configs: list[dict[str, Any]]
    constraints: list[dict[str, Any]]


def template_name(spec: Mapping[str, Any]) -> str:
    """`dra-gateway-` and the first hex digits of the SHA-256 of the spec's canonical JSON."""
    digest = hashlib.sha256(orjson.dumps(spec, option=orjson.OPT_SORT_KEYS)).hexdigest()
    return TEMPLATE_PREFIX + digest[:_HASH_LENGTH]


def plan_shape(found: Sequence[Found], *, context: PodContext, rules: RuleSet) -> ShapePlan:
    """The plan of a pod whose containers `found` ask for legacy resources."""
    containers = tuple(_translate_container(item, context=context, rules=rules)
                       for item in found)
    refused = _first_refusal(containers)
    if refused is not None:
        position, refusal = refused
        return _unchanged(containers, _planning_warnings(containers[:position]),
                          refusal=refusal)
    warnings = _planning_warnings(containers)
    if not any(isinstance(c.result, ContainerPlan) for c in containers):
        return _unchanged(containers, warnings,
                          extended=[use for c in containers for use in c.extended])
    devices = _device_requests(found, containers)
    too_many = _too_many_devices(found, devices.requests)
    if too_many is not None:
        return _unchanged(containers, warnings, refusal=too_many)
    translated = devices.containers
    plans = [c.result for c in translated if isinstance(c.result, ContainerPlan)]
    gated = any(plan.gated for plan in plans)
    return ShapePlan(
        containers=translated, template=orjson.dumps(_template(devices)),
        annotation=_annotation(found, translated, gated=gated), gated=gated,
        warnings=(*warnings, *(w for plan in plans for w in plan.warnings)),
        rules_applied=tuple(sorted({plan.rule for plan in plans})), refusal=None,
        extended=tuple(use for c in containers for use in c.extended))


def _translate_container(item: Found, *, context: PodContext,
                         rules: RuleSet) -> ContainerTranslation:
    """One container's translation, planned on its own (a container after a refused one is
    planned too: its explanation says what it would have become)."""
    warnings: list[str] = []
    uses: list[ExtendedResourceUse] = []
    try:
        result: ContainerPlan | Skipped | Refusal = plan_container(
            item, context=context, rules=rules, warnings=warnings, uses=uses)
    except Refused as refused:
        result = refused.refusal
    return ContainerTranslation(name=item.name, result=result, warnings=tuple(warnings),
                                extended=tuple(uses))


def _first_refusal(containers: Sequence[ContainerTranslation]) -> tuple[int, Refusal] | None:
    """The first refused container's position, and the pod's refusal: that container's, or,
    when several are refused, every one of them in one message (the author fixes them all at
    once), counted; it names the first container and its rule."""
    refused = [(position, c.result) for position, c in enumerate(containers)
               if isinstance(c.result, Refusal)]
    if not refused:
        return None
    position, first = refused[0]
    if len(refused) == 1:
        return position, first
    message = (f"{len(refused)} containers are refused: "
               + "; ".join(refusal.message for _, refusal in refused))
    return position, replace(first, message=message)


def _planning_warnings(containers: Iterable[ContainerTranslation]) -> tuple[str, ...]:
    return tuple(w for c in containers for w in c.warnings)


def _device_requests(found: Sequence[Found],
                     containers: tuple[ContainerTranslation, ...]) -> _DeviceRequests:
    """Each translated container's request in the template, except an init container's that an
    app container's covers: an init container runs before the others and the pod needs the
    larger of the two (as the scheduler counts it), so it uses those devices instead of holding
    devices of its own."""
    mains = [(c.name, c.result) for item, c in zip(found, containers, strict=True)
             if item.key == "containers" and isinstance(c.result, ContainerPlan)]
    requests: list[dict[str, Any]] = []
    configs: list[dict[str, Any]] = []
    constraints: list[dict[str, Any]] = []
    out = []
    for item, container in zip(found, containers, strict=True):
        plan = container.result
        if not isinstance(plan, ContainerPlan):
            out.append(container)
            continue
        if item.key == "initContainers" and not is_sidecar(item.key, item.container):
            host = next((m for m, p in mains if _covers(p, plan)), None)
            if host is not None:
                out.append(replace(container, request=host))
                continue
        out.append(replace(container, request=container.name))
        requests.append(plan.request)
        if plan.config is not None:
            configs.append(plan.config)
        constraints.extend(plan.constraints)
    return _DeviceRequests(tuple(out), requests, configs, constraints)


def _too_many_devices(found: Sequence[Found],
                      requests: Sequence[Mapping[str, Any]]) -> Refusal | None:
    """The refusal of a pod whose requests ask for more devices than one claim holds."""
    total = sum(_count(r) for r in requests)
    if total <= MAX_DEVICES_PER_CLAIM:
        return None
    counts = ", ".join(f"{r['name']}: {_count(r)}" for r in requests)
    # Requests are named after their containers: blame the one asking for the most.
    largest = max(requests, key=_count)["name"]
    item = next(f for f in found if f.name == largest)
    resource = ", ".join(sorted({*item.in_limits, *item.in_requests}))
    return refuse(f"the pod's containers ask for {total} devices in all ({counts}); a DRA "
                  f"claim holds at most {MAX_DEVICES_PER_CLAIM} devices, so it could never be "
                  "allocated; split the work over several pods",
                  container=largest, resource=resource, rule="").refusal


def _template(devices: _DeviceRequests) -> dict[str, Any]:
    """The ResourceClaimTemplate, named by the hash of its spec, without namespace."""
    spec: dict[str, Any] = {"requests": devices.requests}
    if devices.constraints:
        spec["constraints"] = devices.constraints
    if devices.configs:
        spec["config"] = devices.configs
    template_spec = {"metadata": {"labels": dict(MANAGED_LABELS)}, "spec": {"devices": spec}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": template_name(template_spec), "labels": dict(MANAGED_LABELS)},
        "spec": template_spec,
    }


def _annotation(found: Sequence[Found], containers: Sequence[ContainerTranslation], *,
                gated: bool) -> str:
    """The `translated` annotation: per translated container its rule, the legacy amounts it
    asked for and the request it uses; and whether the pod needs the gate."""
    record: dict[str, dict[str, Any]] = {}
    for item, container in zip(found, containers, strict=True):
        if not isinstance(container.result, ContainerPlan):
            continue
        resources = item.container["resources"]
        limits = resources.get("limits") or {}
        requests = resources.get("requests") or {}
        entry: dict[str, Any] = {"rule": container.result.rule}
        if item.in_limits:
            entry["limits"] = {n: str(limits[n]) for n in sorted(item.in_limits)}
        if item.in_requests:
            entry["requests"] = {n: str(requests[n]) for n in sorted(item.in_requests)}
        entry["request"] = container.request
        record[item.name] = entry
    return orjson.dumps({"containers": record, "gated": gated},
                        option=orjson.OPT_SORT_KEYS).decode()


def _unchanged(containers: tuple[ContainerTranslation, ...], warnings: Sequence[str], *,
               refusal: Refusal | None = None,
               extended: Sequence[ExtendedResourceUse] = ()) -> ShapePlan:
    """The plan of a pod left as it is: refused, or with nothing to translate."""
    return ShapePlan(containers=containers, template=None, annotation="", gated=False,
                   warnings=tuple(warnings), rules_applied=(), refusal=refusal,
                   extended=tuple(extended))


def _count(request: Mapping[str, Any]) -> int:
    """The devices a request may take: its count, or its largest alternative's."""
    if "exactly" in request:
        return int(request["exactly"]["count"])
    return max(int(sub["count"]) for sub in request["firstAvailable"])


def _covers(main: ContainerPlan, init: ContainerPlan) -> bool:
    if ("exactly" in main.request) != ("exactly" in init.request):
        return False
    if "exactly" not in main.request:
        # Alternatives: the same ones, in the same order (an init container's would be chosen
        # apart from the app container's otherwise).
        a_subs, b_subs = main.request["firstAvailable"], init.request["firstAvailable"]
        same_subs = a_subs == b_subs
        main_params = main.config["opaque"]["parameters"] if main.config else None
        init_params = init.config["opaque"]["parameters"] if init.config else None
        return same_subs and main_params == init_params and (
            main.constraints == () == init.constraints)
    a, b = main.request["exactly"], init.request["exactly"]
    if a["count"] < b["count"]:
        return False
    same = all(a.get(k) == b.get(k) for k in ("deviceClassName", "selectors", "capacity"))
    main_params = main.config["opaque"]["parameters"] if main.config else None
    init_params = init.config["opaque"]["parameters"] if init.config else None
    return same and main_params == init_params and main.constraints == () == init.constraints

"""Planning one container: which rule translates it, and the device request it becomes.

`plan_container` picks the rule by precedence among those the container's legacy resources
trigger, evaluates the rule's CEL on the container's amounts and the pod's annotations, checks
the results, and returns the DRA device request, its GpuShareConfig and constraints; or a
`Skipped` saying why the container stays as it is; or raises `Refused` with a message naming
the container, the resources and the rule (`errors.py`). The activation a rule sees (the
container's amounts times their units, its kind, the pod's annotations and node selector) is
built here; the rule's device outputs are checked and become the device request in
`evaluation.py`. `shapes.py` assembles the pod's template from these plans, cached per
request shape, and `translate.py` the patch.

Pure: no I/O, no logging, and the pod is never modified. It must not build patches or know
where a container sits in the pod beyond its kind.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, NamedTuple

from dra_gateway.kube import names
from dra_gateway.kube.cel import CelError
from dra_gateway.kube.quantity import (
    Quantity,
    QuantityError,
    mistaken_suffix,
    mistaken_unit_message,
)
from dra_gateway.translator import migshares
from dra_gateway.translator.errors import Refused, quote, refuse
from dra_gateway.translator.evaluation import (
    MAX_SUBREQUESTS,
    Subject,
    checked_outputs,
    evaluate,
    evaluate_all,
    exactly,
    gateway_config,
    rendered_selectors,
    subrequest_names,
)
from dra_gateway.translator.extended import ExtendedResources, ExtendedResourceUse
from dra_gateway.translator.rules import CompiledRule, RuleSet
from dra_gateway.translator.selectors import hami_core_selector

__all__ = [
    "ContainerPlan",
    "Found",
    "PodContext",
    "Skipped",
    "asks_for_devices_here",
    "is_sidecar",
    "plan_container",
]

_INT64_MAX: Final = 2**63 - 1


@dataclass(frozen=True, slots=True)
class ContainerPlan:
    """What one container becomes; independent of where the container sits in the pod."""

    rule: str
    request: dict[str, Any]
    config: dict[str, Any] | None
    constraints: tuple[dict[str, Any], ...]
    gated: bool
    warnings: tuple[str, ...]
    # For explanations (`explaining.py`): each resource the rule read with its value times its
    # unit, and the index in the rule's `device.selectors` of each selector in `request`.
    amounts: tuple[tuple[str, int], ...] = ()
    selector_rules: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Skipped:
    """A container that asks for legacy resources and stays as it is: no enabled rule's trigger
    and conditions hold (`no-rule`), it asks only for zero amounts (`zero`), or a DeviceClass
    declares one of its names and kube-scheduler serves it (`deferred`)."""

    reason: Literal["no-rule", "zero", "deferred"]
    rule: str = ""


class Found(NamedTuple):
    """A container that asks for legacy resources, and where it sits in the pod."""

    key: str  # "initContainers" or "containers"
    position: int  # its index in that list
    container: Mapping[str, Any]
    in_limits: tuple[str, ...]  # legacy names in resources.limits, in the pod's order
    in_requests: tuple[str, ...]  # and in resources.requests

    @property
    def name(self) -> str:
        return str(self.container.get("name", ""))

    @property
    def legacy(self) -> tuple[str, ...]:
        """The legacy names it asks for, limits first (a refusal names these)."""
        return self.in_limits or self.in_requests


@dataclass(frozen=True, slots=True)
class PodContext:
    """What every container's translation reads from the pod besides the container itself."""

    annotations: Mapping[str, str]
    node_selector: Mapping[str, str]
    namespace: str
    extended: ExtendedResources | None
    # The namespace's sharing policies serve its shares with MIG instances (`migshares`).
    mig_shares: bool = False


def is_sidecar(key: str, container: Mapping[str, Any]) -> bool:
    return key == "initContainers" and container.get("restartPolicy") == "Always"


class _BadAmount(Exception):
    """What is wrong with one resource's amount; a container's are refused together."""


def _scaled_value(resource: str, *, subject: Subject, limit: Any, request: Any,
                  factor: int) -> int:
    """A legacy resource's value times its unit, as a non-negative whole number (limits win,
    as upstream). A fractional resource may have a fraction; the product is rounded down.
    Raises `_BadAmount` saying what is wrong with it."""
    raw = limit if limit is not None else request
    if resource not in subject.rule.suffixed:
        suffix = mistaken_suffix(str(raw))
        if suffix is not None:
            raise _BadAmount(mistaken_unit_message(resource, str(raw), factor))
    try:
        quantity = Quantity.parse(str(raw))
        if limit is not None and request is not None and \
                Quantity.parse(str(request)) != quantity:
            raise _BadAmount(f"{resource} has limit {limit} but request {request}; extended "
                             "resources need equal values (or set only the limit)")
    except QuantityError as exc:
        raise _BadAmount(f"{resource}: {exc}") from None
    if quantity.sign() < 0:
        raise _BadAmount(f"{resource} is {raw}, a negative amount")
    if resource in subject.rule.fractional:
        scaled = math.floor(quantity.as_fraction() * factor)
    elif not quantity.is_integer():
        raise _BadAmount(f"{resource} is {raw}, not a whole number; ask for whole units")
    else:
        scaled = quantity.value() * factor
    if scaled > _INT64_MAX:
        # Expressions compute in CEL's 64-bit integers; no device has that much anyway.
        raise _BadAmount(f"{resource} is {raw}, more than any device offers")
    return scaled


def plan_container(found: Found, *, context: PodContext, rules: RuleSet,
                    warnings: list[str], uses: list[ExtendedResourceUse]
                    ) -> ContainerPlan | Skipped:
    name = found.name
    ordered = sorted({*found.in_limits, *found.in_requests})
    chosen = _choose_rule(found, ordered, context=context, rules=rules)
    if chosen is None:
        unmatched = ", ".join(ordered)
        warnings.append(f"container {quote(name)}: {unmatched} matched no enabled rule's trigger; "
                        "left unchanged")
        return _NO_RULE

    rule, activation = chosen
    covered = [n for n in ordered if rule.claims(n)]
    leftover = [n for n in ordered if n not in covered]
    if leftover:
        # The rule the leftover would have: one whose conditions hold for this pod first (a
        # MIG rule that needs a node label is not the one a plain request belongs to).
        owners = sorted(rules.rules_for(leftover[0]), key=lambda r: (
            not _applies(r, found, context),
            leftover[0] not in r.triggers and not r.trigger_pattern, -r.precedence, r.name))
        other = owners[0].name
        raise refuse(f"{covered[0]} (rule {rule.name}) and {leftover[0]} (rule {other}) "
                      "cannot be combined in one container; ask for one protocol per "
                      "container", container=name, resource=f"{covered[0]}, {leftover[0]}",
                      rule=rule.name, name_rule=False)
    amounts = activation["r"]
    if not any(amounts.get(n, amounts.get(f"{rule.pattern}*")) for n in covered
               if rules.asks_for_devices(n)):
        # Only zero amounts of what asks for cards (a hint such as a priority does not; a
        # resource that triggers another rule does, such as nvidia.com/gpu: 1 beside a zero
        # nvidia.com/gpucores): nothing to allocate, the container stays as it is.
        return Skipped("zero", rule.name)
    if context.extended and _defer(name, covered=covered, rule=rule,
                                   extended=context.extended, warnings=warnings, uses=uses):
        return Skipped("deferred", rule.name)
    subject = Subject(rule=rule, container=name, resources=tuple(covered))
    for index, (variable, expression) in enumerate(rule.variables):
        activation[variable] = evaluate(subject, f"variables[{index}]", expression, activation)
    flags = evaluate_all(subject, rule.refusal_batch, [
        *((f"refuse[{i}].when", e) for i, (e, _) in enumerate(rule.refusals)),
        *((f"warn[{i}].when", e) for i, (e, _) in enumerate(rule.warnings))], activation)
    refusals = len(rule.refusals)
    for flag, (_, message) in zip(flags[:refusals], rule.refusals, strict=True):
        if flag is True:
            raise subject.refuse(message)
    own_warnings = [f"container {quote(name)}: {message} (rule {rule.name})"
                    for flag, (_, message) in zip(flags[refusals:], rule.warnings, strict=True)
                    if flag is True]
    outputs = checked_outputs(subject, activation)
    # The namespace's shares are MIG instances (a GPUSharingPolicy's shares.servedBy): the
    # rule's selectors name the instance's card, and `migshares` offers the profiles.
    is_share = rule.class_name == names.GPU_CLASS and bool(
        outputs.memory or outputs.percent or outputs.cores)
    mig = context.mig_shares and is_share
    items = [""] if mig else _alternatives(subject, activation)
    alternatives = []  # per item: (its name, the selectors rendered, each with its rule index)
    conditions: list[Any] = []
    for item in items:
        activation["item"] = item
        these = evaluate_all(subject, rule.condition_batch, [
            *((f"device.selectors[{i}].when", sel.when) for i, sel in enumerate(rule.selectors)),
            *((f"device.constraints[{i}].when", con) for i, (_, con) in
              enumerate(rule.constraints))], activation)
        conditions = conditions or these  # constraints: as the first alternative has them
        rendered = rendered_selectors(subject, these[:len(rule.selectors)], activation,
                                      renamed=migshares.CARD_ATTRIBUTES if mig else None)
        selectors = [text for _, text in rendered]
        if is_share and not mig and outputs.enforcement == "hami-core":
            # A share HAMi-core enforces needs the library on the card's node.
            selectors.append(hami_core_selector(rule.driver))
        alternatives.append((item, rendered, exactly(rule, outputs, selectors)))
    chosen_selectors = alternatives[0][1]
    request: dict[str, Any] = {"name": name}
    if mig:
        share = migshares.Share(memory=outputs.memory, percent=outputs.percent,
                                cores=outputs.cores)
        request = migshares.request(name, count=outputs.count, share=share, selectors=[
            text for _, text in chosen_selectors], driver=rule.driver)
        # The instance is the share: nothing left to enforce in the container.
        outputs = replace(outputs, memory=0, percent=0, cores=0, enforcement="none")
    elif len(alternatives) == 1:
        request["exactly"] = alternatives[0][2]
    else:
        request["firstAvailable"] = [{"name": sub, **spec} for sub, spec in zip(
            subrequest_names([item for item, _, _ in alternatives]),
            (spec for _, _, spec in alternatives), strict=True)]

    config = gateway_config(subject, outputs, own_warnings) if rule.gateway_class else None
    constraints = []
    if outputs.count > 1:
        for (attribute, _), holds in zip(rule.constraints, conditions[len(rule.selectors):],
                                         strict=True):
            if holds is True:
                qualified = attribute if "/" in attribute else f"{rule.driver}/{attribute}"
                constraints.append({"requests": [name], "matchAttribute": qualified})
    pattern_key = f"{rule.pattern}*"
    return ContainerPlan(rule=rule.name, request=request, config=config,
                          constraints=tuple(constraints), gated=rule.gated,
                          warnings=tuple(own_warnings),
                          amounts=tuple((n, amounts[n] if n in rule.exact else amounts[pattern_key])
                                        for n in covered),
                          selector_rules=tuple(index for index, _ in chosen_selectors))


_NO_RULE: Final = Skipped("no-rule")


def _alternatives(subject: Subject, activation: dict[str, Any]) -> list[str]:
    """The items of the rule's `device.firstAvailable` (one alternative each), or [""]."""
    rule = subject.rule
    if rule.first_available is None:
        return [""]
    items = evaluate(subject, "device.firstAvailable", rule.first_available, activation)
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise subject.refuse(f"device.firstAvailable gave {items!r}, not a list of strings")
    if len(items) > MAX_SUBREQUESTS:
        raise subject.refuse(
            f"device.firstAvailable gave {len(items)} alternatives; a DRA request offers at "
            f"most {MAX_SUBREQUESTS}: the rule must offer fewer")
    return items or [""]


def _choose_rule(found: Found, ordered: list[str], *, context: PodContext,
                 rules: RuleSet) -> tuple[CompiledRule, dict[str, Any]] | None:
    """The rule that translates the container, by precedence, with the activation it sees:
    the first whose trigger the container asks for and whose match conditions hold."""
    for rule in rules.by_precedence(ordered):
        mine = [n for n in ordered if rule.claims(n)]
        if not any(rule.triggered_by(n) for n in mine):
            continue
        if not _conditions_hold(rule, context.annotations, context.node_selector):
            continue
        subject = Subject(rule=rule, container=found.name, resources=tuple(mine))
        # match.when decides first, on the amounts that are good (a bad one reads 0): a bad
        # amount is refused by a rule that applies, never by one whose conditions fail.
        problems: list[tuple[str, str]] = []
        activation = _activation(subject, found=found, context=context, problems=problems)
        if rule.when is not None and evaluate(subject, "match.when", rule.when,
                                               activation) is not True:
            continue
        if problems:
            raise _bad_amounts(subject, problems)
        return rule, activation
    return None


def asks_for_devices_here(resource: str, *, found: Found, context: PodContext,
                         rules: RuleSet) -> bool:
    """Whether `resource` asks for devices in this container of this pod: it triggers an
    enabled rule whose conditions hold (`RuleSet.asks_for_devices` without the pod: a rule
    that needs a node label the pod does not select translates nothing here)."""
    return any(rule.triggered_by(resource) and _applies(rule, found, context)
               for rule in rules.rules_for(resource))


def _applies(rule: CompiledRule, found: Found, context: PodContext) -> bool:
    """Whether `rule`'s match conditions (annotations, nodeSelector, match.when on the
    container's good amounts) hold for the container; an expression that fails is false."""
    if not _conditions_hold(rule, context.annotations, context.node_selector):
        return False
    if rule.when is None:
        return True
    mine = tuple(n for n in sorted({*found.in_limits, *found.in_requests}) if rule.claims(n))
    subject = Subject(rule=rule, container=found.name, resources=mine)
    try:
        activation = _activation(subject, found=found, context=context, problems=[])
        return rule.when.evaluate(activation) is True
    except (CelError, Refused):
        return False


def _defer(container: str, *, covered: list[str], rule: CompiledRule,
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
        f"container {quote(container)}: {', '.join(covered)} left to kube-scheduler: DeviceClass "
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


def _activation(subject: Subject, *, found: Found, context: PodContext,
                problems: list[tuple[str, str]] | None = None) -> dict[str, Any]:
    """The variables a rule's expressions see for one container (`BASE_VARIABLES`). A bad
    amount is refused, or, given `problems`, added there and read as 0."""
    rule, container = subject.rule, subject.container
    resources = found.container["resources"]
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    r = dict.fromkeys(rule.exact, 0)
    wildcard = ""
    pattern_names = []
    own_problems: list[tuple[str, str]] = []
    for resource in subject.resources:
        try:
            scaled = _scaled_value(resource, subject=subject, limit=limits.get(resource),
                                   request=requests.get(resource),
                                   factor=rule.exact.get(resource, rule.pattern_factor))
        except _BadAmount as bad:
            # Every bad amount of the container is said at once, not only the first.
            own_problems.append((resource, str(bad)))
            continue
        if resource in rule.exact:
            r[resource] = scaled
        else:
            pattern_names.append(resource)
            r[f"{rule.pattern}*"] = scaled
            wildcard = resource[len(rule.pattern or ""):]
    if own_problems and problems is None:
        raise _bad_amounts(subject, own_problems)
    if problems is not None:
        problems.extend(own_problems)
    if rule.pattern is not None:
        r.setdefault(f"{rule.pattern}*", 0)
    if len(pattern_names) > 1:
        raise refuse(f"{' and '.join(pattern_names)} cannot be combined in one container; "
                      "one container asks for one kind", container=container,
                      resource=", ".join(pattern_names), rule=rule.name)
    annotations, node_selector = context.annotations, context.node_selector
    keys = rule.annotations + tuple(rule.match_annotations)
    kind = "sidecar" if is_sidecar(found.key, found.container) else (
        "initContainer" if found.key == "initContainers" else "container")
    return {
        "r": r,
        "container": {"name": container, "kind": kind},
        "annotations": {k: annotations[k] for k in keys if k in annotations},
        "nodeSelector": {k: node_selector[k] for k in rule.node_selector + tuple(
            rule.match_node_selector) if k in node_selector},
        "namespace": context.namespace,
        "wildcard": wildcard,
        "item": "",
    }


def _bad_amounts(subject: Subject, problems: list[tuple[str, str]]) -> Refused:
    return refuse(_together([problem for _, problem in problems]), container=subject.container,
                  resource=", ".join(resource for resource, _ in problems),
                  rule=subject.rule.name)


def _together(problems: list[str]) -> str:
    """Problems of one container as one refusal's text, counted when there are several."""
    return problems[0] if len(problems) == 1 else (
        f"{len(problems)} problems: " + "; ".join(problems))

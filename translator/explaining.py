"""Explaining a translation: per container, which rule fired (or why none did), what each legacy
key became, and what stays in the container and why.

`explain(pod, rules, plan=...)` reads the plan `translate` made for the pod: what each container
became, by which rule, is the plan's own record (`ContainerTranslation`), so the explanation
cannot disagree with what `/mutate` and `dra-gateway translate` do, and nothing is translated
again. What a key became is read from the rule's expressions: an output (count, memory, a
selector...) depends on a key when its expression, or a rule variable it uses, names the key.
For `dra-gateway translate --explain`, `migrate plan` and audit mode's warnings. Pure: no I/O,
and the pod is not modified. Saying it in words is `wording`'s.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final, Literal

from dra_gateway.gpu.groups import describe as describe_group
from dra_gateway.kube import names
from dra_gateway.kube.cel import Expression
from dra_gateway.kube.quantity import Quantity
from dra_gateway.translator.compiling import DEVICE_OUTPUTS
from dra_gateway.translator.containers import (
    ContainerPlan,
    Found,
    PodContext,
    Skipped,
    is_sidecar,
)
from dra_gateway.translator.documents import UNITS
from dra_gateway.translator.errors import Refusal, quote
from dra_gateway.translator.extended import ExtendedResourceUse
from dra_gateway.translator.pods import node_labels
from dra_gateway.translator.rules import CompiledRule, RuleSet
from dra_gateway.translator.shapes import ContainerTranslation
from dra_gateway.translator.translate import TranslationPlan

__all__ = [
    "ContainerExplanation",
    "ContainerOutcome",
    "KeyUse",
    "Left",
    "PodExplanation",
    "PodOutcome",
    "bytes_text",
    "explain",
]

# What became of a container, and of the pod.
ContainerOutcome = Literal["translated", "shares-request", "no-rule", "zero", "deferred",
                           "refused", "no-gpu", "translated-before"]
PodOutcome = Literal["translated", "unchanged", "refused", "translated-before"]

_UNIT_NAMES: Final = {factor: unit for unit, factor in UNITS.items() if unit}
_RESOURCE_REF: Final = re.compile(r"""\br\s*\[\s*(["'])(.*?)\1\s*\]""")
_KEY_REF: Final = {
    "annotation": re.compile(r"""\bannotations\s*\[\s*(["'])(.*?)\1\s*\]"""
                             r"""|(["'])([^"']*)\3\s+in\s+annotations\b"""),
    "nodeSelector": re.compile(r"""\bnodeSelector\s*\[\s*(["'])(.*?)\1\s*\]"""
                               r"""|(["'])([^"']*)\3\s+in\s+nodeSelector\b"""),
}
_WORD: Final = re.compile(r"\b[A-Za-z_][A-Za-z0-9_]*\b")
_STRING: Final = re.compile(r""""(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*'""")


@dataclass(frozen=True, slots=True)
class KeyUse:
    """A legacy resource, pod annotation or nodeSelector key the rule read, and what it became."""

    key: str
    kind: Literal["resource", "annotation", "nodeSelector"]
    value: str  # as the pod writes it (a resource's limit, else its request)
    amount: int | None  # a resource's value times its unit
    unit: str  # the rule's unit for a resource ("" for a plain number)
    became: tuple[str, ...]  # the parts of the claim it sets; empty when nothing depends on it


@dataclass(frozen=True, slots=True)
class Left:
    """A resource that stays in the container, and why."""

    resource: str
    reason: str


@dataclass(frozen=True, slots=True)
class ContainerExplanation:
    name: str
    kind: str  # container, initContainer or sidecar
    outcome: ContainerOutcome
    why: str = ""  # how the container came to this outcome, in words
    rule: str = ""
    source: str = ""  # where the rule was loaded from
    request: str = ""  # the template request the container uses
    # The request's `exactly`; for alternatives (firstAvailable), the first, without its name.
    device: Mapping[str, Any] | None = None
    alternatives: tuple[str, ...] = ()  # the names of the alternatives, in order (if any)
    config: Mapping[str, Any] | None = None  # its GpuShareConfig parameters
    constraints: tuple[Mapping[str, Any], ...] = ()
    keys: tuple[KeyUse, ...] = ()
    left: tuple[Left, ...] = ()
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class PodExplanation:
    outcome: PodOutcome
    template: str = ""  # the ResourceClaimTemplate's name
    gated: bool = False  # whether the patch adds the scheduling gate
    refusal: str = ""
    group: str = ""  # the pod group it belongs to and why (gpu.groups.describe), if any
    containers: tuple[ContainerExplanation, ...] = ()
    warnings: tuple[str, ...] = ()  # every warning of the plan, as the webhook returns them

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with the field names of these classes; unset parts left out."""
        out = asdict(self)
        for container in out["containers"]:
            container["keys"] = [{k: v for k, v in key.items() if v is not None}
                                 for key in container["keys"]]
            for name in ("device", "config"):
                if container[name] is None:
                    del container[name]
        return out


MIG_SHARES_WHY: Final = (
    "the namespace's GPU sharing policies serve shares with MIG instances (shares.servedBy: "
    "MIG): the share became the smallest MIG instances that hold it")


def explain(pod: Mapping[str, Any], rules: RuleSet, *,
            plan: TranslationPlan) -> PodExplanation:
    """How `plan` (what `translate(pod, rules, ...)` gave) came about."""
    metadata = pod.get("metadata") or {}
    annotations = metadata.get("annotations") or {}
    spec = pod.get("spec") or {}
    if plan.translated_before:
        containers = tuple(
            ContainerExplanation(
                name=str(c.get("name", "")), kind=_kind(key, c), outcome="translated-before",
                why=f"the pod carries {names.ANNOTATION_TRANSLATED}: it was translated before "
                    "and is not translated again",
                left=tuple(Left(r, "translated before") for r in _resource_names(c)))
            for key, _, c in _containers(spec))
        return PodExplanation(outcome="translated-before", gated=plan.adds_gate,
                              containers=containers, group=describe_group(pod) or "",
                              warnings=tuple(plan.warnings))

    refusal = plan.refusal
    context = PodContext(annotations=annotations, node_selector=node_labels(spec),
                         namespace=metadata.get("namespace") or "", extended=None,
                         mig_shares=plan.mig_shares)
    untranslated = {(u.container, u.resource): f"only rule {u.rule} reads it, and it is "
                    "disabled (the warning says how to enable it)" for u in plan.untranslated}
    # A name that looks like a typo is explained as its warning says it (one home: typos.py).
    untranslated.update({(u.container, u.resource): u.reason for u in plan.unknown})
    out = []
    for key, index, container in _containers(spec):
        out.append(_container(key, index, container, rules=rules, context=context,
                              translation=plan.containers.get((key, index)),
                              refusal=refusal, untranslated=untranslated))
    template = plan.templates[0]["metadata"]["name"] if plan.templates else ""
    outcome: PodOutcome = (
        "refused" if refusal is not None else "translated" if plan.patch and template
        else "unchanged")
    return PodExplanation(outcome=outcome, template=template, gated=plan.adds_gate,
                          refusal=refusal.message if refusal is not None else "",
                          group=describe_group(pod) or "",
                          containers=tuple(out), warnings=tuple(plan.warnings))


def _container(key: str, index: int, container: Mapping[str, Any], *, rules: RuleSet,
               context: PodContext, translation: ContainerTranslation | None,
               refusal: Refusal | None, untranslated: Mapping[tuple[str, str], str]
               ) -> ContainerExplanation:
    name = str(container.get("name", ""))
    kind = _kind(key, container)
    resources = container.get("resources") or {}
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    in_limits = tuple(n for n in limits if rules.is_legacy(n))
    in_requests = tuple(n for n in requests if rules.is_legacy(n))

    def left(removed: Sequence[str], legacy_reason: str) -> tuple[Left, ...]:
        out = []
        for resource in _resource_names(container):
            if resource in removed:
                continue
            reason = untranslated.get((name, resource))
            if reason is None:
                reason = legacy_reason if rules.is_legacy(resource) else \
                    "not a GPU resource any enabled rule reads"
            out.append(Left(resource, reason))
        return tuple(out)

    if translation is None:
        disabled = [r for r in _resource_names(container) if (name, r) in untranslated
                    and rules.disabled_rule(r) is not None]
        why = ("asks for no GPU resource an enabled rule reads" if not disabled else
               f"{', '.join(disabled)} only disabled rules read")
        return ContainerExplanation(name=name, kind=kind, outcome="no-gpu", why=why,
                                    left=left((), ""))

    found = Found(key, index, container, in_limits, in_requests)
    result = translation.result
    if isinstance(result, Refusal):
        return ContainerExplanation(name=name, kind=kind, outcome="refused",
                                    why=result.message, rule=result.rule,
                                    left=left((), "the pod is refused"))
    if refusal is not None:
        why = (refusal.message if refusal.container == name else
               f"the pod is refused (container {quote(refusal.container)}), so nothing of it "
               "is translated")
        return ContainerExplanation(name=name, kind=kind, outcome="refused", why=why,
                                    rule=result.rule, left=left((), "the pod is refused"))
    if isinstance(result, Skipped):
        return _skipped(found, result, rules=rules, context=context,
                        uses=translation.extended, warnings=translation.warnings, left=left)

    rule = rules.rule(result.rule)
    # Alternatives (firstAvailable) are explained by the first, which the rule prefers.
    subrequests: list[dict[str, Any]] = result.request.get("firstAvailable") or []
    exactly = result.request.get("exactly") or {
        k: v for k, v in subrequests[0].items() if k != "name"}
    parameters = result.config["opaque"]["parameters"] if result.config else None
    request = translation.request if translation.request is not None else name
    outcome: ContainerOutcome = "translated" if request == name else "shares-request"
    why = ("" if outcome == "translated" else
           f"container {quote(request)}'s request covers this init container's, so it uses "
           "that request (the scheduler counts the larger of the two)")
    mig = context.mig_shares and rule.class_name == names.GPU_CLASS and \
        exactly.get("deviceClassName") == names.MIG_CLASS
    if mig:
        why = " ".join(filter(None, (why, MIG_SHARES_WHY)))
    keys = _key_uses(rule, result, found=found, context=context, exactly=exactly,
                     parameters=parameters, mig=mig)
    covered = [n for n in (*in_limits, *in_requests) if rule.claims(n)]
    return ContainerExplanation(
        name=name, kind=kind, outcome=outcome, why=why, rule=rule.name, source=rule.source,
        request=request, device=exactly, alternatives=tuple(s["name"] for s in subrequests),
        config=parameters, constraints=result.constraints,
        keys=keys, left=left(covered, ""), warnings=result.warnings)


def _skipped(found: Found, skipped: Skipped, *, rules: RuleSet, context: PodContext,
             uses: Sequence[ExtendedResourceUse], warnings: Sequence[str],
             left: Any) -> ContainerExplanation:
    name = found.name
    kind = _kind(found.key, found.container)
    if skipped.reason == "deferred":
        use = uses[0]
        why = (f"left to kube-scheduler: DeviceClass {use.device_class} declares "
               f"{use.resource} (spec.extendedResourceName); extendedResourceNames: translate "
               f"on rule {use.rule} would translate it")
        reason = (f"DeviceClass {use.device_class} declares {use.resource}: kube-scheduler "
                  "serves the container")
        return ContainerExplanation(name=name, kind=kind, outcome="deferred", why=why,
                                    rule=skipped.rule, left=left((), reason),
                                    warnings=tuple(warnings))
    if skipped.reason == "zero":
        why = "asks only for zero amounts: nothing to allocate"
        return ContainerExplanation(name=name, kind=kind, outcome="zero", why=why,
                                    rule=skipped.rule, left=left((), "a zero amount"))
    legacy = sorted({*found.in_limits, *found.in_requests})
    reasons = list(_why_no_rule(legacy, rules=rules, context=context))
    why = "no enabled rule applies: " + "; ".join(reasons)
    return ContainerExplanation(name=name, kind=kind, outcome="no-rule", why=why,
                                left=left((), "no enabled rule applies"),
                                warnings=tuple(warnings))


def _why_no_rule(legacy: list[str], *, rules: RuleSet, context: PodContext) -> Iterator[str]:
    """For each enabled rule reading one of `legacy`, in the order the translator tried them,
    why it did not fire."""
    for rule in rules.by_precedence(legacy):
        mine = [n for n in legacy if rule.claims(n)]
        if not any(rule.triggered_by(n) for n in mine):
            triggers = sorted(rule.triggers) or [f"{rule.pattern}*"]
            yield (f"rule {rule.name} reads {', '.join(mine)} but applies only to a container "
                   f"asking for {' or '.join(triggers)}")
            continue
        wanted = [*((f"annotation {k}", v, context.annotations)
                    for k, v in rule.match_annotations.items()),
                  *((f"nodeSelector {k}", v, context.node_selector)
                    for k, v in rule.match_node_selector.items())]
        missing = [f"{label}: {value}" if value is not None else label
                   for label, value, actual in wanted
                   if label.split(" ", 1)[1] not in actual or (
                       value is not None and actual[label.split(" ", 1)[1]] != value)]
        if missing:
            yield f"rule {rule.name} needs {', '.join(missing)}"
        elif rule.when is not None:
            yield f"rule {rule.name}: its match.when is false for this container"


def _key_uses(rule: CompiledRule, result: ContainerPlan, *, found: Found, context: PodContext,
              exactly: Mapping[str, Any], parameters: Mapping[str, Any] | None,
              mig: bool = False) -> tuple[KeyUse, ...]:
    depends = _dependencies(rule)
    rendered = _rendered_outputs(rule, result, exactly=exactly, parameters=parameters, mig=mig)
    resources = found.container["resources"]
    limits = resources.get("limits") or {}
    requests = resources.get("requests") or {}
    pattern_token = f"resource:{rule.pattern}*"

    def became(token: str) -> tuple[str, ...]:
        return tuple(text for output, text in rendered
                     if token in depends.get(output, ()) or (
                         token.startswith("resource:") and rule.pattern is not None
                         and token[len("resource:"):].startswith(rule.pattern)
                         and pattern_token in depends.get(output, ())))

    out = []
    for resource, amount in result.amounts:
        value = limits.get(resource, requests.get(resource))
        factor = rule.exact.get(resource, rule.pattern_factor)
        out.append(KeyUse(key=resource, kind="resource", value=str(value), amount=amount,
                          unit=_UNIT_NAMES.get(factor, ""), became=became(f"resource:{resource}")))
    for kind, wanted, actual in (
            ("annotation", (*rule.annotations, *rule.match_annotations), context.annotations),
            ("nodeSelector", (*rule.node_selector, *rule.match_node_selector),
             context.node_selector)):
        for key in dict.fromkeys(wanted):
            if key not in actual:
                continue
            uses = became(f"{kind}:{key}")
            matched = rule.match_annotations if kind == "annotation" else \
                rule.match_node_selector
            if key in matched:
                uses = (f"chose rule {rule.name} (match.{kind}s)", *uses)
            out.append(KeyUse(key=key, kind=kind,  # type: ignore[arg-type]
                              value=str(actual[key]), amount=None, unit="", became=uses))
    return tuple(out)


def _text_of(expression: Expression | None) -> str | None:
    """The CEL text of an expression a rule may leave out."""
    return expression.expression if expression else None


def _dependencies(rule: CompiledRule) -> dict[str, frozenset[str]]:
    """Per output of the rule, the keys (`resource:`, `annotation:`, `nodeSelector:`) its
    expressions name, directly or through the rule's variables."""
    variables: dict[str, frozenset[str]] = {}

    def refs(text: str | None) -> frozenset[str]:
        if not text:
            return frozenset()
        found = {f"resource:{m.group(2)}" for m in _RESOURCE_REF.finditer(text)}
        for kind, pattern in _KEY_REF.items():
            found.update(f"{kind}:{m.group(2) if m.group(2) is not None else m.group(4)}"
                         for m in pattern.finditer(text))
        # Variable names inside string literals ("hami-core" holds `core`) are no references.
        for word in _WORD.findall(_STRING.sub('""', text)):
            if word in variables:
                found |= variables[word]
            elif word == "wildcard" and rule.pattern is not None:
                found.add(f"resource:{rule.pattern}*")
        return frozenset(found)

    for name, expression in rule.variables:
        variables[name] = refs(expression.expression)
    out = {output.key: refs(_text_of(getattr(rule, output.attribute)))
           for output in DEVICE_OUTPUTS}
    for index, selector in enumerate(rule.selectors):
        out[f"selectors[{index}]"] = refs(selector.cel) | refs(_text_of(selector.values)) | \
            refs(_text_of(selector.when))
    for index, (_, condition) in enumerate(rule.constraints):
        out[f"constraints[{index}]"] = refs(_text_of(condition))
    return out


def _rendered_outputs(rule: CompiledRule, result: ContainerPlan, *,
                      exactly: Mapping[str, Any], parameters: Mapping[str, Any] | None,
                      mig: bool = False) -> list[tuple[str, str]]:
    """(output, what it set in the claim) for each output that set something; `mig`: the
    share became MIG instances (`migshares`), which its amounts choose."""
    capacity = (exactly.get("capacity") or {}).get("requests") or {}
    params = parameters or {}
    out = [("count", f"count {exactly['count']}")]
    if mig:
        out += [(output, "the MIG profiles offered") for output in ("memory", "memoryPercent",
                                                                     "cores")]
    if names.CAPACITY_MEMORY in capacity and "memory" in params:
        out.append(("memory", f"capacity memory {capacity[names.CAPACITY_MEMORY]}"))
    if "memory" in params:
        out.append(("memory", f"config memory {bytes_text(params['memory'])}"))
    if "memoryPercent" in params:
        out.append(("memoryPercent", f"config memoryPercent {params['memoryPercent']}"))
    if "cores" in params:
        out.append(("cores", f"capacity cores {capacity.get(names.CAPACITY_CORES)}"))
        out.append(("cores", f"config cores {params['cores']}"))
    if not mig and parameters is not None and "memory" not in params \
            and "memoryPercent" not in params and "cores" not in params:
        for output in ("memoryPercent", "cores"):
            out.append((output, "a whole card"))
    if "enforcement" in params:
        out.append(("enforcement", f"config enforcement {params['enforcement']}"))
    if "policy" in params:
        out.append(("policy", f"config policy {params['policy']}"))
    for position, index in enumerate(result.selector_rules):
        out.append((f"selectors[{index}]", f"selector {position + 1}"))
    attributes = {c["matchAttribute"] for c in result.constraints}
    for index, (attribute, _) in enumerate(rule.constraints):
        if f"{rule.driver}/{attribute}" in attributes:
            out.append((f"constraints[{index}]", f"constraint matchAttribute "
                        f"{rule.driver}/{attribute}"))
    return out


def bytes_text(value: Any) -> str:
    """An amount of bytes as a Kubernetes quantity (other values as they are)."""
    return str(Quantity.from_bytes(value)) if isinstance(value, int) else str(value)


def _containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, int, Mapping[str, Any]]]:
    for key in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(key) or ()):
            yield key, index, container


def _kind(key: str, container: Mapping[str, Any]) -> str:
    if key == "containers":
        return "container"
    return "sidecar" if is_sidecar(key, container) else "initContainer"


def _resource_names(container: Mapping[str, Any]) -> list[str]:
    resources = container.get("resources") or {}
    return list(dict.fromkeys((*(resources.get("limits") or {}),
                               *(resources.get("requests") or {}))))

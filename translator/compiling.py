"""Compiling one rule: CEL programs, the class and driver it targets, and a dry run at load.

`compile_rule` turns a validated `RuleSpec` (with any overrides applied, as a `RuleEntry`) into
a `CompiledRule`, batching its expressions and evaluating each on representative inputs so that
a typo fails at load, not at admission; `check_overlaps` refuses two rules reading one resource
with no precedence between them. Problems go to a `Problems` collector with their field path.
The fields of `device` that a rule computes are declared once (`DEVICE_OUTPUTS`, of which
`SHARE_FIELDS` are the card's shares): the share checks, compiling, the dry run and the output
batch read that declaration here, and so do `evaluation.checked_outputs` (the batch's values
checked) and `explaining` (what each output depends on). It must not read files or sources
(`loading.py` does) nor translate pods.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dra_gateway.kube import names
from dra_gateway.kube.api_rules import QUALIFIED_NAME_RE
from dra_gateway.kube.cel import CelError, Expression, compile_expression, compile_selector
from dra_gateway.kube.models import ENFORCEMENTS, STRATEGIES
from dra_gateway.translator.documents import (
    NAME_RE,
    UNITS,
    ExtendedResourceNames,
    RuleSpec,
)
from dra_gateway.translator.errors import Problems
from dra_gateway.translator.ruleset import CompiledRule, CompiledSelector
from dra_gateway.translator.selectors import render_selector, selector_values


@dataclass
class RuleEntry:
    spec: RuleSpec
    source: str
    path: str
    enabled: bool
    precedence: int | None
    class_name: str
    units: dict[str, str]
    order: int
    extended_resource_names: ExtendedResourceNames = "defer"


def _default_driver(class_name: str) -> str:
    if class_name in names.GATEWAY_CLASSES:
        return names.DRIVER
    if class_name == names.NVIDIA_MIG_CLASS:
        return names.NVIDIA_GPU_CLASS
    return class_name


@dataclass(frozen=True, slots=True)
class DeviceOutput:
    """A field of a rule's `device` that a CEL expression computes, declared once for every
    use: the check that shares need a gateway class, compiling, the dry run, the batch, the
    checks of its values at translation and the explanation.

    `key` is its name in the document (and in a problem's path, `device.<key>`), `attribute`
    its name on `DeviceSpec` and `CompiledRule`, `gives` the type its value must have; `unset`
    stands for it in the output batch when the rule leaves it out.
    `moot_elsewhere`: how the gateway enforces or places, which an override that moves the rule
    to another driver's class drops instead of refusing."""

    key: str
    attribute: str
    gives: type
    unset: str
    moot_elsewhere: bool = False


_COUNT: Final = DeviceOutput("count", "count", int, "1")  # never unset: the document's default
# The shares of a card: only a gateway class takes them.
SHARE_FIELDS: Final = (
    DeviceOutput("memory", "memory", int, "0"),
    DeviceOutput("memoryPercent", "memory_percent", int, "0"),
    DeviceOutput("cores", "cores", int, "0"),
    DeviceOutput("enforcement", "enforcement", str, '""', moot_elsewhere=True),
    DeviceOutput("policy", "policy", str, '""', moot_elsewhere=True),
)
# Every output, in the order of the output batch, which `evaluation.checked_outputs` reads.
DEVICE_OUTPUTS: Final = (_COUNT, *SHARE_FIELDS)


@dataclass(frozen=True, slots=True)
class _Reporter:
    """Problems of one rule, each at its field path under the rule's."""

    problems: Problems
    source: str
    base: str

    def fail(self, path: str, message: str) -> None:
        self.problems.add(self.source, f"{self.base}.{path}", message)

    def expression(self, path: str, text: str, sample: Mapping[str, Any]) -> Expression | None:
        """`text` compiled (and dry-run on `sample`), None once its problem is reported."""
        try:
            return compile_expression(text, variables=sample, what="")
        except CelError as exc:
            self.fail(path, str(exc))
            return None


@dataclass(frozen=True, slots=True)
class _Target:
    """The class a rule's devices come from, and who allocates them."""

    spec: RuleSpec  # without the fields an override moved to another driver's class made moot
    class_name: str
    gateway_class: bool
    gated: bool  # the gateway's allocator serves it


@dataclass(frozen=True, slots=True)
class _Reads:
    """The resources a rule reads (with the factor of each one's unit) and those that trigger
    it."""

    exact: dict[str, int]
    pattern: str | None
    pattern_factor: int
    triggers: list[str]


@dataclass(frozen=True, slots=True)
class _Programs:
    """A rule's expressions, compiled; None where one failed (its problem is reported)."""

    when: Expression | None
    variables: tuple[tuple[str, Expression], ...]
    refusals: tuple[tuple[Expression, str], ...]
    warnings: tuple[tuple[Expression, str], ...]
    count: Expression | None
    shares: dict[str, Expression | None]  # by CompiledRule attribute
    selectors: tuple[CompiledSelector, ...]
    constraints: tuple[tuple[str, Expression | None], ...]
    first_available: Expression | None = None


def compile_rule(entry: RuleEntry, problems: Problems) -> CompiledRule | None:
    """The rule compiled, batched and dry-run; None when it has problems (all reported)."""
    errors_before = len(problems.errors)
    report = _Reporter(problems, entry.source, entry.path)
    target = _target(entry, report)
    reads = _reads(target.spec, entry, report)
    # compile_expression dry-runs on this sample; rule variables get their sample values as
    # they compile, so that later expressions see them.
    sample = _sample_activation(reads.exact, reads.pattern, target.spec, value=1, text=None)
    programs = _programs(target.spec, sample, report)
    if len(problems.errors) > errors_before or programs.count is None:
        return None
    rule = _compiled(entry, target, reads, programs)
    _dry_run(rule, entry, problems)
    if len(problems.errors) > errors_before:
        return None
    return _batched(rule, target.spec, sample)


def _target(entry: RuleEntry, report: _Reporter) -> _Target:
    """The rule's class checked, and the allocator and shares it allows."""
    spec, class_name = entry.spec, entry.class_name
    device = spec.device
    if not class_name:
        report.fail("device.className", "required for an enabled rule: name the DeviceClass "
                    "that serves these devices")
    elif not NAME_RE.match(class_name) or len(class_name) > 253:
        report.fail("device.className", f"{json.dumps(class_name)} is not a DeviceClass name")
    gateway_class = class_name in names.GATEWAY_CLASSES
    moot = {field.attribute: None for field in SHARE_FIELDS if field.moot_elsewhere}
    if not gateway_class and class_name != device.class_name and any(
            getattr(device, attribute) is not None for attribute in moot):
        # An override moved the rule to another driver's class (NVIDIA's, say): how the
        # gateway would enforce and place a card is moot there, and not an error of the rule.
        device = device.model_copy(update=moot)
        spec = spec.model_copy(update={"device": device})
    allocator = device.allocator or ("gateway" if gateway_class else "scheduler")
    if allocator == "gateway" and not gateway_class:
        report.fail("device.allocator", f"the gateway's allocator serves only "
                    f"{' and '.join(sorted(names.GATEWAY_CLASSES))}, not {class_name}; use "
                    "scheduler")
    if not gateway_class:
        for field in SHARE_FIELDS:
            if getattr(device, field.attribute) is not None:
                report.fail(f"device.{field.key}", f"shares need a gateway class "
                            f"({' or '.join(sorted(names.GATEWAY_CLASSES))}); {class_name} "
                            "takes whole devices")
    return _Target(spec, class_name, gateway_class, gated=allocator == "gateway")


def _reads(spec: RuleSpec, entry: RuleEntry, report: _Reporter) -> _Reads:
    """The rule's resources by name (or prefix) with their units' factors, and its triggers."""
    exact: dict[str, int] = {}
    pattern: str | None = None
    pattern_factor = 1
    for resource in spec.resources:
        factor = UNITS[entry.units[resource]]
        if resource.endswith("*"):
            pattern, pattern_factor = resource[:-1], factor
        else:
            exact[resource] = factor
    triggers = spec.match.resources if spec.match.resources is not None else list(spec.resources)
    for i, trigger in enumerate(triggers):
        if trigger not in spec.resources:
            report.fail(f"match.resources[{i}]",
                        f"{json.dumps(trigger)} is not one of the rule's resources")
    return _Reads(exact, pattern, pattern_factor, triggers)


def _programs(spec: RuleSpec, sample: dict[str, Any], report: _Reporter) -> _Programs:
    """Every expression of the rule compiled, in the order of the document; each variable's
    sample value is added to `sample` as it compiles."""
    device = spec.device

    def expr(path: str, text: str) -> Expression | None:
        return report.expression(path, text, sample)

    when = expr("match.when", spec.match.when) if spec.match.when else None
    variables = _variables(spec, sample, report)
    refusals = tuple((program, refusal.message) for i, refusal in enumerate(spec.refuse)
                     if (program := expr(f"refuse[{i}].when", refusal.when)) is not None)
    warnings = tuple((program, warning.message) for i, warning in enumerate(spec.warn)
                     if (program := expr(f"warn[{i}].when", warning.when)) is not None)
    count = expr("device.count", device.count)
    shares = {field.attribute: (expr(f"device.{field.key}", text) if text is not None else None)
              for field in SHARE_FIELDS
              for text in (getattr(device, field.attribute),)}
    first_available = (expr("device.firstAvailable", device.first_available)
                       if device.first_available is not None else None)
    return _Programs(when, variables, refusals, warnings, count, shares,
                     _selectors(spec, expr, report), _constraints(spec, expr, report),
                     first_available)


def _variables(spec: RuleSpec, sample: dict[str, Any],
               report: _Reporter) -> tuple[tuple[str, Expression], ...]:
    compiled: list[tuple[str, Expression]] = []
    for i, var in enumerate(spec.variables):
        program = report.expression(f"variables[{i}].expression", var.expression, sample)
        sample[var.name] = 0
        if program is not None:
            compiled.append((var.name, program))
            with contextlib.suppress(CelError):  # reported by the dry run
                sample[var.name] = program.evaluate(sample)
    return tuple(compiled)


def _selectors(spec: RuleSpec, expr: Callable[[str, str], Expression | None],
               report: _Reporter) -> tuple[CompiledSelector, ...]:
    selectors = []
    for i, sel in enumerate(spec.device.selectors):
        path = f"device.selectors[{i}]"
        if sel.cel is not None:
            try:
                compile_selector(sel.cel)
            except CelError as exc:
                report.fail(f"{path}.cel", str(exc))
        values = expr(f"{path}.values", sel.values) if sel.values else None
        when = expr(f"{path}.when", sel.when) if sel.when else None
        selectors.append(CompiledSelector(
            cel=sel.cel, attribute=sel.attribute or sel.capacity or "", op=sel.op,
            values=values, separator=sel.separator, when=when))
    return tuple(selectors)


def _constraints(spec: RuleSpec, expr: Callable[[str, str], Expression | None],
                 report: _Reporter) -> tuple[tuple[str, Expression | None], ...]:
    constraints = []
    for i, con in enumerate(spec.device.constraints):
        if not QUALIFIED_NAME_RE.match(con.match_attribute):
            report.fail(f"device.constraints[{i}].matchAttribute",
                        f"{json.dumps(con.match_attribute)} is not an attribute name (an "
                        "identifier, or domain/identifier such as resource.kubernetes.io/pcieRoot)")
        constraints.append((con.match_attribute,
                            expr(f"device.constraints[{i}].when", con.when) if con.when else None))
    return tuple(constraints)


def _compiled(entry: RuleEntry, target: _Target, reads: _Reads,
              programs: _Programs) -> CompiledRule:
    """The rule's parts put together (its count compiled: the caller checked)."""
    spec = target.spec
    assert programs.count is not None
    shares: dict[str, Any] = programs.shares
    return CompiledRule(
        name=spec.name, source=entry.source,
        precedence=entry.precedence if entry.precedence is not None else 0,
        class_name=target.class_name,
        driver=spec.device.driver or _default_driver(target.class_name),
        gateway_class=target.gateway_class, gated=target.gated, exact=reads.exact,
        pattern=reads.pattern, pattern_factor=reads.pattern_factor,
        triggers=frozenset(t for t in reads.triggers if not t.endswith("*")),
        trigger_pattern=any(t.endswith("*") for t in reads.triggers),
        annotations=tuple(spec.annotations), node_selector=tuple(spec.node_selector),
        match_annotations=dict(spec.match.annotations),
        match_node_selector=dict(spec.match.node_selector), when=programs.when,
        variables=programs.variables, refusals=programs.refusals, warnings=programs.warnings,
        count=programs.count, **shares, selectors=programs.selectors,
        constraints=programs.constraints, first_available=programs.first_available,
        extended_resource_names=entry.extended_resource_names,
        fractional=frozenset(name for name, res in spec.resources.items()
                             if res is not None and res.fractional),
        suffixed=frozenset(name for name, res in spec.resources.items()
                           if res is not None and res.suffixes))


def _batch_text(parts: Sequence[str]) -> str:
    return "[" + ", ".join(f"({part})" for part in parts) + "]"


def _batched(rule: CompiledRule, spec: RuleSpec, sample: dict[str, Any]) -> CompiledRule:
    """The rule with its batched expressions (each part already compiled and dry-run alone)."""
    device = spec.device
    outputs = [getattr(device, field.attribute) or field.unset for field in DEVICE_OUTPUTS]
    conditions = [sel.when or "true" for sel in device.selectors]
    conditions += [con.when or "true" for con in device.constraints]

    def batch(parts: Sequence[str]) -> Expression | None:
        if not parts:
            return None
        return compile_expression(_batch_text(parts), variables=sample,
                                  what=f"rule {spec.name}")

    return dataclasses.replace(
        rule, refusal_batch=batch([r.when for r in spec.refuse] + [w.when for w in spec.warn]),
        output_batch=batch(outputs), condition_batch=batch(conditions))


def _sample_activation(exact: Iterable[str], pattern: str | None, spec: RuleSpec, *,
                       value: int, text: str | None) -> dict[str, Any]:
    r = dict.fromkeys(exact, value)
    if pattern is not None:
        r[pattern + "*"] = value
    # Keys the rule's match requires are always there when it runs; the others are absent in
    # the first sample and present in the second.
    annotations = dict.fromkeys(spec.annotations, text) if text else {}
    annotations.update({k: v or "a" for k, v in spec.match.annotations.items()})
    node_selector = dict.fromkeys(spec.node_selector, text) if text else {}
    node_selector.update({k: v or "a" for k, v in spec.match.node_selector.items()})
    return {
        "r": r,
        "container": {"name": "main", "kind": "container"},
        "annotations": annotations,
        "nodeSelector": node_selector,
        "namespace": "default",
        "wildcard": "1g.5gb" if pattern is not None else "",
        "item": "",
    }


def _sample_activations(rule: CompiledRule, spec: RuleSpec) -> list[dict[str, Any]]:
    """Representative inputs for a dry run: nothing optional set, then everything set."""
    return [_sample_activation(rule.exact, rule.pattern, spec, value=value, text=text)
            for value, text in ((1, None), (2, "a"))]


def _text_free(activation: Mapping[str, Any]) -> bool:
    """Whether a sample carries no pod-provided text (a policy from pod text may be anything)."""
    return all(v != "a" for v in activation["annotations"].values()) and \
        all(v != "a" for v in activation["nodeSelector"].values())


def _dry_run(rule: CompiledRule, entry: RuleEntry, problems: Problems) -> None:
    """Evaluate every expression on representative inputs so that typos fail at load."""
    source, base = entry.source, entry.path
    reported: set[str] = set()

    def check(path: str, expression: Expression | None, activation: dict[str, Any],
              expected: tuple[type, ...] | None) -> Any:
        if expression is None or path in reported:
            return None
        try:
            value = expression.evaluate(activation)
        except CelError as exc:
            reported.add(path)
            problems.add(source, f"{base}.{path}", str(exc))
            return None
        if expected is not None and (not isinstance(value, expected) or
                                     (isinstance(value, bool) and bool not in expected)):
            reported.add(path)
            names_ = " or ".join(t.__name__ for t in expected)
            problems.add(source, f"{base}.{path}",
                         f"gives {type(value).__name__} {json.dumps(value, default=str)}, "
                         f"expected {names_}")
        return value

    for activation in _sample_activations(rule, entry.spec):
        check("match.when", rule.when, activation, (bool,))
        for i, (name, variable) in enumerate(rule.variables):
            activation[name] = check(f"variables[{i}].expression", variable, activation, None)
        for i, (refusal, _) in enumerate(rule.refusals):
            check(f"refuse[{i}].when", refusal, activation, (bool,))
        for i, (warning, _) in enumerate(rule.warnings):
            check(f"warn[{i}].when", warning, activation, (bool,))
        for field in DEVICE_OUTPUTS:
            key = field.key
            value = check(f"device.{key}", getattr(rule, field.attribute), activation,
                          (field.gives,))
            if key == "enforcement" and isinstance(value, str) and value not in ENFORCEMENTS:
                problems.add(source, f"{base}.device.enforcement",
                             f"gives {json.dumps(value)}; expected one of "
                             f"{', '.join(ENFORCEMENTS)}")
                reported.add("device.enforcement")
            if key == "policy" and isinstance(value, str) and value and (
                    value not in STRATEGIES and _text_free(activation)):
                problems.add(source, f"{base}.device.policy",
                             f"gives {json.dumps(value)}; expected one of "
                             f"{', '.join(STRATEGIES)} or \"\"")
                reported.add("device.policy")
        items = check("device.firstAvailable", rule.first_available, activation, (list,))
        if isinstance(items, list) and not all(isinstance(item, str) for item in items):
            problems.add(source, f"{base}.device.firstAvailable",
                         f"gives {json.dumps(items, default=str)}, expected a list of strings")
            reported.add("device.firstAvailable")
        elif isinstance(items, list) and items:
            activation["item"] = items[0]  # the selectors below render the first alternative
        for i, sel in enumerate(rule.selectors):
            path = f"device.selectors[{i}]"
            enabled = check(f"{path}.when", sel.when, activation, (bool,))
            if sel.when is not None and enabled is not True:
                continue
            values = check(f"{path}.values", sel.values, activation,
                           (int,) if sel.op == "atLeast" else (str, list))
            if sel.values is not None and values is not None and f"{path}.values" not in reported:
                rendered = render_selector(sel, rule.driver, selector_values(sel, values))
                if rendered is not None:
                    try:
                        compile_selector(rendered)
                    except CelError as exc:
                        reported.add(f"{path}.values")
                        problems.add(source, f"{base}.{path}", str(exc))
        for i, (_, condition) in enumerate(rule.constraints):
            check(f"device.constraints[{i}].when", condition, activation, (bool,))


def check_overlaps(rules: list[CompiledRule], entries: Mapping[str, RuleEntry],
                    problems: Problems) -> None:
    """Two enabled rules reading one resource need distinct precedences to say who wins.

    The conflict is reported at the rule loaded later (usually the administrator's), once,
    naming every rule it collides with.
    """
    clashes: dict[str, dict[str, list[str]]] = {}
    for i, first in enumerate(rules):
        for second in rules[i + 1:]:
            shared = sorted(set(first.exact) & set(second.exact))
            if not shared:
                for a, b in ((first, second), (second, first)):
                    if a.pattern is not None and (
                            any(n.startswith(a.pattern) for n in b.exact) or
                            (b.pattern is not None and b.pattern.startswith(a.pattern))):
                        shared = [a.pattern + "*"]
            if not shared:
                continue
            p1 = entries[first.name].precedence
            p2 = entries[second.name].precedence
            if p1 is not None and p2 is not None and p1 != p2:
                continue
            later, earlier = sorted((first, second), key=lambda r: -entries[r.name].order)
            clashes.setdefault(later.name, {}).setdefault(shared[0], []).append(earlier.name)
    for name, by_resource in sorted(clashes.items()):
        entry = entries[name]
        for resource, others in sorted(by_resource.items()):
            listed = " and ".join(f'"{o}"' for o in sorted(others))
            noun = "rule" if len(others) == 1 else "rules"
            problems.add(entry.source, f"{entry.path}.precedence",
                         f"rule \"{name}\" reads {resource} like {noun} {listed}, with no "
                         "precedence between them; give it a different precedence, reuse the "
                         "name to replace a rule, or disable one")

"""Compiling one rule: CEL programs, the class and driver it targets, and a dry run at load.

`compile_rule` turns a validated `RuleSpec` (with any overrides applied, as a `RuleEntry`) into
a `CompiledRule`, batching its expressions and evaluating each on representative inputs so that
a typo fails at load, not at admission; `check_overlaps` refuses two rules reading one resource
with no precedence between them. Problems go to a `Problems` collector with their field path.
It must not read files or sources (`loading.py` does) nor translate pods.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from dra_gateway.kube import names
from dra_gateway.kube.cel import CelError, Expression, compile_expression, compile_selector
from dra_gateway.kube.models import ENFORCEMENTS, STRATEGIES
from dra_gateway.translator.documents import (
    NAME_RE,
    QUALIFIED_NAME_RE,
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


def compile_rule(entry: RuleEntry, problems: Problems) -> CompiledRule | None:
    spec, source, base = entry.spec, entry.source, entry.path
    device = spec.device
    errors_before = len(problems.errors)

    def fail(path: str, message: str) -> None:
        problems.add(source, f"{base}.{path}", message)

    class_name = entry.class_name
    if not class_name:
        fail("device.className", "required for an enabled rule: name the DeviceClass that "
             "serves these devices")
    elif not NAME_RE.match(class_name) or len(class_name) > 253:
        fail("device.className", f"{json.dumps(class_name)} is not a DeviceClass name")
    gateway_class = class_name in names.GATEWAY_CLASSES
    if not gateway_class and class_name != device.class_name and (
            device.enforcement is not None or device.policy is not None):
        # An override moved the rule to another driver's class (NVIDIA's, say): how the
        # gateway would enforce and place a card is moot there, and not an error of the rule.
        device = device.model_copy(update={"enforcement": None, "policy": None})
        spec = spec.model_copy(update={"device": device})
    allocator = device.allocator or ("gateway" if gateway_class else "scheduler")
    if allocator == "gateway" and not gateway_class:
        fail("device.allocator", f"the gateway's allocator serves only "
             f"{' and '.join(sorted(names.GATEWAY_CLASSES))}, not {class_name}; use scheduler")
    if not gateway_class:
        for field_name, value in (("memory", device.memory),
                                  ("memoryPercent", device.memory_percent),
                                  ("cores", device.cores), ("enforcement", device.enforcement),
                                  ("policy", device.policy)):
            if value is not None:
                fail(f"device.{field_name}", f"shares need a gateway class "
                     f"({' or '.join(sorted(names.GATEWAY_CLASSES))}); {class_name} takes "
                     "whole devices")

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
            fail(f"match.resources[{i}]",
                 f"{json.dumps(trigger)} is not one of the rule's resources")

    # compile_expression dry-runs on these samples; rule variables get their sample values as
    # they compile, so later expressions see them.
    sample = _sample_activation(exact, pattern, spec, value=1, text=None)
    compiled_vars: list[tuple[str, Expression]] = []

    def expr(path: str, text: str) -> Expression | None:
        try:
            return compile_expression(text, variables=sample, what="")
        except CelError as exc:
            fail(path, str(exc))
            return None

    when = expr("match.when", spec.match.when) if spec.match.when else None
    for i, var in enumerate(spec.variables):
        compiled_var = expr(f"variables[{i}].expression", var.expression)
        sample[var.name] = 0
        if compiled_var is not None:
            compiled_vars.append((var.name, compiled_var))
            with contextlib.suppress(CelError):  # reported by the dry run below
                sample[var.name] = compiled_var.evaluate(sample)
    refusals = []
    for i, refusal in enumerate(spec.refuse):
        compiled_refusal = expr(f"refuse[{i}].when", refusal.when)
        if compiled_refusal is not None:
            refusals.append((compiled_refusal, refusal.message))
    warnings = []
    for i, warning in enumerate(spec.warn):
        compiled_warning = expr(f"warn[{i}].when", warning.when)
        if compiled_warning is not None:
            warnings.append((compiled_warning, warning.message))
    count = expr("device.count", device.count)
    optional = {
        key: (expr(f"device.{key}", text) if text is not None else None)
        for key, text in (("memory", device.memory), ("memoryPercent", device.memory_percent),
                          ("cores", device.cores), ("enforcement", device.enforcement),
                          ("policy", device.policy))
    }
    selectors = []
    for i, sel in enumerate(device.selectors):
        path = f"device.selectors[{i}]"
        if sel.cel is not None:
            try:
                compile_selector(sel.cel)
            except CelError as exc:
                fail(f"{path}.cel", str(exc))
        selectors.append(CompiledSelector(
            cel=sel.cel, attribute=sel.attribute or sel.capacity or "", op=sel.op,
            values=expr(f"{path}.values", sel.values) if sel.values else None,
            separator=sel.separator,
            when=expr(f"{path}.when", sel.when) if sel.when else None))
    constraints = []
    for i, con in enumerate(device.constraints):
        if not QUALIFIED_NAME_RE.match(con.match_attribute):
            fail(f"device.constraints[{i}].matchAttribute",
                 f"{json.dumps(con.match_attribute)} is not an attribute name (an identifier, "
                 "or domain/identifier such as resource.kubernetes.io/pcieRoot)")
        constraints.append((con.match_attribute,
                            expr(f"device.constraints[{i}].when", con.when) if con.when else None))

    if len(problems.errors) > errors_before or count is None:
        return None
    driver = device.driver or _default_driver(class_name)
    rule = CompiledRule(
        name=spec.name, source=source,
        precedence=entry.precedence if entry.precedence is not None else 0,
        class_name=class_name, driver=driver, gateway_class=gateway_class,
        gated=allocator == "gateway", exact=exact, pattern=pattern,
        pattern_factor=pattern_factor,
        triggers=frozenset(t for t in triggers if not t.endswith("*")),
        trigger_pattern=any(t.endswith("*") for t in triggers),
        annotations=tuple(spec.annotations), node_selector=tuple(spec.node_selector),
        match_annotations=dict(spec.match.annotations),
        match_node_selector=dict(spec.match.node_selector), when=when,
        variables=tuple(compiled_vars), refusals=tuple(refusals), warnings=tuple(warnings),
        count=count,
        memory=optional["memory"], memory_percent=optional["memoryPercent"],
        cores=optional["cores"], enforcement=optional["enforcement"],
        policy=optional["policy"], selectors=tuple(selectors), constraints=tuple(constraints),
        extended_resource_names=entry.extended_resource_names,
        fractional=frozenset(name for name, res in spec.resources.items()
                             if res is not None and res.fractional),
        suffixed=frozenset(name for name, res in spec.resources.items()
                           if res is not None and res.suffixes))
    _dry_run(rule, entry, problems)
    if len(problems.errors) > errors_before:
        return None
    return _batched(rule, spec, sample)


def _batch_text(parts: Sequence[str]) -> str:
    return "[" + ", ".join(f"({part})" for part in parts) + "]"


def _batched(rule: CompiledRule, spec: RuleSpec, sample: dict[str, Any]) -> CompiledRule:
    """The rule with its batched expressions (each part already compiled and dry-run alone)."""
    device = spec.device
    outputs = [device.count, device.memory or "0", device.memory_percent or "0",
               device.cores or "0", device.enforcement or '""', device.policy or '""']
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
    }


def _sample_activations(rule: CompiledRule, spec: RuleSpec) -> list[dict[str, Any]]:
    """Representative inputs for a dry run: nothing optional set, then everything set."""
    return [_sample_activation(rule.exact, rule.pattern, spec, value=value, text=text)
            for value, text in ((1, None), (2, "a"))]


_EXPECTED: Final[Mapping[str, tuple[type, ...]]] = {
    "count": (int,), "memory": (int,), "memoryPercent": (int,), "cores": (int,),
    "enforcement": (str,), "policy": (str,),
}


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
        for key, output in (("count", rule.count), ("memory", rule.memory),
                                ("memoryPercent", rule.memory_percent), ("cores", rule.cores),
                                ("enforcement", rule.enforcement), ("policy", rule.policy)):
            value = check(f"device.{key}", output, activation, _EXPECTED[key])
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

"""Translation rules: the `TranslationRules` document, its loader, and the compiled rule set.

A rules document (`apiVersion: dra-gateway.io/v1alpha1`, `kind: TranslationRules`) lists rules
that say which legacy container resources they translate, how to compute the DRA device request
from them with CEL, and which device class serves it. The built-in documents ship in
`builtin/*.yaml`; administrators add files, folders or ConfigMap data that add rules, replace a
rule by name, or adjust a rule with an `overrides` entry (enable/disable, precedence, class,
units). Everything is validated at load, CEL expressions included (they are dry-run, because the
CEL runtime only parses at compile time), and every error names its source and field path.

The typed pydantic models exist for loading only. `RuleSet` holds plain, precompiled structures
for the admission hot path. This module reads files when asked to load them and nothing else: no
cluster access, no logging.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources as package_resources
from pathlib import Path
from typing import Annotated, Any, Final, Literal, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

from dra_gateway.kube import names
from dra_gateway.kube.cel import CelError, Expression, compile_expression, compile_selector
from dra_gateway.kube.models import ENFORCEMENTS, POLICY_NAMES

__all__ = [
    "UNITS",
    "CompiledRule",
    "CompiledSelector",
    "ExtendedResourceNames",
    "RuleSet",
    "RulesDocument",
    "RulesError",
    "Source",
    "load_rules",
    "render_selector",
]

# Units a legacy resource's value may be in; the translator multiplies the value by the factor
# so that rules compute with bytes for memory and plain numbers for everything else.
UNITS: Final[Mapping[str, int]] = {
    "": 1,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
}

# Variables every rule expression sees. `r` maps each resource the rule declares to its whole
# value (times its unit), 0 when the container does not ask for it.
BASE_VARIABLES: Final = ("r", "container", "annotations", "nodeSelector", "namespace", "wildcard")

SelectorOp = Literal["equals", "in", "notIn", "containsAnyIgnoreCase", "notContainsAnyIgnoreCase"]
Allocator = Literal["gateway", "scheduler"]
# What a rule does with a resource it reads that a DeviceClass of the cluster declares as its
# `spec.extendedResourceName` (kube-scheduler then serves the name itself; translator/extended.py).
ExtendedResourceNames = Literal["defer", "translate"]

_NAME_RE: Final = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_IDENT_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESOURCE_RE: Final = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_PATTERN_RE: Final = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[-A-Za-z0-9_.]*\*$")
_MAX_EXPRESSION: Final = 4096


class RulesError(ValueError):
    """Rules that failed to load. `errors` holds one `<source>: <path>: <problem>` per problem;
    `summary` says what failed, e.g. "2 rules and 1 document failed to load" (a document that
    cannot be read or parsed, or whose own fields are wrong, counts as a document)."""

    def __init__(self, errors: Sequence[str], failed: Mapping[str, int]) -> None:
        self.errors = list(errors)
        self.failed = dict(failed)
        parts = [f"{n} {kind}{'' if n == 1 else 's'}"
                 for kind in ("rule", "override", "document") if (n := failed.get(kind, 0))]
        listed = " and ".join([", ".join(parts[:-1]), parts[-1]] if len(parts) > 1 else parts)
        self.summary = f"{listed or 'nothing'} failed to load"
        super().__init__(f"{self.summary}: " + "; ".join(self.errors))


# --------------------------------------------------------------------------------------------
# The document, as typed models (load time only).


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, frozen=True)


def _check_expression(value: str) -> str:
    if not value.strip():
        raise ValueError("an empty expression; write a CEL expression or leave the field out")
    if len(value) > _MAX_EXPRESSION:
        raise ValueError(f"expression is {len(value)} characters long, the limit is "
                         f"{_MAX_EXPRESSION}")
    return value


def _check_unit(value: str) -> str:
    if value not in UNITS:
        known = ", ".join(f'"{u}"' for u in UNITS)
        raise ValueError(f"unknown unit {json.dumps(value)}; use one of {known}")
    return value


CelText = Annotated[str, AfterValidator(_check_expression)]
Unit = Annotated[str, AfterValidator(_check_unit)]


class ResourceSpec(_Model):
    """One legacy resource a rule reads (and removes from the container)."""

    unit: Unit = Field(default="", description="unit of the value; the rule sees value × unit")


class MatchSpec(_Model):
    """When the rule applies to a container; every condition given must hold."""

    resources: list[str] | None = Field(
        default=None, description="any of these resources triggers the rule (default: any of "
        "the rule's resources)")
    annotations: dict[str, str | None] = Field(
        default_factory=dict, description="pod annotations that must be present (with this "
        "value when one is given)")
    node_selector: dict[str, str | None] = Field(default_factory=dict, alias="nodeSelector")
    when: CelText | None = Field(default=None,
                                 description="CEL condition on the rule's variables")


class VariableSpec(_Model):
    name: str
    expression: CelText

    @field_validator("name")
    @classmethod
    def _identifier(cls, value: str) -> str:
        if not _IDENT_RE.match(value):
            raise ValueError(f"{json.dumps(value)} is not a CEL identifier")
        if value in BASE_VARIABLES:
            raise ValueError(f"{json.dumps(value)} is a built-in variable; choose another name")
        return value


class RefusalSpec(_Model):
    when: CelText = Field(description="CEL condition; true refuses the pod")
    message: str = Field(min_length=1, description="what is wrong and how to fix it")


class SelectorSpec(_Model):
    """A device selector: either raw DRA CEL, or an attribute test built from the pod safely."""

    cel: CelText | None = Field(default=None, description="a DRA CEL selector, used as written")
    attribute: str | None = Field(default=None, description="device attribute, e.g. productName")
    op: SelectorOp = "equals"
    values: CelText | None = Field(default=None,
                                   description="CEL giving a string or list of strings")
    separator: str | None = Field(default=None, description="split string values on this")
    when: CelText | None = Field(default=None,
                                 description="CEL condition; false skips the selector")


    @field_validator("attribute")
    @classmethod
    def _attribute(cls, value: str | None) -> str | None:
        if value is not None and not _IDENT_RE.match(value):
            raise ValueError(f"{json.dumps(value)} is not an attribute name (a C identifier)")
        return value

    @model_validator(mode="after")
    def _one_form(self) -> SelectorSpec:
        if (self.cel is None) == (self.attribute is None):
            raise ValueError("set exactly one of cel or attribute")
        if self.attribute is not None and self.values is None:
            raise ValueError("an attribute selector needs values")
        return self


class ConstraintSpec(_Model):
    match_attribute: str = Field(alias="matchAttribute")
    when: CelText | None = None


class DeviceSpec(_Model):
    """The device request a rule produces. Amounts are CEL expressions, per card."""

    class_name: str = Field(default="", alias="className")
    driver: str | None = Field(default=None, description="driver whose attributes selectors "
                               "read (default: derived from the class)")
    allocator: Allocator | None = None
    count: CelText = "1"
    memory: CelText | None = Field(default=None, description="bytes per card")
    memory_percent: CelText | None = Field(default=None, alias="memoryPercent")
    cores: CelText | None = Field(default=None, description="percent of a card's compute")
    enforcement: CelText | None = Field(default=None,
                                        description="CEL giving none|hami-core|mps")
    policy: CelText | None = Field(default=None, description="CEL giving a policy name or \"\"")
    selectors: list[SelectorSpec] = Field(default_factory=list)
    constraints: list[ConstraintSpec] = Field(default_factory=list)



class RuleSpec(_Model):
    name: str
    description: str = ""
    enabled: bool = True
    precedence: int | None = None
    resources: dict[str, ResourceSpec | None]
    annotations: list[str] = Field(default_factory=list, description="pod annotations read")
    node_selector: list[str] = Field(default_factory=list, alias="nodeSelector")
    match: MatchSpec = Field(default_factory=MatchSpec)
    variables: list[VariableSpec] = Field(default_factory=list)
    refuse: list[RefusalSpec] = Field(default_factory=list)
    device: DeviceSpec
    extended_resource_names: ExtendedResourceNames = Field(
        default="defer", alias="extendedResourceNames",
        description="defer: leave a container to kube-scheduler when a DeviceClass declares one "
        "of the rule's resources as spec.extendedResourceName; translate: translate it anyway")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not _NAME_RE.match(value) or len(value) > 63:
            raise ValueError(f"{json.dumps(value)} is not a rule name (lower-case letters, "
                             "digits, '-' and '.', at most 63)")
        return value

    @field_validator("resources")
    @classmethod
    def _resources(cls, value: dict[str, ResourceSpec | None]) -> dict[str, ResourceSpec | None]:
        if not value:
            raise ValueError("a rule reads at least one resource")
        for name in value:
            if not (_RESOURCE_RE.match(name) or _PATTERN_RE.match(name)):
                raise ValueError(f"{json.dumps(name)} is not a resource name (a trailing * "
                                 "matches a prefix)")
        if sum(1 for name in value if name.endswith("*")) > 1:
            raise ValueError("at most one resource pattern (ending in *) per rule")
        return value


class OverrideSpec(_Model):
    """Changes to a rule defined elsewhere (a built-in, usually), applied after all rules load."""

    rule: str
    enabled: bool | None = None
    precedence: int | None = None
    class_name: str | None = Field(default=None, alias="className")
    units: dict[str, Unit] = Field(default_factory=dict)
    extended_resource_names: ExtendedResourceNames | None = Field(
        default=None, alias="extendedResourceNames")


class RulesDocument(_Model):
    """The document; `rules` and `overrides` entries are validated one by one (`_validated`)
    so that one broken rule does not hide the problems of the others."""

    api_version: Literal["dra-gateway.io/v1alpha1"] = Field(alias="apiVersion")
    kind: Literal["TranslationRules"]
    metadata: dict[str, Any] = Field(default_factory=dict)
    rules: list[Any] = Field(default_factory=list)
    overrides: list[Any] = Field(default_factory=list)


_M = TypeVar("_M", bound=BaseModel)


@dataclass
class _ValidDocument:
    source: str
    rules: list[tuple[int, RuleSpec]]
    overrides: list[tuple[int, OverrideSpec]]


# --------------------------------------------------------------------------------------------
# Compiled structures (hot path).


@dataclass(frozen=True, slots=True)
class CompiledSelector:
    cel: str | None
    attribute: str
    op: str
    values: Expression | None
    separator: str | None
    when: Expression | None


@dataclass(frozen=True, slots=True)
class CompiledRule:
    name: str
    source: str
    precedence: int
    class_name: str
    driver: str
    gateway_class: bool
    gated: bool
    exact: Mapping[str, int]
    pattern: str | None
    pattern_factor: int
    triggers: frozenset[str]
    trigger_pattern: bool
    annotations: tuple[str, ...]
    node_selector: tuple[str, ...]
    match_annotations: Mapping[str, str | None]
    match_node_selector: Mapping[str, str | None]
    when: Expression | None
    variables: tuple[tuple[str, Expression], ...]
    refusals: tuple[tuple[Expression, str], ...]
    count: Expression
    memory: Expression | None
    memory_percent: Expression | None
    cores: Expression | None
    enforcement: Expression | None
    policy: Expression | None
    selectors: tuple[CompiledSelector, ...]
    constraints: tuple[tuple[str, Expression | None], ...]
    # The same expressions batched into one list each, because every evaluation pays for a
    # fresh engine context: refusal conditions; [count, memory, memoryPercent, cores,
    # enforcement, policy] with 0 / "" for unset; selector then constraint conditions.
    refusal_batch: Expression | None = None
    output_batch: Expression | None = None
    condition_batch: Expression | None = None
    # "defer" or "translate": see ExtendedResourceNames.
    extended_resource_names: ExtendedResourceNames = "defer"

    def claims(self, resource: str) -> bool:
        """Whether this rule reads `resource`."""
        if resource in self.exact:
            return True
        return self.pattern is not None and resource.startswith(self.pattern)

    def triggered_by(self, resource: str) -> bool:
        """Whether asking for `resource` makes this rule apply (a hint it reads does not)."""
        return resource in self.triggers or (
            self.trigger_pattern and self.pattern is not None
            and resource.startswith(self.pattern))


@dataclass(slots=True)
class RuleSet:
    """Enabled rules, indexed for the hot path, plus a bounded cache of translated shapes.

    The cache maps a container's or pod's request shape to what the translator computed for it;
    it is owned by this object (not a module global) and is dropped with it when rules change.
    """

    rules: tuple[CompiledRule, ...]
    disabled: tuple[str, ...] = ()
    by_resource: dict[str, tuple[CompiledRule, ...]] = field(default_factory=dict)
    by_prefix: tuple[tuple[str, CompiledRule], ...] = ()
    cache: dict[Any, Any] = field(default_factory=dict)
    cache_size: int = 4096
    # Sorted pod annotation and nodeSelector keys some rule reads: part of the shape key.
    annotation_order: tuple[str, ...] = ()
    node_selector_order: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return (f"RuleSet(rules={list(self.rule_names)}, disabled={list(self.disabled)}, "
                f"cached={len(self.cache)})")

    def __post_init__(self) -> None:
        index: dict[str, list[CompiledRule]] = {}
        prefixes: list[tuple[str, CompiledRule]] = []
        for rule in self.rules:
            for name in rule.exact:
                index.setdefault(name, []).append(rule)
            if rule.pattern is not None:
                prefixes.append((rule.pattern, rule))
        self.by_resource = {k: tuple(v) for k, v in index.items()}
        self.by_prefix = tuple(prefixes)
        self.annotation_order = tuple(sorted(self.annotation_keys()))
        self.node_selector_order = tuple(sorted(self.node_selector_keys()))

    @property
    def rule_names(self) -> tuple[str, ...]:
        return tuple(rule.name for rule in self.rules)

    def rule(self, name: str) -> CompiledRule:
        for rule in self.rules:
            if rule.name == name:
                return rule
        raise KeyError(name)

    def legacy_resource_names(self) -> frozenset[str]:
        """Exact resource names the enabled rules translate (see `legacy_resource_prefixes`)."""
        return frozenset(self.by_resource)

    def legacy_resource_prefixes(self) -> frozenset[str]:
        """Prefixes of resource names the enabled rules translate, e.g. `nvidia.com/mig-`."""
        return frozenset(prefix for prefix, _ in self.by_prefix)

    def annotation_keys(self) -> frozenset[str]:
        """Pod annotations the enabled rules read or match on."""
        keys: set[str] = set()
        for rule in self.rules:
            keys.update(rule.annotations)
            keys.update(rule.match_annotations)
        return frozenset(keys)

    def node_selector_keys(self) -> frozenset[str]:
        keys: set[str] = set()
        for rule in self.rules:
            keys.update(rule.node_selector)
            keys.update(rule.match_node_selector)
        return frozenset(keys)

    def is_legacy(self, resource: str) -> bool:
        if resource in self.by_resource:
            return True
        return any(resource.startswith(prefix) for prefix, _ in self.by_prefix)

    def asks_for_devices(self, resource: str) -> bool:
        """Whether `resource` asks for devices: some enabled rule applies when a container asks
        for it. A resource rules only read alongside others (HAMi's nvidia.com/priority, or
        nvidia.com/gpu when only the HAMi rule is enabled) does not."""
        return any(rule.triggered_by(resource) for rule in self.rules_for(resource))

    def rules_for(self, resource: str) -> tuple[CompiledRule, ...]:
        found = self.by_resource.get(resource, ())
        for prefix, rule in self.by_prefix:
            if resource.startswith(prefix):
                found = (*found, rule)
        return found

    def remember(self, key: Any, value: Any) -> None:
        if len(self.cache) >= self.cache_size:
            # Shapes repeat heavily in practice; a full reset keeps the bound without tracking
            # recency on the hot path.
            self.cache.clear()
        self.cache[key] = value


# --------------------------------------------------------------------------------------------
# Loading.


# A file or folder path; a ConfigMap's data; or (label, data) such as
# ("ConfigMap dra-gateway/site-rules", data) so that messages name the ConfigMap.
Source = str | Path | Mapping[str, str] | tuple[str, Mapping[str, str]]


@dataclass
class _Problems:
    errors: list[str] = field(default_factory=list)
    failed: set[tuple[str, str]] = field(default_factory=set)

    def add(self, source: str, path: str, message: str) -> None:
        self.errors.append(f"{source}: {path}: {message}" if path else f"{source}: {message}")
        # Count failures per rule (or per other top-level entry) as the summary line says.
        entry = re.match(r"^(rules|overrides)\[\d+\]", path)
        self.failed.add((source, entry.group(0) if entry else ""))

    def counts(self) -> dict[str, int]:
        """How many rules, overrides and whole documents failed."""
        out: dict[str, int] = {}
        for _, entry in self.failed:
            kind = ("rule" if entry.startswith("rules[") else
                    "override" if entry.startswith("overrides[") else "document")
            out[kind] = out.get(kind, 0) + 1
        return out


def format_path(loc: Iterable[int | str]) -> str:
    """A pydantic location as a field path: `rules[3].resources["aliyun.com/gpu-mem"].unit`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif _IDENT_RE.match(part):
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out


def _pydantic_message(error: Mapping[str, Any]) -> str:
    kind = error.get("type", "")
    if kind == "missing":
        return "required"
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "literal_error":
        expected = error.get("ctx", {}).get("expected", "")
        return f"must be {expected}, not {json.dumps(error.get('input'), default=str)}"
    message = str(error.get("msg", "invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        if message.startswith(prefix):
            message = message[len(prefix):]
    return message


def _read_documents(source: Source, problems: _Problems) -> list[tuple[str, Any]]:
    """Raw YAML documents of a source, each with a display name."""
    return _parse_texts(_source_texts(source, problems), problems)


def _source_texts(source: Source, problems: _Problems) -> list[tuple[str, str]]:
    texts: list[tuple[str, str]] = []
    if isinstance(source, tuple):
        label, data = source
        for key in sorted(data):
            texts.append((f"{label} key {key}", data[key]))
    elif isinstance(source, Mapping):
        # A ConfigMap labelled as rules holds rule documents under every key.
        for key in sorted(source):
            texts.append((f"configmap key {key}", source[key]))
    else:
        path = Path(source)
        if path.is_dir():
            files = sorted(p for p in path.iterdir()
                           if p.suffix in (".yaml", ".yml", ".json") and p.is_file())
            if not files:
                problems.add(str(path), "", "no .yaml, .yml or .json files in this folder")
            for file in files:
                texts.append((str(file), _read_text(file, problems)))
        else:
            texts.append((str(path), _read_text(path, problems)))
    return texts


def _parse_texts(texts: list[tuple[str, str]], problems: _Problems) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for name, text in texts:
        try:
            docs = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}" if mark is not None else "somewhere"
            problems.add(name, "", f"not valid YAML ({where}: {getattr(exc, 'problem', exc)})")
            continue
        for i, doc in enumerate(docs):
            out.append((f"{name}[{i}]" if len(docs) > 1 else name, doc))
    return out


def _read_text(path: Path, problems: _Problems) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        problems.add(str(path), "", f"cannot be read: {exc.strerror or exc}")
        return ""
    except UnicodeDecodeError:
        problems.add(str(path), "", "not a text file (not UTF-8): rules are YAML or JSON")
        return ""


def builtin_sources() -> list[tuple[str, str]]:
    """The built-in rule files shipped in the package, as (name, text), in file-name order."""
    folder = package_resources.files("dra_gateway.translator").joinpath("builtin")
    out = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            out.append((f"builtin/{entry.name}", entry.read_text(encoding="utf-8")))
    return out


def load_rules(*sources: Source, builtin: bool = True) -> RuleSet:
    """Load rules: the built-in files first (unless `builtin=False`), then each source in order.

    A source is a file, a folder (its .yaml/.yml/.json files in name order), a ConfigMap's
    `data` mapping (every key a rules document), or `(label, data)` to name that ConfigMap in
    messages. A later rule with the same name replaces an earlier one; `overrides` apply
    after every rule is known. Raises `RulesError` listing every problem with its path.
    """
    problems = _Problems()
    raw: list[tuple[str, Any]] = []
    if builtin:
        raw.extend(_parse_texts(builtin_sources(), problems))
    for source in sources:
        raw.extend(_read_documents(source, problems))

    documents: list[_ValidDocument] = []
    for name, data in raw:
        if not isinstance(data, dict):
            problems.add(name, "", "a rules document is a mapping with apiVersion, kind and rules")
            continue
        try:
            document = RulesDocument.model_validate(data)
        except ValidationError as exc:
            for error in exc.errors():
                problems.add(name, format_path(error["loc"]), _pydantic_message(error))
            continue
        documents.append(_ValidDocument(
            name, _validated(name, "rules", document.rules, RuleSpec, problems),
            _validated(name, "overrides", document.overrides, OverrideSpec, problems)))
    return _assemble(documents, problems)


def _validated(source: str, key: str, items: list[Any], model: type[_M],
               problems: _Problems) -> list[tuple[int, _M]]:
    out = []
    for i, item in enumerate(items):
        try:
            out.append((i, model.model_validate(item)))
        except ValidationError as exc:
            for error in exc.errors():
                problems.add(source, format_path((key, i, *error["loc"])),
                             _pydantic_message(error))
    return out


@dataclass
class _Entry:
    spec: RuleSpec
    source: str
    path: str
    enabled: bool
    precedence: int | None
    class_name: str
    units: dict[str, str]
    order: int
    extended_resource_names: ExtendedResourceNames = "defer"


def _assemble(documents: list[_ValidDocument], problems: _Problems) -> RuleSet:
    entries: dict[str, _Entry] = {}
    order = 0
    for document in documents:
        seen: set[str] = set()
        for i, spec in document.rules:
            order += 1
            if spec.name in seen:
                problems.add(document.source, f"rules[{i}].name",
                             f"rule {json.dumps(spec.name)} is defined twice in this document")
                continue
            seen.add(spec.name)
            units = {name: (res.unit if res is not None else "")
                     for name, res in spec.resources.items()}
            # The same name in a later source replaces the earlier rule as a whole.
            entries[spec.name] = _Entry(spec, document.source, f"rules[{i}]", spec.enabled,
                                        spec.precedence, spec.device.class_name, units, order,
                                        spec.extended_resource_names)
    for document in documents:
        for i, override in document.overrides:
            entry = entries.get(override.rule)
            path = f"overrides[{i}]"
            if entry is None:
                problems.add(document.source, f"{path}.rule",
                             f"no rule named {json.dumps(override.rule)}")
                continue
            if override.enabled is not None:
                entry.enabled = override.enabled
            if override.precedence is not None:
                entry.precedence = override.precedence
            if override.class_name is not None:
                entry.class_name = override.class_name
            if override.extended_resource_names is not None:
                entry.extended_resource_names = override.extended_resource_names
            for resource, unit in override.units.items():
                if resource not in entry.units:
                    problems.add(document.source, f"{path}.units[{json.dumps(resource)}]",
                                 f"rule {json.dumps(override.rule)} does not read "
                                 f"{resource}")
                    continue
                entry.units[resource] = unit

    compiled: list[CompiledRule] = []
    disabled: list[str] = []
    for name in sorted(entries):
        entry = entries[name]
        if not entry.enabled:
            disabled.append(name)
            continue
        rule = _compile_rule(entry, problems)
        if rule is not None:
            compiled.append(rule)
    _check_overlaps(compiled, entries, problems)
    if problems.errors:
        raise RulesError(problems.errors, problems.counts())
    compiled.sort(key=lambda r: (-r.precedence, r.name))
    return RuleSet(rules=tuple(compiled), disabled=tuple(disabled))


def _default_driver(class_name: str) -> str:
    if class_name in names.GATEWAY_CLASSES:
        return names.DRIVER
    if class_name == names.NVIDIA_MIG_CLASS:
        return names.NVIDIA_GPU_CLASS
    return class_name


def _compile_rule(entry: _Entry, problems: _Problems) -> CompiledRule | None:
    spec, source, base = entry.spec, entry.source, entry.path
    device = spec.device
    errors_before = len(problems.errors)

    def fail(path: str, message: str) -> None:
        problems.add(source, f"{base}.{path}", message)

    class_name = entry.class_name
    if not class_name:
        fail("device.className", "required for an enabled rule: name the DeviceClass that "
             "serves these devices")
    elif not _NAME_RE.match(class_name) or len(class_name) > 253:
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
            fail(f"match.resources[{i}]", f"{trigger} is not one of the rule's resources")

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
            cel=sel.cel, attribute=sel.attribute or "", op=sel.op,
            values=expr(f"{path}.values", sel.values) if sel.values else None,
            separator=sel.separator,
            when=expr(f"{path}.when", sel.when) if sel.when else None))
    constraints = []
    for i, con in enumerate(device.constraints):
        if not _IDENT_RE.match(con.match_attribute):
            fail(f"device.constraints[{i}].matchAttribute",
                 f"{json.dumps(con.match_attribute)} is not an attribute name")
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
        variables=tuple(compiled_vars), refusals=tuple(refusals), count=count,
        memory=optional["memory"], memory_percent=optional["memoryPercent"],
        cores=optional["cores"], enforcement=optional["enforcement"],
        policy=optional["policy"], selectors=tuple(selectors), constraints=tuple(constraints),
        extended_resource_names=entry.extended_resource_names)
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
        rule, refusal_batch=batch([r.when for r in spec.refuse]),
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


def _dry_run(rule: CompiledRule, entry: _Entry, problems: _Problems) -> None:
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
                    value not in POLICY_NAMES and _text_free(activation)):
                problems.add(source, f"{base}.device.policy",
                             f"gives {json.dumps(value)}; expected one of "
                             f"{', '.join(POLICY_NAMES)} or \"\"")
                reported.add("device.policy")
        for i, sel in enumerate(rule.selectors):
            path = f"device.selectors[{i}]"
            enabled = check(f"{path}.when", sel.when, activation, (bool,))
            if sel.when is not None and enabled is not True:
                continue
            values = check(f"{path}.values", sel.values, activation, (str, list))
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


def selector_values(selector: CompiledSelector, value: Any) -> list[str]:
    """The strings a selector's `values` expression gave, split and trimmed."""
    items = [value] if isinstance(value, str) else list(value)
    out: list[str] = []
    for item in items:
        text = str(item)
        parts = text.split(selector.separator) if selector.separator else [text]
        out.extend(p.strip() for p in parts if p.strip())
    return out


def _literal(text: str) -> str:
    # JSON string syntax (with \uXXXX escapes) is valid CEL string syntax.
    return json.dumps(text)


def render_selector(selector: CompiledSelector, driver: str, values: Sequence[str]) -> str | None:
    """A DRA CEL selector for an attribute test, guarded so it never errors on a device.

    Values come from pods (annotations) and are only ever placed inside string literals.
    Returns None when there is nothing to test (no values).
    """
    if not values:
        return None
    attrs = f"device.attributes[{_literal(driver)}]"
    present = f"{_literal(selector.attribute)} in {attrs}"
    attr = f"{attrs}.{selector.attribute}"
    op = selector.op
    if op in ("equals", "in", "notIn"):
        if len(values) == 1:
            test = f"{attr} == {_literal(values[0])}"
        else:
            test = f"{attr} in [{', '.join(_literal(v) for v in values)}]"
    else:
        lowered = [v.lower() for v in values]
        test = " || ".join(f"{attr}.lowerAscii().contains({_literal(v)})" for v in lowered)
        if len(lowered) > 1:
            test = f"({test})"
    if op in ("notIn", "notContainsAnyIgnoreCase"):
        return f"!({present}) || !({test})"
    return f"{present} && {test}"


def _check_overlaps(rules: list[CompiledRule], entries: Mapping[str, _Entry],
                    problems: _Problems) -> None:
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

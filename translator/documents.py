"""The `TranslationRules` document as typed models: what a rules file may say, field by field.

A rules document (`apiVersion: dra-gateway.io/v1alpha1`, `kind: TranslationRules`) lists rules
that say which legacy container resources they translate, how to compute the DRA device request
from them with CEL, and which device class serves it, plus `overrides` of rules defined
elsewhere. These pydantic models exist for loading only: they check shapes, names and units
(a unit is a key of the core's `UNITS`, `gpu/legacy_resources.py`). They must not compile
CEL, read files or be used on the admission path (`ruleset.py` holds what that path reads);
`loading.py` turns them into a `RuleSet`.
"""

from __future__ import annotations

import json
import re
import types
from collections.abc import Sequence
from typing import Annotated, Any, Final, Literal, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

# The units a resource's value may be in are the core's, re-exported for the rules' readers.
from dra_gateway.gpu.legacy_resources import UNITS as UNITS

# Variables every rule expression sees. `r` maps each resource the rule declares to its whole
# value (times its unit), 0 when the container does not ask for it.
# `item` is the alternative of `device.firstAvailable` being rendered ("" outside one).
BASE_VARIABLES: Final = ("r", "container", "annotations", "nodeSelector", "namespace", "wildcard",
                         "item")

SelectorOp = Literal["equals", "in", "notIn", "containsAnyIgnoreCase", "notContainsAnyIgnoreCase",
                     "atLeast"]
Allocator = Literal["gateway", "scheduler"]
# What a rule does with a resource it reads that a DeviceClass of the cluster declares as its
# `spec.extendedResourceName` (kube-scheduler then serves the name itself; translator/extended.py).
ExtendedResourceNames = Literal["defer", "translate"]

NAME_RE: Final = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
IDENT_RE: Final = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_RESOURCE_RE: Final = re.compile(
    r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
_PATTERN_RE: Final = re.compile(r"^([a-z0-9]([-a-z0-9.]*[a-z0-9])?/)?[-A-Za-z0-9_.]*\*$")
_MAX_EXPRESSION: Final = 4096


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
    fractional: bool = Field(
        default=False, description="the value may have a fraction (gpushare's 5.5 GiB); the "
        "rule sees value × unit rounded down to a whole number")
    suffixes: bool = Field(
        default=False, description="the value is a quantity of bytes and may carry suffixes "
        "(8Gi); without it a binary suffix, or a decimal one from M up, is refused as a unit "
        "mistaken (HAMi's nvidia.com/gpumem counts MiB: 8Gi would mean 8Pi)")


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
        if not IDENT_RE.match(value):
            raise ValueError(f"{json.dumps(value)} is not a CEL identifier")
        if value in BASE_VARIABLES:
            raise ValueError(f"{json.dumps(value)} is a built-in variable; choose another name")
        return value


class RefusalSpec(_Model):
    when: CelText = Field(description="CEL condition; true refuses the pod")
    message: str = Field(min_length=1, description="what is wrong and how to fix it")


class WarningSpec(_Model):
    when: CelText = Field(description="CEL condition; true adds the message to the warnings")
    message: str = Field(min_length=1, description="what looks wrong and what to check")


class SelectorSpec(_Model):
    """A device selector: raw DRA CEL, an attribute test built from the pod safely, or a
    capacity test (`op: atLeast`) against an amount the rule computes."""

    cel: CelText | None = Field(default=None, description="a DRA CEL selector, used as written")
    attribute: str | None = Field(default=None, description="device attribute, e.g. productName")
    capacity: str | None = Field(default=None, description="device capacity, e.g. memory "
                                 "(with op atLeast and values giving a whole number)")
    op: SelectorOp = "equals"
    values: CelText | None = Field(default=None,
                                   description="CEL giving a string or list of strings (a "
                                   "whole number for a capacity)")
    separator: str | None = Field(default=None, description="split string values on this")
    when: CelText | None = Field(default=None,
                                 description="CEL condition; false skips the selector")


    @field_validator("attribute", "capacity")
    @classmethod
    def _attribute(cls, value: str | None) -> str | None:
        if value is not None and not IDENT_RE.match(value):
            raise ValueError(f"{json.dumps(value)} is not an attribute or capacity name (a C "
                             "identifier)")
        return value

    @model_validator(mode="after")
    def _one_form(self) -> SelectorSpec:
        if sum(x is not None for x in (self.cel, self.attribute, self.capacity)) != 1:
            raise ValueError("set exactly one of cel, attribute or capacity")
        if (self.attribute is not None or self.capacity is not None) and self.values is None:
            raise ValueError("an attribute or capacity selector needs values")
        if (self.capacity is not None) != (self.op == "atLeast"):
            raise ValueError("op atLeast goes with capacity, and a capacity selector uses "
                             "op atLeast")
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
    first_available: CelText | None = Field(
        default=None, alias="firstAvailable",
        description="CEL giving a list of at most 8 strings: the request offers one "
        "alternative per item, in order (DRA firstAvailable), each with the selectors as they "
        "render with `item` set to it; a list of one item (or none) is a plain request")


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
    warn: list[WarningSpec] = Field(default_factory=list, description="conditions that still "
                                    "translate the pod, with a warning to its author")
    device: DeviceSpec
    extended_resource_names: ExtendedResourceNames = Field(
        default="defer", alias="extendedResourceNames",
        description="defer: leave a container to kube-scheduler when a DeviceClass declares one "
        "of the rule's resources as spec.extendedResourceName; translate: translate it anyway")
    extended_resource_names_from: str | None = Field(
        default=None, alias="extendedResourceNamesFrom",
        description="take extendedResourceNames from this rule (as overrides leave it), so that "
        "rules reading one name decide alike; an override of this rule's own wins")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        if not NAME_RE.match(value) or len(value) > 63:
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


def field_names_at(model: type[BaseModel], loc: Sequence[int | str]) -> list[str]:
    """The field names (as a document writes them: aliases) of the model at `loc` inside
    `model`, as a validation error locates a field; [] where `loc` leads to no model. For the
    did-you-mean of an unknown field."""
    current: Any = model
    for part in loc:
        current = _inner(current, part)
        if current is None:
            return []
    current = _model_of(current)
    if current is None:
        return []
    return [info.alias or name for name, info in current.model_fields.items()]


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The model `annotation` is (`Model`, `Model | None`, `Annotated[Model, ...]`), or None."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        found = [a for a in get_args(annotation) if a is not type(None)]
        return _model_of(found[0]) if len(found) == 1 else None
    if origin is Annotated:
        return _model_of(get_args(annotation)[0])
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _inner(annotation: Any, part: int | str) -> Any:
    """The type at `part` of a value of type `annotation`: a model's field, a list's item, a
    mapping's value; None where there is none."""
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        found = [a for a in get_args(annotation) if a is not type(None)]
        return _inner(found[0], part) if len(found) == 1 else None
    if origin is Annotated:
        return _inner(get_args(annotation)[0], part)
    model = _model_of(annotation)
    if model is not None:
        for name, info in model.model_fields.items():
            if part in (name, info.alias):
                return info.annotation
        return None
    if origin is list and isinstance(part, int):
        return get_args(annotation)[0]
    if origin is dict and isinstance(part, str):
        return get_args(annotation)[1]
    return None

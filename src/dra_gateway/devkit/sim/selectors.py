"""Kubernetes label and field selectors: parsing and matching, as the API server does them.

The in-memory cluster filters lists and watches with these; the same parser validates the
selectors the HTTP front receives, so a typo fails as a 400 naming the selector rather than
silently matching nothing. This module is pure: no I/O, no cluster state.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from dra_gateway.kube.cluster.port import BadRequest
from dra_gateway.kube.nodeselectors import label_selector_matches as _label_selector_matches
from dra_gateway.kube.resources import PODS, RESOURCE_SLICES, ResourceType

Operator = Literal["=", "!=", "in", "notin", "exists", "!", "gt", "lt"]

# A label key: optional DNS-subdomain prefix and a name of at most 63 characters.
_NAME = r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
_KEY_RE = re.compile(rf"^(?:[a-z0-9](?:[-a-z0-9.]{{0,251}}[a-z0-9])?/)?{_NAME}$")
_VALUE_RE = re.compile(rf"^(?:{_NAME})?$")


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    operator: Operator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.operator == "=":
            return present and value == self.values[0]
        if self.operator == "!=":
            # Kubernetes: a missing label satisfies `!=` and `notin`.
            return not present or value != self.values[0]
        if self.operator == "in":
            return present and value in self.values
        if self.operator == "notin":
            return not present or value not in self.values
        if self.operator == "exists":
            return present
        if self.operator == "!":
            return not present
        if not present or value is None:
            return False
        try:
            have, want = int(value), int(self.values[0])
        except ValueError:
            return False
        return have > want if self.operator == "gt" else have < want


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """All requirements must hold (comma is AND); the empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


_TOKEN_RE = re.compile(r"\s*(\(|\)|,|!=|==|=|!|[^\s(),!=<>]+|<|>)")


def _tokens(text: str, selector: str) -> list[str]:
    tokens: list[str] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN_RE.match(text, pos)
        if match is None:  # pragma: no cover - the pattern accepts any non-space character
            raise _bad_label(selector, f"unexpected character at position {pos}")
        tokens.append(match.group(1))
        pos = match.end()
    return tokens


def _bad_label(selector: str, why: str) -> BadRequest:
    return BadRequest(f'invalid label selector "{selector}": {why}')


def _check_key(key: str, selector: str) -> str:
    if not _KEY_RE.match(key) or len(key.rsplit("/", 1)[-1]) > 63:
        raise _bad_label(selector, f'"{key}" is not a valid label key (name, or prefix/name, '
                                   "of alphanumerics, '-', '_' or '.')")
    return key


def _check_value(value: str, selector: str) -> str:
    if len(value) > 63 or not _VALUE_RE.match(value):
        raise _bad_label(selector, f'"{value}" is not a valid label value (at most 63 '
                                   "alphanumerics, '-', '_' or '.', starting and ending "
                                   "alphanumeric)")
    return value


def parse_label_selector(selector: str | None) -> LabelSelector:
    """Parse `a=b,a==b,a!=b,a in (x,y),a notin (x),a,!a,a>1,a<1`; BadRequest on bad syntax."""
    if selector is None or not selector.strip():
        return LabelSelector()
    tokens = _tokens(selector, selector)
    requirements: list[Requirement] = []
    i = 0

    def take() -> str | None:
        nonlocal i
        if i >= len(tokens):
            return None
        token = tokens[i]
        i += 1
        return token

    while True:
        token = take()
        if token is None:
            raise _bad_label(selector, "expected a requirement after ','")
        if token == "!":
            key = take()
            if key is None or key in ("(", ")", ",", "=", "==", "!=", "!", "<", ">"):
                raise _bad_label(selector, "expected a label key after '!'")
            requirements.append(Requirement(_check_key(key, selector), "!"))
        elif token in ("(", ")", ",", "=", "==", "!=", "<", ">"):
            raise _bad_label(selector, f"expected a label key, found '{token}'")
        else:
            key = _check_key(token, selector)
            op = take()
            if op is None or op == ",":
                requirements.append(Requirement(key, "exists"))
                if op is None:
                    break
                continue
            if op in ("=", "==", "!="):
                value = take()
                if value is None or value == ",":
                    # `a=` selects the empty value, as in Kubernetes.
                    value_str = ""
                    if value == ",":
                        i -= 1
                elif value in ("(", ")", "=", "==", "!=", "!", "<", ">"):
                    raise _bad_label(selector, f"expected a value after '{key}{op}'")
                else:
                    value_str = value
                requirements.append(Requirement(key, "!=" if op == "!=" else "=",
                                                (_check_value(value_str, selector),)))
            elif op in ("<", ">"):
                value = take()
                if value is None or not re.fullmatch(r"-?\d+", value):
                    raise _bad_label(selector, f"'{key}{op}' needs an integer value")
                requirements.append(Requirement(key, "gt" if op == ">" else "lt", (value,)))
            elif op in ("in", "notin"):
                if take() != "(":
                    raise _bad_label(selector, f"expected '(' after '{key} {op}'")
                values: list[str] = []
                while True:
                    value = take()
                    if value is None:
                        raise _bad_label(selector, f"missing ')' in '{key} {op} (...'")
                    if value == ")" and not values:
                        raise _bad_label(selector, f"'{key} {op} ()' needs at least one value")
                    if value in (",", ")"):
                        # An empty element such as `(a,,b)` or `(a,)` selects the empty value.
                        values.append("")
                        if value == ")":
                            break
                        continue
                    values.append(_check_value(value, selector))
                    sep = take()
                    if sep == ")":
                        break
                    if sep != ",":
                        raise _bad_label(selector, f"expected ',' or ')' in '{key} {op} (...)'")
                requirements.append(Requirement(key, "in" if op == "in" else "notin",
                                                tuple(values)))
            else:
                raise _bad_label(selector, f"unknown operator '{op}' after '{key}' (use =, ==, "
                                           "!=, in, notin)")
        sep = take()
        if sep is None:
            break
        if sep != ",":
            raise _bad_label(selector, f"expected ',' between requirements, found '{sep}'")
    return LabelSelector(tuple(requirements))


# Field selectors -----------------------------------------------------------------------------

FieldGetter = Callable[[Mapping[str, Any]], str]


def _path(*keys: str) -> FieldGetter:
    def get(obj: Mapping[str, Any]) -> str:
        value: Any = obj
        for key in keys:
            if not isinstance(value, Mapping):
                return ""
            value = value.get(key)
        if value is None:
            return ""
        if isinstance(value, bool):
            return "true" if value else "false"
        return str(value)

    return get


_COMMON_FIELDS: dict[str, FieldGetter] = {
    "metadata.name": _path("metadata", "name"),
    "metadata.namespace": _path("metadata", "namespace"),
}

# The field labels the API server supports for each type the project selects by field.
_EXTRA_FIELDS: dict[tuple[str, str], dict[str, FieldGetter]] = {
    (PODS.group, PODS.plural): {
        "spec.nodeName": _path("spec", "nodeName"),
        "spec.schedulerName": _path("spec", "schedulerName"),
        "spec.serviceAccountName": _path("spec", "serviceAccountName"),
        "status.phase": _path("status", "phase"),
        "status.podIP": _path("status", "podIP"),
        "status.nominatedNodeName": _path("status", "nominatedNodeName"),
    },
    (RESOURCE_SLICES.group, RESOURCE_SLICES.plural): {
        "spec.nodeName": _path("spec", "nodeName"),
        "spec.driver": _path("spec", "driver"),
    },
    ("", "events"): {
        "involvedObject.kind": _path("involvedObject", "kind"),
        "involvedObject.namespace": _path("involvedObject", "namespace"),
        "involvedObject.name": _path("involvedObject", "name"),
        "involvedObject.uid": _path("involvedObject", "uid"),
        "involvedObject.apiVersion": _path("involvedObject", "apiVersion"),
        "reason": _path("reason"),
        "type": _path("type"),
    },
    ("", "nodes"): {"spec.unschedulable": _path("spec", "unschedulable")},
}


@dataclass(frozen=True, slots=True)
class FieldRequirement:
    field: str
    getter: FieldGetter
    negate: bool
    value: str

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return (self.getter(obj) == self.value) != self.negate


@dataclass(frozen=True, slots=True)
class FieldSelector:
    requirements: tuple[FieldRequirement, ...] = ()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all(r.matches(obj) for r in self.requirements)

    @property
    def empty(self) -> bool:
        return not self.requirements


def _split_unescaped(text: str, sep: str) -> list[str]:
    """Split on `sep` unless it is escaped with a backslash, as Kubernetes field selectors do."""
    parts: list[str] = []
    current: list[str] = []
    escaped = False
    for char in text:
        if escaped:
            current.append(char)
            escaped = False
        elif char == "\\":
            current.append(char)
            escaped = True
        elif char == sep:
            parts.append("".join(current))
            current = []
        else:
            current.append(char)
    parts.append("".join(current))
    return parts


def _unescape(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value)


def parse_field_selector(selector: str | None, rt: ResourceType) -> FieldSelector:
    """Parse `f=v,f==v,f!=v` over the field labels `rt` supports; BadRequest otherwise."""
    if selector is None or not selector.strip():
        return FieldSelector()
    fields = {**_COMMON_FIELDS, **_EXTRA_FIELDS.get((rt.group, rt.plural), {})}
    requirements: list[FieldRequirement] = []
    for part in _split_unescaped(selector, ","):
        term = part.strip()
        match = re.fullmatch(r"([^=!\s]+)\s*(!=|==|=)(.*)", term)
        if match is None:
            raise BadRequest(f'invalid field selector "{selector}": "{term}" is not of the form '
                             "field=value, field==value or field!=value")
        name, op, value = match.group(1), match.group(2), match.group(3).strip()
        if name not in fields:
            raise BadRequest(f'invalid field selector "{selector}": field label not supported: '
                             f"{name} (on {rt.plural}: {', '.join(fields)})")
        requirements.append(FieldRequirement(name, fields[name], op == "!=", _unescape(value)))
    return FieldSelector(tuple(requirements))


def label_selector_matches(selector: Mapping[str, Any] | None,
                           labels: Mapping[str, str] | None) -> bool:
    """A webhook's metav1.LabelSelector (`namespaceSelector`, `objectSelector`) against labels,
    by kube.nodeselectors' one implementation. The API server defaults a webhook's missing
    selector to the empty one, so None matches everything here, as `{}` does."""
    return _label_selector_matches({} if selector is None else selector, labels or {})

"""Structural schemas as the API server applies them to a write: unknown fields (refused under
`fieldValidation=Strict`, pruned otherwise), defaults, and validation (types, enums, bounds,
patterns, sizes, list sets, and the `x-kubernetes-validations` CEL rules through the project's
Kubernetes CEL library).

Custom resources get all of it, from their CRD's `openAPIV3Schema` (apiextensions-apiserver's
order: prune, default, validate the schema, then the CEL rules unless a value has the wrong
type). Built-in kinds get the unknown-field check only, against their OpenAPI schema (`openapi`):
the API server decodes them into Go types, which drop what they do not know.

Errors are worded as the API server words them (kube-openapi's validator and apiextensions'
CEL validator) and returned as `FieldError`s: nothing here raises or stores anything.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping
from typing import Any

from dra_gateway.devkit.sim.errors import FieldError, render
from dra_gateway.kube.cel import CelError, compile_expression

Schema = Mapping[str, Any]
Resolve = Callable[[Schema], Schema]
# Fields a custom resource's schema never describes: the API server handles them itself.
_ROOT_FIELDS = frozenset({"apiVersion", "kind", "metadata"})


def _no_refs(schema: Schema) -> Schema:
    return schema


def _path(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def unknown_fields(schema: Schema, obj: Any, *, resolve: Resolve = _no_refs,
                   custom: bool = False) -> list[str]:
    """The paths of `obj`'s fields `schema` does not know ("spec.cohrt"), in document order."""
    found: list[str] = []

    def walk(node: Schema, value: Any, path: str, root: bool) -> None:
        node = resolve(node)
        if node.get("x-kubernetes-preserve-unknown-fields") or \
                node.get("x-kubernetes-int-or-string"):
            return
        if isinstance(value, dict):
            properties = node.get("properties")
            extra = node.get("additionalProperties")
            if properties is None and extra is None and (
                    not custom or node.get("type") != "object"):
                return  # an untyped node (IntOrString, RawExtension): anything goes
            for key, item in value.items():
                if root and custom and key in _ROOT_FIELDS:
                    continue
                if properties is not None and key in properties:
                    walk(properties[key], item, _path(path, key), False)
                elif isinstance(extra, Mapping):
                    walk(extra, item, _path(path, key), False)
                elif extra is not True:
                    found.append(_path(path, key))
        elif isinstance(value, list) and isinstance(node.get("items"), Mapping):
            for i, item in enumerate(value):
                walk(node["items"], item, f"{path}[{i}]", False)

    walk(schema, obj, "", True)
    return found


def prune(schema: Schema, obj: Any) -> Any:
    """`obj` less the fields `schema` does not know (a custom resource's structural pruning)."""

    def walk(node: Schema, value: Any, root: bool) -> Any:
        if node.get("x-kubernetes-preserve-unknown-fields") or \
                node.get("x-kubernetes-int-or-string"):
            return value
        if isinstance(value, dict):
            properties = node.get("properties") or {}
            extra = node.get("additionalProperties")
            kept = {}
            for key, item in value.items():
                if root and key in _ROOT_FIELDS:
                    kept[key] = item
                elif key in properties:
                    kept[key] = walk(properties[key], item, False)
                elif isinstance(extra, Mapping):
                    kept[key] = walk(extra, item, False)
                elif extra is True:
                    kept[key] = item
            return kept
        if isinstance(value, list) and isinstance(node.get("items"), Mapping):
            return [walk(node["items"], item, False) for item in value]
        return value

    return walk(schema, obj, True)


def default(schema: Schema, obj: Any) -> Any:
    """`obj` with the schema's defaults filled in where a field is missing."""
    if isinstance(obj, dict):
        properties = schema.get("properties") or {}
        result = dict(obj)
        for key, node in properties.items():
            if key not in result and "default" in node:
                result[key] = node["default"]
            if key in result:
                result[key] = default(node, result[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, Mapping):
            for key in result:
                if key not in properties:
                    result[key] = default(extra, result[key])
        return result
    if isinstance(obj, list) and isinstance(schema.get("items"), Mapping):
        return [default(schema["items"], item) for item in obj]
    return obj


def _type_ok(expected: str, value: Any) -> bool:
    return {"object": lambda: isinstance(value, dict), "array": lambda: isinstance(value, list),
            "string": lambda: isinstance(value, str), "integer": lambda: _is_int(value),
            "number": lambda: _is_number(value), "boolean": lambda: isinstance(value, bool),
            }.get(expected, lambda: True)()


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if _is_int(value):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else "null"


@functools.lru_cache(maxsize=256)
def _pattern(text: str) -> re.Pattern[str]:
    return re.compile(text)


class _Validator:
    def __init__(self) -> None:
        self.errors: list[FieldError] = []
        self.type_errors = False

    def add(self, error: FieldError) -> None:
        self.errors.append(error)

    def schema(self, node: Schema, value: Any, path: str) -> None:
        """kube-openapi's validation of one value (CEL apart)."""
        if value is None:
            if not node.get("nullable"):
                self.type_errors = True
                self.add(FieldError(path, "Invalid", f'{path} in body must be of type '
                                    f'{node.get("type", "object")}: "null"', None))
            return
        int_or_string = node.get("x-kubernetes-int-or-string")
        expected = node.get("type")
        if int_or_string:
            if not (isinstance(value, str) or _is_int(value)):
                self.type_errors = True
                self.add(FieldError(path, "Invalid", f'{path} in body must be of type '
                                    f'integer or string: "{_json_type(value)}"',
                                    _json_type(value)))
                return
        elif expected and not _type_ok(str(expected), value):
            self.type_errors = True
            self.add(FieldError(path, "Invalid", f'{path} in body must be of type {expected}: '
                                f'"{_json_type(value)}"', _json_type(value)))
            return
        if "enum" in node and value not in node["enum"]:
            self.add(FieldError(path, "NotSupported", "supported values: "
                                + ", ".join(render(v) for v in node["enum"]), value))
        if _is_number(value):
            if "minimum" in node and value < node["minimum"]:
                self.add(FieldError(path, "Invalid", f"{path} in body should be greater than "
                                    f"or equal to {node['minimum']}", value))
            if "maximum" in node and value > node["maximum"]:
                self.add(FieldError(path, "Invalid", f"{path} in body should be less than or "
                                    f"equal to {node['maximum']}", value))
        if isinstance(value, str):
            if "minLength" in node and len(value) < node["minLength"]:
                self.add(FieldError(path, "Invalid", f"{path} in body should be at least "
                                    f"{node['minLength']} chars long", value))
            if "maxLength" in node and len(value) > node["maxLength"]:
                self.add(FieldError(path, "TooLong",
                                    f"may not be more than {node['maxLength']} bytes", value))
            if "pattern" in node and not _pattern(node["pattern"]).search(value):
                self.add(FieldError(path, "Invalid", f"{path} in body should match "
                                    f"'{node['pattern']}'", value))
        if isinstance(value, list):
            self._array(node, value, path)
        if isinstance(value, dict):
            self._object(node, value, path)

    def _array(self, node: Schema, value: list[Any], path: str) -> None:
        if "minItems" in node and len(value) < node["minItems"]:
            self.add(FieldError(path, "Invalid", f"{path} in body should have at least "
                                f"{node['minItems']} items", len(value)))
        if "maxItems" in node and len(value) > node["maxItems"]:
            self.add(FieldError(path, "TooMany", f"must have at most {node['maxItems']} items",
                                len(value)))
        if node.get("x-kubernetes-list-type") == "set":
            seen: list[Any] = []
            for i, item in enumerate(value):
                if item in seen:
                    self.add(FieldError(f"{path}[{i}]", "Duplicate", "", item))
                seen.append(item)
        items = node.get("items")
        if isinstance(items, Mapping):
            for i, item in enumerate(value):
                self.schema(items, item, f"{path}[{i}]")

    def _object(self, node: Schema, value: dict[str, Any], path: str) -> None:
        for key in node.get("required") or []:
            if key not in value:
                self.add(FieldError(_path(path, key), "Required", ""))
        if "minProperties" in node and len(value) < node["minProperties"]:
            self.add(FieldError(path, "Invalid", f"{path} in body should have at least "
                                f"{node['minProperties']} properties", len(value)))
        if "maxProperties" in node and len(value) > node["maxProperties"]:
            self.add(FieldError(path, "Invalid", f"{path} in body should have at most "
                                f"{node['maxProperties']} properties", len(value)))
        properties = node.get("properties") or {}
        extra = node.get("additionalProperties")
        for key, item in value.items():
            if key in properties:
                self.schema(properties[key], item, _path(path, key))
            elif isinstance(extra, Mapping):
                self.schema(extra, item, _path(path, key))

    def rules(self, node: Schema, value: Any, old: Any, path: str) -> None:
        """The `x-kubernetes-validations` of `node` and of every node below it."""
        if value is None:
            return
        for rule in node.get("x-kubernetes-validations") or []:
            self._rule(rule, node, value, old, path)
        if isinstance(value, dict):
            properties = node.get("properties") or {}
            extra = node.get("additionalProperties")
            old_map = old if isinstance(old, dict) else {}
            for key, item in value.items():
                child = properties.get(key) or (extra if isinstance(extra, Mapping) else None)
                if child is not None:
                    self.rules(child, item, old_map.get(key), _path(path, key))
        elif isinstance(value, list) and isinstance(node.get("items"), Mapping):
            for i, item in enumerate(value):
                # Items are matched to their old selves by position only for atomic lists;
                # transition rules inside lists are not checked (none of the chart's are).
                self.rules(node["items"], item, None, f"{path}[{i}]")

    def _rule(self, rule: Mapping[str, Any], node: Schema, value: Any, old: Any,
              path: str) -> None:
        text = str(rule.get("rule", ""))
        transition = re.search(r"\boldSelf\b", text) is not None
        if transition and old is None:
            return  # a transition rule checks updates only
        variables = {"self": value, **({"oldSelf": old} if transition else {})}
        message = rule.get("message") or f"failed rule: {text}"
        field = path + str(rule.get("fieldPath") or "")
        shown = node.get("type") or "object"
        try:
            compiled = compile_expression(text, variables=variables,
                                          what=f"{path or '<root>'} rule", expect=bool)
            passed = compiled.evaluate(variables)
        except CelError as exc:
            self.add(FieldError(field, "Invalid", f"{message}: {exc.reason}", shown))
            return
        if not passed:
            kind = {"FieldValueForbidden": "Forbidden", "FieldValueRequired": "Required",
                    "FieldValueDuplicate": "Duplicate"}.get(str(rule.get("reason")), "Invalid")
            if kind == "Invalid":
                self.add(FieldError(field, "Invalid", str(message), shown))
            else:
                self.add(FieldError(field, kind, str(message)))  # type: ignore[arg-type]


def validate(schema: Schema, obj: Mapping[str, Any], old: Mapping[str, Any] | None,
             *, status: bool = False) -> list[FieldError]:
    """What the API server refuses in a custom resource: its schema, then its CEL rules.

    `status` validates the status only (a write to the /status subresource). The CEL rules are
    skipped, as apiextensions skips them, when a value has the wrong type.
    """
    validator = _Validator()
    properties = schema.get("properties") or {}
    for key in ("status",) if status else [k for k in properties if k not in _ROOT_FIELDS]:
        node = properties.get(key)
        if node is None:
            continue
        if key in obj:
            validator.schema(node, obj[key], key)
        elif key in (schema.get("required") or []):
            validator.add(FieldError(key, "Required", ""))
    if validator.type_errors:
        return validator.errors
    for key in ("status",) if status else [k for k in properties if k not in _ROOT_FIELDS]:
        if key in obj and key in properties:
            validator.rules(properties[key], obj[key], (old or {}).get(key), key)
    return validator.errors

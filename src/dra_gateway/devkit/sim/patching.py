"""Patches as the API server applies them: JSON patch (RFC 6902), JSON merge patch (RFC 7386)
and a simplified strategic merge patch, and `copy_object`, the deep copy they and the store use.

A strategic merge patch merges lists by key only for the fields listed in `_MERGE_KEYS` (by
field name, whatever the type) and unions `finalizers`; other lists are replaced. Patches are
pure functions of an object and a patch: they must not touch the store, and they refuse a
malformed patch with BadRequest (Invalid for a failed `test` operation).
"""

from __future__ import annotations

from typing import Any

import jsonpatch  # type: ignore[import-untyped,unused-ignore]
import orjson

from dra_gateway.devkit.sim.errors import render
from dra_gateway.kube.cluster.port import BadRequest, Invalid, Object, PatchType


def copy_object(obj: Any) -> Any:
    """A deep copy of a JSON value (an orjson round trip: several times faster than deepcopy)."""
    try:
        return orjson.loads(orjson.dumps(obj))
    except TypeError as exc:
        raise BadRequest(f"the object is not valid JSON: {exc}") from None


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy_object(patch)
    result: dict[str, Any] = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


# Lists a strategic merge patch merges by key, by field name. Field names are not unique across
# types in general, but they are for the types this project patches (pods, nodes, claims).
_MERGE_KEYS: dict[str, str] = {
    "containers": "name", "initContainers": "name", "ephemeralContainers": "name",
    "env": "name", "volumes": "name", "volumeMounts": "mountPath", "ports": "containerPort",
    "resourceClaims": "name", "schedulingGates": "name", "imagePullSecrets": "name",
    "ownerReferences": "uid", "conditions": "type", "reservedFor": "uid",
    "resourceClaimStatuses": "name", "taints": "key",
}
# Primitive lists with patchStrategy=merge: the patch's items are added to the existing ones.
_MERGE_SETS = frozenset({"finalizers"})


def strategic_merge_patch(target: Any, patch: Any) -> Any:
    """A strategic merge patch limited to the list fields of `_MERGE_KEYS` and `_MERGE_SETS`.

    Supports the `$patch: delete|replace` directives and `$deleteFromPrimitiveList/<field>`;
    `$setElementOrder/<field>` and `$retainKeys` are accepted and ignored (order is kept as the
    merge produces it).
    """
    if not isinstance(patch, dict):
        return copy_object(patch)
    if patch.get("$patch") == "replace":
        return {k: copy_object(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    result: dict[str, Any] = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key.startswith("$setElementOrder/") or key in ("$retainKeys", "$patch"):
            continue
        if key.startswith("$deleteFromPrimitiveList/"):
            name = key.split("/", 1)[1]
            drop = set(value) if isinstance(value, list) else set()
            if isinstance(result.get(name), list):
                result[name] = [v for v in result[name] if v not in drop]
            continue
        if value is None:
            result.pop(key, None)
        elif isinstance(value, list) and key in _MERGE_KEYS and isinstance(result.get(key), list):
            result[key] = _merge_keyed_list(result[key], value, _MERGE_KEYS[key])
        elif isinstance(value, list) and key in _MERGE_SETS and isinstance(result.get(key), list):
            merged = list(result[key])
            merged.extend(v for v in value if v not in merged)
            result[key] = merged
        elif isinstance(value, dict):
            merged_value = strategic_merge_patch(result.get(key), value)
            if merged_value is None:
                result.pop(key, None)
            else:
                result[key] = merged_value
        else:
            result[key] = copy_object(value)
    return result


def _merge_keyed_list(current: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    merged = list(current)
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise BadRequest(f"strategic merge patch: every item of a list merged by "
                             f"'{merge_key}' needs a '{merge_key}' (found {render(item)})")
        position = next((i for i, have in enumerate(merged)
                         if isinstance(have, dict) and have.get(merge_key) == item[merge_key]),
                        None)
        if item.get("$patch") == "delete":
            if position is not None:
                del merged[position]
        elif position is None:
            merged.append({k: copy_object(v) for k, v in item.items() if k != "$patch"})
        else:
            merged[position] = strategic_merge_patch(merged[position], item)
    return merged


def apply_patch(obj: Object, patch: Any, patch_type: PatchType) -> Object:
    """The object after `patch`; BadRequest for a malformed patch, Invalid for a failed test."""
    if patch_type == "json":
        if not isinstance(patch, list):
            raise BadRequest("a JSON patch (RFC 6902) must be a list of operations, "
                             f"got {type(patch).__name__}")
        try:
            result = jsonpatch.JsonPatch(patch).apply(obj)
        except jsonpatch.JsonPatchTestFailed as exc:
            raise Invalid(f"the JSON patch test operation failed: {exc}") from None
        except (jsonpatch.JsonPatchException, jsonpatch.JsonPointerException, KeyError,
                IndexError, TypeError, ValueError) as exc:
            raise BadRequest(f"the JSON patch (RFC 6902) cannot be applied: {exc}") from None
    elif patch_type in ("merge", "strategic"):
        if not isinstance(patch, dict):
            raise BadRequest(f"a {patch_type} patch must be a JSON object, "
                             f"got {type(patch).__name__}")
        merge = merge_patch if patch_type == "merge" else strategic_merge_patch
        result = merge(obj, patch)
    else:
        raise BadRequest(f"unsupported patch type {patch_type!r}: use json, merge or strategic")
    if not isinstance(result, dict):
        raise BadRequest("the patch does not leave a JSON object")
    return result

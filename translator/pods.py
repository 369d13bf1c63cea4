"""The shape of a pod the translator can read: what the API server's typed decoding guarantees.

`translate` works on plain dicts and relies on their types; a pod from a manifest file or a
hand-made AdmissionReview has had no such decoding, so callers check it here first and refuse
it with the one-line problem this returns. Pure; it must not repair a pod.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def _is_str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _containers_problem(spec: dict[str, Any], key: str) -> str | None:
    containers = spec.get(key)
    if containers is None:
        return None
    if not isinstance(containers, list):
        return f"spec.{key} is not a list"
    for i, container in enumerate(containers):
        if not isinstance(container, dict) or not isinstance(container.get("name", ""), str):
            return f"spec.{key}[{i}] is not a container with a name"
        resources = container.get("resources")
        if resources is None:
            continue
        if not isinstance(resources, dict):
            return f"spec.{key}[{i}].resources is not an object"
        for part in ("limits", "requests"):
            amounts = resources.get(part)
            if amounts is not None and not (isinstance(amounts, dict) and all(
                    isinstance(v, str | int | float) and not isinstance(v, bool)
                    for v in amounts.values())):
                return f"spec.{key}[{i}].resources.{part} is not a map of quantities"
        claims = resources.get("claims")
        if claims is not None and not (isinstance(claims, list)
                                       and all(isinstance(c, dict) for c in claims)):
            return f"spec.{key}[{i}].resources.claims is not a list of objects"
    return None


def pod_shape_problem(pod: dict[str, Any]) -> str | None:
    """What makes `pod` unlike any Pod the API server could send, or None.

    The API server decodes a pod into its typed form before admission, so a real review always
    passes; this keeps hand-made or corrupted objects (a container that is a string, a limit
    that is a list) out of `translate`, which relies on the types. Only the fields the
    translator and the webhook's decisions read are checked, to stay cheap. `pod` must have a
    `spec` object.
    """
    meta = pod.get("metadata", {})
    if not isinstance(meta, dict):
        return "metadata is not an object"
    for key in ("name", "generateName", "namespace"):
        if not isinstance(meta.get(key, ""), str):
            return f"metadata.{key} is not a string"
    for key in ("annotations", "labels"):
        if meta.get(key) is not None and not _is_str_map(meta[key]):
            return f"metadata.{key} is not a map of strings"
    spec = pod["spec"]
    if not isinstance(spec.get("containers"), list):
        return "spec.containers is not a list"
    for key in ("containers", "initContainers"):
        problem = _containers_problem(spec, key)
        if problem:
            return problem
    if spec.get("nodeSelector") is not None and not _is_str_map(spec["nodeSelector"]):
        return "spec.nodeSelector is not a map of strings"
    for key in ("resourceClaims", "schedulingGates"):
        items = spec.get(key)
        if items is not None and not (isinstance(items, list) and all(
                isinstance(i, dict) and isinstance(i.get("name", ""), str)
                and all(isinstance(v, str) for v in i.values() if v is not None)
                for i in items)):
            return f"spec.{key} is not a list of objects with string fields"
    return None


def node_labels(spec: Mapping[str, Any]) -> dict[str, str]:
    """The node labels the pod pins to one value, as rules read them (`nodeSelector`): its
    `spec.nodeSelector`, and each key that every term of its required node affinity tests
    with operator In and one value, the same in each (the terms are alternatives: a key only
    some of them pin says nothing of the node). The nodeSelector wins over the affinity; a
    malformed affinity (the API server's decoding would have refused it) is ignored."""
    selector = spec.get("nodeSelector") or {}
    terms = _required_terms(spec)
    if not terms:
        return selector
    pinned: dict[str, str] | None = None
    for term in terms:
        here: dict[str, str] = {}
        for expression in term.get("matchExpressions") or ():
            if not isinstance(expression, dict):
                continue
            key, values = expression.get("key"), expression.get("values")
            if (expression.get("operator") == "In" and isinstance(key, str)
                    and isinstance(values, list) and len(values) == 1
                    and isinstance(values[0], str) and here.get(key, values[0]) == values[0]):
                here[key] = values[0]
        pinned = here if pinned is None else {
            k: v for k, v in pinned.items() if here.get(k) == v}
    if not pinned:
        return selector
    return {**pinned, **selector}


def _required_terms(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    affinity = spec.get("affinity")
    node = affinity.get("nodeAffinity") if isinstance(affinity, dict) else None
    required = (node.get("requiredDuringSchedulingIgnoredDuringExecution")
                if isinstance(node, dict) else None)
    terms = required.get("nodeSelectorTerms") if isinstance(required, dict) else None
    if not isinstance(terms, list) or not all(isinstance(t, dict) for t in terms):
        return []
    return terms

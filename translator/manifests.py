"""Rewriting manifests: every pod spec inside any Kubernetes document, translated with the rules.

Finds pod specs wherever a document embeds one (a Pod; the pod template of a Deployment,
StatefulSet, DaemonSet, ReplicaSet, Job or CronJob; custom resources such as PyTorchJob, MPIJob,
JobSet or RayJob), applies `translate` to each and collects the ResourceClaimTemplates they need,
once per namespace and name. Pure: it takes parsed documents and returns new ones; reading and
writing files is the CLI's business. The input documents are not modified.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import jsonpatch

from dra_gateway.translator.pods import pod_shape_problem
from dra_gateway.translator.rules import RuleSet
from dra_gateway.translator.translate import translate

__all__ = ["ManifestResult", "describe", "pod_specs", "rewrite_manifests"]


@dataclass
class ManifestResult:
    """Rewritten documents (same order), the templates they need, and what went wrong."""

    documents: list[Any] = field(default_factory=list)
    templates: list[dict[str, Any]] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    translated: int = 0


def _is_pod_like(value: Any) -> bool:
    spec = value.get("spec") if isinstance(value, dict) else None
    return isinstance(spec, dict) and isinstance(spec.get("containers"), list)


def pod_specs(document: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, pod-like object) for every object with `spec.containers` in `document`.

    A pod-like object is a Pod or a pod template (`metadata` + `spec`); the walk does not look
    inside one, since pods do not nest.
    """
    if isinstance(document, dict):
        if _is_pod_like(document):
            yield path, document
            return
        for key, value in document.items():
            if isinstance(value, (dict, list)):
                yield from pod_specs(value, f"{path}.{key}" if path else str(key))
    elif isinstance(document, list):
        for index, value in enumerate(document):
            if isinstance(value, (dict, list)):
                yield from pod_specs(value, f"{path}[{index}]")


def describe(document: Any, index: int) -> str:
    """How messages name a document: `Deployment team-a/train`, or its position."""
    if isinstance(document, dict):
        kind = document.get("kind") or "document"
        metadata = document.get("metadata") or {}
        name = metadata.get("name") or metadata.get("generateName") or f"#{index + 1}"
        namespace = metadata.get("namespace")
        return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"
    return f"document #{index + 1}"


def rewrite_manifests(documents: Iterable[Any], rules: RuleSet) -> ManifestResult:
    """Translate every pod spec of every document; refused documents come back unchanged."""
    result = ManifestResult()
    seen: set[tuple[str, str]] = set()
    for index, document in enumerate(documents):
        found = list(pod_specs(document))
        if not found:
            result.documents.append(document)
            continue
        namespace = ""
        if isinstance(document, dict):
            namespace = (document.get("metadata") or {}).get("namespace") or ""
        label = describe(document, index)
        rewritten = copy.deepcopy(document)
        targets = list(pod_specs(rewritten))
        refused = False
        templates: list[dict[str, Any]] = []
        changed = False
        for (path, pod), (_, target) in zip(found, targets, strict=True):
            where = f"{label} ({path})" if path else label
            view = pod
            if namespace and not (pod.get("metadata") or {}).get("namespace"):
                # A pod template takes its namespace from the document that holds it.
                view = {**pod, "metadata": {**(pod.get("metadata") or {}),
                                            "namespace": namespace}}
            problem = pod_shape_problem(view)
            if problem is not None:
                result.refusals.append(f"{where}: the pod's {problem}; it is not a valid pod "
                                       f"spec")
                refused = True
                continue
            plan = translate(view, rules)
            result.warnings.extend(f"{where}: {w}" for w in plan.warnings)
            if plan.refusal is not None:
                result.refusals.append(f"{where}: {plan.refusal.message}")
                refused = True
                continue
            if plan.patch:
                if view is not pod and "metadata" not in pod:
                    # The patch assumed the namespaced view's metadata exists.
                    target["metadata"] = {}
                jsonpatch.apply_patch(target, plan.patch, in_place=True)
                changed = True
            templates.extend(plan.templates)
        if refused or not changed:
            result.documents.append(document)
            continue
        result.documents.append(rewritten)
        result.translated += 1
        for template in templates:
            key = (template["metadata"].get("namespace", ""), template["metadata"]["name"])
            if key not in seen:
                seen.add(key)
                result.templates.append(template)
    return result

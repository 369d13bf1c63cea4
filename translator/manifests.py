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

from dra_gateway.translator.extended import ExtendedResources
from dra_gateway.translator.pods import pod_shape_problem
from dra_gateway.translator.rules import RuleSet
from dra_gateway.translator.translate import TranslationPlan, translate

__all__ = ["ManifestResult", "PodTranslation", "describe", "pod_specs", "rewrite_manifests"]


@dataclass(frozen=True, slots=True)
class PodTranslation:
    """One pod spec found in the documents: where, the pod as translated (a pod template with
    the namespace of the object holding it), and its plan, or why it is no valid pod."""

    where: str
    pod: dict[str, Any]
    plan: TranslationPlan | None
    problem: str = ""


@dataclass
class ManifestResult:
    """Rewritten documents (same order), the templates they need, and what went wrong."""

    documents: list[Any] = field(default_factory=list)
    templates: list[dict[str, Any]] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    translated: int = 0
    pods: list[PodTranslation] = field(default_factory=list)  # every pod spec, in order


def _is_pod_like(value: Any) -> bool:
    spec = value.get("spec") if isinstance(value, dict) else None
    return isinstance(spec, dict) and isinstance(spec.get("containers"), list)


def pod_specs(document: Any, path: str = "") -> Iterator[tuple[str, dict[str, Any]]]:
    """(path, pod-like object) for every object with `spec.containers` in `document`.

    A pod-like object is a Pod or a pod template (`metadata` + `spec`); the walk does not look
    inside one, since pods do not nest.
    """
    for found_path, pod, _ in _pod_specs(document, path, None):
        yield found_path, pod


def _pod_specs(document: Any, path: str, owner: dict[str, Any] | None
               ) -> Iterator[tuple[str, dict[str, Any], dict[str, Any] | None]]:
    """As `pod_specs`, with the innermost Kubernetes object (apiVersion and kind) holding each
    pod-like object: the item of a `kind: List`, say, whose namespace a pod template takes."""
    if isinstance(document, dict):
        if "apiVersion" in document and "kind" in document:
            owner = document
        if _is_pod_like(document):
            yield path, document, owner
            return
        for key, value in document.items():
            if isinstance(value, (dict, list)):
                yield from _pod_specs(value, f"{path}.{key}" if path else str(key), owner)
    elif isinstance(document, list):
        for index, value in enumerate(document):
            if isinstance(value, (dict, list)):
                yield from _pod_specs(value, f"{path}[{index}]", owner)


def _namespace_of(obj: dict[str, Any] | None) -> str:
    metadata = obj.get("metadata") if obj is not None else None
    namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    return namespace if isinstance(namespace, str) else ""


def describe(document: Any, index: int) -> str:
    """How messages name a document: `Deployment team-a/train`, or its position."""
    if isinstance(document, dict):
        kind = document.get("kind") or "document"
        metadata = document.get("metadata")
        if not isinstance(metadata, dict):
            metadata = {}  # a malformed document is still named, by its position
        name = metadata.get("name") or metadata.get("generateName") or f"#{index + 1}"
        namespace = metadata.get("namespace")
        return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"
    return f"document #{index + 1}"


def rewrite_manifests(documents: Iterable[Any], rules: RuleSet, *,
                      extended: ExtendedResources | None = None,
                      mig_shares: bool = False) -> ManifestResult:
    """Translate every pod spec of every document; refused documents come back unchanged.

    `extended`: the names the cluster's DeviceClasses declare as spec.extendedResourceName,
    left to kube-scheduler as the webhook leaves them (see `translate`); `mig_shares`: shares
    are served by MIG instances, as in a namespace whose GPUSharingPolicy says so."""
    result = ManifestResult()
    seen: set[tuple[str, str]] = set()
    for index, document in enumerate(documents):
        found = list(_pod_specs(document, "", None))
        if not found:
            result.documents.append(document)
            continue
        rewritten = copy.deepcopy(document)
        targets = list(pod_specs(rewritten))
        refused = False
        templates: list[dict[str, Any]] = []
        changed = False
        for (path, pod, owner), (_, target) in zip(found, targets, strict=True):
            # Named after the object that holds the pod (an item of a List is its own object).
            label = describe(owner if owner is not None else document, index)
            where = f"{label} ({path})" if path else label
            namespace = _namespace_of(owner)
            view = pod
            if namespace and not _namespace_of(pod):
                # A pod template takes its namespace from the object that holds it.
                metadata = pod.get("metadata")
                view = {**pod, "metadata": {**(metadata if isinstance(metadata, dict) else {}),
                                            "namespace": namespace}}
            problem = pod_shape_problem(view)
            if problem is not None:
                result.refusals.append(f"{where}: the pod's {problem}; it is not a valid pod "
                                       f"spec")
                result.pods.append(PodTranslation(where, view, None, problem))
                refused = True
                continue
            plan = translate(view, rules, extended=extended, mig_shares=mig_shares)
            result.pods.append(PodTranslation(where, view, plan))
            result.warnings.extend(f"{where}: {w}" for w in plan.warnings)
            if plan.refusal is not None:
                result.refusals.append(f"{where}: {plan.refusal.message}")
                refused = True
                continue
            if plan.patch:
                if view is not pod and not isinstance(pod.get("metadata"), dict):
                    # The patch assumed the namespaced view's metadata exists (the template
                    # may have none, or an empty `metadata:`).
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

"""The /mutate decision: from a pod and the rules in force to a patch or a refusal.

The translator does the work (and caches it per request shape on the rule set); this module
turns its plan into what a response carries: the base64 JSON patch, warnings, audit
annotations, the templates to make exist, or a refusal with a Status code and reason, plus the
legacy names left to kube-scheduler because a DeviceClass declares them (for the app's log and
metrics). It is pure apart from reading the `class_lookup` it is handed; making templates exist
is `templates`, and answering the HTTP request is `app`.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from dra_gateway.translator.extended import ExtendedResources, ExtendedResourceUse
from dra_gateway.translator.rules import RuleSet
from dra_gateway.translator.translate import ClassLookup, Untranslated, translate
from dra_gateway.webhook.reviews import Refusal, encode_patch

# A pod the rules cannot honour is a request the user must change, not a server failure.
REFUSED_CODE = 403
REFUSED_REASON = "Forbidden"


@dataclass(frozen=True, slots=True)
class Mutation:
    patch: str | None = None  # base64 RFC 6902, None when nothing changes
    templates: tuple[dict[str, Any], ...] = ()
    refusal: Refusal | None = None
    warnings: tuple[str, ...] = ()
    audit: Mapping[str, str] = field(default_factory=dict)
    rules_applied: tuple[str, ...] = ()
    # Resources a DeviceClass declares as spec.extendedResourceName: deferred or translated.
    extended: tuple[ExtendedResourceUse, ...] = ()
    # Known legacy names left in the pod because their rule is disabled (each with a warning).
    untranslated: tuple[Untranslated, ...] = ()


NO_CHANGE = Mutation()

# Pods are a few KiB; a huge one is decided uncached so the cache stays within a few MiB.
MAX_CACHED_POD_BYTES = 32 * 1024


class PlanCache:
    """Decisions per distinct pod, for one generation of the rules and DeviceClasses.

    Replicas of one workload arrive as byte-identical pods (a generateName, no name), so the
    serialised pod and its namespace make an exact key: a hit skips the shape check and the
    translation. Pods naming their own claims are not cached (their decision depends on the
    classes of those claims, which can change). Bounded; a full cache is dropped whole, as
    shapes repeat heavily and recency tracking would cost more than it saves.
    """

    def __init__(self, size: int = 2048) -> None:
        self._size = size
        self._generation: Hashable = None
        self._entries: dict[bytes, Mutation] = {}

    @staticmethod
    def key(pod: Mapping[str, Any], namespace: str) -> bytes | None:
        spec = pod.get("spec")
        if isinstance(spec, dict) and spec.get("resourceClaims"):
            return None
        try:
            text = orjson.dumps(pod)
        except TypeError:  # not JSON-shaped (e.g. an integer beyond 64 bits): decide uncached
            return None
        if len(text) > MAX_CACHED_POD_BYTES:
            return None
        return namespace.encode() + b"\0" + text

    def get(self, key: bytes, generation: Hashable) -> Mutation | None:
        if generation != self._generation:
            self._entries.clear()
            self._generation = generation
            return None
        return self._entries.get(key)

    def put(self, key: bytes, generation: Hashable, mutation: Mutation) -> None:
        if generation != self._generation:
            self._entries.clear()
            self._generation = generation
        if len(self._entries) >= self._size:
            self._entries.clear()
        self._entries[key] = mutation


def decide(pod: Mapping[str, Any], namespace: str, rules: RuleSet, *,
           class_lookup: ClassLookup | None = None,
           extended: ExtendedResources | None = None) -> Mutation:
    """What /mutate answers for a pod being created in `namespace`; `extended`: the names the
    cluster's DeviceClasses declare as spec.extendedResourceName (see `translate`)."""
    meta = pod.get("metadata")
    # The patch applies to the pod as sent: metadata added here must be added by it too.
    made_metadata: list[dict[str, Any]] = []
    if namespace and (not isinstance(meta, dict) or not meta.get("namespace")):
        # The API server fills the namespace in before admission; a review built by hand may
        # not, and the templates must land in the pod's namespace all the same.
        pod = {**pod, "metadata": {**(meta if isinstance(meta, dict) else {}),
                                   "namespace": namespace}}
        if not isinstance(meta, dict):
            made_metadata.append({"op": "add", "path": "/metadata", "value": {}})
    plan = translate(pod, rules, class_lookup=class_lookup, extended=extended)
    warnings = tuple(plan.warnings)
    applied = tuple(plan.rules_applied)
    uses = tuple(plan.extended)
    untranslated = tuple(plan.untranslated)
    if plan.refusal is not None:
        return Mutation(
            refusal=Refusal(REFUSED_CODE, REFUSED_REASON, plan.refusal.message),
            warnings=warnings, rules_applied=applied,
            audit={"refused-by-rule": plan.refusal.rule} if plan.refusal.rule else {},
        )
    if not plan.patch:
        return Mutation(warnings=warnings, extended=uses, untranslated=untranslated) \
            if warnings or uses else NO_CHANGE
    audit: dict[str, str] = {}
    if applied:
        audit["translated-by"] = ",".join(applied)
    if plan.templates:
        audit["resource-claim-templates"] = ",".join(
            t["metadata"]["name"] for t in plan.templates)
    return Mutation(
        patch=encode_patch([*made_metadata, *plan.patch]),
        templates=tuple(plan.templates),
        warnings=warnings,
        audit=audit,
        rules_applied=applied,
        extended=uses,
        untranslated=untranslated,
    )

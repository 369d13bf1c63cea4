"""The /mutate decision: from a pod and the rules in force to a patch or a denial.

The translator does the work (and caches it per request shape on the rule set), once per pod;
this module turns its plan into what a response carries: the base64 JSON patch, warnings, audit
annotations, or a denial with a Status code and reason. The `Mutation` keeps the plan itself
for what the app reads of it (the templates to make exist, the rules that applied, the legacy
names left to kube-scheduler because a DeviceClass declares them). It is pure apart from
reading the `class_lookup` it is handed; making templates exist is `templates`, and answering
the HTTP request is `app`.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from dra_gateway.kube import names
from dra_gateway.kube.api_rules import claim_spec_problems
from dra_gateway.translator.explaining import explain
from dra_gateway.translator.extended import ExtendedResources, ExtendedResourceUse
from dra_gateway.translator.rules import RuleSet
from dra_gateway.translator.translate import (
    ClassLookup,
    TranslationPlan,
    Untranslated,
    translate,
)
from dra_gateway.translator.wording import summary_lines
from dra_gateway.webhook import translation
from dra_gateway.webhook.reviews import Denial, encode_patch
from dra_gateway.webhook.translation import NamespaceMode

# A pod the rules cannot honour is a request the user must change, not a server failure.
REFUSED_CODE = 403
REFUSED_REASON = "Forbidden"
# A pod whose own translation annotation cannot be read is malformed input.
INVALID_CODE = 422
INVALID_REASON = "Invalid"
# Heads each audit-mode warning, so that it reads apart from the API server's own.
AUDIT_PREFIX = "dra-gateway audit: "


@dataclass(frozen=True, slots=True)
class Mutation:
    """What /mutate answers for a pod, and the translation it answers from."""

    patch: str | None = None  # base64 RFC 6902, None when nothing changes
    denial: Denial | None = None
    warnings: tuple[str, ...] = ()
    audit: Mapping[str, str] = field(default_factory=dict)
    # The pod's translation mode: enabled, or why its legacy requests were left as they are
    # (audit, disabled by its annotation).
    mode: str = names.TRANSLATION_ENABLED
    # The translation carried out (the mode enabled), or the one the pod was held back from
    # (audit mode says it; its legacy requests stay); None where there is nothing of it to tell.
    translation: TranslationPlan | None = None
    held_back_from: TranslationPlan | None = None

    @property
    def templates(self) -> Sequence[dict[str, Any]]:
        """The ResourceClaimTemplates to make exist before the pod is admitted."""
        return self.translation.templates if self.translation is not None else ()

    @property
    def rules_applied(self) -> Sequence[str]:
        return self.translation.rules_applied if self.translation is not None else ()

    @property
    def extended(self) -> Sequence[ExtendedResourceUse]:
        """Resources a DeviceClass declares as spec.extendedResourceName: deferred or
        translated."""
        return self.translation.extended if self.translation is not None else ()

    @property
    def would_apply(self) -> Sequence[str]:
        """The rules audit mode says would apply."""
        if self.held_back_from is None or self.mode != names.TRANSLATION_AUDIT:
            return ()
        return self.held_back_from.rules_applied

    @property
    def untranslated(self) -> Sequence[Untranslated]:
        """Known legacy names left in the pod because their rule is disabled (each with a
        warning)."""
        plan = self.translation if self.translation is not None else self.held_back_from
        return plan.untranslated if plan is not None else ()


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
    def key(pod: Mapping[str, Any], namespace: str, mode: str = "") -> bytes | None:
        spec = pod.get("spec")
        if isinstance(spec, dict) and spec.get("resourceClaims"):
            return None
        try:
            text = orjson.dumps(pod)
        except TypeError:  # not JSON-shaped (e.g. an integer beyond 64 bits): decide uncached
            return None
        if len(text) > MAX_CACHED_POD_BYTES:
            return None
        return f"{mode}\0{namespace}\0".encode() + text

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
           extended: ExtendedResources | None = None,
           mode: NamespaceMode = names.TRANSLATION_ENABLED,
           namespace_label: str | None = None, opt_out: bool = False,
           mig_shares: bool = False) -> Mutation:
    """What /mutate answers for a pod being created in `namespace`; `extended`: the names the
    cluster's DeviceClasses declare as spec.extendedResourceName (see `translate`); `mode`:
    the namespace's translation mode, which the webhook configuration's namespaceSelectors
    tell through the path the API server calls (see `translation`), and `namespace_label` its
    label's value where the webhook knows it (for the warning of an unknown value); `opt_out`:
    whether the namespace grants its pods to hold themselves back from translation;
    `mig_shares`: its GPU sharing policies serve shares with MIG instances."""
    held = translation.held_back(pod, namespace, mode, namespace_label=namespace_label,
                                 opt_out=opt_out)
    if held.refusal is not None:
        if held.forbidden:
            return Mutation(denial=Denial(REFUSED_CODE, REFUSED_REASON, held.refusal))
        return Mutation(denial=Denial(INVALID_CODE, INVALID_REASON, held.refusal))
    if held.mode != names.TRANSLATION_ENABLED:
        return _held(pod, namespace, rules, held, class_lookup=class_lookup, extended=extended,
                     mig_shares=mig_shares)
    return _translated(pod, namespace, rules, class_lookup=class_lookup, extended=extended,
                       mig_shares=mig_shares)


def _held(pod: Mapping[str, Any], namespace: str, rules: RuleSet, held: translation.Held, *,
          class_lookup: ClassLookup | None, extended: ExtendedResources | None,
          mig_shares: bool) -> Mutation:
    """A pod admitted with its legacy requests as they are: what translation would do is said
    (in audit mode) but not done; a pod whose own claims use a gateway class is still gated."""
    made_metadata = _metadata_made(pod, namespace)
    pod = _with_namespace(pod, namespace)
    would = translate(pod, rules, class_lookup=class_lookup, extended=extended,
                      mig_shares=mig_shares)
    audit = {"translation": held.mode}
    warnings = list(held.warnings)
    if held.mode == names.TRANSLATION_AUDIT:
        warnings += _audit(pod, rules, would, audit)
    warnings += [w for w in would.warnings if w not in warnings]
    return Mutation(
        patch=encode_patch([*made_metadata, *would.held_patch]) if would.held_patch else None,
        warnings=tuple(warnings), audit=audit, mode=held.mode, held_back_from=would)


def _audit(pod: Mapping[str, Any], rules: RuleSet, would: TranslationPlan,
           audit: dict[str, str]) -> list[str]:
    """What audit mode says the translation would do: the audit annotations (added to
    `audit`), and the warnings it returns."""
    warnings = []
    if would.refusal is not None or would.templates:
        warnings += summary_lines(explain(pod, rules, plan=would), prefix=AUDIT_PREFIX)
    if would.refusal is not None:
        audit["would-be-refused"] = would.refusal.message
    if would.rules_applied:
        audit["would-translate-by"] = ",".join(would.rules_applied)
    if would.templates:
        audit["would-use-resource-claim-templates"] = ",".join(
            t["metadata"]["name"] for t in would.templates)
    return warnings


def _with_namespace(pod: Mapping[str, Any], namespace: str) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    if namespace and (not isinstance(meta, dict) or not meta.get("namespace")):
        # The API server fills the namespace in before admission; a review built by hand may
        # not, and the templates must land in the pod's namespace all the same.
        return {**pod, "metadata": {**(meta if isinstance(meta, dict) else {}),
                                    "namespace": namespace}}
    return pod


def _metadata_made(pod: Mapping[str, Any], namespace: str) -> list[dict[str, Any]]:
    """The patch applies to the pod as sent: metadata `_with_namespace` adds must be added by
    it too."""
    return [] if not namespace or isinstance(pod.get("metadata"), dict) else [
        {"op": "add", "path": "/metadata", "value": {}}]


def _translated(pod: Mapping[str, Any], namespace: str, rules: RuleSet, *,
                class_lookup: ClassLookup | None,
                extended: ExtendedResources | None, mig_shares: bool) -> Mutation:
    made_metadata = _metadata_made(pod, namespace)
    pod = _with_namespace(pod, namespace)
    plan = translate(pod, rules, class_lookup=class_lookup, extended=extended,
                     mig_shares=mig_shares)
    warnings = tuple(plan.warnings)
    if plan.refusal is not None:
        return Mutation(
            denial=Denial(REFUSED_CODE, REFUSED_REASON, plan.refusal.message),
            warnings=warnings,
            audit={"refused-by-rule": plan.refusal.rule} if plan.refusal.rule else {},
        )
    if not plan.patch:
        return Mutation(warnings=warnings, translation=plan) \
            if warnings or plan.extended else NO_CHANGE
    problems = [f"ResourceClaimTemplate {t['metadata']['name']}: {problem}"
                for t in plan.templates for problem in claim_spec_problems(t["spec"]["spec"],
                                                                           "spec.spec")]
    if problems:
        # What the API refuses from 1.38 is never sent (the translator's amounts never make
        # it: this guards a change there from a create every controller would retry).
        return Mutation(denial=Denial(INVALID_CODE, INVALID_REASON, (
            "the pod's translation is not one the API accepts (" + "; ".join(problems)
            + "); check the amounts of its legacy resources and the rules that translated "
              "them (dra-gateway translate --explain)")), warnings=warnings)
    audit: dict[str, str] = {}
    if plan.rules_applied:
        audit["translated-by"] = ",".join(plan.rules_applied)
    if plan.templates:
        audit["resource-claim-templates"] = ",".join(
            t["metadata"]["name"] for t in plan.templates)
    return Mutation(patch=encode_patch([*made_metadata, *plan.patch]), warnings=warnings,
                    audit=audit, translation=plan)

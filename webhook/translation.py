"""Whether a pod is translated: its namespace's mode and its own annotation, per review.

A cluster moves to the gateway namespace by namespace (ARCHITECTURE.md, "Moving a live
cluster"). The namespace label `dra-gateway.io/translation` says `enabled`, `audit` or
`disabled`; the webhook configurations' namespaceSelectors turn it into the path the API server
calls (`webhook/config.py`), so a review says its namespace's mode without the webhook reading
the namespace, and a label changed a moment ago counts at once. Namespaces without the label get
the install's default; a `disabled` one is never sent. A namespace whose label has any other
value is sent too, as `unknown`: its pods are admitted unchanged, with a warning naming the
label and the fix, never read as `enabled`.

A pod's annotation of the same name can only hold its own pod back: `disabled` keeps its legacy
requests as they are, `audit` says what translation would do without doing it; `enabled` on a
pod in an `audit` namespace changes nothing (a namespace's administrator stages the move, not
each workload). Holding a pod back in an `enabled` namespace is the namespace administrator's to
grant, not the tenant's: a legacy pod escapes the gateway's sharing policies, so the annotation
is honoured only where the namespace carries the label `dra-gateway.io/pod-opt-out: allowed`
(or the webhook runs with `--pod-opt-out=everywhere`), and refused elsewhere with the fix. An
annotation with another value is refused where the pod would be translated, and warned about
where it would not (audit mode promises to change nothing).

Pure: no I/O. The webhook's handlers pass the path's mode in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from dra_gateway.kube import names
from dra_gateway.webhook.reviews import display_name

NamespaceMode = Literal["enabled", "audit", "unknown"]
NAMESPACE_UNKNOWN: Final = "unknown"
NAMESPACE_MODES: Final[tuple[NamespaceMode, ...]] = (
    names.TRANSLATION_ENABLED, names.TRANSLATION_AUDIT, NAMESPACE_UNKNOWN)

# How far each mode holds a pod back: the stricter of namespace and pod wins.
_STRICTNESS: Final = {names.TRANSLATION_ENABLED: 0, names.TRANSLATION_AUDIT: 1,
                      names.TRANSLATION_DISABLED: 2}
_MODES_TEXT: Final = ", ".join(names.TRANSLATION_MODES)


@dataclass(frozen=True, slots=True)
class Held:
    """The mode a pod is admitted under (enabled, audit or disabled), the warnings that go with
    it, or the refusal of a pod whose annotation cannot be read."""

    mode: str
    warnings: tuple[str, ...] = ()
    refusal: str | None = None
    # What is wrong with the pod's annotation (refused or warned about), "" when nothing.
    bad_annotation: str = ""
    # The refusal is of an opt-out the namespace does not grant (not of an unreadable value).
    forbidden: bool = False


ENABLED: Final = Held(names.TRANSLATION_ENABLED)


def pod_annotation(pod: Mapping[str, Any]) -> object:
    """The pod's `dra-gateway.io/translation` annotation, None when it has none."""
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, dict) else None
    return annotations.get(names.TRANSLATION_LABEL) if isinstance(annotations, dict) else None


def bad_annotation_message(pod: Mapping[str, Any], namespace: str, value: object) -> str:
    """What a pod whose translation annotation has an unknown value is told."""
    meta = pod.get("metadata")
    name = display_name("pod", namespace, meta if isinstance(meta, dict) else {})
    return (f"{name}: metadata.annotations"
            f"[{json.dumps(names.TRANSLATION_LABEL)}] is {json.dumps(value)}, which is none of "
            f"{_MODES_TEXT}; set it to disabled to keep this pod's legacy GPU requests as they "
            f"are, to audit to see what translation would do, or remove it")


def unknown_namespace_warning(namespace: str, value: str | None) -> str:
    """What a pod created in a namespace whose label has an unknown value is told."""
    said = f"is {json.dumps(value)}" if value is not None else "has a value"
    return (f"dra-gateway: namespace {namespace} label {names.TRANSLATION_LABEL} {said}, which "
            f"is none of {_MODES_TEXT}: the pod was admitted unchanged, as in audit mode; set the "
            f"label to one of them")


def opt_out_refused_message(pod: Mapping[str, Any], namespace: str, value: str) -> str:
    """What a pod that holds itself back where its namespace does not grant it is told."""
    meta = pod.get("metadata")
    name = display_name("pod", namespace, meta if isinstance(meta, dict) else {})
    label = f"{names.POD_OPT_OUT_LABEL}={names.POD_OPT_OUT_ALLOWED}"
    return (f"{name}: metadata.annotations[{json.dumps(names.TRANSLATION_LABEL)}] is "
            f"{json.dumps(value)}, but namespace {namespace} does not let its pods opt out of "
            f"translation (a legacy pod escapes the namespace's GPU policies); remove the "
            f"annotation, or have a cluster administrator grant it: kubectl label namespace "
            f"{namespace} {label}")


def held_back(pod: Mapping[str, Any], namespace: str, mode: NamespaceMode, *,
              namespace_label: str | None = None, opt_out: bool = False) -> Held:
    """The mode `pod` is admitted under in a namespace of `mode` (whose label reads
    `namespace_label`, when known, for the warning of an unknown value); `opt_out`: whether the
    namespace grants its pods to hold themselves back where it is enabled."""
    warnings: list[str] = []
    effective: str = mode
    if mode == NAMESPACE_UNKNOWN:
        warnings.append(unknown_namespace_warning(namespace, namespace_label))
        effective = names.TRANSLATION_AUDIT
    value = pod_annotation(pod)
    if value is None:
        return ENABLED if effective == names.TRANSLATION_ENABLED else Held(effective,
                                                                           tuple(warnings))
    if not isinstance(value, str) or value not in _STRICTNESS:
        message = bad_annotation_message(pod, namespace, value)
        if effective == names.TRANSLATION_ENABLED:
            return Held(effective, refusal=message, bad_annotation=message)
        return Held(effective, (*warnings, "dra-gateway: " + message), bad_annotation=message)
    if _STRICTNESS[value] > _STRICTNESS[effective]:
        if effective == names.TRANSLATION_ENABLED and not opt_out:
            message = opt_out_refused_message(pod, namespace, value)
            return Held(effective, refusal=message, bad_annotation=message, forbidden=True)
        effective = value
    return Held(effective, tuple(warnings))

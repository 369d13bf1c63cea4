"""An explanation in words: the indented text of `dra-gateway translate --explain`, and the
one-line summaries per container that audit mode returns as admission warnings.

Pure: it formats what `explaining.explain` found and decides nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from dra_gateway.kube import names
from dra_gateway.translator.errors import quote
from dra_gateway.translator.explaining import KeyUse, PodExplanation, bytes_text

__all__ = ["render_text", "summary_lines"]


def render_text(where: str, explanation: PodExplanation) -> list[str]:
    """The explanation as indented lines of text, headed by `where` (the object and path)."""
    head = {
        "translated": f"translated: ResourceClaimTemplate {explanation.template}"
                      + (f", scheduling gate {names.SCHEDULING_GATE}" if explanation.gated
                         else ""),
        "unchanged": "left unchanged" + (f" (scheduling gate {names.SCHEDULING_GATE} added)"
                                         if explanation.gated else ""),
        "refused": "refused: " + explanation.refusal,
        "translated-before": f"translated before ({names.ANNOTATION_TRANSLATED})",
    }[explanation.outcome]
    lines = [f"{where}: {head}"]
    if explanation.group:
        lines.append(f"  {explanation.group}")
    for c in explanation.containers:
        label = f"{'' if c.kind == 'container' else c.kind + ' '}{quote(c.name)}"
        if c.outcome in ("translated", "shares-request"):
            lines.append(f"  container {label}: rule {c.rule} ({c.source}) -> request "
                         f"{quote(c.request)}")
            if c.why:
                lines.append(f"    {c.why}")
        else:
            rule = f" (rule {c.rule})" if c.rule and c.outcome != "refused" else ""
            lines.append(f"  container {label}: {_OUTCOME_WORDS[c.outcome]}{rule}: {c.why}")
        for key in c.keys:
            lines.append("    " + _key_line(key))
        if c.device is not None:
            lines.append("    device: " + _device_line(c.device) + _alternatives(c.alternatives))
            for position, selector in enumerate(c.device.get("selectors") or (), start=1):
                lines.append(f"      selector {position}: {selector['cel']['expression']}")
        for constraint in c.constraints:
            lines.append(f"    constraint: matchAttribute {constraint['matchAttribute']}")
        if c.config is not None:
            lines.append("    config: GpuShareConfig " + ", ".join(
                f"{k} {bytes_text(v) if k == 'memory' else v}" for k, v in c.config.items()
                if k not in ("apiVersion", "kind")))
        for item in c.left:
            lines.append(f"    left {item.resource}: {item.reason}")
        for warning in c.warnings:
            lines.append(f"    warning: {warning}")
    said = {w for c in explanation.containers for w in c.warnings}
    for warning in explanation.warnings:
        if warning not in said:
            lines.append(f"  warning: {warning}")
    return lines


def summary_lines(explanation: PodExplanation, *, prefix: str = "") -> list[str]:
    """One short line per container that asks for a GPU resource, saying what it would become
    and by which rule (or why it would stay as it is); a refused pod gets one line. For the
    warnings of a namespace in audit mode, which the API server shows to whoever created the
    pod: each line, `prefix` first, stays within the 256 characters a warning keeps."""
    if explanation.outcome == "refused":
        return [_clip(prefix + f"would be refused: {explanation.refusal}")]
    lines = []
    for c in explanation.containers:
        if c.outcome in ("no-gpu", "translated-before"):
            continue
        label = f"{'' if c.kind == 'container' else c.kind + ' '}{quote(c.name)}"
        keys = ", ".join(f"{k.key}: {k.value}" for k in c.keys if k.kind == "resource")
        if c.outcome in ("translated", "shares-request") and c.device is not None:
            lines.append(_clip(
                prefix + f"container {label} ({keys}) would get {_device_line(c.device)}"
                f"{_alternatives(c.alternatives)} by rule "
                f"{c.rule}, from ResourceClaimTemplate {explanation.template}"))
        else:
            lines.append(_clip(prefix + f"container {label} would stay untranslated: {c.why}"))
    return lines


_WARNING_LIMIT: Final = 256


def _clip(text: str) -> str:
    return text if len(text) <= _WARNING_LIMIT else text[:_WARNING_LIMIT - 3] + "..."


_OUTCOME_WORDS: Final = {
    "no-rule": "not translated", "zero": "not translated", "deferred": "not translated",
    "refused": "refused", "no-gpu": "nothing to translate",
    "translated-before": "not translated",
}


def _key_line(key: KeyUse) -> str:
    if key.kind == "resource":
        amount = ""
        if key.unit and key.amount is not None:
            amount = f" (x {key.unit} = {bytes_text(key.amount)})"
        text = f"{key.key}: {key.value}{amount}"
    else:
        text = f"{key.kind} {key.key}: {quote(key.value)}"
    became = ", ".join(key.became) if key.became else \
        "removed; nothing in the claim depends on it" if key.kind == "resource" else \
        "nothing in the claim depends on it"
    return f"{text} -> {became}"


def _alternatives(names: Sequence[str]) -> str:
    """What follows the device line of a request with alternatives (firstAvailable)."""
    if not names:
        return ""
    return (f" (alternative {names[0]}, the first of {len(names)} offered in order: "
            f"{', '.join(names)})")


def _device_line(exactly: Mapping[str, Any]) -> str:
    count = exactly["count"]
    text = f"{count} {'device' if count == 1 else 'devices'} of class {exactly['deviceClassName']}"
    capacity = (exactly.get("capacity") or {}).get("requests") or {}
    if capacity:
        text += ", capacity " + ", ".join(f"{k} {v}" for k, v in capacity.items())
    return text

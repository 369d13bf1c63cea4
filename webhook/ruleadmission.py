"""The /validate-rules decision: a rules ConfigMap that would not load is refused when written.

The ValidatingWebhookConfiguration sends CREATE and UPDATE of ConfigMaps labelled
`dra-gateway.io/rules=true` in the gateway's namespace here. The ConfigMap's data is loaded as
the rule store would load it beside the ConfigMaps in force (`RuleStore.check_config_map`), and a
load error refuses the write with the translator's message, field paths included, as Kyverno
refuses a broken policy. Without this, a broken ConfigMap is only refused when the webhook reads
it, after the write succeeded, and every replica stays unready until it is fixed.

Pure apart from the store it is handed; it must not perform I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

from dra_gateway.kube import names
from dra_gateway.webhook.reviews import Denial, Review
from dra_gateway.webhook.rulestore import RuleStore

INVALID_CODE = 422


@dataclass(frozen=True, slots=True)
class RulesVerdict:
    denial: Denial | None


def decide(review: Review, store: RuleStore, *, namespace: str) -> RulesVerdict:
    """Whether the ConfigMap under review may be written."""
    if review.operation not in ("CREATE", "UPDATE") or review.sub_resource:
        return RulesVerdict(None)
    meta = review.object.get("metadata")
    meta = meta if isinstance(meta, dict) else {}
    labels = meta.get("labels")
    labelled = isinstance(labels, dict) and labels.get(names.RULES_LABEL) == names.RULES_LABEL_VALUE
    if review.namespace != namespace or not labelled:
        # Not read by the gateway: the label was removed, or another namespace's ConfigMap.
        return RulesVerdict(None)
    name = review.name or str(meta.get("name") or "")
    data = review.object.get("data")
    if data is not None and not isinstance(data, dict):
        return RulesVerdict(Denial(INVALID_CODE, "Invalid",
                                    f"rules ConfigMap {namespace}/{name}: data is not a mapping"))
    error = store.check_config_map(name, data or {})
    if error is None:
        return RulesVerdict(None)
    return RulesVerdict(Denial(INVALID_CODE, "Invalid", (
        f"rules ConfigMap {namespace}/{name} refused by dra-gateway, it would not load: {error}; "
        f"fix the rules (`dra-gateway rules check FILE` checks them before they are "
        f"written), or remove the label {names.RULES_LABEL} to keep the ConfigMap without "
        f"using it")))

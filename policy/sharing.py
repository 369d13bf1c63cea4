"""GPU sharing policies: which apply to a namespace, and what they allow on a card.

Several `GPUSharingPolicy` objects may select one namespace (by its labels); their rules combine
to the strictest: exclusive if any says so, the smallest maxClaimsPerDevice, the largest
minimum share, compute required if any requires it, the enforcement modes every list allows,
a model every list allows, Namespace isolation over Label isolation (a namespace is a
narrower tenant than a label value), and shares served by MIG instances if any says so
(hardware isolation is the stricter).

A tenant is what isolation groups: the namespace, or `labelKey=value` read from the namespace's
labels (a namespace without the label is its own tenant). Labels of namespaces rather than pods,
because namespace labels are the administrator's and pod labels the user's. A card is shared
only among claims of one tenant when any holder or the newcomer is isolated. Pure: no I/O.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from dra_gateway.kube import names
from dra_gateway.kube.nodeselectors import label_selector_matches
from dra_gateway.policy.models import GPUSharingPolicy, LabelSelector

Tenant = str  # "" for a namespace without isolation
# The newcomer neither isolation nor any maxClaimsPerDevice concerns, whoever holds the card:
# the planner ranks nodes for it once for every namespace, then asks each pod's own rules of
# the cards it picked. No namespace is of this tenant.
EVERY_TENANT: Tenant = "\x00every"


def selector_matches(selector: LabelSelector, labels: Mapping[str, str]) -> bool:
    """A policy's namespaceSelector against a namespace's labels (kube.nodeselectors'
    metav1.LabelSelector matching). The field is never nil here: left out, it is the empty
    selector, which selects every namespace, as Kubernetes reads an empty LabelSelector."""
    return label_selector_matches(selector.model_dump(by_alias=True), labels)


@dataclass(frozen=True, slots=True)
class SharingRules:
    """The rules of every sharing policy selecting one namespace, combined."""

    policies: tuple[str, ...] = ()  # names, for messages
    exclusive: bool = False
    max_claims_per_device: int | None = None
    min_memory: int | None = None
    min_cores: int | None = None
    require_cores: bool = False
    enforcement: frozenset[str] | None = None  # None: any
    models: tuple[tuple[str, ...], ...] = ()  # every list must allow the card's productName
    tenant: Tenant = ""
    # Shares are MIG instances (shares.servedBy: MIG in any of the policies).
    mig_shares: bool = False

    @property
    def empty(self) -> bool:
        return not self.policies

    def allows_model(self, product_name: str | None) -> bool:
        if not self.models:
            return True
        name = (product_name or "").lower()
        return all(any(fnmatch.fnmatchcase(name, p.lower()) for p in patterns)
                   for patterns in self.models)

    def named(self) -> str:
        plural = "y" if len(self.policies) == 1 else "ies"
        return f"GPUSharingPolic{plural} {', '.join(self.policies)}"


NO_RULES = SharingRules()


def combine(policies: Sequence[GPUSharingPolicy], namespace: str,
            labels: Mapping[str, str]) -> SharingRules:
    """The strictest combination of the policies that select this namespace."""
    chosen = sorted((p for p in policies
                     if selector_matches(p.spec.namespace_selector, labels)),
                    key=lambda p: p.metadata.name)
    if not chosen:
        return NO_RULES
    specs = [p.spec for p in chosen]
    maxima = [s.max_claims_per_device for s in specs if s.max_claims_per_device is not None]
    memories = [s.min_share.memory for s in specs if s.min_share and s.min_share.memory]
    cores = [s.min_share.cores for s in specs if s.min_share and s.min_share.cores]
    enforcement: frozenset[str] | None = None
    for spec in specs:
        if spec.allowed_enforcement:
            allowed = frozenset(spec.allowed_enforcement)
            enforcement = allowed if enforcement is None else enforcement & allowed
    tenant: Tenant = ""
    if any(s.isolation.mode == "Namespace" for s in specs):
        tenant = f"namespace={namespace}"
    else:
        keys = [s.isolation.label_key for s in specs if s.isolation.mode == "Label"]
        if keys and keys[0]:
            value = labels.get(keys[0])
            tenant = f"{keys[0]}={value}" if value is not None else f"namespace={namespace}"
    return SharingRules(
        policies=tuple(p.metadata.name for p in chosen),
        exclusive=any(s.exclusive for s in specs),
        max_claims_per_device=min(maxima) if maxima else None,
        min_memory=max(memories) if memories else None,
        min_cores=max(cores) if cores else None,
        require_cores=any(s.require_cores for s in specs),
        enforcement=enforcement,
        models=tuple(s.allowed_models for s in specs if s.allowed_models),
        tenant=tenant,
        mig_shares=any(s.shares.served_by == "MIG" for s in specs))


@dataclass(frozen=True, slots=True)
class Holder:
    """A claim holding part of a card, as the sharing rules see it."""

    tenant: Tenant
    max_claims_per_device: int | None


def card_refusal(rules: SharingRules, *, whole: bool, product_name: str | None,
                 holders: Iterable[Holder]) -> str | None:
    """Why a claim under `rules` may not take this card given who holds it, or None.

    `whole` says the claim takes the whole card (then nobody else holds it, which the planner
    checks). The reason is a phrase completing "card X: ...".
    """
    if not rules.allows_model(product_name):
        return (f"model {product_name or 'unknown'!r} is not allowed by {rules.named()} "
                "(allowedModels)")
    listed = list(holders)
    if whole or not listed:
        return None
    if rules.exclusive:
        return f"shared, and {rules.named()} allows no shares (exclusive)"
    if rules.tenant == EVERY_TENANT:
        return None
    limits = [h.max_claims_per_device for h in listed if h.max_claims_per_device is not None]
    if rules.max_claims_per_device is not None:
        limits.append(rules.max_claims_per_device)
    if limits and len(listed) + 1 > min(limits):
        return f"already holds {len(listed)} claims, the most a sharing policy allows is " \
               f"{min(limits)} (maxClaimsPerDevice)"
    for holder in listed:
        if (holder.tenant or rules.tenant) and holder.tenant != rules.tenant:
            theirs = holder.tenant or "a tenant without isolation"
            ours = rules.tenant or "a tenant without isolation"
            return f"shared by {theirs}, isolated from {ours} (isolation)"
    return None


def product_name(device: Mapping[str, object] | None) -> str | None:
    attribute = ((device or {}).get("attributes") or {})
    if not isinstance(attribute, Mapping):
        return None
    value = attribute.get(names.ATTR_PRODUCT_NAME)
    if isinstance(value, Mapping):
        text = value.get("string")
        return text if isinstance(text, str) else None
    return None

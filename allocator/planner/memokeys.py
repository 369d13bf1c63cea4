"""What the memo keys carry of the sharing rules, worked out beside the rules they serve.

The node class key (`caches.NodeClasses`) and the memo of searches (`visit.PodVisit`) must
tell apart what the sharing rules plan differently, and no more, so that 50 policies do not make
50 copies of every memo. Of a held card they carry its `card_fact` (the tenant of its holders
when any is isolated; its holder count and the holders' smallest maxClaimsPerDevice only near
the smallest limit of any policy, `holders_counted_from`), and of the newcomer's rules the part
`memo_rules` finds relevant to one node's cards (its tenant where a held card belongs to
another, its maxClaimsPerDevice where a card is that full; nothing for a pod taking whole cards
only, `PlannerPolicies.planned`). Quotas, minShare, requireCores, allowedEnforcement and
exclusive are checked per pod, not per card.

The rules themselves are `policy.sharing`'s and `policies.PlannerPolicies`'s; nothing here
decides whether a card fits. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from dra_gateway.policy.sharing import Holder, SharingRules

MIXED = "*"  # the tenant fact of a card held by several tenants: no newcomer may share it

# Holder counts enter the node class key from this many below the smallest maxClaimsPerDevice,
# so a pod putting up to this many shares on one card is planned from memoised classes; a pod
# with more is planned node by node (`memoisable`).
OWN_SHARES_MEMOISED = 2


@dataclass(frozen=True, slots=True)
class HolderSummary:
    """What the newcomer's rules are checked against on one node's cards, for the memo key."""

    # The tenant fact of each card held in shares ("" when none is isolated); a card held
    # whole takes nobody, whoever holds it, and counts for no tenant.
    tenants: frozenset[str]
    most: int  # the most holders counted on one card (counted only near a limit), else 0
    free: int = 0  # gateway GPUs nobody holds
    # Where a card is held by an isolated tenant: the node's usage id as it reads were its
    # holders of no isolated tenant (`fact_without_tenant`). The search of a tenant whose
    # cards are the only ones held there reads the node so (it may join every held
    # card, within the same limits): nodes differing only in which tenant holds a card share
    # it.
    neutral: int | None = None

    def barred(self, tenant: str) -> bool:
        """Whether a share of `tenant` may join no card of the node and none is free: a pod
        asking only for gateway GPUs cannot fit there (found without a search)."""
        return bool(self.tenants) and not self.free and tenant not in self.tenants

    def neutral_for(self, tenant: str) -> int | None:
        """The usage id a search under `tenant` reads the node by when isolation cannot
        change it there, else None (the node's own)."""
        return self.neutral if self.tenants == {tenant} else None


NO_HOLDERS = HolderSummary(frozenset(), 0)

# A held card's facts for the class key: (tenant, holders, their smallest maxClaimsPerDevice),
# the last two 0 far from every limit.
CardFact = tuple[str, int, int]


def holders_counted_from(limits: Iterable[int]) -> int | None:
    """From how many holders a card's count enters the class key, given every policy's
    maxClaimsPerDevice (None: no policy limits claims per card)."""
    found = list(limits)
    return max(1, min(found) - OWN_SHARES_MEMOISED + 1) if found else None


def card_fact(holder: Callable[[str], Holder], count_from: int | None,
              namespaces: Mapping[str, int]) -> CardFact | None:
    """What a card's holders bring to the node class key: None when no holder is isolated
    and the card is far from every limit (it then plans like any held card), else the
    holders' tenant (`MIXED` for several) and, near a limit, their count and smallest
    maxClaimsPerDevice. Nodes whose cards differ here must not share a memoised search;
    nodes whose cards differ only elsewhere (which namespaces, which limits far away) may."""
    if not namespaces:
        return None
    tenants: set[str] = set()
    limit: int | None = None
    count = 0
    for namespace, held in namespaces.items():
        held_by = holder(namespace)
        tenants.add(held_by.tenant)
        count += held
        if held_by.max_claims_per_device is not None:
            limit = held_by.max_claims_per_device if limit is None \
                else min(limit, held_by.max_claims_per_device)
    tenant = next(iter(tenants)) if len(tenants) == 1 else MIXED
    if count_from is not None and count >= count_from:
        return (tenant, count, limit or 0)
    return (tenant, 0, 0) if tenant else None


def fact_without_tenant(fact: CardFact | None) -> CardFact | None:
    """A held card's fact as it would read were its holders of no isolated tenant (what
    `card_fact` gives for such holders: their count and limit only near a limit)."""
    if fact is None or not fact[0]:
        return fact
    return ("", fact[1], fact[2]) if fact[1] else None


def summarise_holders(facts: Iterable[CardFact | None], free: int = 0) -> HolderSummary:
    """A node's cards held in shares (their `card_fact`, None for a card without one) and
    how many of its gateway GPUs nobody holds."""
    tenants: set[str] = set()
    most = 0
    for fact in facts:
        if fact is None:
            tenants.add("")
            continue
        tenants.add(fact[0])
        most = max(most, fact[1])
    return HolderSummary(frozenset(tenants), most, free) if tenants else NO_HOLDERS


def memoisable(count_from: int | None, own_shares: int) -> bool:
    """Whether a pod putting `own_shares` shares on one card plans from memoised classes
    (the class key counts holders only from `count_from`)."""
    return count_from is None or own_shares <= OWN_SHARES_MEMOISED


def card_rules(rules: SharingRules | None, *, relative_shares: bool) -> tuple[object, ...] | None:
    """The parts of a namespace's rules every search of the pod depends on, whatever the node
    (its tenant aside, which `memo_rules` keys where it matters): allowed models, exclusive,
    and minShare memory where a share is relative to the card. Policy names are not among
    them: reasons name the policies when they are reported."""
    if rules is None:
        return None
    return (rules.models, rules.exclusive,
            rules.min_memory if relative_shares else None)


def memo_rules(rules: SharingRules | None, summary: HolderSummary,
               own_shares: int) -> tuple[object, ...] | None:
    """The part of the newcomer's rules a search on a node with these held cards depends on:
    where a held card is another tenant's (or isolated from it), its tenant if it holds cards
    there too, else only that every held card is barred (tenants without cards on the node
    search it alike; reasons name the tenant when reported); its maxClaimsPerDevice where a
    card with the pod's own shares would reach it, on a node of no held card too (two shares
    of the pod cannot share a card under a limit of one). A pod without shares (whole cards
    only) depends on neither."""
    if rules is None or not own_shares:
        return None
    ours = rules.tenant
    tenant: str | None = None
    if any(t != ours for t in summary.tenants):  # t != ours: one of them is isolated
        tenant = ours if ours in summary.tenants else MIXED
    limit = rules.max_claims_per_device
    if limit is not None and summary.most + own_shares <= limit:
        limit = None
    if tenant is None and limit is None:
        return None
    return (tenant, limit)


__all__ = ["MIXED", "NO_HOLDERS", "OWN_SHARES_MEMOISED", "CardFact", "HolderSummary", "card_fact",
           "card_rules", "fact_without_tenant", "holders_counted_from", "memo_rules",
           "memoisable", "summarise_holders"]

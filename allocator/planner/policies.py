"""The GPU policies as the planner applies them: quota usage, sharing rules, the quota queue.

`PlannerPolicies` holds what the planner needs of the cluster's `GPUQuota`s and
`GPUSharingPolicy`s (a `dra_gateway.policy.Catalog`): the `QuotaLedger` of usage per quota,
counted from every allocated gateway-class claim of the namespace whoever wrote it (and from
plans assumed but not yet written); the combined sharing rules of each namespace and what a
holder of a card brings to `card_refusal` (its tenant and its maxClaimsPerDevice); and the
`QuotaQueue` of pods waiting for quota, so that they are placed in creation order
(creationTimestamp, then name) as usage frees.

A pod leaves the queue when it is placed, gone, or when its quotas let it through but no node
fits it (it then waits for room like any pod: keeping it at the head would hold every later pod
of the namespace behind a pod that does not fit anywhere).

Rankings of shares are kept under the rules without tenant and maxClaimsPerDevice (`planned`,
`EVERY_TENANT`), once for every namespace. What the node class key and the memo of searches
under a pod's own rules carry of the sharing rules is kept to what changes which card fits,
so that 50 policies do not make 50 copies of every memo: a card's
`card_fact` (the tenant of its holders when any is isolated; its holder count and the holders'
smallest maxClaimsPerDevice only near the smallest limit of any policy), and of the newcomer's
rules the part `memo_rules` finds relevant to one node's cards (its tenant where a held card
belongs to another, its maxClaimsPerDevice where a card is that full; nothing for a pod
taking whole cards only, `planned`). Quotas, minShare, requireCores, allowedEnforcement
and exclusive are checked per pod, not per card.

Pure: no I/O, no clock; the state feeds it and `plan_pod` asks it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from dra_gateway.policy.amounts import Amounts, RequestShape
from dra_gateway.policy.catalog import Catalog
from dra_gateway.policy.quotas import Exceeded, Quota, QuotaLedger, least_cost, over
from dra_gateway.policy.sharing import EVERY_TENANT, NO_RULES, Holder, SharingRules

_NO_HOLDER = Holder("", None)
MIXED = "*"  # the tenant fact of a card held by several tenants: no newcomer may share it

# Holder counts enter the node class key from this many below the smallest maxClaimsPerDevice,
# so a pod putting up to this many shares on one card is planned from memoised classes; a pod
# with more is planned node by node (`PlannerPolicies.memoisable`).
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
    # holders of no isolated tenant (`PlannerPolicies.fact_without_tenant`). The search of a tenant
    # whose cards are the only ones held there reads the node so (it may join every held
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


@dataclass(frozen=True, slots=True, order=True)
class Waiting:
    """A pod waiting for quota, ordered as it will be let through."""

    created: str  # creationTimestamp (RFC 3339 in UTC sorts as text)
    name: str
    namespace: str
    uid: str
    quotas: frozenset[tuple[str, str]]  # the quotas it waits for

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"


class QuotaQueue:
    """Pods refused for quota, per namespace, in creation order."""

    def __init__(self) -> None:
        self._by_namespace: dict[str, dict[str, Waiting]] = {}
        self._namespace_of: dict[str, str] = {}

    def wait(self, entry: Waiting) -> None:
        self.leave(entry.uid)
        self._by_namespace.setdefault(entry.namespace, {})[entry.uid] = entry
        self._namespace_of[entry.uid] = entry.namespace

    def leave(self, uid: str) -> bool:
        namespace = self._namespace_of.pop(uid, None)
        if namespace is None:
            return False
        waiting = self._by_namespace[namespace]
        del waiting[uid]
        if not waiting:
            del self._by_namespace[namespace]
        return True

    def any_waiting(self, namespace: str) -> bool:
        return namespace in self._by_namespace

    def ahead_of(self, namespace: str, created: str, name: str, uid: str,
                 quotas: Iterable[tuple[str, str]]) -> Waiting | None:
        """The earliest pod created before this one that waits for one of these quotas."""
        wanted = set(quotas)
        first: Waiting | None = None
        for entry in self._by_namespace.get(namespace, {}).values():
            if entry.uid == uid or (entry.created, entry.name) >= (created, name):
                continue
            if entry.quotas & wanted and (first is None or entry < first):
                first = entry
        return first

    def waiting(self, namespace: str | None = None) -> list[Waiting]:
        if namespace is not None:
            return sorted(self._by_namespace.get(namespace, {}).values())
        return sorted(e for listed in self._by_namespace.values() for e in listed.values())

    def __contains__(self, uid: object) -> bool:
        return uid in self._namespace_of


class PlannerPolicies:
    """The catalog's quotas and sharing rules, with usage; replaced whole by `set_catalog`."""

    def __init__(self) -> None:
        self.catalog = Catalog()
        self.generation = 0  # bumped by each catalog: what was read of the last goes stale
        self.ledger = QuotaLedger()
        self.queue = QuotaQueue()
        self.sharing_active = False  # any sharing policy: cards carry holder facts
        # Holder counts matter from here on (None: no policy limits claims per card).
        self.count_from: int | None = None
        self._rules: dict[str, SharingRules] = {}
        self._holders: dict[str, Holder] = {}
        self._planned: dict[tuple[str, bool], tuple[SharingRules, SharingRules]] = {}
        # `least_cost` per (claim specs, quota classes, smallest card): pods of one trace shape
        # ask it again and again, and it reads only those.
        self._least_costs: dict[tuple[object, ...], Amounts] = {}
        # Per (namespace, claim specs): the quotas counting them, and whether no sharing rule
        # of the namespace refuses them by themselves (`check_admission` found nothing).
        self._quotas_for: dict[tuple[str, object], list[Quota]] = {}
        self._admitted: set[tuple[str, object]] = set()

    def set_catalog(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.generation += 1
        self.sharing_active = bool(catalog.sharing)
        limits = [p.spec.max_claims_per_device for p in catalog.sharing
                  if p.spec.max_claims_per_device is not None]
        self.count_from = max(1, min(limits) - OWN_SHARES_MEMOISED + 1) if limits else None
        self._rules.clear()
        self._holders.clear()
        self._planned.clear()
        self._least_costs.clear()
        self._quotas_for.clear()
        self._admitted.clear()
        self.ledger = QuotaLedger()
        self.ledger.set_quotas(catalog.compiled_quotas())

    def has_quotas(self, namespace: str) -> bool:
        return self.ledger.has_quotas(namespace)

    def rules(self, namespace: str) -> SharingRules:
        rules = self._rules.get(namespace)
        if rules is None:
            rules = self.catalog.sharing_for(namespace) if self.sharing_active else NO_RULES
            self._rules[namespace] = rules
        return rules

    def holder(self, namespace: str) -> Holder:
        """What a claim of `namespace` holding part of a card brings to `card_refusal`."""
        holder = self._holders.get(namespace)
        if holder is None:
            rules = self.rules(namespace)
            holder = _NO_HOLDER if rules.empty else Holder(rules.tenant,
                                                           rules.max_claims_per_device)
            self._holders[namespace] = holder
        return holder

    def holders(self, namespaces: Mapping[str, int]) -> list[Holder]:
        return [self.holder(ns) for ns, count in namespaces.items() for _ in range(count)]

    def card_fact(self, namespaces: Mapping[str, int]) -> CardFact | None:
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
            holder = self.holder(namespace)
            tenants.add(holder.tenant)
            count += held
            if holder.max_claims_per_device is not None:
                limit = holder.max_claims_per_device if limit is None \
                    else min(limit, holder.max_claims_per_device)
        tenant = next(iter(tenants)) if len(tenants) == 1 else MIXED
        if self.count_from is not None and count >= self.count_from:
            return (tenant, count, limit or 0)
        return (tenant, 0, 0) if tenant else None

    @staticmethod
    def fact_without_tenant(fact: CardFact | None) -> CardFact | None:
        """A held card's fact as it would read were its holders of no isolated tenant (what
        `card_fact` gives for such holders: their count and limit only near a limit)."""
        if fact is None or not fact[0]:
            return fact
        return ("", fact[1], fact[2]) if fact[1] else None

    @staticmethod
    def summary(facts: Iterable[CardFact | None], free: int = 0) -> HolderSummary:
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

    def planned(self, namespace: str, *, shares: bool) -> tuple[SharingRules, SharingRules]:
        """The rules a pod of the namespace is searched under, and those its ranking is kept
        for (remembered per namespace).

        A pod with shares is searched under the namespace's rules and ranked without its
        tenant and any maxClaimsPerDevice (`EVERY_TENANT`: each can only keep a pod off cards,
        so every namespace's pods share one ranking and check their own rules on the cards
        its best nodes pick). A pod taking whole cards only meets the rules only in its
        allowed models (tenant isolation, maxClaimsPerDevice, exclusive and minShare rule
        shares), for both; the policies are kept for reasons."""
        key = (namespace, shares)
        found = self._planned.get(key)
        if found is None:
            rules = self.rules(namespace)
            if shares:
                found = (rules, replace(rules, max_claims_per_device=None, tenant=EVERY_TENANT))
            else:
                whole = SharingRules(policies=rules.policies, models=rules.models)
                found = (whole, whole)
            self._planned[key] = found
        return found

    def least_cost(self, quota: Quota, claims: Sequence[Sequence[RequestShape]], *,
                   smallest_card: int, claims_key: object = None) -> Amounts:
        """The module's `least_cost`, remembered per `claims_key` (what names the claims'
        specs, None: not remembered) for quotas not scoped by a device selector (those cost
        nothing for sure)."""
        if claims_key is None or quota.scoped_by_device:
            return least_cost(quota, claims, smallest_card=smallest_card)
        key = (claims_key, quota.classes, smallest_card)
        found = self._least_costs.get(key)
        if found is None:
            if len(self._least_costs) > 10_000:
                self._least_costs.clear()
            found = least_cost(quota, claims, smallest_card=smallest_card)
            self._least_costs[key] = found
        return found

    def quotas_for(self, namespace: str, claims: Sequence[Sequence[RequestShape]], *,
                   claims_key: object = None) -> list[Quota]:
        """The quotas of the namespace that count any of these claims' classes (remembered
        per `claims_key`, what names the claims' specs, when given)."""
        key = (namespace, claims_key)
        if claims_key is not None and (found := self._quotas_for.get(key)) is not None:
            return found
        classes = {s.class_name for shapes in claims for s in shapes}
        found = [q for q in self.ledger.quotas(namespace) if q.classes & classes]
        if claims_key is not None:
            if len(self._quotas_for) > 10_000:
                self._quotas_for.clear()
            self._quotas_for[key] = found
        return found

    def admitted(self, namespace: str, claims_key: object) -> bool:
        """Whether claims of these specs were found to break none of the namespace's sharing
        rules by themselves (they then never do: the check reads only the two)."""
        return (namespace, claims_key) in self._admitted

    def admit(self, namespace: str, claims_key: object) -> None:
        if len(self._admitted) > 10_000:
            self._admitted.clear()
        self._admitted.add((namespace, claims_key))

    def memoisable(self, own_shares: int) -> bool:
        """Whether a pod putting `own_shares` shares on one card plans from memoised classes
        (the class key counts holders only from `count_from`)."""
        return self.count_from is None or own_shares <= OWN_SHARES_MEMOISED


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
    card (with the pod's own shares) would reach it. A pod without shares (whole cards only)
    depends on neither."""
    if rules is None or summary is NO_HOLDERS or not own_shares:
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


def exceeded_by_least_cost(policies: PlannerPolicies, quotas: Sequence[Quota],
                           claims: Sequence[Sequence[RequestShape]], *, smallest_card: int = 0,
                           claims_key: object = None) -> tuple[list[Exceeded], list[Exceeded]]:
    """(quotas the claims' least cost exceeds by itself, quotas it exceeds given current
    usage); `claims_key` names the claims' specs, so that their `least_cost` is remembered."""
    never: list[Exceeded] = []
    now: list[Exceeded] = []
    for quota in quotas:
        asked = policies.least_cost(quota, claims, smallest_card=smallest_card,
                                    claims_key=claims_key)
        if not policies.ledger.exceeds(quota, asked):
            continue
        used = policies.ledger.used(quota)
        fields = over(quota, asked, used)
        if not fields:  # then not alone either: usage only adds
            continue
        alone = over(quota, asked, Amounts())
        if alone:
            never.append(Exceeded(quota, asked, used, alone))
        else:
            now.append(Exceeded(quota, asked, used, fields))
    return never, now


__all__ = ["MIXED", "NO_HOLDERS", "OWN_SHARES_MEMOISED", "CardFact", "HolderSummary",
           "PlannerPolicies", "QuotaQueue", "Waiting", "card_rules", "exceeded_by_least_cost",
           "least_cost", "memo_rules"]

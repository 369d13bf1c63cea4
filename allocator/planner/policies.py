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
`EVERY_TENANT`), once for every namespace; what the memo keys carry of the rules is worked out
beside them, in `memokeys`.

Pure: no I/O, no clock; the state feeds it and `plan_pod` asks it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from dra_gateway.allocator.planner.memokeys import holders_counted_from
from dra_gateway.policy.amounts import Amounts, RequestShape
from dra_gateway.policy.catalog import Catalog
from dra_gateway.policy.quotas import Exceeded, Quota, QuotaLedger, least_cost, over
from dra_gateway.policy.sharing import EVERY_TENANT, NO_RULES, Holder, SharingRules

_NO_HOLDER = Holder("", None)


@dataclass(frozen=True, slots=True, order=True)
class Waiting:
    """A pod waiting for quota, ordered as it will be let through: highest priority first,
    then oldest."""

    rank: int  # minus the pod's priority
    created: str  # creationTimestamp (RFC 3339 in UTC sorts as text)
    name: str
    namespace: str
    uid: str
    quotas: frozenset[tuple[str, str]]  # the quotas it waits for

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"


class QuotaQueue:
    """Pods refused for quota, per namespace, by priority then creation."""

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

    def ahead_of(self, namespace: str, rank: int, created: str, name: str, uid: str,
                 quotas: Iterable[tuple[str, str]]) -> Waiting | None:
        """The first pod let through before this one (of higher priority, or as high and
        created earlier) that waits for one of these quotas."""
        wanted = set(quotas)
        first: Waiting | None = None
        for entry in self._by_namespace.get(namespace, {}).values():
            if entry.uid == uid or (entry.rank, entry.created, entry.name) >= (rank, created,
                                                                               name):
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
        # Holder counts enter the memo keys from here on (None: no policy limits claims
        # per card; `memokeys.holders_counted_from`).
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
        self.count_from = holders_counted_from(limits)
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
        found = policies.ledger.exceeded(quota, asked)
        if found is None:
            continue
        alone = over(quota, asked, Amounts())
        if alone:
            never.append(Exceeded(quota, asked, found.used, alone))
        else:
            now.append(found)
    return never, now


__all__ = ["PlannerPolicies", "QuotaQueue", "Waiting", "exceeded_by_least_cost", "least_cost"]

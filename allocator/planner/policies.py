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

Pure: no I/O, no clock; the state feeds it and `plan_pod` asks it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from dra_gateway.kube import names
from dra_gateway.policy.amounts import Amounts, RequestShape
from dra_gateway.policy.catalog import Catalog
from dra_gateway.policy.quotas import Exceeded, Quota, QuotaLedger, over
from dra_gateway.policy.sharing import NO_RULES, Holder, SharingRules

_NO_HOLDER = Holder("", None)
_MIB = 1 << 20


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
        self.ledger = QuotaLedger()
        self.queue = QuotaQueue()
        self.sharing_active = False  # any sharing policy: cards carry holder facts
        self._rules: dict[str, SharingRules] = {}
        self._holders: dict[str, Holder] = {}

    def set_catalog(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.sharing_active = bool(catalog.sharing)
        self._rules.clear()
        self._holders.clear()
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

    def holder_facts(self, namespaces: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
        """The facts of a card's holders that sharing rules read, for the node class key:
        nodes whose cards are held by other tenants must not share a memoised search."""
        facts: dict[tuple[str, int], int] = {}
        for namespace, count in namespaces.items():
            holder = self.holder(namespace)
            fact = (holder.tenant, holder.max_claims_per_device or 0)
            facts[fact] = facts.get(fact, 0) + count
        return tuple(sorted((f"{t}|{m}", n) for (t, m), n in facts.items()))

    def holders(self, namespaces: Mapping[str, int]) -> list[Holder]:
        return [self.holder(ns) for ns, count in namespaces.items() for _ in range(count)]


def surely(quota: Quota, claims: Sequence[Sequence[RequestShape]], *,
           smallest_card: int = 0) -> Amounts:
    """What claims cost against `quota` wherever they land: stated memory and cores, memory
    relative to the card and whole cards on the smallest card of the cluster, and whole cards
    as devices (nobody else touches them); a share may land on a card the namespace already
    touches, and a quota scoped by a device selector may not count the card at all."""
    if quota.scoped_by_device:
        return Amounts()
    memory = cores = whole = count = 0
    for shapes in claims:
        counted = [s for s in shapes if s.class_name in quota.classes]
        if not counted:
            continue
        count += 1
        for shape in counted:
            amounts = shape.amounts
            memory += amounts.memory
            cores += amounts.cores
            gpu = shape.class_name == names.GPU_CLASS
            if shape.memory is None and gpu and shape.memory_percent is not None:
                memory += (smallest_card * shape.memory_percent // 100 // _MIB * _MIB
                           * shape.count)
            if shape.whole:
                whole += shape.count
                if gpu and shape.memory is None:
                    memory += smallest_card * shape.count
    return Amounts(memory, cores, whole, count)


def quotas_for(policies: PlannerPolicies, namespace: str,
               claims: Sequence[Sequence[RequestShape]]) -> list[Quota]:
    """The quotas of the namespace that count any of these claims' classes."""
    classes = {s.class_name for shapes in claims for s in shapes}
    return [q for q in policies.ledger.quotas(namespace) if q.classes & classes]


def surely_exceeded(policies: PlannerPolicies, quotas: Sequence[Quota],
                    claims: Sequence[Sequence[RequestShape]], *, smallest_card: int = 0,
                    ) -> tuple[list[Exceeded], list[Exceeded]]:
    """(quotas the claims exceed by themselves, quotas they exceed given current usage)."""
    never: list[Exceeded] = []
    now: list[Exceeded] = []
    for quota in quotas:
        asked = surely(quota, claims, smallest_card=smallest_card)
        used = policies.ledger.used(quota)
        alone = over(quota, asked, Amounts())
        if alone:
            never.append(Exceeded(quota, asked, used, alone))
            continue
        fields = over(quota, asked, used)
        if fields:
            now.append(Exceeded(quota, asked, used, fields))
    return never, now


__all__ = ["PlannerPolicies", "QuotaQueue", "Waiting", "quotas_for", "surely",
           "surely_exceeded"]

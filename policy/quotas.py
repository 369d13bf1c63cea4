"""GPU quotas compiled for the hot paths, and the ledger of what each quota has used.

A `Quota` says which device charges it counts (its scope: device classes and a CEL selector over
device attributes) and its hard amounts. `least_cost` is what claims cost a quota at the least
wherever they land (one reading for the allocator and /validate). `QuotaLedger` keeps, per quota,
the usage of every allocated claim of its namespace (by any writer) and answers
`excess(namespace, charges)`: the quotas a new claim would take past their hard amounts. Devices
count once per quota however many claims of the namespace share them ("cards touched"), so the
ledger keeps a count per device. Quotas with `min` and a `cohort` lend their unused guarantee
to the cohort and borrow from it up to `hard` (`QuotaLedger`). `exceeded_message` writes
ResourceQuota's wording, `cohort_message` what a cohort lacks. Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_gateway.gpu.memory_percent import share_bytes_in_whole_mib
from dra_gateway.kube import names
from dra_gateway.kube.cel import CelError, Selector, compile_selector, device_view
from dra_gateway.policy.amounts import (
    FIELDS,
    Amounts,
    DeviceCharge,
    DeviceKey,
    RequestShape,
    format_amount,
)
from dra_gateway.policy.models import GPUQuota


@dataclass(frozen=True, slots=True)
class Quota:
    namespace: str
    name: str
    hard: tuple[tuple[str, int], ...]  # (field, amount) for the fields the quota limits
    classes: frozenset[str]  # the gateway classes it counts
    selector: Selector | None
    refuse: bool  # spec.admission: Refuse
    # spec.min, (field, amount) for the fields it guarantees, and spec.cohort: the quotas it
    # lends its unused guarantee to and borrows theirs from (both empty: a plain ceiling).
    min: tuple[tuple[str, int], ...] = ()
    cohort: str | None = None
    key: tuple[str, str] = field(init=False, compare=False)  # (namespace, name)

    def __post_init__(self) -> None:
        object.__setattr__(self, "key", (self.namespace, self.name))

    @property
    def scoped_by_device(self) -> bool:
        """Counts only some devices of its classes: only the allocation can tell which."""
        return self.selector is not None

    def counts(self, charge: DeviceCharge) -> bool:
        if charge.class_name not in self.classes:
            return False
        if self.selector is None:
            return True
        if charge.device is None:
            return False
        try:
            return self.selector.matches(device_view(charge.key[0], charge.device))
        except (CelError, ValueError):
            return False

    def amounts(self, charges: Sequence[DeviceCharge]) -> Amounts:
        counted = [c for c in charges if self.counts(c)]
        return Amounts(memory=sum(c.memory for c in counted),
                       cores=sum(c.cores for c in counted),
                       devices=len({c.key for c in counted}), claims=1 if counted else 0)

    def hard_amounts(self) -> dict[str, int]:
        return dict(self.hard)

    def min_amounts(self) -> dict[str, int]:
        return dict(self.min)

    @property
    def label(self) -> str:
        return f"{self.namespace}/{self.name}"


def compile_quota(quota: GPUQuota) -> Quota:
    scope = quota.spec.scope
    classes = frozenset(scope.device_class_names) if scope and scope.device_class_names \
        else frozenset(names.GATEWAY_CLASSES)
    selector = compile_selector(scope.selector) if scope and scope.selector else None
    return Quota(namespace=quota.metadata.namespace or "", name=quota.metadata.name,
                 hard=tuple(quota.spec.hard.items()), classes=classes, selector=selector,
                 refuse=quota.spec.admission == "Refuse",
                 min=tuple(quota.spec.min.items()) if quota.spec.min else (),
                 cohort=quota.spec.cohort)


@dataclass(frozen=True, slots=True)
class CohortShort:
    """What a quota's cohort lacks for a request that its hard amounts allow: the cohort's
    usage and guarantees over the fields short, and whether the request is within the quota's
    own guarantee (`lent`: what it lacks is lent to the cohort, taken back by preemption)."""

    name: str
    used: Amounts
    guaranteed: Amounts
    lent: bool


@dataclass(frozen=True, slots=True)
class Exceeded:
    quota: Quota
    requested: Amounts
    used: Amounts
    fields: tuple[str, ...]  # the limited fields the request takes past hard (or the cohort)
    cohort: CohortShort | None = None  # set when the cohort, not hard, is what stops it

    @property
    def reclaims(self) -> bool:
        """Within the quota's guarantee: borrowed pods of the cohort may be preempted."""
        return self.cohort is not None and self.cohort.lent

    @property
    def message(self) -> str:
        if self.cohort is None:
            return exceeded_message(self.quota, self.requested, self.used, self.fields)
        return cohort_message(self.quota, self.requested, self.used, self.fields, self.cohort)


def _listed(fields: Sequence[str], values: Mapping[str, int]) -> str:
    return ",".join(f"{f}={format_amount(f, values[f])}" for f in fields)


def exceeded_message(quota: Quota, requested: Amounts, used: Amounts,
                     fields: Sequence[str]) -> str:
    """`exceeded quota team-a-gpu: requested memory=40Gi, used memory=100Gi, limited
    memory=120Gi`, ResourceQuota's wording, each list over the fields taken past hard."""
    hard = quota.hard_amounts()
    return (f"exceeded quota {quota.name}: requested "
            f"{_listed(fields, {f: requested.get(f) for f in fields})}, used "
            f"{_listed(fields, {f: used.get(f) for f in fields})}, limited "
            f"{_listed(fields, hard)}")


def cohort_message(quota: Quota, requested: Amounts, used: Amounts, fields: Sequence[str],
                   short: CohortShort) -> str:
    """Why a request within hard waits for its cohort: it would borrow and nothing is left to
    borrow, or its own guarantee is lent and is being taken back."""
    minimum = quota.min_amounts()
    asked = (f"requested {_listed(fields, {f: requested.get(f) for f in fields})}, used "
             f"{_listed(fields, {f: used.get(f) for f in fields})}, min "
             f"{_listed(fields, minimum)}")
    cohort = (f"cohort {short.name} uses {_listed(fields, {f: short.used.get(f) for f in fields})}"
              f" of its guarantees {_listed(fields, {f: short.guaranteed.get(f) for f in fields})}")
    if short.lent:
        return (f"quota {quota.name}'s guarantee is lent to its cohort: {asked}; {cohort}: "
                f"pods borrowing it are preempted to take it back")
    return (f"exceeded quota {quota.name}'s guarantee and its cohort has none left to lend: "
            f"{asked}; {cohort}")


def over(quota: Quota, requested: Amounts, used: Amounts) -> tuple[str, ...]:
    """The limited fields where used + requested passes hard (a field requested as 0 never)."""
    fields: list[str] = []
    for field_, limit in quota.hard:
        asked = getattr(requested, field_)
        if asked > 0 and getattr(used, field_) + asked > limit:
            fields.append(field_)
    return tuple(fields)


def least_cost(quota: Quota, claims: Sequence[Sequence[RequestShape]], *,
               smallest_card: int = 0, shares_take_cards: bool = False) -> Amounts:
    """The least the claims (the gateway-class requests of each) cost against `quota` wherever
    they land: the memory and cores stated; memory relative to the card, and a whole card's
    memory, on the smallest card of the cluster (`smallest_card`, 0 where unknown: then not
    counted); whole cards as devices (nobody else touches them). A quota scoped by a device
    selector may not count the card at all (nothing for sure).

    Shares count no device by default (one may land on a card the namespace already touches);
    with `shares_take_cards` (/validate, which does not know the cards touched) the largest
    share request counts as many devices as it asks for (the shares may all land on its
    cards)."""
    if quota.scoped_by_device:
        return Amounts()
    memory = cores = whole = shared = count = 0
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
                memory += (share_bytes_in_whole_mib(smallest_card, shape.memory_percent)
                           * shape.count)
            if shape.whole:
                whole += shape.count
                if gpu and shape.memory is None:
                    memory += smallest_card * shape.count
            elif shares_take_cards:
                shared = max(shared, shape.count)
    return Amounts(memory, cores, whole + shared, count)


@dataclass(slots=True)
class _Use:
    memory: int = 0
    cores: int = 0
    claims: int = 0
    devices: Counter[DeviceKey] = field(default_factory=Counter)
    # (index in FIELDS, hard amount) of each field the quota limits.
    limits: tuple[tuple[int, int], ...] = ()
    # (index in FIELDS, min amount) of each field it guarantees (in a cohort).
    guarantee: tuple[tuple[int, int], ...] = ()

    def amounts(self) -> Amounts:
        return Amounts(self.memory, self.cores, len(self.devices), self.claims)

    def used(self) -> tuple[int, int, int, int]:
        return (self.memory, self.cores, len(self.devices), self.claims)

    def passed_by(self, asked: Sequence[int]) -> bool:
        """Whether `asked` (amounts in FIELDS order) on top of this usage passes a limit; a
        field asked as 0 never does."""
        used = self.used()
        return any(asked[i] > 0 and used[i] + asked[i] > limit for i, limit in self.limits)

    def borrowing(self) -> bool:
        """Uses more than it is guaranteed in some field."""
        used = self.used()
        return any(used[i] > minimum for i, minimum in self.guarantee)


class QuotaLedger:
    """Usage per quota from allocated claims; `set_quotas` re-counts from the claims it holds.

    Quotas with `min` and a `cohort` lend and borrow: a request that takes a quota past its
    `min` in a field borrows there, and is let through only while the cohort's usage of the
    field stays within the sum of its quotas' guarantees of it (so that what is borrowed never
    exceeds what lenders leave unused); a request within its own guarantee that the cohort
    lacks room for finds that guarantee lent (`Exceeded.reclaims`: borrowed pods are preempted
    to take it back). A field a quota limits but does not guarantee is a plain ceiling."""

    def __init__(self) -> None:
        self._quotas: dict[str, list[Quota]] = {}
        self._claims: dict[str, tuple[str, tuple[DeviceCharge, ...]]] = {}
        self._use: dict[tuple[str, str], _Use] = {}
        self._cohorts: dict[str, list[Quota]] = {}

    def set_quotas(self, quotas: Iterable[Quota]) -> None:
        by_ns: dict[str, list[Quota]] = {}
        for quota in quotas:
            by_ns.setdefault(quota.namespace, []).append(quota)
        for listed in by_ns.values():
            listed.sort(key=lambda q: q.name)
        self._quotas = by_ns
        self._use = {q.key: _Use(limits=tuple((FIELDS.index(f), limit) for f, limit in q.hard),
                                 guarantee=tuple((FIELDS.index(f), m) for f, m in q.min))
                     for listed in by_ns.values() for q in listed}
        self._cohorts = {}
        for listed in by_ns.values():
            for quota in listed:
                if quota.cohort and quota.min:
                    self._cohorts.setdefault(quota.cohort, []).append(quota)
        for claims in self._claims.values():
            self._count(claims[0], claims[1], 1)

    def quotas(self, namespace: str | None = None) -> list[Quota]:
        if namespace is not None:
            return list(self._quotas.get(namespace, ()))
        return [q for ns in sorted(self._quotas) for q in self._quotas[ns]]

    def has_quotas(self, namespace: str) -> bool:
        return namespace in self._quotas

    def cohorts(self) -> dict[str, list[Quota]]:
        """The quotas of each cohort, by cohort name (namespace, then name, order)."""
        return {name: sorted(members, key=lambda q: q.key)
                for name, members in sorted(self._cohorts.items())}

    def set_claim(self, uid: str, namespace: str, charges: Sequence[DeviceCharge]) -> None:
        self.remove_claim(uid)
        if not charges:
            return
        kept = tuple(charges)
        self._claims[uid] = (namespace, kept)
        self._count(namespace, kept, 1)

    def remove_claim(self, uid: str) -> None:
        old = self._claims.pop(uid, None)
        if old is not None:
            self._count(old[0], old[1], -1)

    def holds(self, uid: str) -> bool:
        return uid in self._claims

    def _count(self, namespace: str, charges: Sequence[DeviceCharge], sign: int) -> None:
        for quota in self._quotas.get(namespace, ()):
            counted = [c for c in charges if quota.counts(c)]
            if not counted:
                continue
            use = self._use[quota.key]
            use.memory += sign * sum(c.memory for c in counted)
            use.cores += sign * sum(c.cores for c in counted)
            use.claims += sign
            for charge in counted:
                use.devices[charge.key] += sign
                if use.devices[charge.key] <= 0:
                    del use.devices[charge.key]

    def used(self, quota: Quota) -> Amounts:
        use = self._use.get(quota.key)
        return use.amounts() if use is not None else Amounts()

    def borrowing(self, quota: Quota) -> bool:
        """Whether the quota uses more than its guarantee in some field (it borrows)."""
        use = self._use.get(quota.key)
        return use is not None and use.borrowing()

    def _cohort_totals(self, cohort: str, index: int) -> tuple[int, int]:
        """(usage, guarantees) of one field over the cohort's quotas that guarantee it."""
        used = guaranteed = 0
        for member in self._cohorts.get(cohort, ()):
            use = self._use[member.key]
            for i, minimum in use.guarantee:
                if i == index:
                    used += use.used()[i]
                    guaranteed += minimum
        return used, guaranteed

    def _cohort_short(self, quota: Quota, use: _Use,
                      asked: Sequence[int]) -> tuple[tuple[str, ...], CohortShort] | None:
        """The guaranteed fields the cohort lacks room for `asked` in, and what it lacks."""
        if not use.guarantee or quota.cohort is None:
            return None
        used = use.used()
        short: list[str] = []
        lent = True
        totals: dict[str, tuple[int, int]] = {}
        for i, minimum in use.guarantee:
            if asked[i] <= 0:
                continue
            in_cohort, guaranteed = self._cohort_totals(quota.cohort, i)
            if in_cohort + asked[i] > guaranteed:
                short.append(FIELDS[i])
                totals[FIELDS[i]] = (in_cohort, guaranteed)
                lent = lent and used[i] + asked[i] <= minimum
        if not short:
            return None
        return tuple(short), CohortShort(
            quota.cohort, Amounts(**{f: totals[f][0] for f in short}),
            Amounts(**{f: totals[f][1] for f in short}), lent)

    def exceeds(self, quota: Quota, asked: Amounts) -> bool:
        """Whether `asked` on top of the quota's usage passes one of its hard amounts, or
        needs a guarantee its cohort has no room for (what `exceeded` tells in full)."""
        use = self._use.get(quota.key)
        if use is None:
            return bool(over(quota, asked, Amounts()))
        values = (asked.memory, asked.cores, asked.devices, asked.claims)
        return use.passed_by(values) or self._cohort_short(quota, use, values) is not None

    def exceeded(self, quota: Quota, asked: Amounts) -> Exceeded | None:
        """How `asked` on top of the quota's usage exceeds it (hard first, then the cohort),
        None when it does not."""
        use = self._use.get(quota.key)
        used = self.used(quota)
        fields = over(quota, asked, used)
        if fields:
            return Exceeded(quota, asked, used, fields)
        if use is None:
            return None
        found = self._cohort_short(quota, use, (asked.memory, asked.cores, asked.devices,
                                                asked.claims))
        return None if found is None else Exceeded(quota, asked, used, found[0], found[1])

    def excess(self, namespace: str, claims: Sequence[Sequence[DeviceCharge]]) -> list[Exceeded]:
        """The quotas of `namespace` that these new claims would take past their hard amounts
        (or past a guarantee their cohort has no room for)."""
        found: list[Exceeded] = []
        for quota in self._quotas.get(namespace, ()):
            use = self._use[quota.key]
            asked = self._asked(quota, use, claims)
            # Amounts and messages only for a quota passed (rare): this runs once per plan.
            if use.passed_by(asked):
                requested, now = Amounts(*asked), use.amounts()
                found.append(Exceeded(quota, requested, now, over(quota, requested, now)))
            elif use.guarantee and (short := self._cohort_short(quota, use, asked)):
                found.append(Exceeded(quota, Amounts(*asked), use.amounts(), *short))
        return found

    def _asked(self, quota: Quota, use: _Use,
               claims: Sequence[Sequence[DeviceCharge]]) -> tuple[int, int, int, int]:
        memory = cores = count = 0
        fresh: set[DeviceKey] = set()
        for charges in claims:
            counted = False
            for charge in charges:
                if quota.counts(charge):
                    counted = True
                    memory += charge.memory
                    cores += charge.cores
                    if charge.key not in use.devices:
                        fresh.add(charge.key)
            count += counted
        return (memory, cores, len(fresh), count)

    def borrows(self, namespace: str,
                claims: Sequence[Sequence[DeviceCharge]]) -> list[Quota]:
        """The quotas of `namespace` in a cohort that these new claims take past their
        guarantee in some field (they run on borrowed quota)."""
        found: list[Quota] = []
        for quota in self._quotas.get(namespace, ()):
            use = self._use[quota.key]
            if not use.guarantee:
                continue
            asked, used = self._asked(quota, use, claims), use.used()
            if any(asked[i] > 0 and used[i] + asked[i] > minimum
                   for i, minimum in use.guarantee):
                found.append(quota)
        return found

    def cohort_peers(self, namespace: str) -> dict[str, bool]:
        """The other namespaces that share a cohort with `namespace`'s quotas, each with
        whether one of its quotas there borrows now."""
        peers: dict[str, bool] = {}
        for quota in self._quotas.get(namespace, ()):
            for member in self._cohorts.get(quota.cohort or "", ()) if quota.min else ():
                if member.namespace != namespace:
                    peers[member.namespace] = (peers.get(member.namespace, False)
                                               or self._use[member.key].borrowing())
        return peers

    def lent(self, quota: Quota) -> Amounts:
        """The part of the quota's unused guarantee its cohort's borrowers use now: the
        cohort's borrowed total of each field, shared among its lenders in proportion to what
        each leaves unused (rounded down, the remainder to the first in name order)."""
        if not quota.min or quota.cohort is None:
            return Amounts()
        members = sorted(self._cohorts.get(quota.cohort, ()), key=lambda q: q.key)
        values: dict[str, int] = {}
        for f, _ in quota.min:
            i = FIELDS.index(f)
            unused: list[tuple[tuple[str, str], int]] = []
            borrowed = 0
            for member in members:
                use = self._use[member.key]
                for j, minimum in use.guarantee:
                    if j == i:
                        used = use.used()[i]
                        borrowed += max(0, used - minimum)
                        unused.append((member.key, max(0, minimum - used)))
            free = sum(amount for _, amount in unused)
            share = dict.fromkeys([k for k, _ in unused], 0)
            if free and borrowed:
                lending = min(borrowed, free)
                for key, amount in unused:
                    share[key] = lending * amount // free
                rest = lending - sum(share.values())
                for key, amount in unused:
                    if rest <= 0:
                        break
                    if amount > share[key]:
                        extra = min(rest, amount - share[key])
                        share[key] += extra
                        rest -= extra
            values[f] = share.get(quota.key, 0)
        return Amounts(**values)

    def status(self, quota: Quota) -> dict[str, Any]:
        """GPUQuota status: `hard` and `used` over the fields the quota limits; in a cohort
        also `min`, `borrowed` (used past min) and `lent` (of its unused min, what borrowers
        of the cohort use) over the fields it guarantees."""
        limited = [f for f in FIELDS if f in quota.hard_amounts()]
        hard = Amounts(**{f: quota.hard_amounts()[f] for f in limited})
        used = self.used(quota)
        status: dict[str, Any] = {"hard": hard.to_json(limited), "used": used.to_json(limited)}
        if quota.min and quota.cohort:
            minimum = quota.min_amounts()
            guaranteed = [f for f in FIELDS if f in minimum]
            status["min"] = Amounts(**minimum).to_json(guaranteed)
            status["borrowed"] = Amounts(**{f: max(0, used.get(f) - minimum[f])
                                            for f in guaranteed}).to_json(guaranteed)
            status["lent"] = self.lent(quota).to_json(guaranteed)
        return status

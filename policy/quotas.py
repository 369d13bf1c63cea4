"""GPU quotas compiled for the hot paths, and the ledger of what each quota has used.

A `Quota` says which device charges it counts (its scope: device classes and a CEL selector over
device attributes) and its hard amounts. `least_cost` is what claims cost a quota at the least
wherever they land (one reading for the allocator and /validate). `QuotaLedger` keeps, per quota,
the usage of every allocated claim of its namespace (by any writer) and answers
`excess(namespace, charges)`: the quotas a new claim would take past their hard amounts. Devices
count once per quota however many claims of the namespace share them ("cards touched"), so the
ledger keeps a count per device. `exceeded_message` writes ResourceQuota's wording. Pure: no I/O.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

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


def compile_quota(quota: GPUQuota) -> Quota:
    scope = quota.spec.scope
    classes = frozenset(scope.device_class_names) if scope and scope.device_class_names \
        else frozenset(names.GATEWAY_CLASSES)
    selector = compile_selector(scope.selector) if scope and scope.selector else None
    return Quota(namespace=quota.metadata.namespace or "", name=quota.metadata.name,
                 hard=tuple(quota.spec.hard.items()), classes=classes, selector=selector,
                 refuse=quota.spec.admission == "Refuse")


@dataclass(frozen=True, slots=True)
class Exceeded:
    quota: Quota
    requested: Amounts
    used: Amounts
    fields: tuple[str, ...]  # the limited fields the request takes past hard

    @property
    def message(self) -> str:
        return exceeded_message(self.quota, self.requested, self.used, self.fields)


def exceeded_message(quota: Quota, requested: Amounts, used: Amounts,
                     fields: Sequence[str]) -> str:
    """`exceeded quota team-a-gpu: requested memory=40Gi, used memory=100Gi, limited
    memory=120Gi`, ResourceQuota's wording, each list over the fields taken past hard."""
    hard = quota.hard_amounts()

    def listed(values: Mapping[str, int]) -> str:
        return ",".join(f"{f}={format_amount(f, values[f])}" for f in fields)

    return (f"exceeded quota {quota.name}: requested "
            f"{listed({f: requested.get(f) for f in fields})}, used "
            f"{listed({f: used.get(f) for f in fields})}, limited {listed(hard)}")


def over(quota: Quota, requested: Amounts, used: Amounts) -> tuple[str, ...]:
    """The limited fields where used + requested passes hard (a field requested as 0 never)."""
    fields: list[str] = []
    for field_, limit in quota.hard:
        asked = getattr(requested, field_)
        if asked > 0 and getattr(used, field_) + asked > limit:
            fields.append(field_)
    return tuple(fields)


_MIB = 1 << 20


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
                memory += (smallest_card * shape.memory_percent // 100 // _MIB * _MIB
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

    def amounts(self) -> Amounts:
        return Amounts(self.memory, self.cores, len(self.devices), self.claims)

    def used(self) -> tuple[int, int, int, int]:
        return (self.memory, self.cores, len(self.devices), self.claims)

    def passed_by(self, asked: Sequence[int]) -> bool:
        """Whether `asked` (amounts in FIELDS order) on top of this usage passes a limit; a
        field asked as 0 never does."""
        used = self.used()
        return any(asked[i] > 0 and used[i] + asked[i] > limit for i, limit in self.limits)


class QuotaLedger:
    """Usage per quota from allocated claims; `set_quotas` re-counts from the claims it holds."""

    def __init__(self) -> None:
        self._quotas: dict[str, list[Quota]] = {}
        self._claims: dict[str, tuple[str, tuple[DeviceCharge, ...]]] = {}
        self._use: dict[tuple[str, str], _Use] = {}

    def set_quotas(self, quotas: Iterable[Quota]) -> None:
        by_ns: dict[str, list[Quota]] = {}
        for quota in quotas:
            by_ns.setdefault(quota.namespace, []).append(quota)
        for listed in by_ns.values():
            listed.sort(key=lambda q: q.name)
        self._quotas = by_ns
        self._use = {q.key: _Use(limits=tuple((FIELDS.index(f), limit) for f, limit in q.hard))
                     for listed in by_ns.values() for q in listed}
        for namespace, charges in self._claims.values():
            self._count(namespace, charges, 1)

    def quotas(self, namespace: str | None = None) -> list[Quota]:
        if namespace is not None:
            return list(self._quotas.get(namespace, ()))
        return [q for ns in sorted(self._quotas) for q in self._quotas[ns]]

    def has_quotas(self, namespace: str) -> bool:
        return namespace in self._quotas

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

    def exceeds(self, quota: Quota, asked: Amounts) -> bool:
        """Whether `asked` on top of the quota's usage passes one of its hard amounts (what
        `over` tells field by field, without building the usage)."""
        use = self._use.get(quota.key)
        if use is None:
            return bool(over(quota, asked, Amounts()))
        return use.passed_by((asked.memory, asked.cores, asked.devices, asked.claims))

    def excess(self, namespace: str, claims: Sequence[Sequence[DeviceCharge]]) -> list[Exceeded]:
        """The quotas of `namespace` that these new claims would take past their hard amounts."""
        found: list[Exceeded] = []
        for quota in self._quotas.get(namespace, ()):
            use = self._use[quota.key]
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
            asked = (memory, cores, len(fresh), count)
            # Amounts and messages only for a quota passed (rare): this runs once per plan.
            if use.passed_by(asked):
                requested, now = Amounts(*asked), use.amounts()
                found.append(Exceeded(quota, requested, now, over(quota, requested, now)))
        return found

    def status(self, quota: Quota) -> dict[str, Any]:
        """GPUQuota status: `hard` and `used` over the fields the quota limits."""
        limited = [f for f in FIELDS if f in quota.hard_amounts()]
        hard = Amounts(**{f: quota.hard_amounts()[f] for f in limited})
        return {"hard": hard.to_json(limited), "used": self.used(quota).to_json(limited)}

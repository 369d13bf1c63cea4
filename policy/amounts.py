"""What a claim asks for and what an allocation holds, in the four amounts quotas count.

`Amounts` is memory (bytes), cores (percent of a card, 100 = one card's compute), devices and
claims. `requests_of` reads a claim spec (as the translator writes it, or natively) into one
`RequestShape` per request of a gateway class: `capacity.requests` and the `GpuShareConfig`
that travels in the claim's config. `charges_of` reads an allocated claim into one
`DeviceCharge` per device result. Pure: no I/O, no cluster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_gateway.gpu.shares import allocated_shares, result_key, shares_by_result
from dra_gateway.kube import names
from dra_gateway.kube.quantity import Quantity, QuantityError, parse_quantity

FIELDS: tuple[str, ...] = ("memory", "cores", "devices", "claims")

DeviceKey = tuple[str, str, str]  # (driver, pool, device)
DeviceLookup = Callable[[DeviceKey], Mapping[str, Any] | None]


@dataclass(frozen=True, slots=True)
class Amounts:
    memory: int = 0
    cores: int = 0
    devices: int = 0
    claims: int = 0

    def __add__(self, other: Amounts) -> Amounts:
        return Amounts(self.memory + other.memory, self.cores + other.cores,
                       self.devices + other.devices, self.claims + other.claims)

    def get(self, field: str) -> int:
        value: int = getattr(self, field)
        return value

    def to_json(self, fields: Iterable[str] = FIELDS) -> dict[str, str | int]:
        """As in GPUQuota status: memory as a quantity text ("40Gi"), the rest as integers."""
        return {f: format_amount(f, self.get(f)) if f == "memory" else self.get(f)
                for f in fields}


def format_amount(field: str, value: int) -> str:
    """`40Gi` for memory (binary suffixes, as kubectl shows bytes), plain numbers otherwise."""
    return str(Quantity.from_bytes(value)) if field == "memory" else str(value)


@dataclass(frozen=True, slots=True)
class RequestShape:
    """One request (or, for firstAvailable, its first alternative) of a gateway class.

    `memory` and `cores` are per card, None when the claim does not say (memory given as a
    percent of the card, or a whole card whose size only the allocation knows).
    """

    name: str
    class_name: str
    count: int
    whole: bool
    memory: int | None
    memory_percent: int | None
    cores: int | None
    enforcement: str
    # Its place in spec.devices.requests, and each alternative's device class and own CEL
    # selectors (one for `exactly`, each of `firstAvailable` in order): which cards it may
    # take, for the allowed-models check (policy.profiles).
    index: int = 0
    alternatives: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # The later firstAvailable alternatives that are shares of a gateway card, by name: the
    # sharing rules that forbid shares judge them too (the allocator may fall back to one).
    later_shares: tuple[str, ...] = ()

    @property
    def amounts(self) -> Amounts:
        """What the request surely costs: unknown memory counts 0, a whole card 100 cores, a
        MIG instance no cores (its profile's compute slices are charged once allocated)."""
        if self.class_name == names.MIG_CLASS:
            cores = self.cores or 0
        else:
            cores = names.CORES_PER_CARD if self.whole else (self.cores or 0)
        return Amounts(memory=(self.memory or 0) * self.count, cores=cores * self.count,
                       devices=self.count)


def _int(value: Any) -> int | None:
    try:
        quantity = parse_quantity(value)
    except (QuantityError, TypeError):
        return None
    return quantity.value()


def _share_config(spec: Mapping[str, Any], request: str) -> Mapping[str, Any]:
    for entry in (spec.get("devices") or {}).get("config") or ():
        if not isinstance(entry, Mapping):
            continue
        opaque = entry.get("opaque") or {}
        if opaque.get("driver") != names.DRIVER:
            continue
        targets = entry.get("requests")
        if targets and request not in targets:
            continue
        parameters = opaque.get("parameters")
        if isinstance(parameters, Mapping) and parameters.get("kind") == \
                names.KIND_GPU_SHARE_CONFIG:
            return parameters
    return {}


def requests_of(spec: Mapping[str, Any]) -> list[RequestShape]:
    """The gateway-class requests of a ResourceClaim spec (a template's spec.spec)."""
    shapes: list[RequestShape] = []
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    for index, request in enumerate((devices or {}).get("requests") or ()):
        if not isinstance(request, Mapping):
            continue
        name = str(request.get("name", ""))
        exact = request.get("exactly")
        if isinstance(exact, Mapping):
            choices = [exact]
        else:
            alternatives = request.get("firstAvailable") or ()
            choices = [a if isinstance(a, Mapping) else {} for a in alternatives] \
                if isinstance(alternatives, list) else []
            exact = choices[0] if choices else None
        if exact is None or exact.get("deviceClassName") not in names.GATEWAY_CLASSES:
            continue
        config = _share_config(spec, name)
        memory, percent, cores = _share_of(exact, config)
        count = exact.get("count", 1) if exact.get("allocationMode", "ExactCount") == \
            "ExactCount" else 1
        whole = _whole(memory, percent, cores)
        shapes.append(RequestShape(
            name=name, class_name=str(exact["deviceClassName"]),
            count=count if isinstance(count, int) and count > 0 else 1, whole=whole,
            memory=memory if isinstance(memory, int) else None,
            memory_percent=percent if isinstance(percent, int) else None,
            cores=cores if isinstance(cores, int) else None,
            enforcement=str(config.get("enforcement") or "none"),
            index=index, alternatives=tuple(_selectable(c) for c in choices),
            later_shares=tuple(_later_shares(spec, name, choices[1:]))))
    return shapes


def _share_of(choice: Mapping[str, Any], config: Mapping[str, Any]
              ) -> tuple[Any, Any, Any]:
    """(memory, memory percent, cores) one `exactly` or alternative asks of each card: its
    capacity requests where it states them, else its GpuShareConfig's."""
    capacity = (choice.get("capacity") or {}).get("requests") or {}
    memory = _int(capacity.get(names.CAPACITY_MEMORY)) if names.CAPACITY_MEMORY in capacity \
        else config.get("memory")
    cores = _int(capacity.get(names.CAPACITY_CORES)) if names.CAPACITY_CORES in capacity \
        else config.get("cores")
    return memory, config.get("memoryPercent"), cores


def _whole(memory: Any, percent: Any, cores: Any) -> bool:
    return memory is None and percent is None and cores in (None, names.CORES_PER_CARD)


def _later_shares(spec: Mapping[str, Any], request: str,
                  later: Sequence[Mapping[str, Any]]) -> list[str]:
    """The names of the alternatives after the first that ask for a share of a gateway card
    (a config for `request/name` or for the whole request counts as theirs)."""
    out = []
    for choice in later:
        if choice.get("deviceClassName") != names.GPU_CLASS:
            continue
        sub = str(choice.get("name", ""))
        config = _share_config(spec, f"{request}/{sub}") or _share_config(spec, request)
        if not _whole(*_share_of(choice, config)):
            out.append(sub)
    return out


def _selectable(choice: Mapping[str, Any]) -> tuple[str, tuple[str, ...]]:
    """(device class, CEL selectors) of one `exactly` or `firstAvailable` entry."""
    selectors = choice.get("selectors")
    expressions = []
    for selector in selectors if isinstance(selectors, list) else ():
        cel = selector.get("cel") if isinstance(selector, Mapping) else None
        expression = cel.get("expression") if isinstance(cel, Mapping) else None
        expressions.append(expression if isinstance(expression, str) else "")
    return str(choice.get("deviceClassName", "")), tuple(expressions)


@dataclass(frozen=True, slots=True)
class DeviceCharge:
    """What one allocation result holds of one device."""

    key: DeviceKey
    class_name: str
    memory: int
    cores: int
    whole: bool
    device: Mapping[str, Any] | None  # the published device, when known


def _request_classes(claim: Mapping[str, Any]) -> dict[str, str]:
    classes: dict[str, str] = {}
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
        if not isinstance(request, Mapping):
            continue
        name = str(request.get("name", ""))
        exact = request.get("exactly")
        if isinstance(exact, Mapping):
            classes[name] = str(exact.get("deviceClassName", ""))
        for sub in request.get("firstAvailable") or ():
            if isinstance(sub, Mapping):
                classes[f"{name}/{sub.get('name', '')}"] = str(sub.get("deviceClassName", ""))
    return classes


def _capacity(device: Mapping[str, Any] | None, name: str, default: int) -> int:
    entry = ((device or {}).get("capacity") or {}).get(name)
    value = _int(entry.get("value")) if isinstance(entry, Mapping) else None
    return default if value is None else value


def card_amounts(device: Mapping[str, Any] | None) -> tuple[int, int]:
    """(memory, cores) of a whole published device, as a charge holding all of it counts."""
    return (_capacity(device, names.CAPACITY_MEMORY, 0),
            _capacity(device, names.CAPACITY_CORES, names.CORES_PER_CARD))


def _consumed(consumed: Mapping[str, Any], name: str) -> int:
    """One amount of a share: 0 when absent, -1 when the API would refuse it."""
    if consumed.get(name) is None:
        return 0
    value = _int(consumed[name])
    return -1 if value is None or value < 0 else value


def charges_of(claim: Mapping[str, Any], lookup: DeviceLookup) -> list[DeviceCharge]:
    """One charge per device result of an allocated claim of a gateway class, whoever wrote it.

    The amount is the result's `consumedCapacity`, else the share the allocator recorded in the
    allocation itself (`gpu.shares`: a cluster without consumable capacity), else the whole
    device (how kube-scheduler and non-sharing writers allocate). Never the annotation
    dra-gateway.io/shares: any tenant who may edit its claims may edit it, and a share read
    from it would shrink what the quota counts below what the card holds for the claim.
    """
    allocation = (claim.get("status") or {}).get("allocation")
    if not isinstance(allocation, Mapping):
        return []
    recorded = shares_by_result(allocated_shares(allocation))
    classes = _request_classes(claim)
    charges: list[DeviceCharge] = []
    for result in (allocation.get("devices") or {}).get("results") or ():
        class_name = classes.get(str(result.get("request", "")), "")
        if class_name not in names.GATEWAY_CLASSES:
            continue
        key = (str(result.get("driver", "")), str(result.get("pool", "")),
               str(result.get("device", "")))
        device = lookup(key)
        consumed = result.get("consumedCapacity")
        entries = recorded.get(result_key(result)) if consumed is None else None
        if entries:
            consumed = entries.pop(0).consumed_capacity
        card_memory, card_cores = card_amounts(device)
        memory = cores = -1
        if isinstance(consumed, Mapping):
            memory, cores = (_consumed(consumed, names.CAPACITY_MEMORY),
                             _consumed(consumed, names.CAPACITY_CORES))
        if memory >= 0 and cores >= 0:
            whole = device is not None and memory >= card_memory > 0 and cores >= card_cores
        else:
            # No share, or one the API refuses (negative or not a quantity, from 1.38): the
            # whole card, as the planner's ledger counts it.
            memory, cores, whole = card_memory, card_cores, True
        charges.append(DeviceCharge(key, class_name, memory, cores, whole, device))
    return charges


def total(charges: Sequence[DeviceCharge]) -> Amounts:
    """The amounts of one claim's charges: distinct devices, one claim when any."""
    return Amounts(memory=sum(c.memory for c in charges), cores=sum(c.cores for c in charges),
                   devices=len({c.key for c in charges}), claims=1 if charges else 0)

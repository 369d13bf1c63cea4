"""What a pod left on legacy GPU names costs its namespace's GPUQuotas.

While a namespace moves to the gateway, some of its pods keep their legacy requests (created
before it was enabled, audited, or opted out where the namespace grants it) and a legacy device
plugin serves them. A ResourceQuota on `requests.nvidia.com/gpu` no longer sees the translated
pods (their legacy names became claims), so the GPUQuota must see both worlds: it counts each
legacy pod as the claim it would be if translated (the same rules, the same shapes), so that
translated and legacy pods together never pass its hard amounts.

A legacy pod's cards are the legacy plugin's choice and unknown to the gateway: each card it
asks for counts as a card touched of its own (`DeviceCharge` keys of the driver
`LEGACY_DRIVER`, one per card of each request), whole cards and shares alike; memory is what
the request states per card, and where it states none (a whole card, a percent of the card) the
smallest card the gateway publishes (`card_memory`), as the least it holds. A quota scoped by a
device selector cannot tell which cards those are and does not count them.

A pod whose translation is refused, or that no rule translates, is still served by its legacy
plugin: `counted_cards` reads the count names (`nvidia.com/gpu`, `volcano.sh/vgpu-number`...)
into whole cards, so that no pod escapes the count by being untranslatable.

Pure: it takes request shapes and pods as plain data and returns data.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Final

from dra_gateway.gpu.legacy_resources import is_legacy_gpu_resource
from dra_gateway.gpu.memory_percent import share_bytes_in_whole_mib
from dra_gateway.kube import names
from dra_gateway.kube.quantity import QuantityError, parse_quantity
from dra_gateway.policy.amounts import DeviceCharge, RequestShape, requests_of
from dra_gateway.policy.legacyquotas import legacy_name

__all__ = [
    "LEGACY_CLAIM_PREFIX",
    "LEGACY_DRIVER",
    "counted_cards",
    "keeps_legacy_gpus",
    "legacy_charges",
    "legacy_names",
    "pod_charges",
    "still_counted",
    "whole_cards",
]

# The pseudo-driver of a legacy pod's cards in the quota ledger, and the prefix of its record.
LEGACY_DRIVER: Final = "legacy.dra-gateway.io"
LEGACY_CLAIM_PREFIX: Final = "legacy/"


def legacy_charges(pod_uid: str, claims: Sequence[Sequence[RequestShape]], *,
                   card_memory: int = 0) -> tuple[DeviceCharge, ...]:
    """The charges of a legacy pod whose translation would make `claims` (the gateway-class
    requests of each claim): one per card each request asks for."""
    charges: list[DeviceCharge] = []
    for number, shapes in enumerate(claims):
        for shape in shapes:
            if shape.memory is not None:
                memory = shape.memory
            elif shape.memory_percent is not None:
                memory = share_bytes_in_whole_mib(card_memory, shape.memory_percent)
            else:
                memory = card_memory if shape.whole else 0
            cores = names.CORES_PER_CARD if shape.whole else (shape.cores or 0)
            for card in range(shape.count):
                key = (LEGACY_DRIVER, pod_uid, f"{number}/{shape.name}/{card}")
                charges.append(DeviceCharge(key, shape.class_name, memory, cores, shape.whole,
                                            None))
    return tuple(charges)


def whole_cards(pod_uid: str, count: int, *, card_memory: int = 0) -> tuple[DeviceCharge, ...]:
    """The charges of `count` whole cards of a legacy pod no rule translates."""
    return tuple(DeviceCharge((LEGACY_DRIVER, pod_uid, f"cards/{card}"), names.GPU_CLASS,
                              card_memory, names.CORES_PER_CARD, True, None)
                 for card in range(count))


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _count(value: Any) -> int:
    try:
        quantity = parse_quantity(value)
    except (QuantityError, TypeError):
        return 0
    return max(quantity.value(), 0) if quantity.is_integer() else 0


def _container_cards(container: Any, skip: Collection[str] = ()) -> int:
    resources = container.get("resources") if isinstance(container, Mapping) else None
    if not isinstance(resources, Mapping):
        return 0
    amounts: dict[str, Any] = {}
    for part in ("requests", "limits"):  # limits win: requests default to them
        values = resources.get(part)
        if isinstance(values, Mapping):
            amounts.update(values)
    total = 0
    for resource, value in amounts.items():
        if resource in skip:
            continue
        known = legacy_name(str(resource))
        if known is not None and known.dimension == "devices":
            total += _count(value)
    return total


def counted_cards(pod: Mapping[str, Any], skip: Collection[str] = ()) -> int:
    """The cards a pod's legacy count names (other than those in `skip`) ask for, as the
    scheduler counts a pod: the larger of its containers together and its largest init
    container."""
    spec = _mapping(pod.get("spec"))
    main = sum(_container_cards(c, skip) for c in _list(spec.get("containers")))
    return max([main, *(_container_cards(c, skip)
                        for c in _list(spec.get("initContainers")))])


def _asks_for_gpus(container: Any, skip: Collection[str]) -> bool:
    resources = container.get("resources") if isinstance(container, Mapping) else None
    if not isinstance(resources, Mapping):
        return False
    for part in ("limits", "requests"):
        values = resources.get(part)
        for resource, value in (values.items() if isinstance(values, Mapping) else ()):
            if resource in skip or not is_legacy_gpu_resource(str(resource)):
                continue
            known = legacy_name(str(resource))
            if known is not None and known.dimension is None:
                continue  # a hint, or another accelerator's devices
            try:
                if parse_quantity(value).sign() > 0:
                    return True
            except (QuantityError, TypeError):
                return True  # unreadable: the API server refuses it; never let it pass uncounted
    return False


def legacy_names(pod: Mapping[str, Any]) -> set[str]:
    """Every resource name a pod's containers and init containers ask for."""
    spec = _mapping(pod.get("spec"))
    found: set[str] = set()
    for key in ("initContainers", "containers"):
        for container in _list(spec.get(key)):
            resources = _mapping(_mapping(container).get("resources"))
            for part in ("limits", "requests"):
                found.update(str(n) for n in _mapping(resources.get(part)))
    return found


def keeps_legacy_gpus(pod: Mapping[str, Any], *, skip: Collection[str] = ()) -> bool:
    """Whether a pod asks a legacy stack for GPUs: a container or init container with a
    non-zero legacy GPU name, other than those in `skip` (what kube-scheduler serves through
    claims: the names DeviceClasses declare as their extended resource, with what their rule
    reads beside them). The pod's own annotations are not trusted: a translated pod has no
    legacy GPU name left, whatever it says."""
    spec = _mapping(pod.get("spec"))
    return any(_asks_for_gpus(c, skip) for key in ("initContainers", "containers")
               for c in _list(spec.get(key)))


def pod_charges(pod: Mapping[str, Any], claim_specs: Sequence[Mapping[str, Any]] | None, *,
                card_memory: int = 0, skip: Collection[str] = ()) -> tuple[DeviceCharge, ...]:
    """What a legacy pod costs its namespace's GPUQuotas: its translation's claims
    (`claim_specs`, the specs of the ResourceClaimTemplates the rules in force would make of
    it; None when they refuse it) charged as `legacy_charges` does, else its count names
    (other than `skip`) as whole cards (`counted_cards`)."""
    meta = _mapping(pod.get("metadata"))
    uid = str(meta.get("uid") or meta.get("name") or "")
    claims = [shapes for shapes in (requests_of(spec) for spec in claim_specs or ()) if shapes]
    if claims:
        return legacy_charges(uid, claims, card_memory=card_memory)
    return whole_cards(uid, counted_cards(pod, skip), card_memory=card_memory)


def still_counted(pod: Mapping[str, Any], now: datetime) -> bool:
    """Whether a pod counts against quotas at `now`, as a ResourceQuota counts it: not once it
    has finished, and a pod being deleted until its grace period is over (its kubelet keeps the
    legacy plugin's card while its containers stop)."""
    if _mapping(pod.get("status")).get("phase") in ("Succeeded", "Failed"):
        return False
    meta = _mapping(pod.get("metadata"))
    deleting = meta.get("deletionTimestamp")
    if not deleting:
        return True
    try:
        deadline = datetime.fromisoformat(str(deleting).replace("Z", "+00:00"))
    except ValueError:
        return False
    grace = meta.get("deletionGracePeriodSeconds")
    if isinstance(grace, int) and grace > 0:
        deadline += timedelta(seconds=grace)
    return now <= deadline

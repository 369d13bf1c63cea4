"""The defrag planner's estimate of a node, from its cards alone (which holders would leave, how
much of a card that frees), and the small conversions between pods, claims and plans it needs.
The estimate only orders the trials; `plan_pod` decides. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_gateway.allocator.planner import kubefit
from dra_gateway.allocator.planner.allocation import PodPlan
from dra_gateway.allocator.planner.defrag.model import Placement
from dra_gateway.allocator.planner.demand import ClaimDemand
from dra_gateway.allocator.planner.devices import Device
from dra_gateway.allocator.planner.state import ClusterState
from dra_gateway.gpu.memory_percent import share_fraction
from dra_gateway.kube import names, objects

DeviceKey = tuple[str, str, str]


@dataclass(slots=True)
class Card:
    device: Device
    free: float  # fraction of the card nobody holds
    holders: tuple[str, ...]  # resident pods holding it
    sizes: tuple[float, ...]  # each holder's fraction of the card, as `holders`
    freeable: bool  # every holder known and allowed to move (for some waiter)


def label(pod: Mapping[str, Any]) -> str:
    return "/".join(objects.namespace_name(pod))


def devices_of(claims: Iterable[Mapping[str, Any]]) -> list[DeviceKey]:
    keys: list[DeviceKey] = []
    for claim in claims:
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for result in (allocation.get("devices") or {}).get("results") or ():
            keys.append((result.get("driver", ""), result.get("pool", ""),
                         result.get("device", "")))
    return keys


def plan_devices(plan: PodPlan) -> list[DeviceKey]:
    return devices_of({"status": {"allocation": a}} for a in plan.allocations.values())


def unplaced(claim: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in claim.items() if key != "status"}


def unbound(pod: Mapping[str, Any]) -> dict[str, Any]:
    spec = {k: v for k, v in (pod.get("spec") or {}).items() if k != "nodeName"}
    return {**pod, "spec": spec}


def to_free(card: Card, share: float, may_move: Any) -> tuple[str, ...] | None:
    """The fewest holders of `card` whose leaving frees `share` of it (largest first)."""
    if card.free + 1e-9 >= share:
        return ()
    free = card.free
    leaving: list[str] = []
    for size, holder in sorted(zip(card.sizes, card.holders, strict=True), reverse=True):
        if not may_move(holder):
            continue
        leaving.append(holder)
        free += size
        if free + 1e-9 >= share:
            return tuple(leaving) if card.freeable or free - card.free >= share else None
    return None


@dataclass(slots=True)
class Need:
    """What a waiter asks of the gateway's GPUs, as the estimate reads it."""

    whole: int
    shares: list[float]
    cpu: int
    memory: int
    checks: list[tuple[str, Any, bool]]  # selectors of its classes and requests

    def accepts(self, state: ClusterState, device: Device) -> bool:
        return all(state.verdict_for(device, expression, selector, identity) is True
                   for expression, selector, identity in self.checks)


def need_of(state: ClusterState, pod: Mapping[str, Any],
          claims: Sequence[Mapping[str, Any]]) -> Need | None:
    whole = 0
    shares: list[float] = []
    checks: list[tuple[str, Any, bool]] = []
    memory_card = state.typical_card_memory()
    for claim in claims:
        demand: ClaimDemand = state.demand(claim.get("spec") or {})[1]
        for request in demand.requests:
            alternative = request.alternatives[0]
            if alternative.class_name != names.GPU_CLASS:
                continue
            info = state.classes.get(alternative.class_name)
            if info is not None:
                checks += [(e, s, False)
                           for e, s in zip(info.expressions, info.selectors, strict=True)]
            checks += [(e, s, alternative.identity_sensitive)
                       for e, s in zip(alternative.expressions, alternative.selectors,
                                       strict=True)]
            share = alternative.share
            fraction = 0.0
            if share.memory_percent is not None:
                fraction = share_fraction(share.memory_percent)
            elif share.memory is not None:
                fraction = share.memory / memory_card
            if share.cores is not None:
                fraction = max(fraction, share.cores / names.CORES_PER_CARD)
            if alternative.whole or fraction <= 0 or fraction >= 1:
                whole += max(alternative.count, 1)
            else:
                shares += [fraction] * max(alternative.count, 1)
    if not whole and not shares:
        return None
    cpu, memory = kubefit.pod_requests(pod)
    return Need(whole, shares, cpu, memory, checks)


def placement(state: ClusterState, plan: PodPlan) -> Placement:
    return Placement(plan.node_name or "", tuple(k[2] for k in plan_devices(plan)))

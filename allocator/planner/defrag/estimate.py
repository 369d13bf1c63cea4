"""The defrag planner's estimate of a node, from its cards alone (which holders would leave, how
much of a card that frees), and the small conversions between pods, claims and plans it needs.
The estimate only orders the trials; `plan_pod` decides. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
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
    # A card cut into MIG instances on demand: the devices drawing on its counters (its
    # profiles at every placement, the whole card among them); their holders are the card's.
    parts: tuple[Device, ...] = ()


def counter_draw(device: Device, sets: frozenset[tuple[str, str, str]]) -> int:
    """What the device draws on the counter sets `sets` (nanos, every counter summed)."""
    return sum(amount for key, amount in device.counters if key[:3] in sets)


def counter_sets(device: Device) -> frozenset[tuple[str, str, str]]:
    return frozenset(key[:3] for key, _ in device.counters)


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
    """What a waiter asks of the gateway's GPUs, as the estimate reads it. A MIG instance is a
    share of the card it is cut from: the least of the card's counters any device it accepts
    draws (`mig_checks` pick those devices)."""

    whole: int
    shares: list[float]
    cpu: int
    memory: int
    checks: list[tuple[str, Any, bool]]  # selectors of its classes and requests
    mig_checks: list[tuple[str, Any, bool]] = field(default_factory=list)

    def accepts(self, state: ClusterState, device: Device) -> bool:
        return all(state.verdict_for(device, expression, selector, identity) is True
                   for expression, selector, identity in self.checks)

    def accepts_card(self, state: ClusterState, card: Card) -> bool:
        """Whether the card suits the need: its own device, and for MIG instances a device
        drawing on its counters."""
        if not self.accepts(state, card.device):
            return False
        return not self.mig_checks or any(
            all(state.verdict_for(part, e, s, i) is True for e, s, i in self.mig_checks)
            for part in card.parts)


def need_of(state: ClusterState, pod: Mapping[str, Any],
            claims: Sequence[Mapping[str, Any]],
            fractions: dict[tuple[object, ...], float | None] | None = None) -> Need | None:
    """`fractions` remembers each MIG request's share of a card (by its selectors) across
    calls: it depends on the devices published alone."""
    whole = 0
    shares: list[float] = []
    checks: list[tuple[str, Any, bool]] = []
    mig_checks: list[tuple[str, Any, bool]] = []
    memory_card = state.typical_card_memory()
    for claim in claims:
        demand: ClaimDemand = state.demand(claim.get("spec") or {})[1]
        for request in demand.requests:
            alternative = request.alternatives[0]
            if alternative.class_name == names.MIG_CLASS:
                these = _selector_checks(state, alternative)
                key = tuple((e, i) for e, _, i in these)
                if fractions is None or key not in fractions:
                    fraction = _instance_fraction(state, these)
                    if fractions is not None:
                        fractions[key] = fraction
                else:
                    fraction = fractions[key]
                if fraction is not None:
                    mig_checks += these
                    shares += [fraction] * max(alternative.count, 1)
                continue
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
    return Need(whole, shares, cpu, memory, checks, mig_checks)


def _selector_checks(state: ClusterState, alternative: Any) -> list[tuple[str, Any, bool]]:
    info = state.classes.get(alternative.class_name)
    checks = [] if info is None else [
        (e, s, False) for e, s in zip(info.expressions, info.selectors, strict=True)]
    return checks + [(e, s, alternative.identity_sensitive)
                     for e, s in zip(alternative.expressions, alternative.selectors, strict=True)]


def _instance_fraction(state: ClusterState, checks: list[tuple[str, Any, bool]]
                       ) -> float | None:
    """The least share of its card an instance the checks accept takes (its counters against
    its card's); None where no device cut on demand is accepted (instances an administrator
    made are not freed by moving pods)."""
    best: float | None = None
    seen: set[tuple[object, ...]] = set()  # fractions already known
    for node, totals in state.inventory.node_counters.items():
        for device in state.node_devices.get(node, ()):
            if not device.counters:
                continue
            sets = counter_sets(device)
            total = sum(v for k, v in totals.items() if k[:3] in sets)
            shape: tuple[object, ...] = (tuple(sorted(a for _, a in device.counters)), total)
            if shape in seen or total <= 0:
                continue
            if all(state.verdict_for(device, e, s, i) is True for e, s, i in checks):
                seen.add(shape)
                fraction = counter_draw(device, sets) / total
                best = fraction if best is None else min(best, fraction)
    return best


def placement(state: ClusterState, plan: PodPlan) -> Placement:
    return Placement(plan.node_name or "", tuple(k[2] for k in plan_devices(plan)))

"""Coexistence with a legacy GPU device plugin on one node: which cards to withhold, and why.

While a node moves from a legacy device plugin (NVIDIA's, HAMi, Volcano vGPU, gpushare, qGPU...)
to DRA, two allocators could hand out the same card: the kubelet's device manager, through the
legacy plugin's resource names, and DRA, through this plugin's ResourceSlices. The rule kept here
is that a card is never offered by both at once:

- `Legacy`: a legacy plugin offers GPUs on the node (the kubelet's allocatable devices, or the
  Node's status.allocatable or status.capacity, show a legacy GPU name: the capacity counts the
  devices a plugin reports Unhealthy, which the kubelet hands out again once healthy). Nothing is
  published: any card may be handed out by the kubelet at any moment.
- `CuttingOver`: nothing offers legacy GPUs any more, but running containers still hold devices
  under legacy names. The cards they hold are withheld; an ID that maps to no card of the node
  withholds every card until its holder ends, since it cannot be ruled out.
- `DRA`: neither. Every card is published.

Where the kubelet cannot be asked (its pod-resources socket is missing or unreadable), the
Node's status decides: a legacy GPU name with a non-zero amount (allocatable or capacity) means
`Legacy`; a name present at zero means a legacy plugin left since the kubelet started and
containers may still hold its devices, so every card is withheld; no legacy name at all means
`DRA`. Without the Node either, every card is withheld.

Which resource names are legacy GPU names is the core's list (`gpu/legacy_resources.py`), which
policy's quota conversion reads too.

This module is pure: facts and the kubelet's answers in, a `Verdict` out. It reads no socket,
calls no API and publishes nothing; `coexistence.py` does that.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dra_gateway.gpu.legacy_resources import is_legacy_gpu_resource
from dra_gateway.kube import names
from dra_gateway.kube.quantity import Quantity, QuantityError
from dra_gateway.node_plugin.devices import DeviceInfo
from dra_gateway.node_plugin.facts import NodeFacts

_PCI = re.compile(r"^([0-9a-f]{1,8}):([0-9a-f]{2}):([0-9a-f]{2})\.([0-7])$")
_INDEX = re.compile(r"^(\d+)$")
# NVIDIA's plugin with deviceIDStrategy=index names a MIG device `<card index>:<MIG index>`.
_INDEX_MIG = re.compile(r"^(\d+):(\d+)$")
# NVIDIA's MIG UUIDs before driver R470: `MIG-GPU-<card uuid>/<GPU instance>/<compute instance>`.
_OLD_MIG = re.compile(r"^MIG-(GPU-[^/]+)/(\d+)/(\d+)$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class MigInstance:
    device: str  # the published device name
    uuid: str
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None


@dataclass(frozen=True, slots=True)
class Card:
    """One physical card as the legacy plugins may name it, and the devices it is published as."""

    index: int
    uuid: str
    devices: tuple[str, ...]  # the card itself, or its MIG instances
    pci_bus_id: str | None = None
    migs: tuple[MigInstance, ...] = ()


def cards_of(facts: NodeFacts, table: Mapping[str, DeviceInfo]) -> tuple[Card, ...]:
    """The node's cards with the names their devices are published under (from `device_table`)."""
    by_card: dict[str, list[DeviceInfo]] = {}
    for info in table.values():
        by_card.setdefault(info.card_uuid, []).append(info)
    out = []
    for gpu in facts.gpus:
        infos = sorted(by_card.get(gpu.uuid, []), key=lambda i: i.name)
        out.append(Card(
            index=gpu.index, uuid=gpu.uuid, devices=tuple(i.name for i in infos),
            pci_bus_id=gpu.pci_bus_id,
            migs=tuple(MigInstance(device=i.name, uuid=i.uuid,
                                   gpu_instance_id=i.gpu_instance_id,
                                   compute_instance_id=i.compute_instance_id)
                       for i in infos if i.kind == "mig")))
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Mapped:
    """What one legacy device ID stands for on this node."""

    card: str  # the card's UUID
    devices: frozenset[str]  # the published devices it takes: the whole card, or one instance


def _pci_key(text: str) -> tuple[int, int, int, int] | None:
    # NVML writes an 8-digit domain (`00000000:3B:00.0`), sysfs and ROCm a 4-digit one.
    match = _PCI.match(text.lower())
    if match is None:
        return None
    domain, bus, device, function = match.groups()
    return int(domain, 16), int(bus, 16), int(device, 16), int(function)


def map_device_id(device_id: str, cards: Sequence[Card]) -> Mapped | None:
    """The card (and devices) a legacy plugin's device ID names; None when it names none.

    NVIDIA's plugin uses card UUIDs (`GPU-…`), `GPU-…::N` for time-slicing replicas, MIG UUIDs
    (`MIG-…`, or `MIG-GPU-…/gi/ci` before R470) and, with deviceIDStrategy=index, indexes
    (`0`, MIG `0:1`). HAMi and Volcano's vGPU build `<card UUID>-<n>`, gpushare `<card
    UUID>-_-<n>`: any ID that is a card's UUID followed by a separator is that card. Some
    plugins (qGPU, AMD's) use an index or a PCI bus ID. A MIG UUID takes only its instance; every
    other form takes the whole card, since which part of it is used cannot be told.
    """
    lowered = device_id.lower()
    for card in cards:
        for mig in card.migs:
            if mig.uuid.lower() == lowered:
                return Mapped(card=card.uuid, devices=frozenset({mig.device}))
    old = _OLD_MIG.match(device_id)
    if old is not None:
        parent, gi, ci = old.group(1).lower(), int(old.group(2)), int(old.group(3))
        for card in cards:
            if card.uuid.lower() == parent:
                hit = [m.device for m in card.migs
                       if (m.gpu_instance_id, m.compute_instance_id) == (gi, ci)]
                return Mapped(card=card.uuid, devices=frozenset(hit or card.devices))
        return None
    # The longest UUID wins, so that a card named like another's prefix is never confused.
    best: Card | None = None
    for card in cards:
        uuid = card.uuid.lower()
        names_it = lowered == uuid or (
            lowered.startswith(uuid) and not lowered[len(uuid)].isalnum())
        if names_it and (best is None or len(card.uuid) > len(best.uuid)):
            best = card
    if best is not None:
        return Mapped(card=best.uuid, devices=frozenset(best.devices))
    pci = _pci_key(device_id)
    if pci is not None:
        for card in cards:
            if card.pci_bus_id is not None and _pci_key(card.pci_bus_id) == pci:
                return Mapped(card=card.uuid, devices=frozenset(card.devices))
        return None
    index = _INDEX.match(device_id) or _INDEX_MIG.match(device_id)
    if index is not None:
        for card in cards:
            if card.index == int(index.group(1)):
                return Mapped(card=card.uuid, devices=frozenset(card.devices))
    return None


@dataclass(frozen=True, slots=True)
class Holder:
    """Devices of one legacy resource name that one running container holds."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]

    @property
    def pod_ref(self) -> str:
        return f"{self.namespace}/{self.pod}"


@dataclass(frozen=True, slots=True)
class KubeletView:
    """What the kubelet's pod-resources API said, every resource name included (`decide` keeps
    the legacy GPU names): allocatable device IDs per name, and what running containers hold."""

    allocatable: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    holders: tuple[Holder, ...] = ()


@dataclass(frozen=True, slots=True)
class Verdict:
    """Where the node is in the move, and the devices that must not be published."""

    state: str  # names.NODE_STATE_LEGACY, NODE_STATE_CUTTING_OVER or NODE_STATE_DRA
    withheld: frozenset[str]  # published device names to leave out
    held_cards: frozenset[str]  # UUIDs of the cards with a withheld device
    cards: int  # cards on the node
    message: str
    offered: tuple[str, ...] = ()  # legacy GPU names offered on the node
    holders: tuple[Holder, ...] = ()  # containers holding legacy GPU devices
    unmapped: tuple[str, ...] = ()  # held IDs that name no card of the node
    # False when the kubelet could not be asked and the Node's status decided.
    from_kubelet: bool = True


def _nonzero(amount: str) -> bool:
    try:
        return Quantity.parse(amount) != Quantity.parse("0")
    except QuantityError:
        return True  # unreadable: assume it offers something


def _every_card(cards: Sequence[Card]) -> tuple[frozenset[str], frozenset[str]]:
    """(withheld devices, held card UUIDs) when every card is kept from DRA."""
    return (frozenset(d for c in cards for d in c.devices), frozenset(c.uuid for c in cards))


def _holders_text(holders: Sequence[Holder], limit: int = 5) -> str:
    seen: dict[str, set[str]] = {}
    for holder in holders:
        seen.setdefault(holder.pod_ref, set()).add(holder.resource)
    parts = [f"{pod} ({', '.join(sorted(res))})" for pod, res in sorted(seen.items())]
    more = len(parts) - limit
    return ", ".join(parts[:limit]) + (f" and {more} more" if more > 0 else "")


def decide(*, cards: Sequence[Card], kubelet: KubeletView | None,
           node_allocatable: Mapping[str, str] | None = None,
           node_capacity: Mapping[str, str] | None = None,
           kubelet_error: str = "") -> Verdict:
    """The node's state and the devices to withhold.

    `kubelet` is None when the pod-resources API could not be read (`kubelet_error` says why);
    `node_allocatable` and `node_capacity` are the Node's status.allocatable and
    status.capacity, None when the Node could not be read. The kubelet lists healthy devices
    only (its pod-resources API and the Node's allocatable): a legacy plugin's cards turned
    Unhealthy (NVIDIA's after an XID) show only in the capacity, and the kubelet hands them out
    again once healthy, so a legacy GPU name the capacity counts keeps the node `Legacy` (as
    does a departed plugin's, for the grace of about five minutes the capacity keeps it).
    """
    total = len(cards)
    node_names = {n: a for n, a in {**(node_capacity or {}), **(node_allocatable or {})}.items()
                  if is_legacy_gpu_resource(n)}
    node_offers = sorted({n for n, a in (node_allocatable or {}).items()
                          if is_legacy_gpu_resource(n) and _nonzero(a)}
                         | {n for n, a in (node_capacity or {}).items()
                            if is_legacy_gpu_resource(n) and _nonzero(a)})
    if kubelet is None:
        return _without_kubelet(cards, node_allocatable, node_names, node_offers, kubelet_error)
    # With the kubelet's answer, the Node's amounts add only the offers of names no device
    # plugin serves; a name at zero there says nothing the kubelet's holders do not.
    offered = sorted(set(node_offers) | {
        n for n, ids in kubelet.allocatable.items() if ids and is_legacy_gpu_resource(n)})
    holders = tuple(sorted(
        (h for h in kubelet.holders if h.device_ids and is_legacy_gpu_resource(h.resource)),
        key=lambda h: (h.namespace, h.pod, h.container, h.resource)))
    if offered:
        withheld, held = _every_card(cards)
        return Verdict(
            state=names.NODE_STATE_LEGACY, withheld=withheld, held_cards=held, cards=total,
            offered=tuple(offered), holders=holders,
            message=f"a legacy device plugin offers {', '.join(offered)} on this node: none of "
                    f"its {total} card(s) is published until it leaves the node (label "
                    f"{names.NODE_CUT_OVER_LABEL}={names.NODE_CUT_OVER_VALUE})")
    devices: set[str] = set()
    held_cards: set[str] = set()
    unmapped: list[str] = []
    for holder in holders:
        for device_id in holder.device_ids:
            mapped = map_device_id(device_id, cards)
            if mapped is None:
                unmapped.append(f"{device_id} of {holder.pod_ref} ({holder.resource})")
            else:
                devices.update(mapped.devices)
                held_cards.add(mapped.card)
    if unmapped:
        withheld, held = _every_card(cards)
        return Verdict(
            state=names.NODE_STATE_CUTTING_OVER, withheld=withheld, held_cards=held, cards=total,
            holders=holders, unmapped=tuple(unmapped),
            message=f"legacy device ID(s) {'; '.join(unmapped[:5])} name no card of this "
                    f"node: all {total} card(s) withheld until those pods end; held by "
                    f"{_holders_text(holders)}")
    if holders:
        return Verdict(
            state=names.NODE_STATE_CUTTING_OVER, withheld=frozenset(devices),
            held_cards=frozenset(held_cards), cards=total, holders=holders,
            message=f"{len(held_cards)} of {total} card(s) held by legacy pods: "
                    f"{_holders_text(holders)}; withheld until those pods end")
    return Verdict(state=names.NODE_STATE_DRA, withheld=frozenset(), held_cards=frozenset(),
                   cards=total, message=f"no legacy device plugin offers GPUs and no container "
                   f"holds legacy GPU devices: all {total} card(s) published")


def _without_kubelet(cards: Sequence[Card], node_allocatable: Mapping[str, str] | None,
                     node_names: Mapping[str, str], node_offers: Sequence[str],
                     kubelet_error: str) -> Verdict:
    total = len(cards)
    why = f"the kubelet's pod-resources API cannot be read ({kubelet_error})"
    withheld, held = _every_card(cards)
    if node_allocatable is None:
        return Verdict(state=names.NODE_STATE_CUTTING_OVER, withheld=withheld, held_cards=held,
                       cards=total, from_kubelet=False,
                       message=f"{why} and neither can the Node: all {total} card(s) withheld")
    if node_offers:
        return Verdict(state=names.NODE_STATE_LEGACY, withheld=withheld, held_cards=held,
                       cards=total, offered=tuple(node_offers), from_kubelet=False,
                       message=f"the Node's status offers {', '.join(node_offers)} and "
                               f"{why}: none of its {total} card(s) is published")
    if node_names:
        return Verdict(state=names.NODE_STATE_CUTTING_OVER, withheld=withheld, held_cards=held,
                       cards=total, from_kubelet=False,
                       message=f"the Node lists {', '.join(sorted(node_names))} at zero (a "
                               f"legacy plugin left; its pods may still hold cards) and {why}: "
                               f"all {total} card(s) withheld")
    return Verdict(state=names.NODE_STATE_DRA, withheld=frozenset(), held_cards=frozenset(),
                   cards=total, from_kubelet=False,
                   message=f"the Node's status shows no legacy GPU resource, so no container "
                           f"can hold one ({why}): all {total} card(s) published")

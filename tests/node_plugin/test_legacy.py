"""Which cards a legacy device plugin's IDs name, and the verdict that keeps them unpublished."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dra_gateway.gpu.legacy_resources import is_legacy_gpu_resource
from dra_gateway.kube import names
from dra_gateway.node_plugin.devices import DeviceOptions, device_table
from dra_gateway.node_plugin.inventory import load_inventory
from dra_gateway.node_plugin.legacy import (
    Card,
    Holder,
    KubeletView,
    Mapped,
    MigInstance,
    cards_of,
    decide,
    map_device_id,
)

MIG_CARD = "GPU-5a1e2b7c-0d3f-4e59-8a61-2c4b9e7f1a03"
SHARED_CARD = "GPU-7c9d1e2f-3a4b-4c5d-8e6f-7a8b9c0d1e2f"
L4 = "GPU-9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b"
MIG_3G = "MIG-0f8e6a2d-3b1c-5e47-9d20-6a7b8c9d0e11"


def _cards(inventory: Path) -> tuple[Card, ...]:
    facts = load_inventory(inventory)
    return cards_of(facts, device_table(facts, DeviceOptions()))


@pytest.fixture
def mixed_cards(mixed: Path) -> tuple[Card, ...]:
    return _cards(mixed)


def _holder(resource: str, *ids: str, pod: str = "train") -> Holder:
    return Holder(namespace="ml", pod=pod, container="main", resource=resource,
                  device_ids=ids)


@pytest.mark.parametrize("name", [
    "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "nvidia.com/gpumem",
    "nvidia.com/gpucores", "volcano.sh/vgpu-number", "aliyun.com/gpu-mem",
    "aliyun.com/gpu-core.percentage", "koordinator.sh/gpu-core", "koordinator.sh/gpu.shared",
    "tke.cloud.tencent.com/qgpu-core", "amd.com/gpu", "k8s.amazonaws.com/vgpu",
    "kubernetes.io/gpu-core", "kubernetes.io/gpu-memory", "kubernetes.io/gpu",
    "volcano.sh/gpu-number", "volcano.sh/gpu-memory"])
def test_the_legacy_gpu_names_of_every_vendor_are_recognised(name: str) -> None:
    assert is_legacy_gpu_resource(name)


@pytest.mark.parametrize("name", ["nvidia.com/priority", "example.com/nic", "cpu",
                                  "hugepages-2Mi", "rdma/hca"])
def test_names_that_hand_out_no_gpu_are_not_legacy_gpu_names(name: str) -> None:
    assert not is_legacy_gpu_resource(name)


def test_cards_carry_the_names_their_devices_are_published_under(
        mixed_cards: tuple[Card, ...]) -> None:
    assert [(c.index, c.uuid, c.devices) for c in mixed_cards] == [
        (0, MIG_CARD, ("gpu-0-mig-14-4-2", "gpu-0-mig-19-6-1", "gpu-0-mig-9-0-4")),
        (1, SHARED_CARD, ("gpu-1",)),
        (2, L4, ("gpu-2",))]
    assert {m.uuid: m.device for m in mixed_cards[0].migs}[MIG_3G] == "gpu-0-mig-9-0-4"


@pytest.mark.parametrize("device_id", [
    SHARED_CARD,  # NVIDIA's plugin
    f"{SHARED_CARD}::3",  # NVIDIA time-slicing replica
    f"{SHARED_CARD}-7",  # HAMi and Volcano vGPU
    f"{SHARED_CARD}-_-12",  # gpushare
    SHARED_CARD.upper().replace("GPU-", "GPU-"),  # case does not matter
    "1",  # an index (deviceIDStrategy=index, qGPU)
    "0000:0f:00.0",  # a PCI bus ID as sysfs and AMD's plugin write it
    "00000000:0F:00.0",  # and as NVML writes it
])
def test_an_id_naming_a_whole_card_withholds_the_card(
        mixed_cards: tuple[Card, ...], device_id: str) -> None:
    assert map_device_id(device_id, mixed_cards) == Mapped(card=SHARED_CARD,
                                                           devices=frozenset({"gpu-1"}))


def test_a_mig_uuid_withholds_its_instance_only_and_names_its_parent_card(
        mixed_cards: tuple[Card, ...]) -> None:
    assert map_device_id(MIG_3G, mixed_cards) == Mapped(
        card=MIG_CARD, devices=frozenset({"gpu-0-mig-9-0-4"}))


def test_a_card_id_of_a_card_in_mig_mode_withholds_all_its_instances(
        mixed_cards: tuple[Card, ...]) -> None:
    for device_id in (MIG_CARD, "0", "0:1", f"MIG-{MIG_CARD}/1/0"):
        # The inventory does not know the instance ids: the old MIG form takes the whole card.
        assert map_device_id(device_id, mixed_cards) == Mapped(
            card=MIG_CARD, devices=frozenset(mixed_cards[0].devices)), device_id


def test_an_old_style_mig_id_withholds_the_instance_with_its_ids() -> None:
    card = Card(index=0, uuid="GPU-aa", devices=("gpu-0-mig-a", "gpu-0-mig-b"), migs=(
        MigInstance(device="gpu-0-mig-a", uuid="MIG-a", gpu_instance_id=1, compute_instance_id=0),
        MigInstance(device="gpu-0-mig-b", uuid="MIG-b", gpu_instance_id=2,
                    compute_instance_id=0)))
    assert map_device_id("MIG-GPU-aa/2/0", [card]) == Mapped(
        card="GPU-aa", devices=frozenset({"gpu-0-mig-b"}))


@pytest.mark.parametrize("device_id", [
    "GPU-00000000-0000-0000-0000-000000000000", "MIG-ffffffff-0000-0000-0000-000000000000",
    "7", "0000:99:00.0", f"{SHARED_CARD}x", "renderD128", ""])
def test_an_id_of_no_card_of_the_node_maps_to_nothing(
        mixed_cards: tuple[Card, ...], device_id: str) -> None:
    assert map_device_id(device_id, mixed_cards) is None


def test_a_uuid_that_begins_another_cards_uuid_never_takes_that_card() -> None:
    short = Card(index=0, uuid="GPU-1", devices=("gpu-0",))
    long = Card(index=1, uuid="GPU-1-2", devices=("gpu-1",))
    assert map_device_id("GPU-1-2-5", [short, long]) == Mapped(card="GPU-1-2",
                                                               devices=frozenset({"gpu-1"}))
    assert map_device_id("GPU-1-5", [short, long]) == Mapped(card="GPU-1",
                                                             devices=frozenset({"gpu-0"}))


def test_a_legacy_plugin_offering_gpus_leaves_the_pool_empty(
        mixed_cards: tuple[Card, ...]) -> None:
    verdict = decide(cards=mixed_cards, kubelet=KubeletView(
        allocatable={"nvidia.com/gpu": (SHARED_CARD, L4), "example.com/nic": ("eth1",)}))
    assert verdict.state == names.NODE_STATE_LEGACY
    assert verdict.withheld == {d for c in mixed_cards for d in c.devices}
    assert verdict.offered == ("nvidia.com/gpu",)
    assert verdict.message == (
        "a legacy device plugin offers nvidia.com/gpu on this node: none of its 3 card(s) is "
        "published until it leaves the node (label dra-gateway.io/cut-over=true)")


def test_once_the_plugin_left_only_the_cards_legacy_pods_hold_are_withheld(
        mixed_cards: tuple[Card, ...]) -> None:
    verdict = decide(cards=mixed_cards, kubelet=KubeletView(
        allocatable={"nvidia.com/gpu": ()},  # a plugin that left keeps its name, no devices
        holders=(_holder("nvidia.com/gpu", f"{SHARED_CARD}::1"),
                 _holder("nvidia.com/mig-3g.40gb", MIG_3G, pod="infer"),
                 _holder("example.com/nic", "eth1", pod="net"))))
    assert verdict.state == names.NODE_STATE_CUTTING_OVER
    assert verdict.withheld == {"gpu-1", "gpu-0-mig-9-0-4"}
    assert verdict.held_cards == {SHARED_CARD, MIG_CARD}
    assert verdict.message == (
        "2 of 3 card(s) held by legacy pods: ml/infer (nvidia.com/mig-3g.40gb), "
        "ml/train (nvidia.com/gpu); withheld until those pods end")


def test_a_held_id_of_no_card_withholds_every_card_until_it_ends(
        mixed_cards: tuple[Card, ...]) -> None:
    verdict = decide(cards=mixed_cards, kubelet=KubeletView(holders=(
        _holder("nvidia.com/gpu", SHARED_CARD), _holder("aliyun.com/gpu-mem", "mystery-3"))))
    assert verdict.state == names.NODE_STATE_CUTTING_OVER
    assert verdict.withheld == {d for c in mixed_cards for d in c.devices}
    assert verdict.unmapped == ("mystery-3 of ml/train (aliyun.com/gpu-mem)",)
    assert verdict.message == (
        "legacy device ID(s) mystery-3 of ml/train (aliyun.com/gpu-mem) name no card of this "
        "node: all 3 card(s) withheld until those pods end; held by ml/train "
        "(aliyun.com/gpu-mem, nvidia.com/gpu)")


def test_without_legacy_offers_or_holders_every_card_is_published(
        mixed_cards: tuple[Card, ...]) -> None:
    verdict = decide(cards=mixed_cards, kubelet=KubeletView(
        allocatable={"example.com/nic": ("eth1",)},
        holders=(_holder("example.com/nic", "eth1"),)))
    assert verdict.state == names.NODE_STATE_DRA
    assert verdict.withheld == frozenset()


def test_a_non_zero_legacy_amount_on_the_node_counts_as_an_offer_the_kubelet_lists_not(
        mixed_cards: tuple[Card, ...]) -> None:
    # Koordinator and HAMi's memory names are served by no device plugin.
    verdict = decide(cards=mixed_cards, kubelet=KubeletView(),
                     node_allocatable={"koordinator.sh/gpu-core": "300", "cpu": "64"})
    assert verdict.state == names.NODE_STATE_LEGACY
    assert verdict.offered == ("koordinator.sh/gpu-core",)


@pytest.mark.parametrize("kubelet", [KubeletView(allocatable={"nvidia.com/gpu": ()}), None])
def test_a_legacy_name_the_nodes_capacity_counts_keeps_every_card_withheld(
        mixed_cards: tuple[Card, ...], kubelet: KubeletView | None) -> None:
    # Cards a registered plugin reports Unhealthy leave the kubelet's lists and the Node's
    # allocatable, not its capacity; the kubelet hands them out again once healthy.
    verdict = decide(cards=mixed_cards, kubelet=kubelet,
                     node_allocatable={"nvidia.com/gpu": "0", "cpu": "64"},
                     node_capacity={"nvidia.com/gpu": "4", "cpu": "64"},
                     kubelet_error="" if kubelet else "socket missing")
    assert verdict.state == names.NODE_STATE_LEGACY
    assert verdict.offered == ("nvidia.com/gpu",)
    assert verdict.withheld == {d for c in mixed_cards for d in c.devices}
    gone = decide(cards=mixed_cards, kubelet=KubeletView(),
                  node_allocatable={"nvidia.com/gpu": "0"}, node_capacity={"nvidia.com/gpu": "0"})
    assert gone.state == names.NODE_STATE_DRA


@pytest.mark.parametrize(("allocatable", "state", "published"), [
    ({"nvidia.com/gpu": "8", "cpu": "64"}, names.NODE_STATE_LEGACY, False),
    ({"nvidia.com/gpu": "0"}, names.NODE_STATE_CUTTING_OVER, False),
    ({"cpu": "64", "example.com/nic": "2"}, names.NODE_STATE_DRA, True),
    (None, names.NODE_STATE_CUTTING_OVER, False),
])
def test_without_the_kubelet_the_nodes_allocatable_decides_and_doubt_withholds_all(
        mixed_cards: tuple[Card, ...], allocatable: dict[str, str] | None, state: str,
        published: bool) -> None:
    verdict = decide(cards=mixed_cards, kubelet=None, node_allocatable=allocatable,
                     kubelet_error="socket missing")
    assert (verdict.state, verdict.from_kubelet) == (state, False)
    every = {d for c in mixed_cards for d in c.devices}
    assert verdict.withheld == (frozenset() if published else every)
    assert "the kubelet's pod-resources API cannot be read (socket missing)" in verdict.message


# Properties -----------------------------------------------------------------------------------

_HEX = "0123456789abcdef"


@st.composite
def _nodes(draw: st.DrawFn) -> tuple[Card, ...]:
    """Cards with real-looking UUIDs, distinct indexes and PCI addresses, some in MIG mode."""
    count = draw(st.integers(1, 8))
    uuids = draw(st.lists(st.text(_HEX, min_size=32, max_size=32), min_size=count,
                          max_size=count, unique=True))
    buses = draw(st.lists(st.integers(1, 255), min_size=count, max_size=count, unique=True))
    cards = []
    for index, (raw, bus) in enumerate(zip(uuids, buses, strict=True)):
        uuid = f"GPU-{raw[:8]}-{raw[8:12]}-{raw[12:16]}-{raw[16:20]}-{raw[20:]}"
        migs = tuple(MigInstance(device=f"gpu-{index}-mig-{m}", uuid=f"MIG-{raw[::-1]}-{m}",
                                 gpu_instance_id=m + 1, compute_instance_id=0)
                     for m in range(draw(st.integers(0, 3))))
        cards.append(Card(index=index, uuid=uuid, pci_bus_id=f"00000000:{bus:02X}:00.0",
                          devices=tuple(m.device for m in migs) or (f"gpu-{index}",),
                          migs=migs))
    return tuple(cards)


def _vendor_ids(card: Card, n: int) -> dict[str, str]:
    """The IDs each vendor's plugin gives one card, by the forms their code builds."""
    return {"nvidia": card.uuid, "nvidia-time-slicing": f"{card.uuid}::{n}",
            "hami": f"{card.uuid}-{n}", "gpushare": f"{card.uuid}-_-{n}",
            "index": str(card.index), "index-mig": f"{card.index}:{n}",
            "pci": (card.pci_bus_id or "")[4:].lower()}


@given(_nodes(), st.data())
def test_every_vendors_id_of_a_card_maps_to_that_card(cards: tuple[Card, ...],
                                                      data: st.DataObject) -> None:
    card = data.draw(st.sampled_from(cards))
    n = data.draw(st.integers(0, 64))
    for vendor, device_id in _vendor_ids(card, n).items():
        assert map_device_id(device_id, cards) == Mapped(
            card=card.uuid, devices=frozenset(card.devices)), vendor
    for mig in card.migs:
        assert map_device_id(mig.uuid, cards) == Mapped(card=card.uuid,
                                                        devices=frozenset({mig.device}))
        assert map_device_id(f"MIG-{card.uuid}/{mig.gpu_instance_id}/0", cards) == Mapped(
            card=card.uuid, devices=frozenset({mig.device}))


@given(_nodes(), st.data())
def test_a_held_card_is_never_published(cards: tuple[Card, ...], data: st.DataObject) -> None:
    every_id = [device_id for card in cards
                for device_id in [*_vendor_ids(card, 1).values(), *(m.uuid for m in card.migs)]]
    held = data.draw(st.lists(st.tuples(
        st.sampled_from(sorted(n for n in ("nvidia.com/gpu", "nvidia.com/mig-1g.10gb",
                                           "volcano.sh/vgpu-number", "aliyun.com/gpu-mem",
                                           "example.com/nic"))),
        st.lists(st.one_of(st.sampled_from(every_id), st.text(max_size=12)), max_size=3)),
        max_size=4))
    offered = data.draw(st.dictionaries(st.sampled_from(["nvidia.com/gpu", "example.com/nic"]),
                                        st.lists(st.sampled_from(every_id), max_size=2)
                                        .map(tuple), max_size=2))
    holders = tuple(_holder(resource, *ids, pod=f"p{i}")
                    for i, (resource, ids) in enumerate(held))
    verdict = decide(cards=cards, kubelet=KubeletView(allocatable=offered, holders=holders))
    published = {d for c in cards for d in c.devices} - verdict.withheld
    for holder in holders:
        if not is_legacy_gpu_resource(holder.resource):
            continue
        for device_id in holder.device_ids:
            mapped = map_device_id(device_id, cards)
            if mapped is None:
                assert not published, f"{device_id!r} names no card, yet {published} published"
            else:
                assert not mapped.devices & published
    if any(ids for name, ids in offered.items() if is_legacy_gpu_resource(name)):
        assert not published
        assert verdict.state == names.NODE_STATE_LEGACY

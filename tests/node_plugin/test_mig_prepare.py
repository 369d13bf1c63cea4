"""MIG on demand at prepare (issue 47): a claim allocated a placement of a card cut on demand
gets its instance made through NVML (the stand-in), the CDI spec naming the new instance; the
instance goes at unprepare; a prepare that fails half-way leaves nothing behind (no instance,
no spec, no checkpoint entry), and a crash at any point is finished or undone at restart. An
instance made by hand is never touched."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_gateway.devkit.migcards import MODELS
from dra_gateway.devkit.nvmlmig import INSUFFICIENT_RESOURCES, MigNvml
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.node_plugin import cdi
from dra_gateway.node_plugin.devices import DeviceOptions, device_table, devices_of
from dra_gateway.node_plugin.facts import GpuFacts, MigFacts, NodeFacts
from dra_gateway.node_plugin.miginstances import MigInstances
from dra_gateway.node_plugin.prepare import ClaimRef, Preparer

from .claimdata import NODE, claim
from .conftest import allocated

H100 = MODELS["NVIDIA H100 80GB HBM3"]
ONE_G = "gpu-0-mig-1g10gb-19-6"
THREE_G = "gpu-0-mig-3g40gb-9-0"


class Crash(BaseException):
    """The plugin killed mid-call."""


def crash() -> None:
    raise Crash


@pytest.fixture
def nvml() -> MigNvml:
    return MigNvml([H100])


def _facts(nvml: MigNvml) -> NodeFacts:
    """The card as discovery sees it now: cut on demand, with every instance on it (the
    plugin's own among them), as NVML lists them."""
    card = nvml.cards[0]
    instances = tuple(MigFacts(uuid=f"MIG-seen-{gi_id}", profile=gi.row.name,
                               memory=gi.row.memory_mib << 20, profile_id=gi.row.profile_id,
                               placement_start=gi.start, placement_size=gi.row.size)
                      for gi_id, gi in sorted(card.instances.items()))
    return NodeFacts(gpus=(GpuFacts(index=0, uuid=card.uuid, product_name=H100.name,
                                    memory=H100.memory_mib << 20, mig_enabled=True,
                                    mig_devices=instances, mig_geometry=H100.geometry()),))


def _preparer(root: Path, cluster: MemoryCluster, nvml: MigNvml) -> Preparer:
    mig = MigInstances(nvml.module(), root / "state" / "mig-instances.json")
    return Preparer(cluster, node_name=NODE, cdi_dir=root / "cdi", state_dir=root / "state",
                    devices=lambda: device_table(_facts(nvml), DeviceOptions(),
                                                 made=mig.placements()), mig=mig)


def _ref(obj: dict[str, Any]) -> ClaimRef:
    meta = obj["metadata"]
    return ClaimRef(meta["namespace"], meta["name"], meta["uid"])


def _spec_file(root: Path, obj: dict[str, Any]) -> Path:
    return root / "cdi" / f"k8s.gpu.dra-gateway.io-claim_{obj['metadata']['uid']}.json"


def _left_behind(root: Path, nvml: MigNvml, preparer: Preparer, obj: dict[str, Any]) -> list[Any]:
    """What of the claim is still on the node: instances, spec, checkpoint, journal."""
    uid = obj["metadata"]["uid"]
    assert preparer.mig is not None
    return [x for x in (nvml.instances(0), _spec_file(root, obj).exists(),
                        preparer.checkpoint.get(uid), preparer.mig.keys_of(uid)) if x]


async def test_a_placement_is_made_at_prepare_named_in_the_spec_and_gone_after(
        root: Path, cluster: MemoryCluster, nvml: MigNvml) -> None:
    obj = await allocated(cluster, claim(devices=[ONE_G]))
    preparer = _preparer(root, cluster, nvml)
    preparer.recover()
    result = (await preparer.prepare([_ref(obj)]))[obj["metadata"]["uid"]]
    assert result.error == ""
    assert nvml.instances(0) == [("1g.10gb", 6, [0])]
    assert preparer.mig is not None
    (made,) = preparer.mig.journal.entries()
    spec = json.loads(_spec_file(root, obj).read_text())
    assert cdi.validate_spec(spec) == []
    assert f"NVIDIA_VISIBLE_DEVICES={made.uuid}" in spec["devices"][0]["containerEdits"]["env"]
    # Prepared again (the kubelet restarted): the same answer, nothing made twice.
    again = (await preparer.prepare([_ref(obj)]))[obj["metadata"]["uid"]]
    assert again == result
    assert nvml.instances(0) == [("1g.10gb", 6, [0])]
    # Discovery sees the instance; it is the plugin's, not an administrator's.
    published = {d["name"] for d in devices_of(_facts(nvml), DeviceOptions(),
                                              made=preparer.mig.placements())}
    assert ONE_G in published
    assert not any(name.startswith("gpu-0-mig-19-") for name in published)

    assert await preparer.unprepare([_ref(obj)]) == {obj["metadata"]["uid"]: ""}
    assert _left_behind(root, nvml, preparer, obj) == []


async def test_the_whole_card_of_a_cut_card_is_served_by_its_largest_profile(
        root: Path, cluster: MemoryCluster, nvml: MigNvml) -> None:
    obj = await allocated(cluster, claim(devices=["gpu-0"]))
    preparer = _preparer(root, cluster, nvml)
    preparer.recover()
    assert (await preparer.prepare([_ref(obj)]))[obj["metadata"]["uid"]].error == ""
    assert nvml.instances(0) == [("7g.80gb", 0, [0])]
    await preparer.unprepare([_ref(obj)])
    assert nvml.instances(0) == []


@pytest.mark.parametrize("step", ["nvmlDeviceCreateGpuInstanceWithPlacement",
                                  "nvmlGpuInstanceCreateComputeInstance"])
async def test_a_prepare_that_fails_half_way_leaves_nothing_behind(
        root: Path, cluster: MemoryCluster, nvml: MigNvml, step: str) -> None:
    """Two instances: the first is made, the second fails; the first goes too, and the claim
    is forgotten, so the kubelet's error sends the pod elsewhere with the card as it was."""
    obj = await allocated(cluster, claim(devices=[THREE_G, ONE_G]))
    preparer = _preparer(root, cluster, nvml)
    preparer.recover()
    calls = 0

    def second() -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            nvml.fail(step, INSUFFICIENT_RESOURCES)

    made = preparer.mig
    assert made is not None
    original = made.make

    def make(key: str, wanted: Any) -> Any:
        second()
        return original(key, wanted)

    made.make = make  # type: ignore[method-assign]
    result = (await preparer.prepare([_ref(obj)]))[obj["metadata"]["uid"]]
    assert f"MIG 1g.10gb at memory slice 6 of card {nvml.cards[0].uuid}: NVML {step} failed" \
        in result.error
    assert result.error.startswith("ResourceClaim ml/train-gpu-abcde: ")
    assert _left_behind(root, nvml, preparer, obj) == []


@pytest.mark.parametrize("step", ["nvmlGpuInstanceCreateComputeInstance",
                                  "nvmlComputeInstanceGetInfo"])
async def test_a_crash_during_prepare_is_undone_at_restart(
        root: Path, cluster: MemoryCluster, nvml: MigNvml, step: str) -> None:
    obj = await allocated(cluster, claim(devices=[THREE_G, ONE_G]))
    preparer = _preparer(root, cluster, nvml)
    preparer.recover()
    made = preparer.mig
    assert made is not None
    original = made.make

    def make(key: str, wanted: Any) -> Any:
        if wanted.start == 6:  # the second instance: the plugin dies inside it
            nvml.fail(step, crash)
        return original(key, wanted)

    made.make = make  # type: ignore[method-assign]
    with pytest.raises(Crash):
        await preparer.prepare([_ref(obj)])
    assert nvml.instances(0)  # the first instance, and half the second

    restarted = _preparer(root, cluster, nvml)
    repairs = restarted.recover()
    assert any("rolled back the interrupted prepare" in line for line in repairs)
    assert _left_behind(root, nvml, restarted, obj) == []
    # The kubelet prepares again: made afresh.
    assert (await restarted.prepare([_ref(obj)]))[obj["metadata"]["uid"]].error == ""
    assert nvml.instances(0) == [("1g.10gb", 6, [0]), ("3g.40gb", 0, [0])]


async def test_a_crash_during_unprepare_is_finished_at_restart(
        root: Path, cluster: MemoryCluster, nvml: MigNvml) -> None:
    obj = await allocated(cluster, claim(devices=[ONE_G]))
    preparer = _preparer(root, cluster, nvml)
    preparer.recover()
    await preparer.prepare([_ref(obj)])
    nvml.fail("nvmlGpuInstanceDestroy", crash)
    with pytest.raises(Crash):
        await preparer.unprepare([_ref(obj)])
    restarted = _preparer(root, cluster, nvml)
    restarted.recover()
    assert _left_behind(root, nvml, restarted, obj) == []


async def test_an_instance_made_by_hand_is_published_and_never_touched(
        root: Path, cluster: MemoryCluster, nvml: MigNvml) -> None:
    """An administrator's 3g at slice 4: published as it is, handed out as it is, left on the
    card after its claim; the placements it covers are no one's to make."""
    nvml.made_by_hand(0, "3g.40gb", 4)
    published = {d["name"] for d in devices_of(_facts(nvml), DeviceOptions())}
    (by_hand,) = [name for name in published if name.startswith("gpu-0-mig-9-")]
    obj = await allocated(cluster, claim(devices=[by_hand]))
    preparer = _preparer(root, cluster, nvml)
    preparer.recover()
    result = (await preparer.prepare([_ref(obj)]))[obj["metadata"]["uid"]]
    assert result.error == ""
    assert preparer.mig is not None
    assert preparer.mig.journal.entries() == []
    await preparer.unprepare([_ref(obj)])
    restarted = _preparer(root, cluster, nvml)
    restarted.recover()
    assert nvml.instances(0) == [("3g.40gb", 4, [0])]
    # A claim for a placement it covers (allocated against the rules) is refused by NVML's
    # own check, and nothing of the administrator's is destroyed.
    clash = await allocated(cluster, claim(uid="0b9f7c2e-5d1a-4c3b-9e8f-7a6b5c4d3e30",
                                           name="clash", devices=["gpu-0-mig-1g10gb-19-5"]))
    failed = (await restarted.prepare([_ref(clash)]))[clash["metadata"]["uid"]]
    assert failed.error
    assert nvml.instances(0) == [("3g.40gb", 4, [0])]


async def test_a_plugin_without_mig_on_demand_refuses_an_instance_to_make(
        root: Path, cluster: MemoryCluster, nvml: MigNvml) -> None:
    obj = await allocated(cluster, claim(devices=[ONE_G]))
    preparer = Preparer(cluster, node_name=NODE, cdi_dir=root / "cdi", state_dir=root / "state",
                        devices=lambda: device_table(_facts(nvml), DeviceOptions()))
    preparer.recover()
    result = (await preparer.prepare([_ref(obj)]))[obj["metadata"]["uid"]]
    assert "MIG instance made on demand, and this node plugin makes none" in result.error
    assert nvml.instances(0) == []

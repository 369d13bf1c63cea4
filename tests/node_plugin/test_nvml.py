from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_gateway.node_plugin.devices import DeviceOptions, device_table, devices_of
from dra_gateway.node_plugin.facts import NodeFacts
from dra_gateway.node_plugin.nvml import Nvml, NvmlError, discover_nvml

from .fake_nvml import FakeGpu, FakeMig, FakeNvml

H100 = "GPU-3a096533-5ed3-f658-6018-3170205738d1"
A100 = "GPU-5a1e2b7c-0d3f-4e59-8a61-2c4b9e7f1a03"


def _sysfs(tmp_path: Path) -> Path:
    """A sysfs where 0000:18:00.0 sits under root complex pci0000:17."""
    real = tmp_path / "devices/pci0000:17/0000:17:01.0/0000:18:00.0"
    real.mkdir(parents=True)
    (real / "numa_node").write_text("1\n")
    links = tmp_path / "bus/pci/devices"
    links.mkdir(parents=True)
    (links / "0000:18:00.0").symlink_to(real)
    return tmp_path


def test_discovery_reads_every_fact_of_a_card(tmp_path: Path) -> None:
    fake = FakeNvml([FakeGpu(uuid=H100, minor=3)])
    facts = discover_nvml(fake.module(), sysfs=_sysfs(tmp_path))
    (gpu,) = facts.gpus
    assert gpu.uuid == H100
    assert gpu.product_name == "NVIDIA H100 80GB HBM3"
    assert gpu.memory == 80 * 2**30
    assert (gpu.index, gpu.minor, gpu.device_number) == (0, 3, 3)
    assert (gpu.brand, gpu.architecture) == ("Nvidia", "Hopper")
    assert gpu.cuda_compute_capability == "9.0"
    assert (gpu.driver_version, gpu.cuda_driver_version) == ("550.54.15", "12.4")
    assert gpu.pci_bus_id == "0000:18:00.0"
    assert gpu.pcie_root == "pci0000:17"
    assert gpu.numa_node == 1  # sysfs: x86 NVML does not support the NUMA call
    assert not gpu.mig_enabled
    assert fake.initialised == 0
    assert fake.shutdowns == 1


def test_numa_node_is_the_pci_devices_not_the_gpu_memorys_on_grace(tmp_path: Path) -> None:
    """On Grace Hopper NVML names the node of the GPU's own memory (here 2); the card hangs
    off the CPU's node, which is what aligning CPUs and NICs with it needs."""
    sysfs = _sysfs(tmp_path)
    (sysfs / "devices/pci0000:17/0000:17:01.0/0000:18:00.0/numa_node").write_text("0\n")
    fake = FakeNvml([FakeGpu(uuid=H100, numa=2)])
    (gpu,) = discover_nvml(fake.module(), sysfs=sysfs).gpus
    assert gpu.numa_node == 0


def test_numa_node_comes_from_nvml_where_sysfs_cannot_say(tmp_path: Path) -> None:
    fake = FakeNvml([FakeGpu(uuid=H100, numa=1)])
    (gpu,) = discover_nvml(fake.module(), sysfs=tmp_path).gpus
    assert gpu.numa_node == 1


def test_a_platform_without_numa_has_no_numa_node(tmp_path: Path) -> None:
    sysfs = _sysfs(tmp_path)
    (sysfs / "devices/pci0000:17/0000:17:01.0/0000:18:00.0/numa_node").write_text("-1\n")
    (gpu,) = discover_nvml(FakeNvml([FakeGpu(uuid=H100)]).module(), sysfs=sysfs).gpus
    assert gpu.numa_node is None


def _published(facts: NodeFacts) -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in devices_of(facts, DeviceOptions())}


def _cards(count: int, **fake: object) -> FakeNvml:
    return FakeNvml([FakeGpu(uuid=f"GPU-{i:08d}-0000-0000-0000-000000000000", minor=i,
                             bus_id=f"00000000:{0x18 + i:02x}:00.0".encode())
                     for i in range(count)], **fake)  # type: ignore[arg-type]


def test_nvlink_islands_are_the_cards_nvlink_joins_named_by_their_lowest_index(
        tmp_path: Path) -> None:
    # Two NVLink bridges of four cards each, and two cards with no NVLink peer.
    fake = _cards(10, nvlink=[{0, 1, 2, 3}, {4, 5, 6, 7}])
    facts = discover_nvml(fake.module(), sysfs=tmp_path)
    assert [g.nvlink_island for g in facts.gpus] == [0, 0, 0, 0, 4, 4, 4, 4, None, None]
    table = _published(facts)
    assert table["gpu-5"]["attributes"]["nvlinkIsland"] == {"int": 4}
    assert "nvlinkIsland" not in table["gpu-9"]["attributes"]
    # Cards joined through one another (0-1, 1-2) are one island, as through an NVSwitch.
    chained = discover_nvml(_cards(3, nvlink=[{0, 1}, {1, 2}]).module(), sysfs=tmp_path)
    assert [g.nvlink_island for g in chained.gpus] == [0, 0, 0]


def test_nvlink_left_unknown_when_nvml_cannot_say(tmp_path: Path) -> None:
    facts = discover_nvml(_cards(2, nvlink=[{0, 1}], p2p_error=999).module(), sysfs=tmp_path)
    assert [g.nvlink_island for g in facts.gpus] == [None, None]
    assert len(facts.gpus) == 2  # the cards themselves are published


def test_the_nvlink_fabric_clique_of_a_registered_card(tmp_path: Path) -> None:
    fake = _cards(2)
    cluster = bytes(range(16))
    fake.gpus[0].fabric = (cluster, 7, 3)  # NVML_GPU_FABRIC_STATE_COMPLETED
    fake.gpus[1].fabric = (cluster, 7, 2)  # still registering: no clique yet
    facts = discover_nvml(fake.module(), sysfs=tmp_path)
    assert facts.gpus[0].nvlink_clique == "00010203-0405-0607-0809-0a0b0c0d0e0f.7"
    assert facts.gpus[1].nvlink_clique is None
    table = _published(facts)
    assert table["gpu-0"]["attributes"]["nvlinkClique"] == {
        "string": "00010203-0405-0607-0809-0a0b0c0d0e0f.7"}


def test_the_numa_node_is_published_under_the_standard_name_too(tmp_path: Path) -> None:
    facts = discover_nvml(FakeNvml([FakeGpu(uuid=H100)]).module(), sysfs=_sysfs(tmp_path))
    attributes = _published(facts)["gpu-0"]["attributes"]
    assert attributes["resource.kubernetes.io/numaNode"] == {"int": 1}
    assert attributes["numaNode"] == {"int": 1}


def test_mig_instances_are_enumerated_with_nvidia_profile_names(tmp_path: Path) -> None:
    migs: list[FakeMig | None] = [
        FakeMig(uuid="MIG-aaaa", memory_mb=40192, gi_slices=3, ci_slices=3, profile_id=9,
                start=0, size=4, gi_id=2),
        None,  # an empty slot: NVML says NotFound
        FakeMig(uuid="MIG-bbbb", memory_mb=9856, gi_slices=1, ci_slices=1, profile_id=19,
                start=6, size=1, gi_id=13),
    ]
    fake = FakeNvml([FakeGpu(uuid=A100, memory=81920 * 2**20, mig_mode=1, migs=migs)])
    (gpu,) = discover_nvml(fake.module(), sysfs=tmp_path).gpus
    assert gpu.mig_enabled
    assert [(m.uuid, m.profile, m.profile_id, m.placement_start, m.placement_size)
            for m in gpu.mig_devices] == [("MIG-aaaa", "3g.40gb", 9, 0, 4),
                                          ("MIG-bbbb", "1g.10gb", 19, 6, 1)]
    assert gpu.mig_devices[0].memory == 40192 * 2**20


def test_mig_instances_carry_their_gpu_and_compute_instance_ids(tmp_path: Path) -> None:
    """The ids an XID event names its MIG instance by, as NVML reports them per MIG handle."""
    migs: list[FakeMig | None] = [
        FakeMig(uuid="MIG-aaaa", memory_mb=40192, gi_slices=3, ci_slices=3, profile_id=9,
                start=0, size=4, gi_id=2, ci_id=0),
        FakeMig(uuid="MIG-bbbb", memory_mb=9856, gi_slices=1, ci_slices=1, profile_id=19,
                start=6, size=1, gi_id=13, ci_id=1),
    ]
    fake = FakeNvml([FakeGpu(uuid=A100, memory=81920 * 2**20, mig_mode=1, migs=migs)])
    facts = discover_nvml(fake.module(), sysfs=tmp_path)
    (gpu,) = facts.gpus
    assert [(m.uuid, m.gpu_instance_id, m.compute_instance_id) for m in gpu.mig_devices] == [
        ("MIG-aaaa", 2, 0), ("MIG-bbbb", 13, 1)]
    table = device_table(facts, DeviceOptions())
    assert {name: (info.gpu_instance_id, info.compute_instance_id)
            for name, info in table.items()} == {"gpu-0-mig-9-0-4": (2, 0),
                                                 "gpu-0-mig-19-6-1": (13, 1)}


def test_mig_profile_names_round_as_nvidia_does_on_h200(tmp_path: Path) -> None:
    """H200 reports 143771 MiB (140.4 GiB): its profiles are 3g.71gb and 7g.141gb, and the
    media-extension variant of 1g.18gb is named 1g.18gb+me (go-nvlib, nvidia-smi)."""
    card = 143771 * 2**20
    migs: list[FakeMig | None] = [
        FakeMig(uuid="MIG-cccc", memory_mb=16640, gi_slices=1, ci_slices=1, profile_id=20,
                start=0, size=1, gi_id=7, profile_index=7),
        FakeMig(uuid="MIG-dddd", memory_mb=71424, gi_slices=3, ci_slices=3, profile_id=9,
                start=4, size=4, gi_id=2),
    ]
    whole: list[FakeMig | None] = [
        FakeMig(uuid="MIG-eeee", memory_mb=143104, gi_slices=7, ci_slices=7, profile_id=0,
                start=0, size=8, gi_id=0)]
    fake = FakeNvml([FakeGpu(uuid=H100, memory=card, mig_mode=1, migs=migs),
                     FakeGpu(uuid=A100, memory=card, mig_mode=1, migs=whole)])
    first, second = discover_nvml(fake.module(), sysfs=tmp_path).gpus
    assert [m.profile for m in first.mig_devices] == ["1g.18gb+me", "3g.71gb"]
    assert [m.profile for m in second.mig_devices] == ["7g.141gb"]


def test_a_card_without_mig_support_is_not_in_mig_mode(tmp_path: Path) -> None:
    fake = FakeNvml([FakeGpu(uuid=H100, mig_mode=None)])
    (gpu,) = discover_nvml(fake.module(), sysfs=tmp_path).gpus
    assert not gpu.mig_enabled


def test_a_missing_library_is_explained_with_the_fix() -> None:
    fake = FakeNvml([], init_error=12)
    with pytest.raises(NvmlError) as caught:
        discover_nvml(fake.module())
    assert str(caught.value).startswith(
        "NVML nvmlInit failed: NVML Shared Library Not Found (libnvidia-ml.so.1 was not found")
    assert "--inventory" in str(caught.value)


def test_a_failing_call_names_the_call_and_the_card_and_nvml_is_shut_down(
        tmp_path: Path) -> None:
    fake = FakeNvml([FakeGpu(uuid=H100), FakeGpu(uuid=A100, error=4)])
    with pytest.raises(NvmlError) as caught:
        discover_nvml(fake.module(), sysfs=tmp_path)
    assert str(caught.value).startswith(
        "NVML nvmlDeviceGetUUID (GPU 1) failed: Insufficient Permissions (the plugin may not "
        "open /dev/nvidia*")
    assert caught.value.code == 4
    assert fake.shutdowns == 1


def test_a_lost_card_is_left_out_and_the_others_are_discovered(tmp_path: Path) -> None:
    """GPU_IS_LOST on one card (XID 79 before the plugin started) must not empty the node."""
    fake = FakeNvml([FakeGpu(uuid=H100), FakeGpu(uuid=A100, lost=True)])
    facts = discover_nvml(fake.module(), sysfs=tmp_path)
    assert [g.uuid for g in facts.gpus] == [H100]
    assert fake.shutdowns == 1


def test_xid_events_name_the_card_and_timeouts_are_quiet() -> None:
    fake = FakeNvml([FakeGpu(uuid=H100), FakeGpu(uuid=A100)])
    with Nvml(fake.module()) as nvml:
        events = nvml.xid_events([H100, A100])
        assert fake.registered == [H100, A100]
        assert events.wait(10) is None
        fake.xid(1, 79)
        event = events.wait(1000)
        assert event is not None
        assert (event.uuid, event.xid, event.is_application_error) == (A100, 79, False)
        assert event.gpu_instance_id is None
        events.close()


def test_probe_reports_lost_cards() -> None:
    fake = FakeNvml([FakeGpu(uuid=H100), FakeGpu(uuid=A100, lost=True)])
    with Nvml(fake.module()) as nvml:
        assert nvml.probe([H100, A100]) == {H100: False, A100: True}


def test_the_real_pynvml_module_fails_with_a_clear_message_or_discovers() -> None:
    """Runs against nvidia-ml-py itself: without a driver its error must still be mapped."""
    error: NvmlError | None = None
    try:
        facts = discover_nvml()
    except NvmlError as exc:
        error = exc
    if error is None:
        assert all(g.uuid.startswith("GPU-") for g in facts.gpus)
    else:
        assert str(error).startswith("NVML nvmlInit failed: ")
        assert error.code is not None


def test_pynvml_handles_are_matched_by_address() -> None:
    """An event's device handle is a fresh ctypes pointer: it must match the registered one."""
    import ctypes

    import pynvml

    from dra_gateway.node_plugin.nvml import _handle_key

    target = ctypes.c_int(0)
    one = ctypes.cast(ctypes.pointer(target), pynvml.c_nvmlDevice_t)
    two = ctypes.cast(ctypes.pointer(target), pynvml.c_nvmlDevice_t)
    assert one is not two
    assert {_handle_key(one): "GPU-a"}.get(_handle_key(two)) == "GPU-a"

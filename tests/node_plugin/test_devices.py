from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from dra_gateway.kube import names
from dra_gateway.kube.api_rules import slice_device_problems
from dra_gateway.node_plugin.deviceclasses import device_classes
from dra_gateway.node_plugin.devices import DeviceOptions, device_table, devices_of
from dra_gateway.node_plugin.facts import GpuFacts, MigFacts, NodeFacts
from dra_gateway.node_plugin.inventory import load_inventory
from dra_gateway.node_plugin.publish import build_slices
from dra_gateway.node_plugin.versions import semver

SHARED = DeviceOptions(default_sharing="shared", consumable_capacity=True)


def _validate(obj: dict[str, Any], version: str = "1.34") -> None:
    kubernetes_validate.validate(obj, version, strict=True)


def _slices(path: Path, options: DeviceOptions | None = None, **kw: Any) -> list[dict[str, Any]]:
    return build_slices(node_name="gpu-node-1", driver=names.DRIVER,
                        devices=devices_of(load_inventory(path), options or DeviceOptions()),
                        generation=1,
                        node_uid="5b0c1f4e-0000-4000-8000-000000000001", **kw)


@pytest.mark.parametrize(("text", "expected"), [
    ("9.0", "9.0.0"), ("535.104.05", "535.104.5"), ("12.4", "12.4.0"), ("v1", "1.0.0"),
    ("550.54.15", "550.54.15"), ("31.0.15.3623", "31.0.15+3623")])
def test_versions_are_normalised_to_semver(text: str, expected: str) -> None:
    assert semver(text) == expected


def test_eight_gpus_give_a_schema_valid_slice_with_every_uuid_and_80gi(h100x8: Path) -> None:
    (slice_,) = _slices(h100x8)
    _validate(slice_)
    devices = slice_["spec"]["devices"]
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(8)]
    uuids = {g.uuid for g in load_inventory(h100x8).gpus}
    assert {d["attributes"]["uuid"]["string"] for d in devices} == uuids
    assert {d["capacity"]["memory"]["value"] for d in devices} == {"80Gi"}
    assert {d["capacity"]["cores"]["value"] for d in devices} == {"100"}
    first = devices[0]["attributes"]
    assert first["type"] == {"string": "gpu"}
    assert first["cudaComputeCapability"] == {"version": "9.0.0"}
    assert first["driverVersion"] == {"version": "550.54.15"}
    assert first["cudaDriverVersion"] == {"version": "12.4.0"}
    assert first[names.ATTR_PCIE_ROOT] == {"string": "pci0000:17"}
    assert slice_["spec"]["pool"] == {"name": "gpu-node-1", "generation": 1,
                                      "resourceSliceCount": 1}
    assert slice_["metadata"]["ownerReferences"][0]["kind"] == "Node"
    assert slice_["metadata"]["ownerReferences"][0]["controller"] is True


def test_an_unchanged_node_gives_identical_slices(h100x8: Path) -> None:
    assert _slices(h100x8) == _slices(h100x8)


def test_mig_cards_publish_only_their_instances(mixed: Path) -> None:
    (slice_,) = _slices(mixed)
    _validate(slice_)
    named = {d["name"]: d for d in slice_["spec"]["devices"]}
    assert list(named) == ["gpu-0-mig-9-0-4", "gpu-0-mig-14-4-2", "gpu-0-mig-19-6-1",
                           "gpu-1", "gpu-2"]
    mig = named["gpu-0-mig-19-6-1"]
    assert mig["attributes"]["type"] == {"string": "mig"}
    assert mig["attributes"]["profile"] == {"string": "1g.10gb"}
    assert mig["attributes"]["parentUUID"] == {
        "string": "GPU-5a1e2b7c-0d3f-4e59-8a61-2c4b9e7f1a03"}
    assert mig["capacity"] == {"memory": {"value": "9728Mi"}}
    assert "allowMultipleAllocations" not in named["gpu-1"]  # gate off: not sent at all


def test_shared_cards_get_request_policies_whose_default_is_the_whole_card(
        mixed: Path) -> None:
    (slice_,) = _slices(mixed, DeviceOptions(consumable_capacity=True))
    _validate(slice_)
    _validate(slice_, "1.36")  # beta there: the fields must stay valid as the API moves on
    named = {d["name"]: d for d in slice_["spec"]["devices"]}
    shared = named["gpu-1"]
    assert shared["allowMultipleAllocations"] is True
    assert shared["capacity"]["memory"] == {
        "value": "80Gi",
        "requestPolicy": {"default": "80Gi", "validRange": {"min": "1Mi", "step": "1Mi"}}}
    assert shared["capacity"]["cores"] == {
        "value": "100", "requestPolicy": {"default": "100",
                                          "validRange": {"min": "1", "step": "1"}}}
    assert "allowMultipleAllocations" not in named["gpu-2"]  # exclusive card
    assert "allowMultipleAllocations" not in named["gpu-0-mig-9-0-4"]  # MIG is never shared


def test_a_memory_size_off_the_step_gets_a_range_without_step() -> None:
    gpu = GpuFacts(index=0, uuid="GPU-1", product_name="odd", memory=(1 << 30) + 512,
                   sharing="shared")
    (device,) = devices_of(NodeFacts(gpus=(gpu,)), SHARED)
    policy = device["capacity"]["memory"]["requestPolicy"]
    assert policy == {"default": "1073742336", "validRange": {"min": "1Mi"}}


def test_many_devices_split_into_counted_slices_in_natural_order() -> None:
    gpus = tuple(GpuFacts(index=i, uuid=f"GPU-{i:04d}", product_name="NVIDIA L4",
                          memory=24 << 30) for i in range(150))
    slices = build_slices(node_name="big", driver=names.DRIVER,
                          devices=devices_of(NodeFacts(gpus=gpus), DeviceOptions()),
                          generation=3, node_uid=None, max_devices=64)
    assert [len(s["spec"]["devices"]) for s in slices] == [64, 64, 22]
    assert [s["metadata"]["name"] for s in slices] == [
        f"big-{names.DRIVER}-{i}" for i in range(3)]
    assert {s["spec"]["pool"]["resourceSliceCount"] for s in slices} == {3}
    assert slices[0]["spec"]["devices"][2]["name"] == "gpu-2"  # not gpu-10
    for s in slices:
        _validate(s)


def test_taints_are_attached_and_schema_valid(h100x8: Path) -> None:
    taint = {"key": f"{names.DRIVER}/unhealthy", "value": "xid-79", "effect": "NoSchedule",
             "timeAdded": "2026-01-01T00:00:00Z"}
    devices = devices_of(load_inventory(h100x8), DeviceOptions(), taints={"gpu-3": [taint]})
    (slice_,) = build_slices(node_name="n", driver=names.DRIVER, devices=devices,
                             generation=0, node_uid=None)
    _validate(slice_)
    assert [d["name"] for d in slice_["spec"]["devices"] if "taints" in d] == ["gpu-3"]


def test_withheld_devices_are_left_out(h100x8: Path) -> None:
    devices = devices_of(load_inventory(h100x8), DeviceOptions(), withheld=frozenset({"gpu-0"}))
    assert [d["name"] for d in devices] == [f"gpu-{i}" for i in range(1, 8)]


def test_an_empty_node_still_publishes_its_pool() -> None:
    (slice_,) = build_slices(node_name="n", driver=names.DRIVER, devices=[], generation=0,
                             node_uid=None)
    _validate(slice_)
    assert slice_["spec"]["devices"] == []


def test_two_cards_with_one_number_are_refused() -> None:
    gpus = (GpuFacts(index=0, uuid="GPU-1", product_name="a", memory=1 << 30),
            GpuFacts(index=1, minor=0, uuid="GPU-2", product_name="a", memory=1 << 30))
    with pytest.raises(ValueError, match="device name gpu-0 is used twice on this node"):
        devices_of(NodeFacts(gpus=gpus), DeviceOptions())


def test_long_strings_are_cut_to_the_api_limit() -> None:
    gpu = GpuFacts(index=0, uuid="GPU-1", product_name="x" * 100, memory=1 << 30)
    (device,) = devices_of(NodeFacts(gpus=(gpu,)), DeviceOptions())
    assert device["attributes"]["productName"] == {"string": "x" * 64}


def test_long_strings_are_cut_to_64_bytes_not_64_characters() -> None:
    # The API server counts bytes (Go's len); a cut never splits a character.
    gpu = GpuFacts(index=0, uuid="GPU-1", product_name="Grafikkarte für Übungen " * 4,
                   brand="é" * 40, memory=1 << 30)
    (device,) = devices_of(NodeFacts(gpus=(gpu,)), DeviceOptions())
    for attribute in ("productName", "brand"):
        value = device["attributes"][attribute]["string"]
        assert len(value.encode()) <= 64
        assert len(value.encode()) >= 63
    assert device["attributes"]["brand"] == {"string": "é" * 32}


def test_a_version_longer_than_the_api_allows_is_refused_naming_it() -> None:
    # 18-digit numbers (the most 1.38 allows) and a long fourth part, past 64 characters.
    gpu = GpuFacts(index=0, uuid="GPU-1", product_name="a", memory=1 << 30,
                   driver_version=".".join(("1" * 18, "2" * 18, "3" * 18, "4" * 20)))
    with pytest.raises(ValueError, match=r"device gpu-0: attribute driverVersion: .*longer"):
        devices_of(NodeFacts(gpus=(gpu,)), DeviceOptions())


@pytest.mark.parametrize("version", ["1" * 19 + ".0", "1.2." + "9" * 19])
def test_a_version_number_past_18_digits_is_refused_as_kubernetes_1_38_does(version: str) -> None:
    gpu = GpuFacts(index=0, uuid="GPU-1", product_name="a", memory=1 << 30,
                   driver_version=version)
    with pytest.raises(ValueError, match=r"device gpu-0: attribute driverVersion: .*at most 18 "
                                         r"digits"):
        devices_of(NodeFacts(gpus=(gpu,)), DeviceOptions())


def test_the_devices_published_pass_kubernetes_1_38_rules(mixed: Path) -> None:
    facts = load_inventory(mixed)
    devices = devices_of(facts, DeviceOptions())
    found = [problem for i, device in enumerate(devices)
             for problem in slice_device_problems(device, f"devices[{i}]")]
    assert devices
    assert found == []
    eighteen = GpuFacts(index=0, uuid="GPU-1", product_name="a", memory=1 << 30,
                        driver_version=f"{'9' * 18}.0")
    (device,) = devices_of(NodeFacts(gpus=(eighteen,)), DeviceOptions())
    assert device["attributes"]["driverVersion"] == {"version": f"{'9' * 18}.0.0"}
    assert slice_device_problems(device, "d") == []


def test_device_table_knows_cards_of_mig_instances(mixed: Path) -> None:
    table = device_table(load_inventory(mixed), DeviceOptions())
    assert table["gpu-0-mig-9-0-4"].card_uuid == "GPU-5a1e2b7c-0d3f-4e59-8a61-2c4b9e7f1a03"
    assert table["gpu-1"].shared
    assert not table["gpu-2"].shared


def test_device_classes_are_schema_valid_and_select_by_type() -> None:
    gpu, mig = device_classes()
    for cls in (gpu, mig):
        _validate(cls)
    assert gpu["metadata"]["name"] == names.GPU_CLASS
    assert mig["metadata"]["name"] == names.MIG_CLASS
    assert gpu["spec"]["selectors"][0]["cel"]["expression"] == (
        "device.driver == 'gpu.dra-gateway.io' && "
        "device.attributes['gpu.dra-gateway.io'].type == 'gpu'")


def test_mig_instances_without_a_known_slot_are_named_by_profile_and_position() -> None:
    migs = (MigFacts(uuid="MIG-a", profile="1g.10gb", memory=10 << 30),
            MigFacts(uuid="MIG-b", profile="1g.10gb", memory=10 << 30))
    gpu = GpuFacts(index=1, minor=4, uuid="GPU-1", product_name="A100", memory=80 << 30,
                   mig_enabled=True, mig_devices=migs)
    assert [d["name"] for d in devices_of(NodeFacts(gpus=(gpu,)), DeviceOptions())] == [
        "gpu-4-mig-1g-10gb-0", "gpu-4-mig-1g-10gb-1"]

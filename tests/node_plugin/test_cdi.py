from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dra_gateway.kube import names
from dra_gateway.node_plugin import cdi
from dra_gateway.node_plugin.claims import ClaimError, plan_claim
from dra_gateway.node_plugin.devices import DeviceOptions, device_table
from dra_gateway.node_plugin.inventory import load_inventory

from .claimdata import NODE, UID, claim

KIND = cdi.cdi_kind(names.DRIVER)
GiB = 1 << 30


@pytest.fixture
def table(mixed: Path) -> dict[str, Any]:
    # The mixed example: gpu-1 is a shared 80Gi A100.
    return device_table(load_inventory(mixed), DeviceOptions())


def _plan(obj: dict[str, Any], table: dict[str, Any], uid: str = UID) -> Any:
    return plan_claim(obj, uid=uid, node_name=NODE, node_labels={}, driver=names.DRIVER,
                      kind=KIND, devices=table)


def _env(plan: Any, index: int = 0) -> list[str]:
    return list(plan.cdi_spec["devices"][index]["containerEdits"]["env"])


A100 = "GPU-7c9d1e2f-3a4b-4c5d-8e6f-7a8b9c0d1e2f"
VISIBLE = [f"NVIDIA_VISIBLE_DEVICES={A100}", f"CUDA_VISIBLE_DEVICES={A100}"]


def test_hami_core_share_of_8gib_and_30_percent(table: dict[str, Any]) -> None:
    plan = _plan(claim(devices=["gpu-1"], params={"memory": 8 * GiB, "cores": 30,
                                                  "enforcement": "hami-core"}), table)
    assert _env(plan) == [*VISIBLE, "CUDA_DEVICE_MEMORY_LIMIT=8192m", "CUDA_DEVICE_SM_LIMIT=30",
                          "LD_PRELOAD=/usr/local/vgpu/libvgpu.so"]
    assert plan.cdi_spec["devices"][0]["containerEdits"]["mounts"] == [
        {"hostPath": "/usr/local/vgpu/libvgpu.so", "containerPath": "/usr/local/vgpu/libvgpu.so",
         "options": ["ro", "nosuid", "nodev", "bind"]}]


def test_mps_share_of_8gib_and_30_percent(table: dict[str, Any]) -> None:
    plan = _plan(claim(devices=["gpu-1"], params={"memory": 8 * GiB, "cores": 30,
                                                  "enforcement": "mps"}), table)
    assert _env(plan) == [*VISIBLE, "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30",
                          f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={A100}=8192M"]
    assert "mounts" not in plan.cdi_spec["devices"][0]["containerEdits"]


def test_no_enforcement_gives_visibility_only(table: dict[str, Any]) -> None:
    plan = _plan(claim(devices=["gpu-1"], params={"memory": 8 * GiB, "cores": 30,
                                                  "enforcement": "none"}), table)
    assert _env(plan) == VISIBLE


def test_consumed_capacity_wins_over_the_config(table: dict[str, Any]) -> None:
    plan = _plan(claim(devices=["gpu-1"], consumed={"memory": "8Gi", "cores": "30"},
                       params={"memoryPercent": 50, "cores": 25, "enforcement": "hami-core"}),
                 table)
    assert _env(plan)[2:4] == ["CUDA_DEVICE_MEMORY_LIMIT=8192m", "CUDA_DEVICE_SM_LIMIT=30"]


def test_a_memory_share_is_not_limited_by_the_cores_it_consumes_for_accounting(
        table: dict[str, Any]) -> None:
    # The translator states a memory share's cores at the smallest amount (1) so that the
    # request policy's default (all 100) is not consumed; that amount is no compute limit.
    plan = _plan(claim(devices=["gpu-1"], consumed={"memory": "8Gi", "cores": "1"},
                       params={"memory": 8 * GiB, "enforcement": "hami-core"}), table)
    assert _env(plan)[2:] == ["CUDA_DEVICE_MEMORY_LIMIT=8192m",
                              "LD_PRELOAD=/usr/local/vgpu/libvgpu.so"]


def test_a_claim_without_amounts_in_its_config_is_limited_to_what_it_requested(
        table: dict[str, Any]) -> None:
    obj = claim(devices=["gpu-1"], consumed={"memory": "8Gi", "cores": "100"},
                params={"enforcement": "mps"})
    obj["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {
        "memory": "8Gi"}}
    assert _env(_plan(obj, table))[2:] == [f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={A100}=8192M"]


def test_memory_percent_is_a_share_of_the_card(table: dict[str, Any]) -> None:
    plan = _plan(claim(devices=["gpu-1"], params={"memoryPercent": 10, "enforcement": "mps"}),
                 table)
    assert _env(plan)[2:] == [f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={A100}=8192M"]


def test_the_config_is_read_from_the_claim_spec_when_the_allocation_has_none(
        table: dict[str, Any]) -> None:
    plan = _plan(claim(devices=["gpu-1"], in_spec=True,
                       params={"memory": 8 * GiB, "enforcement": "mps"}), table)
    assert _env(plan)[2:] == [f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={A100}=8192M"]


def _recorded(device: str, consumed: dict[str, str], request: str = "gpu") -> dict[str, Any]:
    # One entry of the allocator's share record, as allocator/planner/plan.py writes it.
    return {"request": request, "driver": names.DRIVER, "pool": NODE, "device": device,
            "shareID": "2860bb2c-8c9c-5cc4-8da5-f5d34bf3d978", "consumedCapacity": consumed}


def test_the_allocators_share_record_gives_the_share_without_consumable_capacity(
        table: dict[str, Any]) -> None:
    obj = claim(devices=["gpu-1"], params={"enforcement": "hami-core"},
                recorded=[_recorded("gpu-1", {"memory": "8Gi", "cores": "30"})])
    assert _env(_plan(obj, table))[2:4] == ["CUDA_DEVICE_MEMORY_LIMIT=8192m",
                                             "CUDA_DEVICE_SM_LIMIT=30"]


@pytest.mark.parametrize("annotation", [
    None,  # removed: the container would get the whole card without limits
    [_recorded("gpu-1", {"memory": "1Gi", "cores": "1"})],  # shrunk
    [_recorded("gpu-1", {"memory": "80Gi", "cores": "100"})],  # grown to the whole card
])
def test_a_tenants_edit_of_the_shares_annotation_changes_no_limit(
        table: dict[str, Any], annotation: list[dict[str, Any]] | None) -> None:
    recorded = [_recorded("gpu-1", {"memory": "8Gi", "cores": "30"})]
    original = claim(devices=["gpu-1"], params={"enforcement": "hami-core"},
                     recorded=recorded, annotation=recorded)
    edited = claim(devices=["gpu-1"], params={"enforcement": "hami-core"},
                   recorded=recorded, annotation=annotation)
    assert _env(_plan(edited, table)) == _env(_plan(original, table))
    assert _env(_plan(edited, table))[2:4] == ["CUDA_DEVICE_MEMORY_LIMIT=8192m",
                                                "CUDA_DEVICE_SM_LIMIT=30"]


def test_an_annotation_added_to_a_whole_card_claim_grants_no_share(
        table: dict[str, Any]) -> None:
    obj = claim(devices=["gpu-1"], params={"enforcement": "hami-core"},
                annotation=[_recorded("gpu-1", {"memory": "8Gi", "cores": "30"})])
    assert _env(_plan(obj, table)) == VISIBLE


def test_shares_recorded_for_another_device_or_request_do_not_apply(
        table: dict[str, Any]) -> None:
    obj = claim(devices=["gpu-1"], params={"enforcement": "hami-core"},
                recorded=[_recorded("gpu-2", {"memory": "8Gi"}),
                          _recorded("gpu-1", {"memory": "8Gi"}, request="other")])
    assert _env(_plan(obj, table)) == VISIBLE
    broken = claim(devices=["gpu-1"], params={"enforcement": "hami-core"}, recorded=[])
    broken["status"]["allocation"]["devices"]["config"][-1]["opaque"]["parameters"][
        "shares"] = "{not a list"
    assert _env(_plan(broken, table)) == VISIBLE  # a whole card, no limits


def test_a_malformed_recorded_share_names_the_record(table: dict[str, Any]) -> None:
    obj = claim(devices=["gpu-1"], params={"enforcement": "hami-core"},
                recorded=[_recorded("gpu-1", {"memory": "8 gigs"})])
    with pytest.raises(ClaimError, match=r"status.allocation.devices.config GpuShareAllocation, "
                                         r"device gpu-1\.memory"):
        _plan(obj, table)


def test_whole_cards_of_one_request_share_one_environment(table: dict[str, Any]) -> None:
    plan = _plan(claim(devices=["gpu-1", "gpu-2"]), table)
    env = _env(plan, 0)
    assert env == _env(plan, 1)
    assert env[0] == ("NVIDIA_VISIBLE_DEVICES=GPU-7c9d1e2f-3a4b-4c5d-8e6f-7a8b9c0d1e2f,"
                      "GPU-9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b")
    assert plan.response_devices(KIND) == [
        {"request_names": ["gpu"], "pool_name": NODE, "device_name": "gpu-1",
         "cdi_device_ids": [f"k8s.gpu.dra-gateway.io/claim={UID}-gpu-1"]},
        {"request_names": ["gpu"], "pool_name": NODE, "device_name": "gpu-2",
         "cdi_device_ids": [f"k8s.gpu.dra-gateway.io/claim={UID}-gpu-2"]}]


def test_a_first_available_subrequest_is_reported_under_its_request(
        table: dict[str, Any]) -> None:
    # The kubelet hands a container the devices whose request_names hold the container's
    # `resources.claims[].request`, a request name: "gpu/whole" would match no container.
    obj = claim(devices=["gpu-1"], request="gpu/whole")
    plan = _plan(obj, table)
    assert [d["request_names"] for d in plan.response_devices(KIND)] == [["gpu"]]


def test_hami_core_numbers_limits_per_card_when_several_are_visible() -> None:
    cards = [cdi.CardShare("GPU-a", memory=8 * GiB, cores=30),
             cdi.CardShare("GPU-b", memory=4 * GiB, cores=50)]
    assert cdi.container_env(cards, "hami-core")[2:] == [
        "CUDA_DEVICE_MEMORY_LIMIT_0=8192m", "CUDA_DEVICE_MEMORY_LIMIT_1=4096m",
        "CUDA_DEVICE_SM_LIMIT=30", "LD_PRELOAD=/usr/local/vgpu/libvgpu.so"]


def test_mig_instances_get_no_software_limits(table: dict[str, Any]) -> None:
    plan = _plan(claim(devices=["gpu-0-mig-19-6-1"],
                       params={"memory": 8 * GiB, "enforcement": "hami-core"}), table)
    assert _env(plan) == ["NVIDIA_VISIBLE_DEVICES=MIG-2b3c4d5e-6f7a-5b8c-9d0e-1f2a3b4c5d6e",
                          "CUDA_VISIBLE_DEVICES=MIG-2b3c4d5e-6f7a-5b8c-9d0e-1f2a3b4c5d6e"]


def test_the_spec_follows_the_cdi_rules(table: dict[str, Any]) -> None:
    plan = _plan(claim(devices=["gpu-1", "gpu-2"]), table)
    spec = plan.cdi_spec
    assert cdi.validate_spec(spec) == []
    assert spec["cdiVersion"] == "0.6.0"
    assert spec["kind"] == "k8s.gpu.dra-gateway.io/claim"
    assert [d["name"] for d in spec["devices"]] == [f"{UID}-gpu-1", f"{UID}-gpu-2"]


@pytest.mark.parametrize(("change", "problem"), [
    ({"cdiVersion": "0.6"}, "cdiVersion: '0.6' is not a semantic version"),
    ({"cdiVersion": "0.5.0"}, "cdiVersion: annotations need 0.6.0, the spec says 0.5.0"),
    ({"kind": "gpu"}, 'kind: "gpu" is not "vendor.com/class"'),
    ({"kind": "-bad.io/claim"}, 'kind: "-bad.io/claim" is not "vendor.com/class"'),
    ({"devices": []}, "devices: at least one device is required"),
    ({"devices": [{"name": "-x"}]},
     "devices[0].name: '-x' must start and end with a letter or digit and contain only "
     "letters, digits, '-', '_' and '.'"),
    ({"devices": [{"name": "a", "containerEdits": {"env": ["=x"]}}]},
     "devices[0].containerEdits.env[0]: '=x' is not K=V"),
    ({"extra": 1}, "extra: unknown field"),
])
def test_spec_rule_violations_are_named(change: dict[str, Any], problem: str) -> None:
    spec = {"cdiVersion": "0.6.0", "kind": "k8s.gpu.dra-gateway.io/claim",
            "annotations": {"a": "b"}, "devices": [{"name": "d"}], **change}
    assert cdi.validate_spec(spec) == [problem]


def test_specs_are_written_whole_and_removed(tmp_path: Path, table: dict[str, Any]) -> None:
    spec = _plan(claim(devices=["gpu-1"]), table).cdi_spec
    path = cdi.write_spec(tmp_path, spec, UID)
    assert path.name == f"k8s.gpu.dra-gateway.io-claim_{UID}.json"
    assert json.loads(path.read_text()) == spec
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left
    assert cdi.remove_spec(tmp_path, KIND, UID) is True
    assert cdi.remove_spec(tmp_path, KIND, UID) is False


@pytest.mark.parametrize(("obj", "message"), [
    (claim(uid="other"), f"ResourceClaim ml/train-gpu-abcde has UID other, the kubelet asked "
                         f"for {UID}"),
    (claim(node="gpu-node-2"), "ResourceClaim ml/train-gpu-abcde: status.allocation."
                               "nodeSelector does not select node gpu-node-1"),
    (claim(devices=["gpu-9"]), "ResourceClaim ml/train-gpu-abcde: status.allocation.devices."
                               "results[0]: device gpu-9 is not published by node gpu-node-1"),
    (claim(devices=["gpu-1"], params={"memoryPercent": 300}),
     "ResourceClaim ml/train-gpu-abcde: GpuShareConfig for request gpu is invalid: "
     "memoryPercent: Input should be less than or equal to 100"),
])
def test_claims_that_are_not_for_this_node_are_refused(obj: dict[str, Any], message: str,
                                                        table: dict[str, Any]) -> None:
    with pytest.raises(ClaimError) as caught:
        _plan(obj, table)
    assert str(caught.value).startswith(message)


def test_an_unallocated_claim_is_refused(table: dict[str, Any]) -> None:
    obj = claim()
    del obj["status"]
    with pytest.raises(ClaimError, match=r"is not allocated \(status.allocation is empty\)"):
        _plan(obj, table)


def _plan_without_hami_core(obj: dict[str, Any], table: dict[str, Any]) -> Any:
    return plan_claim(obj, uid=UID, node_name=NODE, node_labels={}, driver=names.DRIVER,
                      kind=KIND, devices=table,
                      enforcement=cdi.EnforcementSettings(hami_library_present=False))


def test_a_hami_core_share_on_a_node_without_the_library_is_refused_saying_so(
        table: dict[str, Any]) -> None:
    # The runtime would fail every start of the container on the missing bind mount.
    with pytest.raises(ClaimError) as refused:
        _plan_without_hami_core(claim(devices=["gpu-1"], params={
            "memory": 8 * GiB, "cores": 30, "enforcement": "hami-core"}), table)
    message = str(refused.value)
    assert f"node {NODE} has no HAMi-core library at /usr/local/vgpu/libvgpu.so" in message
    assert "request 'gpu'" in message
    assert "nodePlugin.hamiCore.hostPath" in message
    assert "enforcement none" in message


@pytest.mark.parametrize("params", [
    {"enforcement": "hami-core"},  # a whole card: nothing to enforce, nothing mounted
    {"memory": 8 * GiB, "enforcement": "mps"},
    {"memory": 8 * GiB, "enforcement": "none"},
], ids=["whole card", "mps", "none"])
def test_what_needs_no_hami_core_prepares_without_the_library(
        table: dict[str, Any], params: dict[str, Any]) -> None:
    plan = _plan_without_hami_core(claim(devices=["gpu-1"], params=params), table)
    assert "mounts" not in plan.cdi_spec["devices"][0]["containerEdits"]


def test_the_library_is_present_only_as_a_file(tmp_path: Path) -> None:
    assert not cdi.hami_library_present(str(tmp_path / "libvgpu.so"))
    (tmp_path / "libvgpu.so").mkdir()  # what a hostPath mount of a missing file leaves
    assert not cdi.hami_library_present(str(tmp_path / "libvgpu.so"))
    (tmp_path / "lib").write_bytes(b"\x7fELF")
    assert cdi.hami_library_present(str(tmp_path / "lib"))

"""The planner sizes a share from the same GpuShareConfig document the node plugin enforces.

A request may have several configs (a class's and the claim's, or two of the claim's); both
components merge the parameters of those that apply, later entries winning key by key
(`dra_gateway.kube.models.share_parameters`). Before, the planner took only the last config
whole, so a claim whose memory and cores were set by two configs was counted as a cores-only
share while the node plugin limited the container to the memory as well.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from dra_gateway.allocator.planner import ClusterState, PlannerSettings, plan_pod
from dra_gateway.kube import names
from dra_gateway.node_plugin.claims import plan_claim
from dra_gateway.node_plugin.devices import DeviceInfo

GI = 1 << 30
NODE = "gpu-node-1"


def _world(*, native: bool) -> ClusterState:
    state = ClusterState(PlannerSettings(consumable_capacity=native))
    expression = (f"device.driver == '{names.DRIVER}' && "
                  f"device.attributes['{names.DRIVER}'].type == 'gpu'")
    state.set_device_class({"metadata": {"name": names.GPU_CLASS},
                            "spec": {"selectors": [{"cel": {"expression": expression}}]}})
    state.set_node({"metadata": {"name": NODE, "labels": {}}, "spec": {},
                    "status": {"allocatable": {"cpu": "8", "memory": "64Gi"}}})
    state.set_slice({"metadata": {"name": f"{NODE}-0"}, "spec": {
        "driver": names.DRIVER, "nodeName": NODE,
        "pool": {"name": NODE, "generation": 1, "resourceSliceCount": 1},
        "devices": [{
            "name": "gpu-0", "allowMultipleAllocations": True,
            "attributes": {"type": {"string": "gpu"}, "uuid": {"string": "GPU-0"}},
            "capacity": {
                "memory": {"value": "16Gi", "requestPolicy": {
                    "default": "16Gi", "validRange": {"min": "1Mi", "step": "1Mi"}}},
                "cores": {"value": "100", "requestPolicy": {
                    "default": "100", "validRange": {"min": "1", "step": "1"}}}}}]}})
    return state


def _config(**params: Any) -> dict[str, Any]:
    return {"requests": ["gpu"], "opaque": {"driver": names.DRIVER, "parameters": {
        "apiVersion": names.API_VERSION, "kind": names.KIND_GPU_SHARE_CONFIG, **params}}}


def _claim() -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": "ns", "uid": "uid-c"},
            "spec": {"devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": names.GPU_CLASS}}],
                # Memory from one config, cores and enforcement from a later one.
                "config": [_config(memory=8 * GI, enforcement="none"),
                           _config(cores=30, enforcement="hami-core")]}}}


@pytest.mark.parametrize("native", [True, False], ids=["consumable-capacity", "annotation"])
def test_planner_and_node_plugin_agree_on_a_share_set_by_two_configs(native: bool) -> None:
    claim = _claim()
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"},
           "spec": {"containers": [{"name": "main", "image": "x"}]}}
    plan = plan_pod(_world(native=native), pod, [claim])
    assert plan.node_name == NODE, plan.reason

    allocated = {**claim, "status": {"allocation": plan.allocations["uid-c"]}}
    allocated["metadata"] = {**claim["metadata"], "annotations": plan.annotations.get("uid-c")
                             or {}}
    prepared = plan_claim(
        allocated, uid="uid-c", node_name=NODE, node_labels={}, driver=names.DRIVER,
        kind="dra-gateway.io/gpu", devices={"gpu-0": DeviceInfo(
            name="gpu-0", kind="gpu", uuid="GPU-0", card_uuid="GPU-0", card_index=0,
            memory=16 * GI, shared=True)})

    (device,) = prepared.devices
    assert (device.card.memory, device.card.cores) == (8 * GI, 30)
    # What the planner counted on the card is what the container is limited to.
    (result,) = plan.allocations["uid-c"]["devices"]["results"]
    if native:
        consumed = result["consumedCapacity"]
    else:
        (recorded,) = json.loads(plan.annotations["uid-c"][names.ANNOTATION_SHARES])
        consumed = recorded["consumedCapacity"]
    assert consumed == {"memory": "8Gi", "cores": "30"}


@pytest.mark.parametrize(("params", "field"), [
    ({"cores": 150}, "cores"),
    ({"memoryPercent": 0}, "memoryPercent"),
    ({"memory": 8 * GI, "memoryPercent": 50}, "set memory or memoryPercent, not both"),
    ({"cores": 30, "enforcment": "hami-core"}, "enforcment"),
    ({"cores": 30, "kind": "GpuShare"}, "kind"),
], ids=["cores-over-100", "percent-zero", "both-memory-forms", "misspelt-field", "other-kind"])
def test_a_share_the_node_plugin_would_refuse_is_not_placed_and_says_why(
        params: dict[str, Any], field: str) -> None:
    """The planner reads the document as the node plugin does (`read_share_config`): a claim
    whose container could never start is reported unallocatable, naming the field, instead of
    being given devices."""
    claim = _claim()
    claim["spec"]["devices"]["config"] = [_config(**params)]
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "uid-p"},
           "spec": {"containers": [{"name": "main", "image": "x"}]}}
    plan = plan_pod(_world(native=True), pod, [claim])
    assert plan.node_name is None
    assert "spec.devices.config: GpuShareConfig for request gpu is invalid" in plan.reason
    assert field in plan.reason

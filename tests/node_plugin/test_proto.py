from __future__ import annotations

from typing import Any

from dra_gateway.node_plugin.proto import (
    dra_v1_pb2,
    dra_v1beta1_pb2,
    generate,
    pluginregistration_pb2,
    podresources_v1_pb2,
)


def test_generated_modules_match_the_proto_files() -> None:
    generated = generate.generate()
    assert sorted(generated) == sorted(f"{p.removesuffix('.proto')}{s}"
                                       for p in generate.PROTOS for s in generate.SUFFIXES)
    assert generate.drift(generated) == []


def test_messages_carry_the_kubelet_field_numbers() -> None:
    for pb2 in (dra_v1_pb2, dra_v1beta1_pb2):
        device = pb2.Device.DESCRIPTOR.fields_by_name
        assert {n: f.number for n, f in device.items()} == {
            "request_names": 1, "pool_name": 2, "device_name": 3, "cdi_device_ids": 4,
            "share_id": 5}
        claim = pb2.Claim.DESCRIPTOR.fields_by_name
        assert {n: f.number for n, f in claim.items()} == {"namespace": 1, "uid": 2, "name": 3}
        service = pb2.DESCRIPTOR.services_by_name["DRAPlugin"]
        version = pb2.__name__.split("_")[-2]  # dra_v1_pb2 -> v1
        assert service.full_name == f"k8s.io.kubelet.pkg.apis.dra.{version}.DRAPlugin"
    info = pluginregistration_pb2.PluginInfo.DESCRIPTOR.fields_by_name
    assert {n: f.number for n, f in info.items()} == {
        "type": 1, "name": 2, "endpoint": 3, "supported_versions": 4}
    assert pluginregistration_pb2.DESCRIPTOR.package == "pluginregistration"


def test_pod_resources_messages_carry_the_kubelet_field_numbers() -> None:
    pb2 = podresources_v1_pb2
    def numbers(message: Any) -> dict[str, int]:
        return {n: f.number for n, f in message.DESCRIPTOR.fields_by_name.items()}

    assert numbers(pb2.ListPodResourcesResponse) == {"pod_resources": 1}
    assert numbers(pb2.PodResources) == {"name": 1, "namespace": 2, "containers": 3}
    assert numbers(pb2.ContainerResources) == {
        "name": 1, "devices": 2, "cpu_ids": 3, "memory": 4, "dynamic_resources": 5}
    assert numbers(pb2.ContainerDevices) == {"resource_name": 1, "device_ids": 2, "topology": 3}
    assert numbers(pb2.AllocatableResourcesResponse) == {"devices": 1, "cpu_ids": 2, "memory": 3}
    assert numbers(pb2.GetPodResourcesRequest) == {"pod_name": 1, "pod_namespace": 2}
    service = pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert service.full_name == "v1.PodResourcesLister"
    assert sorted(m.name for m in service.methods) == ["Get", "GetAllocatableResources", "List"]

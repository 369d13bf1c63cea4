"""Wire compatibility with the kubelet's own Go definitions, not only with our .proto files.

`kubeletclient/` is a small Go program built on the upstream generated APIs
(k8s.io/kubelet/pkg/apis/pluginregistration/v1, dra/v1, dra/v1beta1; version in its go.mod) and
grpc-go, as the kubelet is. It registers the plugin the way the plugin watcher does, picks the
DRA service the way the kubelet's DRA manager does (v1beta1 through the kubelet's own
V1Beta1ClientWrapper), calls NodePrepareResources / NodeUnprepareResources and prints the
answers as protojson. The node plugin runs in-process exactly as in test_server.py.

The tool is built once per session with the Go toolchain (`go` on PATH, modules from the
configured GOPROXY). Without `go` these tests skip, except in CI (CI=true), where a missing
toolchain is a failure.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.json_format import MessageToDict
from gotools import build_go_tool

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.node_plugin import cdi
from dra_gateway.node_plugin.proto import (
    dra_health_v1alpha1_pb2,
    dra_v1_pb2,
    dra_v1beta1_pb2,
    pluginregistration_pb2,
)

from .claimdata import NODE, claim
from .conftest import allocated, running_plugin

MISSING_UID = "0b6d9a3e-0000-4000-8000-00000000dead"  # a claim the API does not have

# The build (a fixture, with its own time limit) is left out of each test's time: the first
# one downloads the modules and compiles grpc-go.
pytestmark = pytest.mark.timeout(60, func_only=True)

TOOL_DIR = Path(__file__).resolve().parent / "kubeletclient"
GiB = 1 << 30
V1, V1BETA1 = "v1.DRAPlugin", "v1beta1.DRAPlugin"
HEALTH_V1, HEALTH_V1ALPHA1 = "v1.DRAResourceHealth", "v1alpha1.DRAResourceHealth"
SERVICES = [V1, V1BETA1]


@pytest.fixture(scope="session")
def kubeletclient(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_go_tool(TOOL_DIR, tmp_path_factory.mktemp("kubeletclient"),
                         "the kubelet test client")


def _ref(obj: dict[str, Any]) -> dict[str, str]:
    meta = obj["metadata"]
    return {"namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}


async def _run(tool: Path, *args: str) -> tuple[int | None, str, str]:
    # Asynchronously: the plugin serves from this event loop.
    process = await asyncio.create_subprocess_exec(
        str(tool), *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), 50)
    return process.returncode, out.decode(), err.decode()


async def _kubelet(tool: Path, root: Path, *steps: tuple[str, list[dict[str, str]]],
                   service: str | None = None) -> Any:
    """Runs the Go client as the kubelet against the plugin under `root`; its parsed output."""
    args = ["-registration", str(root / "registry" / f"{names.DRIVER}-reg.sock"),
            "-driver", names.DRIVER]
    if service is not None:
        args += ["-service", service]
    for name, claims in steps:
        args += [name, json.dumps(claims)]
    rc, out, err = await _run(tool, *args)
    assert rc == 0, err
    return json.loads(out)


async def test_registration_answers_the_kubelets_plugin_watcher(
        kubeletclient: Path, root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    async with running_plugin(root, cluster, h100x8) as plugin:
        out = await _kubelet(kubeletclient, root)
        assert plugin.server.registration.registered.is_set()
    assert out["info"] == {
        "type": "DRAPlugin", "name": names.DRIVER,
        "endpoint": str(root / "plugins" / names.DRIVER / "dra.sock"),
        "supported_versions": [*SERVICES, HEALTH_V1, HEALTH_V1ALPHA1]}
    # The kubelet takes the first service of the plugin's list that it knows; health apart.
    assert out["service"] == V1
    assert out["healthService"] == HEALTH_V1ALPHA1  # what a 1.34 kubelet knows
    assert out["steps"] == []


async def test_the_kubelet_reads_each_devices_health_from_the_health_stream(
        kubeletclient: Path, root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    async with running_plugin(root, cluster, h100x8) as plugin:
        plugin.health.mark(["gpu-3"], "xid-79")
        out = await _kubelet(kubeletclient, root, ("health", []))
    (step,) = out["steps"]
    devices = {d["device"]["device_name"]: d for d in step["response"]["devices"]}
    assert sorted(devices) == sorted(f"gpu-{i}" for i in range(8))
    assert {d["device"]["pool_name"] for d in devices.values()} == {NODE}
    assert devices["gpu-3"]["health"] == "UNHEALTHY"
    assert {n for n, d in devices.items() if d["health"] == "HEALTHY"} == {
        f"gpu-{i}" for i in range(8) if i != 3}
    assert int(devices["gpu-0"]["last_updated_time"]) > 0


async def test_the_kubelet_refuses_a_plugin_of_another_name(
        kubeletclient: Path, root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    async with running_plugin(root, cluster, h100x8):
        rc, _, err = await _run(kubeletclient, "-driver", "gpu.example.com", "-registration",
                                str(root / "registry" / f"{names.DRIVER}-reg.sock"))
    assert rc == 1
    assert f'PluginInfo.name is "{names.DRIVER}", want "gpu.example.com"' in err


@pytest.mark.parametrize("service", SERVICES)
async def test_prepare_and_unprepare_through_the_kubelets_client(
        kubeletclient: Path, root: Path, cluster: MemoryCluster, h100x8: Path,
        service: str) -> None:
    shared = await allocated(cluster, claim(devices=["gpu-2"], params={
        "memory": 8 * GiB, "cores": 30, "enforcement": "hami-core"}))
    pair = await allocated(cluster, claim(name="pair", uid="5d0c1a9e-1111-4a2b-8c3d-0e1f2a3b4c5d",
                                           devices=["gpu-0", "gpu-1"], request="train"))
    elsewhere = await allocated(cluster, claim(name="other", devices=["gpu-3"],
                                                uid="9a8b7c6d-2222-4e5f-8a9b-0c1d2e3f4a5b",
                                                node="gpu-node-2"))
    missing = {"namespace": "ml", "name": "gone", "uid": MISSING_UID}
    claims = [_ref(shared), _ref(pair), _ref(elsewhere), missing]
    uid, pair_uid, other_uid = (o["metadata"]["uid"] for o in (shared, pair, elsewhere))
    spec_file = root / "cdi" / f"k8s.gpu.dra-gateway.io-claim_{uid}.json"

    async with running_plugin(root, cluster, h100x8):
        out = await _kubelet(kubeletclient, root, ("prepare", claims), ("prepare", claims),
                             service=service)
        assert out["service"] == service
        first, again = (s["response"] for s in out["steps"])
        assert again == first  # a repeated prepare (kubelet restart, retry) answers the same
        answers = first["claims"]
        assert sorted(answers) == sorted([uid, pair_uid, other_uid, MISSING_UID])

        assert answers[uid] == {"error": "", "devices": [{
            "request_names": ["gpu"], "pool_name": NODE, "device_name": "gpu-2",
            "cdi_device_ids": [f"k8s.gpu.dra-gateway.io/claim={uid}-gpu-2"]}]}
        assert answers[pair_uid]["error"] == ""
        assert sorted(answers[pair_uid]["devices"], key=lambda d: d["device_name"]) == [
            {"request_names": ["train"], "pool_name": NODE, "device_name": f"gpu-{i}",
             "cdi_device_ids": [f"k8s.gpu.dra-gateway.io/claim={pair_uid}-gpu-{i}"]}
            for i in (0, 1)]
        assert answers[other_uid] == {"devices": [], "error": (
            "ResourceClaim ml/other: status.allocation.nodeSelector does not select node"
            " gpu-node-1")}
        assert answers[MISSING_UID] == {"devices": [], "error": "ResourceClaim ml/gone not found"}

        spec = json.loads(spec_file.read_text())
        assert cdi.validate_spec(spec) == []
        env = spec["devices"][0]["containerEdits"]["env"]
        assert "CUDA_DEVICE_MEMORY_LIMIT=8192m" in env
        assert "CUDA_DEVICE_SM_LIMIT=30" in env

        prepared = [_ref(shared), _ref(pair)]
        out = await _kubelet(kubeletclient, root, ("unprepare", prepared),
                             ("unprepare", prepared), service=service)
        for step in out["steps"]:
            assert step["response"] == {"claims": {uid: {"error": ""}, pair_uid: {"error": ""}}}
        assert not spec_file.exists()
        assert not list((root / "cdi").glob(f"*{pair_uid}*"))


async def test_the_upstream_descriptors_match_our_proto_files(kubeletclient: Path) -> None:
    """Field by field: names, numbers, types, labels, message and method names, packages."""
    rc, out, err = await _run(kubeletclient, "-describe")
    assert rc == 0, err
    upstream = json.loads(out)
    ours = {"pluginregistration": pluginregistration_pb2, "v1": dra_v1_pb2,
            "v1beta1": dra_v1beta1_pb2, "health-v1alpha1": dra_health_v1alpha1_pb2}
    for key, module in ours.items():
        file = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
        mine = _shape(MessageToDict(file, preserving_proto_field_name=True))
        theirs = _shape(upstream[key])
        assert mine["package"] == theirs["package"]
        assert mine["services"] == theirs["services"], key
        assert sorted(mine["messages"]) == sorted(theirs["messages"]), key
        for message, fields in theirs["messages"].items():
            extra = {n: f for n, f in mine["messages"][message].items() if n not in fields}
            assert {n: f for n, f in mine["messages"][message].items() if n in fields} == fields
            # Ours may only be ahead of the pinned kubelet by fields of later releases.
            assert extra == LATER_FIELDS.get((key, message), {}), (key, message)


# Fields of releases after the pinned kubelet's API (1.34) that our files carry.
LATER_FIELDS = {
    ("v1", "Device"): {"share_id": (5, "LABEL_OPTIONAL", "TYPE_STRING", "")},
    ("v1beta1", "Device"): {"share_id": (5, "LABEL_OPTIONAL", "TYPE_STRING", "")},
    ("health-v1alpha1", "DeviceHealth"): {
        "health_check_timeout_seconds": (4, "LABEL_OPTIONAL", "TYPE_INT64", ""),
        "message": (5, "LABEL_OPTIONAL", "TYPE_STRING", "")},
}


def _shape(file: dict[str, Any]) -> dict[str, Any]:
    """What matters on the wire (and for gRPC routing) of a FileDescriptorProto as JSON."""
    messages: dict[str, dict[str, tuple[int, str, str, str]]] = {}

    def walk(prefix: str, message: dict[str, Any]) -> None:
        name = prefix + message["name"]
        messages[name] = {f["name"]: (f["number"], f.get("label", "LABEL_OPTIONAL"),
                                      f["type"], f.get("type_name", ""))
                          for f in message.get("field", [])}
        for nested in message.get("nested_type", []):
            walk(name + ".", nested)

    for message in file.get("message_type", []):
        walk("", message)
    services = {s["name"]: {m["name"]: (m["input_type"], m["output_type"],
                                        m.get("client_streaming", False),
                                        m.get("server_streaming", False))
                            for m in s.get("method", [])}
                for s in file.get("service", [])}
    return {"package": file["package"], "messages": messages, "services": services}

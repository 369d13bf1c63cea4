"""A node plugin restarted with a prepared claim (a DaemonSet rollout, a crash): nothing the
kubelet, the container runtime or the scheduler sees may change.

The kubelet does not prepare a claim again for a running pod, so the restarted plugin must keep
the claim's CDI spec as it was (the runtime reads it at every container restart), answer a
repeated NodePrepareResources as before from its checkpoint alone (the kubelet repeats it after
its own restart, maybe while the API server is away), and republish its ResourceSlices without
writing them: a write would bump the pool's generation and make every scheduler and allocator
see the node's pool change under running pods.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc.aio
import pytest

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.resources import RESOURCE_CLAIMS, RESOURCE_SLICES, ResourceType
from dra_gateway.node_plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc

from .claimdata import claim
from .conftest import allocated, running_plugin

GiB = 1 << 30


async def _prepare(root: Path, request: Any) -> Any:
    socket = root / "plugins" / names.DRIVER / "dra.sock"
    async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
        return await dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(request)


def _record_calls(cluster: MemoryCluster, monkeypatch: pytest.MonkeyPatch,
                  calls: list[str]) -> None:
    """Note every write of a ResourceSlice (dry runs, which store nothing, aside) and every read
    of a ResourceClaim the plugin makes through `cluster`."""
    for method in ("create", "update", "patch", "delete", "get"):
        original = getattr(cluster, method)

        def recording(rt: ResourceType, *args: Any, _method: str = method,
                      _original: Any = original, **kwargs: Any) -> Any:
            if rt == RESOURCE_SLICES and _method != "get" and not kwargs.get("dry_run"):
                calls.append(f"{_method} ResourceSlice")
            if rt == RESOURCE_CLAIMS and _method == "get":
                calls.append("get ResourceClaim")
            return _original(rt, *args, **kwargs)

        monkeypatch.setattr(cluster, method, recording)


async def test_a_restarted_plugin_keeps_prepared_claims_and_writes_none_of_its_slices(
        root: Path, cluster: MemoryCluster, h100x8: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    obj = await allocated(cluster, claim(devices=["gpu-2"], params={
        "memory": 8 * GiB, "cores": 30, "enforcement": "hami-core"}))
    uid = obj["metadata"]["uid"]
    meta = obj["metadata"]
    request = dra_v1_pb2.NodePrepareResourcesRequest(claims=[dra_v1_pb2.Claim(
        namespace=meta["namespace"], name=meta["name"], uid=uid)])
    spec_file = root / "cdi" / f"k8s.gpu.dra-gateway.io-claim_{uid}.json"
    checkpoint_file = root / "state" / "checkpoint.json"

    async with running_plugin(root, cluster, h100x8) as first:
        await asyncio.wait_for(first.publisher.synced.wait(), 5)
        prepared = await _prepare(root, request)
    assert prepared.claims[uid].error == ""
    slices = (await cluster.list(RESOURCE_SLICES)).items
    assert [s["spec"]["pool"]["generation"] for s in slices] == [1]
    spec, spec_written = spec_file.read_bytes(), spec_file.stat().st_mtime_ns
    checkpoint = checkpoint_file.read_bytes()

    calls: list[str] = []
    _record_calls(cluster, monkeypatch, calls)
    async with running_plugin(root, cluster, h100x8) as restarted:
        await asyncio.wait_for(restarted.publisher.synced.wait(), 5)
        # The runtime still finds the spec, untouched, from the first moment.
        assert spec_file.read_bytes() == spec
        assert spec_file.stat().st_mtime_ns == spec_written
        again = await _prepare(root, request)
        writes = {op: restarted.metrics.slice_writes.labels(op)._value.get()
                  for op in ("create", "update", "delete")}
    assert again == prepared
    assert calls == []  # no slice written, and the answer came from the checkpoint alone
    assert writes == {"create": 0, "update": 0, "delete": 0}
    assert (await cluster.list(RESOURCE_SLICES)).items == slices  # names, versions, generation
    assert spec_file.read_bytes() == spec
    assert checkpoint_file.read_bytes() == checkpoint

"""The kubelet's view: gRPC over real unix sockets against a running node plugin."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
from pathlib import Path
from typing import Any

import grpc.aio
import pytest

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError
from dra_gateway.kube.resources import NODES, RESOURCE_SLICES
from dra_gateway.node_plugin import cdi
from dra_gateway.node_plugin.checkpoint import Checkpoint
from dra_gateway.node_plugin.inventory import load_inventory
from dra_gateway.node_plugin.plugin import NodePlugin, PluginSettings
from dra_gateway.node_plugin.prepare import ClaimRef, Preparer
from dra_gateway.node_plugin.proto import (
    dra_v1_pb2,
    dra_v1_pb2_grpc,
    dra_v1beta1_pb2,
    dra_v1beta1_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from dra_gateway.node_plugin.server import PluginServer

from .claimdata import NODE, claim
from .conftest import allocated, plugin_settings, running_plugin

MISSING_UID = "0b6d9a3e-0000-4000-8000-00000000dead"  # a claim the API does not have

GiB = 1 << 30


def _claim_msg(pb2: Any, obj: dict[str, Any]) -> Any:
    meta = obj["metadata"]
    return pb2.Claim(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


async def test_registration_names_the_driver_and_an_endpoint_that_exists(
        root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    async with running_plugin(root, cluster, h100x8) as plugin:
        socket = root / "registry" / f"{names.DRIVER}-reg.sock"
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(pluginregistration_pb2.InfoRequest())
            assert info.type == "DRAPlugin"
            assert info.name == names.DRIVER
            assert info.endpoint == str(root / "plugins" / names.DRIVER / "dra.sock")
            assert stat.S_ISSOCK(os.stat(info.endpoint).st_mode)
            # The DRA services first (the kubelet takes the first it knows), then health.
            assert list(info.supported_versions) == [
                "v1.DRAPlugin", "v1beta1.DRAPlugin", "v1.DRAResourceHealth",
                "v1alpha1.DRAResourceHealth"]
            await stub.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=True))
            assert plugin.server.registration.registered.is_set()
        await asyncio.wait_for(plugin.publisher.synced.wait(), 5)
        (slice_,) = (await cluster.list(RESOURCE_SLICES)).items
        assert len(slice_["spec"]["devices"]) == 8
    assert not socket.exists()


async def test_relative_socket_directories_serve_an_absolute_endpoint(
        root: Path, cluster: MemoryCluster, h100x8: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(root)
    settings = PluginSettings(node_name=NODE, plugins_dir=Path("plugins"),
                              registry_dir=Path("registry"), cdi_dir=Path("cdi"),
                              state_dir=Path("state"))
    plugin = NodePlugin(settings, cluster, discover=lambda: load_inventory(h100x8))
    started = asyncio.Event()
    task = asyncio.create_task(plugin.run(started=started))
    try:
        await asyncio.wait_for(started.wait(), 5)
        socket = root / "registry" / f"{names.DRIVER}-reg.sock"
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
            info = await stub.GetInfo(pluginregistration_pb2.InfoRequest())
        assert Path(info.endpoint).is_absolute()
        assert stat.S_ISSOCK(os.stat(info.endpoint).st_mode)
        assert os.stat(info.endpoint).st_ino == os.stat(
            root / "plugins" / names.DRIVER / "dra.sock").st_ino
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


@pytest.mark.parametrize(("pb2", "grpc_module"), [(dra_v1_pb2, dra_v1_pb2_grpc),
                                                  (dra_v1beta1_pb2, dra_v1beta1_pb2_grpc)])
async def test_prepare_and_unprepare_are_idempotent(root: Path, cluster: MemoryCluster,
                                                    h100x8: Path, pb2: Any,
                                                    grpc_module: Any) -> None:
    obj = await allocated(cluster, claim(devices=["gpu-2"], params={
        "memory": 8 * GiB, "cores": 30, "enforcement": "hami-core"}))
    uid = obj["metadata"]["uid"]
    spec_file = root / "cdi" / f"k8s.gpu.dra-gateway.io-claim_{uid}.json"
    async with running_plugin(root, cluster, h100x8), grpc.aio.insecure_channel(
            f"unix://{root / 'plugins' / names.DRIVER / 'dra.sock'}") as channel:
        stub = grpc_module.DRAPluginStub(channel)
        request = pb2.NodePrepareResourcesRequest(claims=[_claim_msg(pb2, obj)])
        first = await stub.NodePrepareResources(request)
        again = await stub.NodePrepareResources(request)
        assert first == again
        result = first.claims[uid]
        assert result.error == ""
        (device,) = result.devices
        assert (list(device.request_names), device.pool_name, device.device_name) == (
            ["gpu"], NODE, "gpu-2")
        assert list(device.cdi_device_ids) == [f"k8s.gpu.dra-gateway.io/claim={uid}-gpu-2"]
        spec = json.loads(spec_file.read_text())
        assert cdi.validate_spec(spec) == []
        env = spec["devices"][0]["containerEdits"]["env"]
        assert "CUDA_DEVICE_MEMORY_LIMIT=8192m" in env
        assert "CUDA_DEVICE_SM_LIMIT=30" in env

        unprepare = pb2.NodeUnprepareResourcesRequest(claims=[_claim_msg(pb2, obj)])
        for _ in range(2):
            done = await stub.NodeUnprepareResources(unprepare)
            assert done.claims[uid].error == ""
            assert not spec_file.exists()


async def test_each_claim_gets_its_own_answer(root: Path, cluster: MemoryCluster,
                                              h100x8: Path) -> None:
    good = await allocated(cluster, claim(devices=["gpu-0"]))
    elsewhere = await allocated(cluster, claim(name="other", devices=["gpu-1"],
                                                node="gpu-node-2"))
    missing = claim(name="gone", uid=MISSING_UID)
    async with running_plugin(root, cluster, h100x8), grpc.aio.insecure_channel(
            f"unix://{root / 'plugins' / names.DRIVER / 'dra.sock'}") as channel:
        stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
        response = await stub.NodePrepareResources(dra_v1_pb2.NodePrepareResourcesRequest(
            claims=[_claim_msg(dra_v1_pb2, o) for o in (good, elsewhere, missing)]))
    good_uid, other_uid = good["metadata"]["uid"], elsewhere["metadata"]["uid"]
    assert sorted(response.claims) == sorted([good_uid, other_uid, MISSING_UID])
    assert response.claims[good_uid].error == ""
    assert response.claims[other_uid].error == (
        "ResourceClaim ml/other: status.allocation.nodeSelector does not select node gpu-node-1")
    assert response.claims[MISSING_UID].error == "ResourceClaim ml/gone not found"


class Crash(BaseException):
    """Stands for the process dying: nothing after it runs."""


async def test_a_crash_between_checkpoint_states_is_repaired_on_restart(
        root: Path, cluster: MemoryCluster, h100x8: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    obj = await allocated(cluster, claim(devices=["gpu-3"]))
    uid = obj["metadata"]["uid"]
    ref = ClaimRef(namespace="ml", name=obj["metadata"]["name"], uid=uid)
    spec_file = root / "cdi" / f"k8s.gpu.dra-gateway.io-claim_{uid}.json"
    checkpoint_file = root / "state" / "checkpoint.json"

    def crash(*args: Any, **kwargs: Any) -> None:
        raise Crash

    # Prepare dies after PrepareStarted is on disk, before the CDI spec is written.
    plugin = NodePlugin(plugin_settings(root), cluster, discover=lambda: load_inventory(h100x8))
    await plugin.discover_once()
    plugin.preparer.recover()  # as run() does once this instance holds the state's fence
    # As run() does before any card may be prepared: ask what legacy pods hold (nothing here).
    await plugin.coexistence.check()
    with monkeypatch.context() as patch:
        patch.setattr(cdi, "write_spec", crash)
        with pytest.raises(Crash):
            await plugin.preparer.prepare([ref])
    assert Checkpoint(checkpoint_file).get(uid).state == "PrepareStarted"  # type: ignore[union-attr]

    async with running_plugin(root, cluster, h100x8) as restarted:  # restart: recover() runs first
        assert Checkpoint(checkpoint_file).get(uid) is None
        async with grpc.aio.insecure_channel(
                f"unix://{root / 'plugins' / names.DRIVER / 'dra.sock'}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            request = dra_v1_pb2.NodePrepareResourcesRequest(
                claims=[_claim_msg(dra_v1_pb2, obj)])
            prepared = await stub.NodePrepareResources(request)
        assert prepared.claims[uid].error == ""
        assert spec_file.exists()
        assert Checkpoint(checkpoint_file).get(uid).state == "PrepareCompleted"  # type: ignore[union-attr]

        # Unprepare dies after UnprepareStarted, before the spec is removed.
        with monkeypatch.context() as patch:
            patch.setattr(cdi, "remove_spec", crash)
            with pytest.raises(Crash):
                await restarted.preparer.unprepare([ref])
    assert Checkpoint(checkpoint_file).get(uid).state == "UnprepareStarted"  # type: ignore[union-attr]
    assert spec_file.exists()

    async with running_plugin(root, cluster, h100x8):
        assert Checkpoint(checkpoint_file).get(uid) is None
        assert not spec_file.exists()


async def test_a_lost_cdi_spec_of_a_prepared_claim_is_rewritten(
        root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    obj = await allocated(cluster, claim(devices=["gpu-4"]))
    uid = obj["metadata"]["uid"]
    spec_file = root / "cdi" / f"k8s.gpu.dra-gateway.io-claim_{uid}.json"
    async with running_plugin(root, cluster, h100x8) as plugin:
        await plugin.preparer.prepare([ClaimRef("ml", obj["metadata"]["name"], uid)])
    written = spec_file.read_text()
    spec_file.unlink()  # /var/run/cdi is a tmpfs: a reboot empties it
    async with running_plugin(root, cluster, h100x8):
        assert spec_file.read_text() == written


async def test_a_cdi_folder_that_refuses_the_rewrite_leaves_the_plugin_serving(
        root: Path, cluster: MemoryCluster, h100x8: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    """A CDI folder on a read-only file system (an operator's misconfiguration) fails the
    rewrite of a prepared claim's spec at start: the plugin still serves, so that its Node says
    what is wrong, and the claim keeps its checkpoint entry, so that the kubelet's next
    prepare writes the spec once the folder is writable again."""
    obj = await allocated(cluster, claim(devices=["gpu-6"]))
    uid = obj["metadata"]["uid"]
    ref = ClaimRef("ml", obj["metadata"]["name"], uid)
    spec_file = root / "cdi" / f"k8s.gpu.dra-gateway.io-claim_{uid}.json"
    async with running_plugin(root, cluster, h100x8) as plugin:
        await plugin.preparer.prepare([ref])
    spec_file.unlink()

    def read_only(*args: Any, **kwargs: Any) -> Path:
        raise OSError(30, "Read-only file system", str(spec_file))

    with monkeypatch.context() as patch:
        patch.setattr(cdi, "write_spec", read_only)
        async with running_plugin(root, cluster, h100x8) as plugin:
            assert plugin.preparer.recover() == []
    assert f"could not repair ml/{obj['metadata']['name']} ({uid})" in caplog.text
    assert "Read-only file system" in caplog.text
    assert Checkpoint(root / "state" / "checkpoint.json").get(uid).state == "PrepareCompleted"  # type: ignore[union-attr]
    assert not spec_file.exists()

    async with running_plugin(root, cluster, h100x8) as plugin:  # the folder writable again
        prepared = await plugin.preparer.prepare([ref])
    assert prepared[uid].error == ""
    assert spec_file.exists()


async def test_a_claim_uid_that_is_no_rfc_4122_uid_never_reaches_a_file_name(
        root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    traversal = "../../../victim"
    (root / "victim.json").write_text("{}")  # what removing that "spec" would delete
    obj = await allocated(cluster, claim(devices=["gpu-5"], uid=traversal))
    ref = ClaimRef("ml", obj["metadata"]["name"], traversal)
    async with running_plugin(root, cluster, h100x8) as plugin:
        prepared = await plugin.preparer.prepare([ref])
        unprepared = await plugin.preparer.unprepare([ref])
    why = ("claim UID '../../../victim' is not an RFC 4122 UID (8-4-4-4-12 hexadecimal "
           "digits); it is not used in a file name")
    assert prepared[traversal].error == f"ResourceClaim ml/{obj['metadata']['name']}: {why}"
    assert unprepared[traversal] == f"ResourceClaim ml/{obj['metadata']['name']}: {why}"
    assert (root / "victim.json").read_text() == "{}"
    assert sorted(p.name for p in (root / "cdi").glob("*")) == []
    assert Checkpoint(root / "state" / "checkpoint.json").get(traversal) is None
    with pytest.raises(cdi.UnsafeUid):
        cdi.spec_file_name("k8s.gpu.dra-gateway.io/claim", "a/../../b")


async def test_nvml_failure_publishes_an_empty_pool_instead_of_crashing(
        root: Path, cluster: MemoryCluster) -> None:
    from dra_gateway.node_plugin.discovery import DiscoveryError

    def broken() -> Any:
        raise DiscoveryError("NVML nvmlInit failed: Driver Not Loaded", nvml=True)

    plugin = NodePlugin(plugin_settings(root), cluster, discover=broken)
    started = asyncio.Event()
    task = asyncio.create_task(plugin.run(started=started))
    try:
        await asyncio.wait_for(started.wait(), 5)
        await asyncio.wait_for(plugin.publisher.synced.wait(), 5)
        (slice_,) = (await cluster.list(RESOURCE_SLICES)).items
        assert slice_["spec"]["devices"] == []
        assert plugin.metrics.nvml_up._value.get() == 0
        assert (root / "plugins" / names.DRIVER / "dra.sock").exists()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


class _NodesUnreadable(MemoryCluster):
    """The API server answers claims but fails on the Node (a flaky apiserver, missing RBAC)."""

    async def get(self, rt: Any, name: str, *, namespace: str | None = None) -> Any:
        if rt is NODES:
            raise ApiError("etcdserver: request timed out", code=500)
        return await super().get(rt, name, namespace=namespace)


async def test_an_unreadable_node_fails_only_the_claims_that_need_it(
        root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    done = await allocated(cluster, claim(devices=["gpu-5"]))
    async with running_plugin(root, cluster, h100x8) as plugin:
        await plugin.preparer.prepare([ClaimRef("ml", done["metadata"]["name"],
                                                done["metadata"]["uid"])])
    flaky = _NodesUnreadable()
    await flaky.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    fresh = await allocated(flaky, claim(devices=["gpu-6"], name="fresh"))
    plugin = NodePlugin(plugin_settings(root), flaky, discover=lambda: load_inventory(h100x8))
    await plugin.discover_once()
    plugin.preparer.recover()  # as run() does once this instance holds the state's fence
    results = await plugin.preparer.prepare([
        ClaimRef("ml", done["metadata"]["name"], done["metadata"]["uid"]),
        ClaimRef("ml", "fresh", fresh["metadata"]["uid"])])
    await flaky.close()
    assert results[done["metadata"]["uid"]].error == ""
    assert results[done["metadata"]["uid"]].devices[0]["device_name"] == "gpu-5"
    assert results[fresh["metadata"]["uid"]].error == (
        "ResourceClaim ml/fresh: etcdserver: request timed out")


async def test_the_health_stream_sends_every_change_and_a_recovery(
        root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    from dra_gateway.node_plugin.proto import dra_health_v1_pb2, dra_health_v1_pb2_grpc

    async with running_plugin(root, cluster, h100x8) as plugin:
        socket = root / "plugins" / names.DRIVER / "dra.sock"
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = dra_health_v1_pb2_grpc.DRAResourceHealthStub(channel)
            stream = stub.NodeWatchResources(dra_health_v1_pb2.NodeWatchResourcesRequest())

            async def next_states() -> dict[str, tuple[int, str]]:
                response = await asyncio.wait_for(stream.read(), 5)
                return {d.device.device_name: (d.health, d.message) for d in response.devices}

            first = await next_states()
            assert len(first) == 8
            assert {h for h, _ in first.values()} == {dra_health_v1_pb2.HEALTHY}
            plugin.health.mark(["gpu-2"], "xid-48")
            states = await next_states()
            assert states["gpu-2"][0] == dra_health_v1_pb2.UNHEALTHY
            assert states["gpu-2"][1].startswith("xid-48 (fatal fault) since ")
            plugin.health.clear("xid-48")
            assert (await next_states())["gpu-2"][0] == dra_health_v1_pb2.HEALTHY
            stream.cancel()


async def test_metrics_say_whether_the_kubelet_registered_the_plugin(
        root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    import aiohttp

    from dra_gateway.kube.runtime.serving import serving

    async with running_plugin(root, cluster, h100x8) as plugin, serving(
            plugin.metrics.render, "127.0.0.1:0") as port:
        async def scrape() -> str:
            async with aiohttp.ClientSession() as session, session.get(
                    f"http://127.0.0.1:{port}/metrics") as response:
                assert response.status == 200
                return await response.text()

        assert "dra_gateway_node_plugin_registered 0.0" in await scrape()
        socket = root / "registry" / f"{names.DRIVER}-reg.sock"
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
            await stub.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=True))
            assert "dra_gateway_node_plugin_registered 1.0" in await scrape()
            await stub.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(
                plugin_registered=False, error="another plugin has the name"))
        assert "dra_gateway_node_plugin_registered 0.0" in await scrape()


async def test_the_plugin_is_ready_once_the_kubelet_registered_it_and_it_published(
        root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    """/readyz is the DaemonSet's readiness probe: a rolling update (maxSurge) stops the old
    pod only once the new one is ready, so ready must mean that the kubelet calls it."""
    import aiohttp

    from dra_gateway.kube.runtime.serving import serving

    async with running_plugin(root, cluster, h100x8) as plugin, serving(
            plugin.metrics.render, "127.0.0.1:0", plugin.readiness) as port:
        async def probe(path: str) -> tuple[int, str]:
            async with aiohttp.ClientSession() as session, session.get(
                    f"http://127.0.0.1:{port}{path}") as response:
                return response.status, await response.text()

        await asyncio.wait_for(plugin.publisher.synced.wait(), 10)
        status, text = await probe("/readyz")
        assert status == 503
        assert "the kubelet has not registered the plugin" in text, text
        assert await probe("/healthz") == (200, "ok")
        socket = root / "registry" / f"{names.DRIVER}-reg.sock"
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = pluginregistration_pb2_grpc.RegistrationStub(channel)
            await stub.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=True))
            assert await probe("/readyz") == (200, "ok")
            # A republish (a fault's taint) keeps it ready.
            plugin.health.mark(["gpu-2"], "xid-48")
            assert await probe("/readyz") == (200, "ok")
            await stub.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(
                plugin_registered=False, error="another plugin has the name"))
        status, _ = await probe("/readyz")
        assert status == 503


def _idle_preparer(root: Path, cluster: MemoryCluster) -> Preparer:
    return Preparer(cluster, node_name=NODE, cdi_dir=root / "cdi", state_dir=root / "state",
                    devices=dict)


async def test_instances_serve_sockets_of_their_own_beside_each_other(
        root: Path, cluster: MemoryCluster) -> None:
    """A rolling update's new pod registers beside the old one; neither removes the other's
    sockets when it starts or stops."""
    old = PluginServer(_idle_preparer(root, cluster), plugins_dir=root / "plugins",
                       registry_dir=root / "registry", instance="0b15a1a4-old")
    new = PluginServer(_idle_preparer(root, cluster), plugins_dir=root / "plugins",
                       registry_dir=root / "registry", instance="7c9d1e2f-new")
    await old.start()
    await new.start()
    try:
        assert old.registration_socket.name == f"{names.DRIVER}-0b15a1a4-old-reg.sock"
        assert new.dra_socket.name == "dra-7c9d1e2f-new.sock"
        for server in (old, new):
            socket = server.registration_socket
            async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
                info = await pluginregistration_pb2_grpc.RegistrationStub(channel).GetInfo(
                    pluginregistration_pb2.InfoRequest())
            assert info.endpoint == str(server.dra_socket)
        await old.stop()
        assert new.registration_socket.exists()
        assert new.dra_socket.exists()
        assert not old.registration_socket.exists()
    finally:
        await old.stop()
        await new.stop()


def test_a_pod_uid_names_sockets_that_fit_under_a_long_kubelet_root(
        root: Path, cluster: MemoryCluster) -> None:
    """MicroK8s' kubelet root is 41 characters: a registration socket named by the whole
    36-character pod UID would pass the unix socket limit, and the plugin could not start.
    A long instance is carried by a digest; each UID still gets sockets of its own."""
    microk8s = "/var/snap/microk8s/common/var/lib/kubelet"
    kubelet = root / ("k" * (len(microk8s) - len(str(root)) - 1))  # as long as MicroK8s'
    assert len(str(kubelet)) == len(microk8s)
    uids = ("454fa54d-5cbf-4160-a48a-f05817e3a0d3", "454fa54d-5cbf-4160-a48a-f05817e3a0d4")
    servers = [PluginServer(_idle_preparer(root, cluster), plugins_dir=kubelet / "plugins",
                            registry_dir=kubelet / "plugins_registry", instance=uid)
               for uid in uids]
    assert len(str(servers[0].registration_socket)) > len(str(kubelet)) + 40
    assert servers[0].registration_socket != servers[1].registration_socket
    assert servers[0].dra_socket != servers[1].dra_socket
    for server in servers:
        assert len(str(server.registration_socket).encode()) <= 107


@pytest.mark.parametrize("instance", ["../x", "a" * 64, "-a", "a b"])
def test_an_instance_that_cannot_name_a_socket_is_refused(root: Path, cluster: MemoryCluster,
                                                          instance: str) -> None:
    with pytest.raises(ValueError, match="--instance"):
        PluginServer(_idle_preparer(root, cluster), plugins_dir=root / "plugins",
                     registry_dir=root / "registry", instance=instance)


async def test_a_starting_instance_removes_the_sockets_of_killed_ones_only(
        root: Path, cluster: MemoryCluster) -> None:
    import socket

    registry = root / "registry"
    registry.mkdir(parents=True)
    # A pod killed without its SIGTERM: its socket files stay, nobody listens.
    stale = registry / f"{names.DRIVER}-dead-reg.sock"
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(stale))
    live = PluginServer(_idle_preparer(root, cluster), plugins_dir=root / "plugins",
                        registry_dir=registry, instance="live")
    await live.start()
    new = PluginServer(_idle_preparer(root, cluster), plugins_dir=root / "plugins",
                       registry_dir=registry, instance="new")
    try:
        await new.start()
        assert not stale.exists()
        assert live.registration_socket.exists()  # the old pod of a rolling update, alive
        assert live.dra_socket.exists()
    finally:
        await new.stop()
        await live.stop()


async def test_sockets_removed_under_the_server_are_served_again(
        root: Path, cluster: MemoryCluster) -> None:
    server = PluginServer(_idle_preparer(root, cluster), plugins_dir=root / "plugins",
                          registry_dir=root / "registry")
    await server.start()
    keeper = asyncio.create_task(server.keep_sockets(poll_seconds=0.05))
    try:
        for path in (server.registration_socket, server.dra_socket):
            path.unlink()
        for _ in range(100):
            if server.registration_socket.exists() and server.dra_socket.exists():
                break
            await asyncio.sleep(0.02)
        async with grpc.aio.insecure_channel(f"unix://{server.registration_socket}") as channel:
            info = await pluginregistration_pb2_grpc.RegistrationStub(channel).GetInfo(
                pluginregistration_pb2.InfoRequest())
        assert info.endpoint == str(server.dra_socket)
        assert stat.S_ISSOCK(os.stat(server.dra_socket).st_mode)
    finally:
        keeper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await keeper
        await server.stop()


async def test_a_new_health_stream_is_resent_to_often_then_at_the_usual_pace() -> None:
    """A kubelet clears the driver's health when the old plugin's stream ends in a rolling
    update: the new stream resends soon, so the devices read Unknown only for a moment."""
    from dra_gateway.node_plugin.proto import dra_health_v1_pb2
    from dra_gateway.node_plugin.server import HealthFeed

    feed = HealthFeed(list, resend_seconds=60.0, first_resend_seconds=0.02,
                      first_seconds=0.2)
    stream = feed.stream(dra_health_v1_pb2)
    sent = 0
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(0.6):
            async for _ in stream:
                sent += 1
    await stream.aclose()
    # About ten while young, then none for the remaining 0.4 s (the next is a minute away).
    assert 5 <= sent <= 12

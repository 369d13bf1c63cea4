"""A node plugin next to a legacy device plugin: what the kubelet says legacy pods hold is never
published, and comes back once they end.

The kubelet is played by `podresources/`, a small Go program serving the kubelet's own
pod-resources package (k8s.io/kubelet/pkg/apis/podresources/v1, version in its go.mod) over a
unix socket, answering from a JSON file it re-reads on every call; the plugin's client talks real
gRPC to it. It is built once per session with Go; without `go` those tests skip, except in CI
(CI=true). The fallbacks (no socket) need no Go.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2
from google.protobuf.json_format import MessageToDict
from gotools import build_go_tool

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError
from dra_gateway.kube.resources import NODES, RESOURCE_SLICES
from dra_gateway.node_plugin.coexistence import CoexistenceSettings, LegacyCoexistence
from dra_gateway.node_plugin.inventory import load_inventory
from dra_gateway.node_plugin.legacy import Card, Holder, KubeletView
from dra_gateway.node_plugin.plugin import NodePlugin
from dra_gateway.node_plugin.podresources import PodResourcesClient, PodResourcesError
from dra_gateway.node_plugin.prepare import ClaimRef
from dra_gateway.node_plugin.proto import podresources_v1_pb2

from .claimdata import NODE, claim
from .conftest import allocated, plugin_settings, running_plugin

pytestmark = pytest.mark.timeout(60, func_only=True)

TOOL_DIR = Path(__file__).resolve().parent / "podresources"
# Cards of examples/inventory/h100x8.yaml.
CARD_3 = "GPU-7589ca4a-7cc6-7400-63f6-92b87eb72f82"
CARD_0 = "GPU-3a096533-5ed3-f658-6018-3170205738d1"
EVERY_CARD = [f"gpu-{i}" for i in range(8)]


@pytest.fixture(scope="session")
def podresources_tool(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_go_tool(TOOL_DIR, tmp_path_factory.mktemp("podresources"),
                         "the fake kubelet pod-resources server")


def _socket(root: Path) -> Path:
    return root / "pod-resources" / "kubelet.sock"


def _write_state(path: Path, *, allocatable: dict[str, list[str]] | None = None,
                 held: Sequence[tuple[str, str, str, list[str]]] = ()) -> None:
    """What the fake kubelet answers: allocatable IDs per name; (pod, namespace, resource, IDs)
    held by a container `main` of each pod. Replaced atomically, as the tool asks."""
    state = {
        "allocatable": {"devices": [{"resource_name": n, "device_ids": ids}
                                    for n, ids in (allocatable or {}).items()]},
        "list": {"pod_resources": [
            {"name": pod, "namespace": ns, "containers": [
                {"name": "main", "devices": [{"resource_name": res, "device_ids": ids}]}]}
            for pod, ns, res, ids in held]},
    }
    scratch = path.with_suffix(".tmp")
    scratch.write_text(json.dumps(state))
    os.replace(scratch, path)


@contextlib.asynccontextmanager
async def _kubelet(tool: Path, root: Path) -> AsyncIterator[Path]:
    """The fake kubelet serving `root/pod-resources/kubelet.sock`; yields its state file."""
    _socket(root).parent.mkdir(parents=True, exist_ok=True)
    state = root / "pod-resources-state.json"
    _write_state(state)
    process = await asyncio.create_subprocess_exec(
        str(tool), "-socket", str(_socket(root)), "-state", str(state),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 20)
        assert line.decode().strip() == f"serving {_socket(root)}", line
        yield state
    finally:
        if process.returncode is None:
            process.terminate()
        await process.wait()


async def _eventually(check: Callable[[], Any], seconds: float = 5.0) -> None:
    """Wait until `check()` holds (the plugin polls the kubelet every 0.1 s in these tests)."""
    deadline = asyncio.get_running_loop().time() + seconds
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"{check.__name__} never held"
        await asyncio.sleep(0.05)


async def _settled(plugin: NodePlugin, cluster: MemoryCluster) -> list[str]:
    """The devices in the node's slices once the publisher has caught up."""
    await asyncio.wait_for(plugin.publisher.synced.wait(), 5)
    return await _published(cluster)


async def _published(cluster: MemoryCluster) -> list[str]:
    listed = await cluster.list(RESOURCE_SLICES)
    return sorted((d["name"] for s in listed.items for d in s["spec"]["devices"]),
                  key=lambda n: int(n.split("-")[1]))


async def _condition(cluster: MemoryCluster) -> dict[str, Any] | None:
    node = await cluster.get(NODES, NODE)
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition["type"] == names.NODE_MIGRATION_CONDITION:
            return dict(condition)
    return None


async def _condition_written(cluster: MemoryCluster) -> dict[str, Any]:
    """The node's migration condition, once written (it follows the slices' publication)."""
    async def written() -> bool:
        return await _condition(cluster) is not None
    await _eventually(written, 5)
    condition = await _condition(cluster)
    assert condition is not None
    return condition


def _gauge(plugin: NodePlugin, name: str, **labels: str) -> float | None:
    return plugin.metrics.registry.get_sample_value(f"dra_gateway_node_plugin_{name}", labels)


# With the kubelet's own API (Go) -------------------------------------------------------------

async def test_our_pod_resources_proto_matches_the_kubelets_own(
        podresources_tool: Path) -> None:
    process = await asyncio.create_subprocess_exec(
        str(podresources_tool), "-describe", stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(process.communicate(), 20)
    upstream = json.loads(out)
    ours = MessageToDict(descriptor_pb2.FileDescriptorProto.FromString(
        podresources_v1_pb2.DESCRIPTOR.serialized_pb), preserving_proto_field_name=True)

    def shape(file: dict[str, Any]) -> tuple[Any, ...]:
        messages = {m["name"]: sorted((f["name"], f["number"], f.get("label"), f["type"],
                                       f.get("type_name", "")) for f in m.get("field", []))
                    for m in file["message_type"]}
        services = {s["name"]: sorted((m["name"], m["input_type"], m["output_type"])
                                      for m in s["method"]) for s in file["service"]}
        return file["package"], messages, services

    assert shape(ours) == shape(upstream)


async def test_the_client_reads_what_the_kubelet_offers_and_what_containers_hold(
        podresources_tool: Path, root: Path) -> None:
    async with _kubelet(podresources_tool, root) as state:
        _write_state(state, allocatable={"nvidia.com/gpu": [CARD_0, CARD_3],
                                         "example.com/nic": ["eth1"]},
                     held=[("train", "ml", "nvidia.com/gpu", [f"{CARD_3}::2"])])
        client = PodResourcesClient(_socket(root))
        try:
            view = await client.read()
        finally:
            await client.close()
    assert view == KubeletView(
        allocatable={"example.com/nic": ("eth1",), "nvidia.com/gpu": (CARD_0, CARD_3)},
        holders=(Holder(namespace="ml", pod="train", container="main",
                        resource="nvidia.com/gpu", device_ids=(f"{CARD_3}::2",)),))


async def test_a_kubelet_that_cannot_answer_is_an_error_naming_the_socket(
        podresources_tool: Path, root: Path) -> None:
    async with _kubelet(podresources_tool, root) as state:
        state.write_text("{not json")
        client = PodResourcesClient(_socket(root))
        try:
            with pytest.raises(PodResourcesError) as caught:
                await client.read()
        finally:
            await client.close()
    assert str(caught.value).startswith(
        f"the kubelet's pod-resources API at {_socket(root)} failed: UNAVAILABLE: state file")


async def test_cards_legacy_pods_hold_come_back_once_those_pods_end(
        podresources_tool: Path, root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    async with _kubelet(podresources_tool, root) as state:
        # The legacy plugin has left (its name stays, without devices); one pod still runs.
        _write_state(state, allocatable={"nvidia.com/gpu": []},
                     held=[("train", "ml", "nvidia.com/gpu", [CARD_3])])
        settings = plugin_settings(root, poll_seconds=0.1)
        async with running_plugin(root, cluster, h100x8, settings) as plugin:
            assert await _settled(plugin, cluster) == [d for d in EVERY_CARD if d != "gpu-3"]
            condition = await _condition_written(cluster)
            assert (condition["status"], condition["reason"], condition["message"]) == (
                "True", names.NODE_STATE_CUTTING_OVER,
                "1 of 8 card(s) held by legacy pods: ml/train (nvidia.com/gpu); withheld "
                "until those pods end")
            assert _gauge(plugin, "legacy_held_cards") == 1
            assert _gauge(plugin, "migration_state", state="CuttingOver") == 1

            _write_state(state, allocatable={"nvidia.com/gpu": []})

            async def all_back() -> bool:
                return await _published(cluster) == EVERY_CARD
            await _eventually(all_back, 5)

            async def dra() -> bool:
                condition = await _condition(cluster)
                return condition is not None and condition["reason"] == names.NODE_STATE_DRA
            await _eventually(dra, 5)
            assert _gauge(plugin, "legacy_held_cards") == 0
            assert _gauge(plugin, "migration_state", state="DRA") == 1
            assert _gauge(plugin, "migration_state", state="CuttingOver") == 0


async def test_the_node_says_dra_only_once_its_freed_cards_are_published(
        podresources_tool: Path, root: Path, cluster: MemoryCluster, h100x8: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # An API server slow to take the slices: the condition must not run ahead of them (a
    # migration waiting for DRA would send pods to cards the scheduler cannot see yet).
    slices_open = asyncio.Event()
    slices_open.set()
    for verb in ("create", "update"):
        original = getattr(cluster, verb)

        async def held(rt: Any, *args: Any, _original: Any = original, **kwargs: Any) -> Any:
            if rt is RESOURCE_SLICES:
                await slices_open.wait()
            return await _original(rt, *args, **kwargs)
        monkeypatch.setattr(cluster, verb, held)
    async with _kubelet(podresources_tool, root) as state:
        _write_state(state, allocatable={"nvidia.com/gpu": []},
                     held=[("train", "ml", "nvidia.com/gpu", [CARD_3])])
        settings = plugin_settings(root, poll_seconds=0.1)
        async with running_plugin(root, cluster, h100x8, settings) as plugin:
            await _settled(plugin, cluster)
            assert (await _condition_written(cluster))["reason"] == names.NODE_STATE_CUTTING_OVER

            slices_open.clear()
            _write_state(state, allocatable={"nvidia.com/gpu": []})

            async def judged() -> bool:
                return _gauge(plugin, "legacy_held_cards") == 0
            await _eventually(judged, 5)
            await asyncio.sleep(0.5)  # five polls more
            condition = await _condition(cluster)
            assert condition is not None
            assert condition["reason"] == names.NODE_STATE_CUTTING_OVER
            assert "gpu-3" not in await _published(cluster)

            slices_open.set()

            async def dra() -> bool:
                condition = await _condition(cluster)
                return condition is not None and condition["reason"] == names.NODE_STATE_DRA
            await _eventually(dra, 5)
            assert await _published(cluster) == EVERY_CARD


async def test_while_a_legacy_plugin_offers_gpus_no_card_is_published(
        podresources_tool: Path, root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    async with _kubelet(podresources_tool, root) as state:
        _write_state(state, allocatable={"nvidia.com/gpu": [CARD_0, CARD_3]})
        settings = plugin_settings(root, poll_seconds=0.1)
        async with running_plugin(root, cluster, h100x8, settings) as plugin:
            assert await _settled(plugin, cluster) == []
            condition = await _condition_written(cluster)
            assert condition["reason"] == names.NODE_STATE_LEGACY

            _write_state(state, allocatable={"nvidia.com/gpu": []})

            async def all_back() -> bool:
                return await _published(cluster) == EVERY_CARD
            await _eventually(all_back, 5)


async def test_cards_a_registered_legacy_plugin_reports_unhealthy_stay_withheld(
        podresources_tool: Path, root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    # NVIDIA's plugin after an XID: the kubelet lists healthy devices only (its pod-resources
    # API and the Node's allocatable); the Node's capacity still counts the cards, which the
    # kubelet hands out again once they are healthy.
    node = await cluster.get(NODES, NODE)
    node["status"] = {"capacity": {"nvidia.com/gpu": "8", "cpu": "64"},
                      "allocatable": {"nvidia.com/gpu": "0", "cpu": "64"}}
    await cluster.update(NODES, node, subresource="status")
    async with _kubelet(podresources_tool, root) as state:
        _write_state(state, allocatable={"nvidia.com/gpu": []})
        settings = plugin_settings(root, poll_seconds=0.1)
        settings = replace(settings, coexistence=replace(settings.coexistence,
                                                         node_seconds=0.2))
        async with running_plugin(root, cluster, h100x8, settings) as plugin:
            assert await _settled(plugin, cluster) == []
            condition = await _condition_written(cluster)
            assert condition["reason"] == names.NODE_STATE_LEGACY
            assert "nvidia.com/gpu" in condition["message"]
            # The plugin leaves and the kubelet's grace ends: the capacity drops to zero.
            node = await cluster.get(NODES, NODE)
            node["status"]["capacity"]["nvidia.com/gpu"] = "0"
            await cluster.update(NODES, node, subresource="status")

            async def all_back() -> bool:
                return await _published(cluster) == EVERY_CARD
            await _eventually(all_back, 5)


async def test_a_claim_on_a_card_a_legacy_pod_holds_is_not_prepared(
        podresources_tool: Path, root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    obj = await allocated(cluster, claim(devices=["gpu-3"]))
    ref = ClaimRef(namespace="ml", name=obj["metadata"]["name"], uid=obj["metadata"]["uid"])
    async with _kubelet(podresources_tool, root) as state:
        _write_state(state, held=[("train", "ml", "nvidia.com/gpu", [f"{CARD_3}-0"])])
        async with running_plugin(root, cluster, h100x8,
                                  plugin_settings(root, poll_seconds=0.1)) as plugin:
            refused = await plugin.preparer.prepare([ref])
            assert "device gpu-3 is not published by node" in refused[ref.uid].error
            _write_state(state)

            async def prepared() -> bool:
                return (await plugin.preparer.prepare([ref]))[ref.uid].error == ""
            await _eventually(prepared, 5)


# Without the kubelet's socket ----------------------------------------------------------------

async def test_without_the_socket_a_node_offering_legacy_gpus_publishes_nothing(
        root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    node = await cluster.get(NODES, NODE)
    node["status"] = {"allocatable": {"nvidia.com/gpu": "8", "cpu": "64"}}
    await cluster.update(NODES, node, subresource="status")
    async with running_plugin(root, cluster, h100x8) as plugin:
        assert await _settled(plugin, cluster) == []
        condition = await _condition_written(cluster)
    assert condition["reason"] == names.NODE_STATE_LEGACY
    assert condition["message"] == (
        "the Node's status offers nvidia.com/gpu and the kubelet's pod-resources API "
        f"cannot be read (the kubelet's pod-resources socket {_socket(root)} does not exist: "
        f"mount the kubelet's pod-resources directory ({_socket(root).parent}) into the plugin, "
        "or set --pod-resources-socket to where the kubelet serves it): none of its 8 card(s) "
        "is published")


async def test_without_the_socket_a_node_that_never_offered_legacy_gpus_publishes_all(
        root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    async with running_plugin(root, cluster, h100x8) as plugin:
        assert await _settled(plugin, cluster) == EVERY_CARD
        condition = await _condition_written(cluster)
        assert _gauge(plugin, "pod_resources_up") == 0
    assert condition["reason"] == names.NODE_STATE_DRA


async def test_before_the_kubelet_has_answered_no_card_is_published_or_prepared(
        root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    plugin = NodePlugin(plugin_settings(root), cluster, discover=lambda: load_inventory(h100x8))
    await plugin.discover_once()
    assert plugin.devices() == []
    assert dict(plugin.device_table()) == {}
    await plugin.coexistence.check()
    assert [d["name"] for d in plugin.devices()] == EVERY_CARD


async def test_with_coexistence_off_every_card_is_published_and_no_condition_written(
        root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    node = await cluster.get(NODES, NODE)
    node["status"] = {"allocatable": {"nvidia.com/gpu": "8"}}
    await cluster.update(NODES, node, subresource="status")
    settings = replace(plugin_settings(root), coexistence=CoexistenceSettings(enabled=False))
    async with running_plugin(root, cluster, h100x8, settings) as plugin:
        assert await _settled(plugin, cluster) == EVERY_CARD
        assert await _condition(cluster) is None


class _Kubelet:
    """A kubelet whose pod-resources answer the test sets (at first: no legacy plugin)."""

    def __init__(self) -> None:
        self.view = KubeletView()

    async def read(self) -> KubeletView:
        return self.view

    async def close(self) -> None:
        pass


async def test_the_condition_follows_publication_and_outlives_failures(
        cluster: MemoryCluster, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    shown = asyncio.Event()
    calls: list[str] = []

    async def published() -> None:
        calls.append("published")
        if len(calls) == 1:
            raise RuntimeError("publisher gone astray")
        await shown.wait()

    patch = cluster.patch
    refused: list[str] = []

    async def flaky_patch(rt: Any, *args: Any, **kwargs: Any) -> Any:
        if rt is NODES and not refused:
            refused.append("once")
            raise ApiError("etcdserver: request timed out", code=500)
        return await patch(rt, *args, **kwargs)
    monkeypatch.setattr(cluster, "patch", flaky_patch)
    coexistence = LegacyCoexistence(
        CoexistenceSettings(poll_seconds=0.05), cluster, node_name=NODE,
        cards=lambda: (Card(index=0, uuid=CARD_0, devices=("gpu-0",)),),
        on_change=lambda: None, published=published, client=_Kubelet())  # type: ignore[arg-type]
    verdict = await coexistence.check()
    assert verdict is not None
    assert verdict.state == names.NODE_STATE_DRA
    task = asyncio.create_task(coexistence.run())
    try:
        # The publisher's error is logged and the next poll asks again; nothing is written
        # until the slices show the verdict.
        await asyncio.sleep(0.3)
        assert len(calls) >= 2
        assert await _condition(cluster) is None
        assert "writing the migration condition failed unexpectedly" in caplog.text
        shown.set()
        # The first write is refused; a later poll writes it.
        condition = await _condition_written(cluster)
        assert condition["reason"] == names.NODE_STATE_DRA
        assert refused == ["once"]
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_verdict_back_to_the_one_written_is_written_again_after_a_write_in_flight(
        cluster: MemoryCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # DRA is on the Node; a CuttingOver write is on its way when the holder ends and the
    # verdict is DRA again: the Node must end on DRA, not on the write that landed last.
    writes_open = asyncio.Event()
    writes_open.set()
    written: list[str] = []
    patch = cluster.patch

    async def slow_patch(rt: Any, name: str, body: Any, **kwargs: Any) -> Any:
        if rt is not NODES:
            return await patch(rt, name, body, **kwargs)
        await writes_open.wait()
        stored = await patch(rt, name, body, **kwargs)
        written.append(body["status"]["conditions"][0]["reason"])
        return stored
    monkeypatch.setattr(cluster, "patch", slow_patch)

    async def published() -> None:
        pass
    kubelet = _Kubelet()
    # No poll within the test: only the checks it makes.
    coexistence = LegacyCoexistence(
        CoexistenceSettings(poll_seconds=600), cluster, node_name=NODE,
        cards=lambda: (Card(index=0, uuid=CARD_0, devices=("gpu-0",)),),
        on_change=lambda: None, published=published, client=kubelet)  # type: ignore[arg-type]
    await coexistence.check()
    task = asyncio.create_task(coexistence.run())
    try:
        async def state_is(reason: str) -> bool:
            condition = await _condition(cluster)
            return condition is not None and condition["reason"] == reason

        async def dra() -> bool:
            return await state_is(names.NODE_STATE_DRA)
        await _eventually(dra, 5)

        writes_open.clear()
        kubelet.view = KubeletView(
            allocatable={"nvidia.com/gpu": ()},
            holders=(Holder("ml", "train", "main", "nvidia.com/gpu", (CARD_0,)),))
        verdict = await coexistence.check()
        assert verdict is not None
        assert verdict.state == names.NODE_STATE_CUTTING_OVER
        await asyncio.sleep(0.1)  # the reporter is now waiting on the Node write

        kubelet.view = KubeletView()
        verdict = await coexistence.check()
        assert verdict is not None
        assert verdict.state == names.NODE_STATE_DRA
        writes_open.set()

        async def written_again() -> bool:
            return len(written) == 3
        await _eventually(written_again, 5)
        # The write in flight lands, then the verdict in force is written over it.
        assert written == [names.NODE_STATE_DRA, names.NODE_STATE_CUTTING_OVER,
                           names.NODE_STATE_DRA]
        assert await dra()
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_a_failed_read_of_the_node_keeps_its_last_status(
        cluster: MemoryCluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # NVIDIA's plugin after XIDs on every card: the kubelet offers none, only the Node's
    # capacity still counts them. A Node that cannot be read for a moment must not make the
    # legacy plugin look absent: every card would be published beside it.
    node = await cluster.get(NODES, NODE)
    node["status"] = {"capacity": {"nvidia.com/gpu": "1"},
                      "allocatable": {"nvidia.com/gpu": "0"}}
    await cluster.update(NODES, node, subresource="status")
    kubelet = _Kubelet()
    kubelet.view = KubeletView(allocatable={"nvidia.com/gpu": ()})
    coexistence = LegacyCoexistence(
        CoexistenceSettings(poll_seconds=600, node_seconds=0.0), cluster, node_name=NODE,
        cards=lambda: (Card(index=0, uuid=CARD_0, devices=("gpu-0",)),),
        on_change=lambda: None, client=kubelet)  # type: ignore[arg-type]
    verdict = await coexistence.check()
    assert verdict is not None
    assert verdict.state == names.NODE_STATE_LEGACY
    get = cluster.get

    async def failing_get(rt: Any, name: str, **kwargs: Any) -> Any:
        if rt is NODES:
            raise ApiError("the server was unable to return a response in the time allotted",
                           code=504, reason="Timeout")
        return await get(rt, name, **kwargs)
    monkeypatch.setattr(cluster, "get", failing_get)
    for _ in range(3):
        verdict = await coexistence.check()
        assert verdict is not None
        assert (verdict.state, verdict.withheld) == (names.NODE_STATE_LEGACY,
                                                     frozenset({"gpu-0"}))
    monkeypatch.setattr(cluster, "get", get)
    node = await cluster.get(NODES, NODE)
    node["status"] = {"capacity": {"nvidia.com/gpu": "0"}, "allocatable": {"nvidia.com/gpu": "0"}}
    await cluster.update(NODES, node, subresource="status")
    verdict = await coexistence.check()
    assert verdict is not None
    assert verdict.state == names.NODE_STATE_DRA

"""Health that survives restarts: a node plugin restarted (a helm upgrade, a changed inventory, a
deleted pod, a node reboot) keeps every card out of service that was out before, with its
fault, class, since and recovery, and an administrator's keep and clear; a failed write of the
Node's condition is tried again until it lands; and during a rolling update only the instance
holding the state directory's fence writes slices, conditions or the checkpoint."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube.cluster.port import ApiError
from dra_gateway.kube.device_health import (
    CLEAR_ANNOTATION,
    KEEP_ANNOTATION,
    clear_value,
    node_marks,
)
from dra_gateway.kube.resources import EVENTS, NODES, RESOURCE_SLICES, ResourceType
from dra_gateway.node_plugin import prepare
from dra_gateway.node_plugin.devices import DeviceOptions
from dra_gateway.node_plugin.healthstate import HEALTH_FILE
from dra_gateway.node_plugin.inventory import load_inventory
from dra_gateway.node_plugin.nvml import Nvml, discover_nvml
from dra_gateway.node_plugin.plugin import NodePlugin, PluginSettings
from dra_gateway.node_plugin.prepare import ClaimRef

from .claimdata import NODE, claim
from .conftest import allocated, plugin_settings
from .fake_nvml import FakeGpu, FakeNvml

pytestmark = pytest.mark.timeout(60, func_only=True)

UUIDS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(3)]


def _fake() -> FakeNvml:
    return FakeNvml([FakeGpu(uuid=u, minor=i, bus_id=f"00000000:1{i}:00.0".encode())
                     for i, u in enumerate(UUIDS)])


def _settings(root: Path, *, taints: bool, **changes: Any) -> PluginSettings:
    settings = PluginSettings(node_name=NODE, plugins_dir=root / "p", registry_dir=root / "r",
                              cdi_dir=root / "c", state_dir=root / "s", device_taints=taints,
                              devices=DeviceOptions(), nvml_retry_seconds=0.05,
                              admin_check_seconds=0.05, retry_seconds=0.01)
    return replace(settings, **changes)


@contextlib.asynccontextmanager
async def _running(root: Path, cluster: MemoryCluster, fake: FakeNvml, *, taints: bool,
                   **changes: Any) -> AsyncIterator[NodePlugin]:
    module = fake.module()
    plugin = NodePlugin(_settings(root, taints=taints, **changes), cluster,
                        discover=lambda: discover_nvml(module),
                        nvml_factory=lambda: Nvml(module))
    started = asyncio.Event()
    task = asyncio.create_task(plugin.run(started=started))
    await asyncio.wait_for(started.wait(), 5)
    try:
        yield plugin
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _until(check: Callable[[], Any], what: str) -> Any:
    for _ in range(500):
        value = await check()
        if value:
            return value
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def _devices(cluster: MemoryCluster) -> dict[str, list[dict[str, Any]]]:
    """The published devices by name, each with its taints."""
    listed = await cluster.list(RESOURCE_SLICES)
    return {d["name"]: d.get("taints", []) for s in listed.items for d in s["spec"]["devices"]}


async def _condition(cluster: MemoryCluster) -> dict[str, Any] | None:
    node = await cluster.get(NODES, NODE)
    return next((c for c in node.get("status", {}).get("conditions", [])
                 if c["type"] == "GpuDevicesUnhealthy"), None)


async def _xid_48(root: Path, cluster: MemoryCluster, *, taints: bool) -> None:
    """A plugin sees XID 48 on gpu-2 (the card still enumerates), publishes that, and stops."""
    fake = _fake()
    async with _running(root, cluster, fake, taints=taints):
        await _until(lambda: _now(fake.registered), "XID registration")
        fake.xid(2, 48)

        async def out() -> bool:
            condition = await _condition(cluster)
            marked = condition is not None and condition["status"] == "True"
            devices = await _devices(cluster)
            return marked and (bool(devices.get("gpu-2")) if taints else "gpu-2" not in devices)

        await _until(out, "gpu-2 out of service")


async def _now(value: Any) -> Any:
    return value


async def _absent(cluster: MemoryCluster, device: str) -> bool:
    return device not in await _devices(cluster)


@pytest.mark.parametrize("taints", [False, True], ids=["withheld", "tainted"])
async def test_a_card_with_a_fatal_xid_stays_out_of_service_after_a_restart(
        root: Path, cluster: MemoryCluster, taints: bool) -> None:
    await _xid_48(root, cluster, taints=taints)
    async with _running(root, cluster, _fake(), taints=taints) as plugin:
        await _until(lambda: _now(plugin.publisher.published_once), "the first publish")
        await asyncio.sleep(0.3)  # NVML sessions, recovery rounds, condition writes
        devices = await _devices(cluster)
        condition = await _condition(cluster)
        health = plugin._device_health()
    if taints:
        assert [t["effect"] for t in devices["gpu-2"]] == ["NoExecute"]
        assert [t["value"] for t in devices["gpu-2"]] == ["xid-48"]
        assert not devices["gpu-0"]
        assert not devices["gpu-1"]
    else:
        assert sorted(devices) == ["gpu-0", "gpu-1"]
    assert condition is not None
    assert condition["status"] == "True"
    (mark,) = node_marks({"status": {"conditions": [condition]}})
    assert (mark.device, mark.reason, mark.severity, mark.healthy_at) == (
        "gpu-2", "xid-48", "fatal", "")
    assert [(h.device, h.healthy) for h in health] == [
        ("gpu-0", True), ("gpu-1", True), ("gpu-2", False)]


async def test_the_marks_come_back_from_the_node_condition_without_the_state_file(
        root: Path, cluster: MemoryCluster) -> None:
    """A node rebooted with its state directory on a tmpfs: the Node's condition is the
    copy the cluster kept."""
    await _xid_48(root, cluster, taints=False)
    before = await _condition(cluster)
    (root / "s" / HEALTH_FILE).unlink()
    async with _running(root, cluster, _fake(), taints=False) as plugin:
        await _until(lambda: _now(plugin.publisher.published_once), "the first publish")
        await asyncio.sleep(0.3)
        devices = await _devices(cluster)
        after = await _condition(cluster)
        since = plugin.health.problems["gpu-2"].since
    assert sorted(devices) == ["gpu-0", "gpu-1"]
    assert before is not None
    assert after is not None
    assert after["status"] == "True"
    assert after["message"] == before["message"]
    assert since in before["message"]


async def test_a_degraded_mark_recovers_on_its_clock_across_a_restart(
        root: Path, cluster: MemoryCluster) -> None:
    """The recovery carries on where it stood: a degraded card marked before the restart is
    healthy again once no fault hit it for the recovery period, counted from that fault."""
    fake = _fake()
    async with _running(root, cluster, fake, taints=True, recovery_seconds=1.0) as plugin:
        await _until(lambda: _now(fake.registered), "XID registration")
        fake.xid(0, 94)  # a contained ECC error: degraded
        await _until(lambda: _now("gpu-0" in plugin.health.problems), "gpu-0 marked")
    async with _running(root, cluster, _fake(), taints=True, recovery_seconds=1.0) as plugin:
        assert "gpu-0" in plugin.health.problems
        await _until(lambda: _now(not plugin.health.problems), "gpu-0 healthy again")
        saved = json.loads((root / "s" / HEALTH_FILE).read_text())
    assert saved["marks"] == {}


async def test_a_kept_device_is_read_at_start_and_never_lifts_by_itself(
        root: Path, cluster: MemoryCluster) -> None:
    """`dra-gateway devices keep` written while the plugin was away (or while nothing was
    marked) holds from the start: the degraded card's mark does not lift on its own."""
    await cluster.patch(NODES, NODE, {"metadata": {"annotations": {KEEP_ANNOTATION: "gpu-0"}}},
                        patch_type="merge")
    fake = _fake()
    async with _running(root, cluster, fake, taints=True, recovery_seconds=0.2,
                        admin_check_seconds=60.0) as plugin:
        assert plugin.health.kept == {"gpu-0"}
        await _until(lambda: _now(fake.registered), "XID registration")
        fake.xid(0, 94)
        await _until(lambda: _now("gpu-0" in plugin.health.problems), "gpu-0 marked")
    async with _running(root, cluster, _fake(), taints=True, recovery_seconds=0.2,
                        admin_check_seconds=60.0) as plugin:
        await asyncio.sleep(0.6)  # three recovery periods
        assert set(plugin.health.problems) == {"gpu-0"}
        condition = await _until(lambda: _condition(cluster), "the condition")
    (mark,) = node_marks({"status": {"conditions": [condition]}})
    assert (mark.device, mark.kept) == ("gpu-0", True)


async def test_a_clear_written_while_the_plugin_was_away_lifts_the_mark_at_start(
        root: Path, cluster: MemoryCluster) -> None:
    await _xid_48(root, cluster, taints=False)
    # A clear older than the fault does not lift it: written first, and kept out.
    await cluster.patch(NODES, NODE, {"metadata": {"annotations": {
        CLEAR_ANNOTATION: clear_value(None, ["gpu-2"], datetime.now(UTC) - timedelta(hours=1))}}},
        patch_type="merge")
    async with _running(root, cluster, _fake(), taints=False) as plugin:
        await _until(lambda: _now(plugin.publisher.published_once), "the first publish")
        assert sorted(await _devices(cluster)) == ["gpu-0", "gpu-1"]
    await cluster.patch(NODES, NODE, {"metadata": {"annotations": {
        CLEAR_ANNOTATION: clear_value(None, ["gpu-2"], datetime.now(UTC))}}}, patch_type="merge")
    async with _running(root, cluster, _fake(), taints=False) as plugin:
        await _until(lambda: _now(plugin.publisher.published_once), "the first publish")

        async def healthy() -> bool:
            condition = await _condition(cluster)
            return condition is not None and condition["status"] == "False"

        await _until(healthy, "the condition to say every device is healthy")
        assert sorted(await _devices(cluster)) == ["gpu-0", "gpu-1", "gpu-2"]
        assert not plugin.health.problems
        events = (await cluster.list(EVENTS, namespace="default")).items
    assert [e["reason"] for e in events if e["reason"] == "DeviceHealthy"] == ["DeviceHealthy"]


class FailsConditionWrites(MemoryCluster):
    """An API server that refuses the first `failures` writes of a Node's status."""

    failures = 3

    async def patch(self, rt: ResourceType, name: str, patch: Any, **kwargs: Any) -> Any:
        if rt == NODES and kwargs.get("subresource") == "status" and self.failures > 0:
            self.failures -= 1
            raise ApiError("etcdserver: request timed out", code=500, reason="InternalError")
        return await super().patch(rt, name, patch, **kwargs)


async def test_a_failed_write_of_the_condition_is_tried_again_until_it_lands(
        root: Path) -> None:
    cluster = FailsConditionWrites()
    await cluster.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    fake = _fake()
    async with _running(root, cluster, fake, taints=False):
        await _until(lambda: _now(fake.registered), "XID registration")
        await _until(lambda: _now(cluster.failures == 0), "the refused writes")
        cluster.failures = 2
        fake.xid(1, 79)  # a card fell off the bus: the drain reads only this condition

        async def marked() -> bool:
            condition = await _condition(cluster)
            return condition is not None and condition["status"] == "True"

        await _until(marked, "the condition to be written after two refusals")
    await cluster.close()


# The fence of a rolling update ----------------------------------------------------------------

async def test_an_instance_waiting_for_the_fence_writes_nothing_and_takes_over_what_was_left(
        root: Path, cluster: MemoryCluster, h100x8: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """maxSurge: the new pod starts beside the old one. It is ready once registered, but
    writes no slice, condition or checkpoint while the old one runs; then it takes over the
    marks and the prepared claims the old one left."""
    monkeypatch.setattr(prepare, "HOLD_SECONDS", 0.1)
    obj = await allocated(cluster, claim(devices=["gpu-2"]))
    ref = ClaimRef(namespace="ml", name=obj["metadata"]["name"], uid=obj["metadata"]["uid"])
    fault_file = root / "faults"
    fault_file.touch()

    def plugin(instance: str) -> NodePlugin:
        settings = replace(plugin_settings(root), instance=instance, fault_file=fault_file,
                           fence_poll_seconds=0.02, retry_seconds=0.01)
        return NodePlugin(settings, cluster, discover=lambda: load_inventory(h100x8))

    old, new = plugin("old"), plugin("new")
    old_started = asyncio.Event()
    old_task = asyncio.create_task(old.run(started=old_started))
    await asyncio.wait_for(old_started.wait(), 5)
    await _until(lambda: _now(old.publisher.published_once), "the old pod's first publish")
    new_started = asyncio.Event()
    new_task = asyncio.create_task(new.run(started=new_started))
    try:
        await _until(lambda: _now(new.server.registration_socket.exists()), "the new socket")
        new._registration_status(True)  # the kubelet registered the new pod
        assert new.readiness() == ""  # so the rolling update stops the old pod
        refused = await new.preparer.prepare([ref])
        assert "another instance of the node plugin still runs" in refused[ref.uid].error
        assert (await old.preparer.prepare([ref]))[ref.uid].error == ""
        with fault_file.open("a") as stream:
            stream.write(json.dumps({"device": "gpu-5", "event": "xid", "code": 48}) + "\n")
        await _until(lambda: _now("gpu-5" in old.health.problems
                                  and old.publisher.synced.is_set()), "gpu-5 marked")
        await _until(lambda: _absent(cluster, "gpu-5"), "gpu-5 withheld by the old pod")
        await asyncio.sleep(0.3)  # the new pod would have rewritten the slices by now
        assert "gpu-5" not in await _devices(cluster)
        assert not new_started.is_set()
        assert not new.publisher.published_once
        assert new.metrics.slice_writes.labels("update")._value.get() == 0
    finally:
        old_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await old_task
    try:
        await asyncio.wait_for(new_started.wait(), 5)
        assert new.fence.held
        assert set(new.health.problems) == {"gpu-5"}
        entry = new.preparer.checkpoint.get(ref.uid)
        assert entry is not None
        assert entry.state == "PrepareCompleted"
        assert (await new.preparer.prepare([ref]))[ref.uid].error == ""
        await _until(lambda: _now(new.publisher.synced.is_set()), "the new pod's publish")
        assert "gpu-5" not in await _devices(cluster)
    finally:
        new_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await new_task

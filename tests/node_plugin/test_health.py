from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.device_health import (
    CLEAR_ANNOTATION,
    KEEP_ANNOTATION,
    clear_value,
    node_marks,
    parse_marks,
)
from dra_gateway.kube.resources import NODES, RESOURCE_SLICES
from dra_gateway.node_plugin.devices import DeviceOptions
from dra_gateway.node_plugin.nvml import Nvml, discover_nvml
from dra_gateway.node_plugin.plugin import NodePlugin, PluginSettings

from .claimdata import NODE
from .fake_nvml import FakeGpu, FakeMig, FakeNvml

UUIDS = [f"GPU-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(3)]


@contextlib.asynccontextmanager
async def _running(root: Path, cluster: MemoryCluster, fake: FakeNvml, *,
                   taints: bool | None, admin_check: float = 10.0) -> AsyncIterator[NodePlugin]:
    settings = PluginSettings(node_name=NODE, plugins_dir=root / "p", registry_dir=root / "r",
                              cdi_dir=root / "c", state_dir=root / "s", device_taints=taints,
                              devices=DeviceOptions(), nvml_retry_seconds=0.05,
                              admin_check_seconds=admin_check)
    module = fake.module()
    plugin = NodePlugin(settings, cluster, discover=lambda: discover_nvml(module),
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


def _fake() -> FakeNvml:
    return FakeNvml([FakeGpu(uuid=u, minor=i, bus_id=f"00000000:1{i}:00.0".encode())
                     for i, u in enumerate(UUIDS)])


async def test_a_critical_xid_taints_the_card_where_the_cluster_keeps_taints(
        root: Path, cluster: MemoryCluster) -> None:
    fake = _fake()
    async with _running(root, cluster, fake, taints=True) as plugin:
        await _until(lambda: _async(fake.registered), "XID registration")
        fake.xid(1, 79)

        async def tainted() -> Any:
            (slice_,) = (await cluster.list(RESOURCE_SLICES)).items
            return [d for d in slice_["spec"]["devices"] if "taints" in d] and slice_

        slice_ = await _until(tainted, "a tainted device")
        kubernetes_validate.validate(slice_, "1.34", strict=True)
        (device,) = [d for d in slice_["spec"]["devices"] if "taints" in d]
        assert device["name"] == "gpu-1"
        assert device["taints"][0]["key"] == f"{names.DRIVER}/unhealthy"
        assert device["taints"][0]["value"] == "xid-79"
        # Fallen off the bus: fatal, the card's pods must leave.
        assert device["taints"][0]["effect"] == "NoExecute"
        assert len(slice_["spec"]["devices"]) == 3
        assert plugin.metrics.unhealthy_devices._value.get() == 1


class DropsTaints(MemoryCluster):
    """An API server without DRADeviceTaints: it drops the devices' taints it is sent."""

    async def create(self, rt: Any, obj: dict[str, Any], *, namespace: str | None = None,
                     dry_run: bool = False) -> dict[str, Any]:
        if rt == RESOURCE_SLICES:
            obj = copy.deepcopy(obj)
            for device in obj["spec"].get("devices") or ():
                device.pop("taints", None)
        return await super().create(rt, obj, namespace=namespace, dry_run=dry_run)


@pytest.mark.parametrize(("server", "tainted"), [(MemoryCluster, True), (DropsTaints, False)])
async def test_where_taints_are_left_to_detection_the_api_server_decides(
        root: Path, server: type[MemoryCluster], tainted: bool) -> None:
    cluster = server()
    await cluster.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    fake = _fake()
    async with _running(root, cluster, fake, taints=None) as plugin:
        assert plugin.device_taints is tainted
        await _until(lambda: _async(fake.registered), "XID registration")
        fake.xid(1, 79)

        async def marked() -> Any:
            (slice_,) = (await cluster.list(RESOURCE_SLICES)).items
            devices = {d["name"]: d for d in slice_["spec"]["devices"]}
            if tainted:
                return "taints" in devices.get("gpu-1", {})
            return "gpu-1" not in devices

        await _until(marked, "gpu-1 tainted" if tainted else "gpu-1 withheld")
    await cluster.close()


async def test_without_taints_the_card_is_withheld_and_the_node_says_why(
        root: Path, cluster: MemoryCluster) -> None:
    fake = _fake()
    async with _running(root, cluster, fake, taints=False):
        await _until(lambda: _async(fake.registered), "XID registration")
        fake.xid(0, 13)  # an application error: the card stays
        fake.xid(2, 48)

        async def withheld() -> Any:
            (slice_,) = (await cluster.list(RESOURCE_SLICES)).items
            return [d["name"] for d in slice_["spec"]["devices"]] == ["gpu-0", "gpu-1"]

        await _until(withheld, "gpu-2 to be withheld")

        async def condition() -> Any:
            node = await cluster.get(NODES, NODE)
            conditions = node.get("status", {}).get("conditions", [])
            return [c for c in conditions
                    if c["type"] == "GpuDevicesUnhealthy" and c["status"] == "True"]

        (cond,) = await _until(condition, "the node condition")
        assert cond["message"].startswith("1 gpu.dra-gateway.io device(s) out of service: "
                                          "gpu-2 (xid-48, fatal, withheld, since ")
        # The allocator reads it back (kube/device_health.py): a fatal, withheld device, with
        # no time to be healthy at (it has not come back).
        (mark,) = parse_marks(cond["message"])
        assert (mark.device, mark.reason, mark.severity, mark.withheld, mark.healthy_at) == (
            "gpu-2", "xid-48", "fatal", True, "")


async def test_an_nvml_outage_means_no_healthy_devices_until_it_recovers(
        root: Path, cluster: MemoryCluster) -> None:
    fake = _fake()
    async with _running(root, cluster, fake, taints=False) as plugin:
        await _until(lambda: _async(fake.registered), "XID registration")
        fake.fail_everything = 9  # the driver went away

        async def devices() -> list[str]:
            (slice_,) = (await cluster.list(RESOURCE_SLICES)).items
            return [d["name"] for d in slice_["spec"]["devices"]]

        await _until(lambda: _async(len(plugin.health.problems) == 3), "all devices unhealthy")
        await _until(lambda: _async_call(devices, []), "an empty pool")
        assert plugin.metrics.nvml_up._value.get() == 0
        fake.fail_everything = None
        await _until(lambda: _async_call(devices, ["gpu-0", "gpu-1", "gpu-2"]), "recovery")
        assert plugin.metrics.nvml_up._value.get() == 1


async def _async(value: Any) -> Any:
    return value


async def _async_call(fn: Callable[[], Any], expected: Any) -> bool:
    return bool(await fn() == expected)


async def test_a_card_that_falls_off_the_bus_is_marked_alone(
        root: Path, cluster: MemoryCluster) -> None:
    """XID 79: the event arrives for a card whose every NVML call now says GPU is lost."""
    fake = _fake()
    async with _running(root, cluster, fake, taints=True) as plugin:
        await _until(lambda: _async(fake.registered), "XID registration")
        fake.gpus[1].lost = True
        fake.xid(1, 79)

        await _until(lambda: _async("gpu-1" in plugin.health.problems), "gpu-1 marked")
        # Several sessions' worth of time: the healthy cards must stay healthy.
        await asyncio.sleep(0.3)
        assert set(plugin.health.problems) == {"gpu-1"}
        # Whichever the watcher sees first names the fault (the probe may find the card lost
        # before the event is read); the second is the same severity and keeps the first.
        assert plugin.health.problems["gpu-1"].reason in {"xid-79", "gpu-lost"}
        assert plugin.health.problems["gpu-1"].severity == "fatal"
        assert plugin.metrics.nvml_up._value.get() == 1


async def test_a_card_lost_before_the_watch_starts_does_not_stop_the_others(
        root: Path, cluster: MemoryCluster) -> None:
    fake = _fake()
    module = fake.module()
    facts = discover_nvml(module)
    fake.gpus[2].lost = True
    settings = PluginSettings(node_name=NODE, plugins_dir=root / "p", registry_dir=root / "r",
                              cdi_dir=root / "c", state_dir=root / "s", device_taints=True,
                              devices=DeviceOptions(), nvml_retry_seconds=0.05)
    plugin = NodePlugin(settings, cluster, discover=lambda: facts,
                        nvml_factory=lambda: Nvml(module))
    started = asyncio.Event()
    task = asyncio.create_task(plugin.run(started=started))
    try:
        await asyncio.wait_for(started.wait(), 5)
        await _until(lambda: _async("gpu-2" in plugin.health.problems), "gpu-2 marked")
        await asyncio.sleep(0.2)
        assert {d: p.reason for d, p in plugin.health.problems.items()} == {"gpu-2": "gpu-lost"}
        assert sorted(fake.registered) == sorted(UUIDS[:2])
        fake.xid(0, 48)
        await _until(lambda: _async("gpu-0" in plugin.health.problems), "gpu-0 marked")
        assert fake.event_sets_open <= 1
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def test_an_unexpected_error_in_the_watcher_degrades_and_retries(
        root: Path, cluster: MemoryCluster) -> None:
    """Not only NvmlError: whatever breaks a session must not end health watching."""
    fake = _fake()
    module = fake.module()
    calls = 0

    def factory() -> Nvml:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("ctypes said no")
        return Nvml(module)

    settings = PluginSettings(node_name=NODE, plugins_dir=root / "p", registry_dir=root / "r",
                              cdi_dir=root / "c", state_dir=root / "s", device_taints=True,
                              devices=DeviceOptions(), nvml_retry_seconds=0.05)
    plugin = NodePlugin(settings, cluster, discover=lambda: discover_nvml(module),
                        nvml_factory=factory)
    started = asyncio.Event()
    task = asyncio.create_task(plugin.run(started=started))
    try:
        await asyncio.wait_for(started.wait(), 5)
        await _until(lambda: _async(fake.registered), "XID registration after the retry")
        fake.xid(2, 48)
        await _until(lambda: _async(plugin.health.problems.get("gpu-2")), "gpu-2 marked")
        assert {d: p.reason for d, p in plugin.health.problems.items()} == {"gpu-2": "xid-48"}
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


# A card in MIG mode with three 1g.10gb instances (GPU instances 1-3, compute instance 0 each)
# beside a full card.
MIG_UUIDS = [f"MIG-0000000{i}-aaaa-bbbb-cccc-dddddddddddd" for i in range(3)]
INSTANCES = ["gpu-0-mig-19-0-1", "gpu-0-mig-19-1-1", "gpu-0-mig-19-2-1"]


def _mig_fake() -> FakeNvml:
    migs: list[FakeMig | None] = [
        FakeMig(uuid=u, memory_mb=9856, gi_slices=1, ci_slices=1, profile_id=19, start=i,
                size=1, gi_id=i + 1, ci_id=0)
        for i, u in enumerate(MIG_UUIDS)]
    return FakeNvml([FakeGpu(uuid=UUIDS[0], minor=0, mig_mode=1, migs=migs),
                     FakeGpu(uuid=UUIDS[1], minor=1, bus_id=b"00000000:19:00.0")])


def _reasons(plugin: NodePlugin) -> dict[str, str]:
    return {d: p.reason for d, p in plugin.health.problems.items()}


async def test_an_xid_on_one_mig_instance_marks_that_instance_only(
        root: Path, cluster: MemoryCluster) -> None:
    fake = _mig_fake()
    async with _running(root, cluster, fake, taints=True) as plugin:
        await _until(lambda: _async(fake.registered), "XID registration")
        # Events are handled in order: the ones that name no published instance (a compute
        # instance or a GPU instance the card does not have) are done before the last.
        fake.xid(0, 48, gi=1, ci=1)
        fake.xid(0, 48, gi=9, ci=0)
        fake.xid(0, 48, gi=1, ci=0)

        await _until(lambda: _async(plugin.health.problems), "a marked instance")
        await asyncio.sleep(0.2)
        assert _reasons(plugin) == {INSTANCES[0]: "xid-48"}

        async def tainted() -> Any:
            (slice_,) = (await cluster.list(RESOURCE_SLICES)).items
            return [d for d in slice_["spec"]["devices"] if "taints" in d] and slice_

        slice_ = await _until(tainted, "a tainted device")
        kubernetes_validate.validate(slice_, "1.34", strict=True)
        assert [d["name"] for d in slice_["spec"]["devices"] if "taints" in d] == [INSTANCES[0]]
        assert len(slice_["spec"]["devices"]) == 4


async def test_an_xid_not_attributed_to_an_instance_marks_every_instance_of_the_card(
        root: Path, cluster: MemoryCluster) -> None:
    """0xFFFFFFFF ids: the XID hit the card, not one instance; the other card stays."""
    fake = _mig_fake()
    async with _running(root, cluster, fake, taints=False) as plugin:
        await _until(lambda: _async(fake.registered), "XID registration")
        fake.xid(0, 48, gi=2, ci=0)
        await _until(lambda: _async(plugin.health.problems), "the instance marked")
        assert _reasons(plugin) == {INSTANCES[1]: "xid-48"}
        fake.xid(0, 79)  # gpuInstanceId = computeInstanceId = 0xFFFFFFFF
        await _until(lambda: _async(len(plugin.health.problems) == 3), "every instance marked")
        await asyncio.sleep(0.2)
        # An instance keeps the first reason it was marked for.
        assert _reasons(plugin) == {INSTANCES[0]: "xid-79", INSTANCES[1]: "xid-48",
                                    INSTANCES[2]: "xid-79"}


async def test_application_xids_on_mig_instances_mark_nothing(
        root: Path, cluster: MemoryCluster) -> None:
    fake = _mig_fake()
    async with _running(root, cluster, fake, taints=True) as plugin:
        await _until(lambda: _async(fake.registered), "XID registration")
        for xid in (13, 31, 43, 45, 68, 109):
            fake.xid(0, xid, gi=1, ci=0)
            fake.xid(0, xid)
            fake.xid(1, xid)
        fake.xid(0, 48, gi=3, ci=0)  # a critical one after them, to know they were handled

        await _until(lambda: _async(plugin.health.problems), "the critical XID marked")
        await asyncio.sleep(0.2)
        assert _reasons(plugin) == {INSTANCES[2]: "xid-48"}
        assert plugin.metrics.xid_events.labels("13")._value.get() == 3


def test_transitions_say_what_a_fault_does_where_taints_are_not_kept() -> None:
    from dra_gateway.node_plugin.health import Problem, transitions

    degraded = Problem("xid-92", "2026-12-06T10:00:00Z", "degraded")
    fatal = Problem("xid-79", "2026-12-06T10:00:00Z", "fatal")
    [first] = transitions({}, {"gpu-1": degraded}, tainted=False, lifted_because={})
    assert (first.type, first.reason) == ("Warning", "DeviceUnhealthy")
    assert first.message == ("device gpu-1: xid-92 (degraded fault) since 2026-12-06T10:00:00Z; "
                             "withheld from the node's ResourceSlices: it takes no new pods")
    # Worse: told again; the same class again: not.
    [worse] = transitions({"gpu-1": degraded}, {"gpu-1": fatal}, tainted=True, lifted_because={})
    assert "tainted NoExecute" in worse.message
    assert transitions({"gpu-1": fatal}, {"gpu-1": fatal}, tainted=True, lifted_because={}) == []
    [healed] = transitions({"gpu-1": fatal}, {}, tainted=True,
                           lifted_because={"gpu-1": "nvml-unavailable ended"})
    assert (healed.type, healed.reason) == ("Normal", "DeviceHealthy")
    assert healed.message.startswith("device gpu-1 is healthy again (nvml-unavailable ended)")


async def test_an_administrator_clears_a_failed_card_through_its_node_and_keeps_another(
        root: Path, cluster: MemoryCluster) -> None:
    """The Node's annotations (written by `dra-gateway devices clear|keep`) are read while a
    device is marked: a cleared card is published again at once, untainted, and the Node's
    condition says so; a kept card stays marked."""
    fake = _fake()
    async with _running(root, cluster, fake, taints=True, admin_check=0.02) as plugin:
        await _until(lambda: _async(fake.registered), "XID registration")
        fake.xid(1, 79)
        fake.xid(2, 48)
        await _until(lambda: _async(set(plugin.health.problems) == {"gpu-1", "gpu-2"}),
                     "two failed cards")
        now = datetime.now(UTC) + timedelta(seconds=1)
        await cluster.patch(NODES, NODE, {"metadata": {"annotations": {
            CLEAR_ANNOTATION: clear_value(None, ["gpu-1"], now),
            KEEP_ANNOTATION: "gpu-2"}}}, patch_type="merge")

        async def untainted() -> Any:
            (slice_,) = (await cluster.list(RESOURCE_SLICES)).items
            return {d["name"] for d in slice_["spec"]["devices"] if "taints" in d} == {"gpu-2"}

        await _until(untainted, "gpu-1 published untainted")

        async def listed() -> Any:
            node = await cluster.get(NODES, NODE)
            return {(m.device, m.kept) for m in node_marks(node)} == {("gpu-2", True)}

        await _until(listed, "the condition to list gpu-2 only, kept")
        assert plugin.health.kept == {"gpu-2"}

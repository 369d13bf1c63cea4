"""Health events from `--fault-file`, on a running plugin in inventory mode."""

from __future__ import annotations

import asyncio
import json
import logging
from dataclasses import replace
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube.resources import EVENTS, RESOURCE_SLICES
from dra_gateway.node_plugin.faultfile import FaultLineError, apply_line
from dra_gateway.node_plugin.health import Health
from dra_gateway.node_plugin.inventory import load_inventory

from .conftest import plugin_settings, running_plugin

MIG_CARD = "GPU-5a1e2b7c-0d3f-4e59-8a61-2c4b9e7f1a03"


def _append(path: Path, *events: dict[str, Any] | str) -> None:
    with path.open("a") as stream:
        for event in events:
            stream.write((event if isinstance(event, str) else json.dumps(event)) + "\n")


async def _taints(cluster: MemoryCluster) -> dict[str, str]:
    listed = await cluster.list(RESOURCE_SLICES)
    return {d["name"]: d["taints"][0]["effect"] for s in listed.items
            for d in s["spec"]["devices"] if d.get("taints")}


async def _until(cluster: MemoryCluster, wanted: dict[str, str]) -> None:
    for _ in range(200):
        if await _taints(cluster) == wanted:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"taints {await _taints(cluster)}, not {wanted}")


async def test_faults_from_the_file_taint_devices_and_a_recovery_lifts_them(
        root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    faults = root / "faults.jsonl"
    settings = replace(plugin_settings(root), device_taints=True, fault_file=faults,
                       recovery_seconds=0.5)
    async with running_plugin(root, cluster, h100x8, settings):
        # The file appears after the plugin started.
        _append(faults, {"device": "gpu-3", "event": "xid", "code": 79},
                {"device": "gpu-5", "event": "xid", "code": 92},
                {"device": "gpu-6", "event": "xid", "code": 13})
        await _until(cluster, {"gpu-3": "NoExecute", "gpu-5": "NoSchedule"})
        # The degraded card recovers on its own; the fatal one waits for a sign.
        await _until(cluster, {"gpu-3": "NoExecute"})
        await asyncio.sleep(1.0)
        assert await _taints(cluster) == {"gpu-3": "NoExecute"}
        _append(faults, {"device": "gpu-3", "event": "recovered"})
        await _until(cluster, {})


async def test_a_restarted_plugin_does_not_replay_the_faults_of_its_previous_run(
        root: Path, cluster: MemoryCluster, h100x8: Path,
        caplog: pytest.LogCaptureFixture) -> None:
    faults = root / "faults.jsonl"
    _append(faults, {"device": "gpu-3", "event": "xid", "code": 79})
    faults.write_text(faults.read_text() + '{"device": "gpu-4", "event": "xid"')  # being written
    settings = replace(plugin_settings(root), device_taints=True, fault_file=faults,
                       recovery_seconds=0)
    with caplog.at_level(logging.WARNING):
        async with running_plugin(root, cluster, h100x8, settings):
            await asyncio.sleep(1.0)
            assert await _taints(cluster) == {}
            with faults.open("a") as stream:
                stream.write(', "code": 92}\n')
            _append(faults, "not json")
            await _until(cluster, {"gpu-4": "NoSchedule"})
    # Line numbers count the lines before this run too.
    assert [r.getMessage().split(": ")[0] for r in caplog.records
            if "line skipped" in r.getMessage()] == [f"{faults}:3"]


async def test_bad_lines_are_named_and_skipped(root: Path, cluster: MemoryCluster, h100x8: Path,
                                               caplog: pytest.LogCaptureFixture) -> None:
    faults = root / "faults.jsonl"
    faults.write_text("")
    settings = replace(plugin_settings(root), device_taints=True, fault_file=faults,
                       recovery_seconds=0)
    with caplog.at_level(logging.WARNING):
        async with running_plugin(root, cluster, h100x8, settings):
            _append(faults, "{not json", {"device": "gpu-99", "event": "xid", "code": 79},
                    {"device": "gpu-1", "event": "gpu-lost"})
            await _until(cluster, {"gpu-1": "NoExecute"})
    lines = [r.getMessage() for r in caplog.records if "line skipped" in r.getMessage()]
    assert lines[0].startswith(f"{faults}:1: not JSON: ")
    assert lines[1].startswith(f"{faults}:2: device 'gpu-99' is not a device of this node "
                               "(devices: gpu-0, gpu-1,")


@pytest.mark.parametrize(("line", "why"), [
    ('[1]', "expected an object"),
    ('{"device": "gpu-0", "event": "xid"}', "code: an xid event needs its XID"),
    ('{"device": "gpu-0", "event": "xid", "code": true}', "code: an xid event needs its XID"),
    ('{"device": "gpu-0", "event": "recovered", "code": 3}', "code: only an xid event has one"),
    ('{"device": "gpu-0", "event": "reboot"}', "event: 'reboot' is not one of xid, gpu-lost"),
    ('{"event": "gpu-lost"}', "device: a device name"),
    ('{"device": "gpu-0", "event": "gpu-lost", "when": 1}', "unknown field(s) when"),
])
def test_each_bad_line_says_what_is_wrong(mixed: Path, line: str, why: str) -> None:
    from dra_gateway.node_plugin.devices import DeviceOptions, device_table

    table = device_table(load_inventory(mixed), DeviceOptions())
    health = Health(driver="d", on_change=lambda: None)
    with pytest.raises(FaultLineError, match=why.replace("(", r"\(").replace(")", r"\)")):
        apply_line(line, health, table)
    assert health.problems == {}


def test_a_card_named_by_its_uuid_marks_every_device_on_it(mixed: Path) -> None:
    from dra_gateway.node_plugin.devices import DeviceOptions, device_table

    table = device_table(load_inventory(mixed), DeviceOptions())
    on_card = sorted(n for n, i in table.items() if i.card_uuid == MIG_CARD)
    assert len(on_card) > 1
    health = Health(driver="d", on_change=lambda: None)
    apply_line(json.dumps({"device": MIG_CARD, "event": "xid", "code": 48}), health, table)
    assert sorted(health.problems) == on_card
    one = Health(driver="d", on_change=lambda: None)
    apply_line(json.dumps({"device": on_card[0], "event": "xid", "code": 48}), one, table)
    assert sorted(one.problems) == [on_card[0]]


async def test_a_device_turning_unhealthy_and_healthy_again_is_told_on_its_node(
        root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    """Operators see it where they look (`kubectl describe node`, event exporters): what hit
    the device and what that does, then that it recovered and why."""
    faults = root / "faults.jsonl"
    settings = replace(plugin_settings(root), device_taints=True, fault_file=faults,
                       recovery_seconds=0.5)
    async with running_plugin(root, cluster, h100x8, settings):
        _append(faults, {"device": "gpu-3", "event": "xid", "code": 79},
                {"device": "gpu-5", "event": "xid", "code": 92})
        await _until(cluster, {"gpu-3": "NoExecute", "gpu-5": "NoSchedule"})
        await _until(cluster, {"gpu-3": "NoExecute"})
        _append(faults, {"device": "gpu-3", "event": "recovered"})
        await _until(cluster, {})
        for _ in range(100):
            events = (await cluster.list(EVENTS, namespace="default")).items
            if len(events) == 4:
                break
            await asyncio.sleep(0.05)
    told = sorted((e["type"], e["reason"], e["message"].split(";")[0].split(" (")[0])
                  for e in events)
    assert told == [
        ("Normal", "DeviceHealthy", "device gpu-3 is healthy again"),
        ("Normal", "DeviceHealthy", "device gpu-5 is healthy again"),
        ("Warning", "DeviceUnhealthy", "device gpu-3: xid-79"),
        ("Warning", "DeviceUnhealthy", "device gpu-5: xid-92")], told
    messages = {(e["reason"], e["involvedObject"]["name"], e["message"]) for e in events}
    assert any("tainted NoExecute: its pods are evicted" in m for _, _, m in messages)
    assert any("it came back and had no fault for 0.5s" in m for _, _, m in messages)
    assert any("(no fault for 0.5s)" in m for _, _, m in messages)
    assert {node for _, node, _ in messages} == {plugin_settings(root).node_name}
    for event in events:
        kubernetes_validate.validate(event, "1.34", strict=True)

"""The node plugin decides consumable capacity as the allocator does, unless a flag forces it.

The mixed inventory has one shared card (gpu-1): it carries `allowMultipleAllocations` exactly
when the plugin publishes with consumable capacity.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from testkit import eventually

from dra_gateway.cli import main
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube.cluster.features import detect_consumable_capacity
from dra_gateway.kube.cluster.port import Forbidden
from dra_gateway.kube.resources import NODES, RESOURCE_SLICES
from dra_gateway.node_plugin.cli import register
from dra_gateway.node_plugin.devices import DeviceOptions
from dra_gateway.node_plugin.inventory import load_inventory
from dra_gateway.node_plugin.plugin import NodePlugin, PluginSettings

from .claimdata import NODE


class GateOff(MemoryCluster):
    """An API server with DRAConsumableCapacity off: the gated fields do not survive."""

    async def create(self, rt: Any, obj: dict[str, Any], *, namespace: str | None = None,
                     dry_run: bool = False) -> dict[str, Any]:
        return await super().create(rt, _drop(rt, obj), namespace=namespace, dry_run=dry_run)

    async def update(self, rt: Any, obj: dict[str, Any], **kw: Any) -> dict[str, Any]:
        return await super().update(rt, _drop(rt, obj), **kw)


def _drop(rt: Any, obj: dict[str, Any]) -> dict[str, Any]:
    if rt is RESOURCE_SLICES:
        for device in obj["spec"].get("devices") or []:
            device.pop("allowMultipleAllocations", None)
            for capacity in (device.get("capacity") or {}).values():
                capacity.pop("requestPolicy", None)
    return obj


class Probes(MemoryCluster):
    """Counts dry-run creates; `refuse` makes them fail as a policy or webhook would."""

    refuse = False
    probes = 0

    async def create(self, rt: Any, obj: dict[str, Any], *, namespace: str | None = None,
                     dry_run: bool = False) -> dict[str, Any]:
        if dry_run:
            self.probes += 1
            if self.refuse:
                raise Forbidden("resourceslices.resource.k8s.io is forbidden: dry run refused "
                                "by policy")
        return await super().create(rt, obj, namespace=namespace, dry_run=dry_run)


class OwnNodeOnly(MemoryCluster):
    """The chart's node-plugin-slices admission policy: slices of this plugin's node only."""

    async def create(self, rt: Any, obj: dict[str, Any], *, namespace: str | None = None,
                     dry_run: bool = False) -> dict[str, Any]:
        if rt is RESOURCE_SLICES and obj["spec"].get("nodeName") != NODE:
            raise Forbidden(f"the dra-gateway node plugin on node {NODE} may not write "
                            "ResourceSlices of node '' (spec.nodeName)")
        return await super().create(rt, obj, namespace=namespace, dry_run=dry_run)


class GateOffProbes(GateOff, Probes):
    """Gate off, and the probe refused: only the plugin's own slices can tell."""


@contextlib.asynccontextmanager
async def running(cluster: MemoryCluster, root: Path, mixed: Path, *,
                  consumable_capacity: bool | None = None,
                  retry: float = 0.05) -> AsyncIterator[NodePlugin]:
    await cluster.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE}})
    settings = PluginSettings(node_name=NODE, plugins_dir=root / "plugins",
                              registry_dir=root / "registry", cdi_dir=root / "cdi",
                              state_dir=root / "state", devices=DeviceOptions(),
                              consumable_capacity=consumable_capacity,
                              detect_retry_seconds=retry)
    plugin = NodePlugin(settings, cluster, discover=lambda: load_inventory(mixed))
    started = asyncio.Event()
    task = asyncio.create_task(plugin.run(started=started))
    try:
        await asyncio.wait_for(started.wait(), 5)
        await asyncio.wait_for(plugin.publisher.synced.wait(), 5)
        yield plugin
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await cluster.close()


async def multi_allocatable(cluster: MemoryCluster) -> list[str]:
    return [d["name"] for s in (await cluster.list(RESOURCE_SLICES)).items
            for d in s["spec"]["devices"] if d.get("allowMultipleAllocations")]


@pytest.mark.parametrize(("cluster_type", "expected"), [(MemoryCluster, True), (GateOff, False)])
async def test_by_default_the_plugin_comes_to_the_allocators_answer(
        cluster_type: type[MemoryCluster], expected: bool, root: Path, mixed: Path) -> None:
    cluster = cluster_type()
    allocator_says, _how = await detect_consumable_capacity(cluster)
    assert allocator_says is expected
    async with running(cluster, root, mixed) as plugin:
        assert plugin.consumable_capacity is expected
        assert plugin.metrics.consumable_capacity._value.get() == int(expected)
        assert plugin.metrics.consumable_capacity_detected._value.get() == 1
        published = await multi_allocatable(cluster)
        assert published == (["gpu-1"] if expected else [])
        (slice_,) = (await cluster.list(RESOURCE_SLICES)).items
        shared = next(d for d in slice_["spec"]["devices"] if d["name"] == "gpu-1")
        assert ("requestPolicy" in shared["capacity"]["memory"]) is expected


async def test_the_verdict_is_logged_with_how_it_was_reached(
        root: Path, mixed: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dra_gateway.node_plugin.plugin")
    async with running(GateOff(), root, mixed):
        pass
    (record,) = [r for r in caplog.records if r.getMessage().startswith("consumable capacity")]
    assert record.getMessage().startswith("consumable capacity off:")
    assert record.__dict__["detectedBy"] == "dry-run probe slice"
    assert record.__dict__["consumableCapacity"] is False


async def test_behind_its_admission_policy_the_plugin_decides_by_its_probe(
        root: Path, mixed: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The probe is a slice of the plugin's own node, which the policy lets through; a probe
    # of all nodes would be refused and leave a fresh cluster undecided.
    caplog.set_level(logging.INFO, logger="dra_gateway.node_plugin.plugin")
    async with running(OwnNodeOnly(), root, mixed) as plugin:
        assert plugin.consumable_capacity is True
    (record,) = [r for r in caplog.records if r.getMessage().startswith("consumable capacity")]
    assert record.__dict__["detectedBy"] == "dry-run probe slice"


@pytest.mark.parametrize("forced", [True, False])
async def test_a_forced_mode_is_published_without_asking_the_api_server(
        forced: bool, root: Path, mixed: Path) -> None:
    cluster = Probes()
    async with running(cluster, root, mixed, consumable_capacity=forced) as plugin:
        assert cluster.probes == 0
        assert plugin.consumable_capacity is forced
        assert await multi_allocatable(cluster) == (["gpu-1"] if forced else [])


async def test_a_refused_probe_is_settled_by_a_published_slice_that_kept_the_field(
        root: Path, mixed: Path) -> None:
    cluster = Probes()
    cluster.refuse = True
    await cluster.create(RESOURCE_SLICES, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "other-node-slice"},
        "spec": {"driver": "gpu.dra-gateway.io", "nodeName": "other-node",
                 "pool": {"name": "other-node", "generation": 0, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0", "allowMultipleAllocations": True}]}})
    async with running(cluster, root, mixed) as plugin:
        assert plugin.consumable_capacity is True


async def test_when_the_api_server_cannot_tell_the_plugin_publishes_the_fields_then_learns(
        root: Path, mixed: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dra_gateway.node_plugin.plugin")
    cluster = GateOffProbes()
    cluster.refuse = True
    async with running(cluster, root, mixed) as plugin:
        assert "cannot tell whether the API server keeps consumable capacity" in caplog.text
        assert "publishing shared cards with allowMultipleAllocations (a server" in caplog.text

        async def settled() -> bool:
            return plugin.consumable_capacity is not None

        await eventually(settled)
        # The server dropped what the plugin sent: the same answer the allocator reaches
        # from the published slices.
        assert plugin.consumable_capacity is False
        assert plugin.metrics.consumable_capacity._value.get() == 0
        assert plugin.metrics.consumable_capacity_detected._value.get() == 1
        assert cluster.probes >= 2  # asked again before reading its own slices back
        assert "this node's published slices" in caplog.text


async def test_while_undecided_the_fallback_is_published_and_reported_as_not_detected(
        root: Path, mixed: Path) -> None:
    cluster = Probes()
    cluster.refuse = True
    async with running(cluster, root, mixed, retry=3600.0) as plugin:
        assert plugin.consumable_capacity is None
        assert await multi_allocatable(cluster) == ["gpu-1"]
        assert plugin.metrics.consumable_capacity._value.get() == 1
        assert plugin.metrics.consumable_capacity_detected._value.get() == 0


def _serve_args(*extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    register(sub)
    return parser.parse_args(["node-plugin", "serve", "--inventory", "x.yaml",
                              "--node-name", NODE, *extra])


def test_the_flag_defaults_to_detection_and_either_form_forces() -> None:
    assert _serve_args().consumable_capacity is None
    assert _serve_args("--consumable-capacity").consumable_capacity is True
    assert _serve_args("--no-consumable-capacity").consumable_capacity is False


def test_discover_without_a_flag_shows_the_fields_the_plugin_sends_before_it_knows(
        mixed: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["node-plugin", "discover", "--inventory", str(mixed), "--node-name", "m",
                 "-o", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in listed["items"][0]["spec"]["devices"]
            if d.get("allowMultipleAllocations")] == ["gpu-1"]
    assert main(["node-plugin", "discover", "--inventory", str(mixed), "--node-name", "m",
                 "-o", "json", "--no-consumable-capacity"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert not any(d.get("allowMultipleAllocations")
                   for d in listed["items"][0]["spec"]["devices"])

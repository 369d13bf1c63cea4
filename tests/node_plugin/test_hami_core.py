"""The node plugin says whether its node has HAMi-core (`hamiCore` on every full card), follows
the library being installed or removed, and never prepares a share HAMi-core should enforce
without it (the runtime would fail every start of the container on the missing mount)."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.devkit.simnode import install_hami_core
from dra_gateway.kube import names
from dra_gateway.kube.resources import RESOURCE_SLICES
from dra_gateway.node_plugin import cdi
from dra_gateway.node_plugin.prepare import ClaimRef

from .claimdata import claim
from .conftest import allocated, plugin_settings, running_plugin

GiB = 1 << 30


async def _published(cluster: MemoryCluster) -> set[bool]:
    (slice_,) = (await cluster.list(RESOURCE_SLICES)).items
    return {d["attributes"][names.ATTR_HAMI_CORE]["bool"] for d in slice_["spec"]["devices"]}


async def _until_published(cluster: MemoryCluster, value: bool) -> None:
    for _ in range(200):
        items = (await cluster.list(RESOURCE_SLICES)).items
        if items and await _published(cluster) == {value}:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"cards never published hamiCore={value}: {await _published(cluster)}")


async def test_cards_say_whether_the_node_has_hami_core_and_follow_its_install(
        root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    library = root / "vgpu" / "libvgpu.so"
    settings = replace(plugin_settings(root), enforcement=cdi.EnforcementSettings(
        hami_library=str(library)), hami_check_seconds=0.05)
    async with running_plugin(root, cluster, h100x8, settings):
        await _until_published(cluster, False)
        install_hami_core(library.parent)
        await _until_published(cluster, True)
        library.unlink()
        await _until_published(cluster, False)


async def test_a_hami_core_share_fails_to_prepare_without_the_library_and_succeeds_with_it(
        root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    library = root / "vgpu" / "libvgpu.so"
    settings = replace(plugin_settings(root), enforcement=cdi.EnforcementSettings(
        hami_library=str(library)))
    share = await allocated(cluster, claim(devices=["gpu-0"], params={
        "memory": 8 * GiB, "cores": 30, "enforcement": "hami-core"}))
    ref = ClaimRef(uid=share["metadata"]["uid"], namespace="ml", name=share["metadata"]["name"])
    async with running_plugin(root, cluster, h100x8, settings) as plugin:
        (result,) = (await plugin.preparer.prepare([ref])).values()
        assert f"has no HAMi-core library at {library}" in result.error
        assert not list((root / "cdi").glob("*.json"))  # nothing handed to the runtime
        install_hami_core(library.parent)
        (result,) = (await plugin.preparer.prepare([ref])).values()
        assert result.error == ""
        (spec,) = (root / "cdi").glob("*.json")
        assert str(library) in spec.read_text()

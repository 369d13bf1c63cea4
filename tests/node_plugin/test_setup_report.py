"""The node plugin says on its Node what it found there (condition DraGatewayNodeSetup, read by
`dra-gateway preflight`): the CDI folder writable or not, HAMi-core's library present or not."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube.node_setup import CONDITION_TYPE, NodeSetup, node_setup
from dra_gateway.kube.resources import NODES
from dra_gateway.node_plugin import cdi

from .claimdata import NODE
from .conftest import plugin_settings, running_plugin


async def _reported(cluster: MemoryCluster, wanted: NodeSetup) -> dict[str, str]:
    for _ in range(250):
        node = await cluster.get(NODES, NODE)
        if node_setup(node) == wanted:
            return next(c for c in node["status"]["conditions"] if c["type"] == CONDITION_TYPE)
        await asyncio.sleep(0.02)
    raise AssertionError(f"the Node never said {wanted.message()!r}: {node_setup(node)}")


async def test_the_plugin_reports_a_writable_cdi_folder_and_hami_core_on_its_node(
        root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    settings = plugin_settings(root)
    async with running_plugin(root, cluster, h100x8, settings):
        condition = await _reported(cluster, NodeSetup(
            cdi_dir=str(root / "cdi"), cdi_writable=True,
            hami_library=settings.enforcement.hami_library, hami_core="present"))
    assert (condition["status"], condition["reason"]) == ("True", "SetupComplete")
    assert not list((root / "cdi").iterdir())  # the probe file is gone


async def test_the_plugin_reports_what_is_missing_and_follows_hami_cores_install(
        root: Path, cluster: MemoryCluster, h100x8: Path) -> None:
    (root / "not-a-folder").write_text("")
    library = root / "vgpu" / "libvgpu.so"
    settings = replace(plugin_settings(root), cdi_dir=root / "not-a-folder" / "cdi",
                       enforcement=cdi.EnforcementSettings(hami_library=str(library)),
                       hami_check_seconds=0.05)
    missing = NodeSetup(cdi_dir=str(settings.cdi_dir), cdi_writable=False,
                        cdi_problem="Not a directory", hami_library=str(library),
                        hami_core="missing")
    async with running_plugin(root, cluster, h100x8, settings):
        condition = await _reported(cluster, missing)
        assert (condition["status"], condition["reason"]) == ("False", "SetupIncomplete")
        library.parent.mkdir()
        library.write_bytes(b"\x7fELF")
        await _reported(cluster, replace(missing, hami_core="present"))

"""The node plugin's Events: about its own Node, in namespace default, nowhere else."""

from __future__ import annotations

import pytest

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube.resources import EVENTS
from dra_gateway.node_plugin.events import node_event, record

from .claimdata import NODE


async def test_events_are_recorded_about_the_plugins_own_node_in_default_only(
        cluster: MemoryCluster) -> None:
    event = node_event(NODE, type_="Warning", reason="DeviceUnhealthy", message="m",
                       instance=NODE)
    await record(cluster, event, node=NODE)
    elsewhere = {**event, "metadata": {**event["metadata"], "namespace": "kube-system"}}
    other_node = node_event("node-b", type_="Warning", reason="DeviceUnhealthy", message="m",
                            instance=NODE)
    for wrong in (elsewhere, other_node):
        with pytest.raises(ValueError, match=f"about its Node {NODE} in namespace default"):
            await record(cluster, wrong, node=NODE)
    assert [e["metadata"]["namespace"] for e in
            (await cluster.list(EVENTS)).items] == ["default"]

"""`dra-gateway devices`: list what the node plugins took out of service; clear, keep and unkeep
through the Node's annotations, which the node plugin reads (kube/device_health.py)."""

from __future__ import annotations

import asyncio
import importlib
import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dra_gateway.cli import main
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.device_health import (
    CLEAR_ANNOTATION,
    KEEP_ANNOTATION,
    DeviceMark,
    admin_orders,
    marks_message,
)
from dra_gateway.kube.resources import NODES

MARKS = [DeviceMark("gpu-2", "xid-79", "fatal", "withheld", "2026-12-06T10:00:00Z"),
         DeviceMark("gpu-3", "xid-94", "degraded", "tainted NoSchedule", "2026-12-06T10:01:00Z",
                    healthy_at="2026-12-06T10:11:00Z")]


# The cluster's clock, ten minutes behind the machine the command runs on.
BEHIND = timedelta(minutes=10)


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> MemoryCluster:
    memory = MemoryCluster(clock=lambda: datetime.now(UTC) - BEHIND)

    async def seed() -> None:
        await memory.create(NODES, {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": "gpu-a", "annotations": {KEEP_ANNOTATION: "gpu-7"}}})
        await memory.patch(NODES, "gpu-a", {"status": {"conditions": [{
            "type": names.NODE_HEALTH_CONDITION, "status": "True",
            "message": marks_message(names.DRIVER, MARKS)}]}}, subresource="status",
            patch_type="strategic")
        await memory.create(NODES, {"apiVersion": "v1", "kind": "Node",
                                    "metadata": {"name": "gpu-b"}})

    asyncio.run(seed())

    async def connect(*args: Any, **kwargs: Any) -> MemoryCluster:
        return memory

    monkeypatch.setattr(importlib.import_module("dra_gateway.kube.cluster.connect"), "connect",
                        connect)
    return memory


def _annotations(cluster: MemoryCluster, node: str) -> dict[str, str]:
    return dict(asyncio.run(cluster.get(NODES, node))["metadata"].get("annotations") or {})


def test_list_shows_each_device_its_fault_and_when_it_is_back(
        cluster: MemoryCluster, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["NODE", "DEVICE", "FAULT", "CLASS", "ACTION", "SINCE", "HEALTHY",
                              "AGAIN"]
    assert out[1].split() == ["gpu-a", "gpu-2", "xid-79", "fatal", "withheld",
                              "2026-12-06T10:00:00Z", "when", "the", "card", "comes", "back"]
    assert out[2].split() == ["gpu-a", "gpu-3", "xid-94", "degraded", "tainted", "NoSchedule",
                              "2026-12-06T10:01:00Z", "2026-12-06T10:11:00Z"]
    assert main(["devices", "list", "gpu-b", "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out) == []


def test_clear_writes_a_time_the_plugin_forgets_faults_up_to(
        cluster: MemoryCluster, capsys: pytest.CaptureFixture[str]) -> None:
    before = (datetime.now(UTC) - BEHIND).replace(microsecond=0)
    assert main(["devices", "clear", "gpu-a", "gpu-2"]) == 0
    assert "gpu-2" in capsys.readouterr().out
    orders = admin_orders(_annotations(cluster, "gpu-a"))
    until = orders.cleared_until("gpu-2")
    assert until is not None
    assert until >= before
    assert orders.cleared_until("gpu-3") is None
    assert main(["devices", "clear", "gpu-a", "--all"]) == 0
    assert admin_orders(_annotations(cluster, "gpu-a")).cleared_until("gpu-3") is not None
    # Neither devices nor --all, or both: refused before anything is written.
    assert main(["devices", "clear", "gpu-b"]) == 2
    assert "--all" in capsys.readouterr().err
    assert CLEAR_ANNOTATION not in _annotations(cluster, "gpu-b")


def test_clear_writes_the_clusters_time_not_the_operators(
        cluster: MemoryCluster, capsys: pytest.CaptureFixture[str]) -> None:
    """The node plugin compares the clear with its own clock's fault times: a laptop ten
    minutes ahead of the cluster must not clear the faults of the next ten minutes. The time
    is the API server's, rounded up within its second, so a fault of the same second before
    the clear is cleared."""
    before = datetime.now(UTC) - BEHIND
    assert main(["devices", "clear", "gpu-a", "gpu-2"]) == 0
    after = datetime.now(UTC) - BEHIND
    until = admin_orders(_annotations(cluster, "gpu-a")).cleared_until("gpu-2")
    assert until is not None
    assert before <= until <= after + timedelta(seconds=1)
    assert until.strftime("%Y-%m-%dT%H:%M:%S.%fZ") in capsys.readouterr().out


def test_keep_and_unkeep_edit_the_list_and_an_unknown_node_is_named(
        cluster: MemoryCluster, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["devices", "keep", "gpu-a", "gpu-2", "gpu-3"]) == 0
    assert _annotations(cluster, "gpu-a")[KEEP_ANNOTATION] == "gpu-2,gpu-3,gpu-7"
    assert main(["devices", "unkeep", "gpu-a", "gpu-2", "gpu-3", "gpu-7"]) == 0
    assert KEEP_ANNOTATION not in _annotations(cluster, "gpu-a")  # an empty list goes
    assert main(["devices", "keep", "gpu-z", "gpu-0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ")
    assert "gpu-z" in err

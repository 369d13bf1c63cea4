"""`dra-gateway defrag`: the times it reads holds by and writes into them are the cluster's,
which the allocator compares with its own clock, never the operator's machine's."""

from __future__ import annotations

import importlib
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dra_gateway.cli import main
from dra_gateway.devkit.sim.memory import MemoryCluster

CLUSTER_NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)  # far from any operator's clock


@pytest.mark.parametrize("command", ["plan", "apply"])
def test_defrag_reads_and_writes_the_clusters_time(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        command: str) -> None:
    memory = MemoryCluster(clock=lambda: CLUSTER_NOW)

    async def connect(*args: Any, **kwargs: Any) -> MemoryCluster:
        return memory

    monkeypatch.setattr(importlib.import_module("dra_gateway.kube.cluster.connect"), "connect",
                        connect)
    store = importlib.import_module("dra_gateway.allocator.eviction.store")
    moves = importlib.import_module("dra_gateway.allocator.eviction.moves")
    seen: dict[str, datetime] = {}
    read_snapshot = store.read_snapshot

    async def reading(*args: Any, now: datetime, **kwargs: Any) -> Any:
        seen["snapshot"] = now
        return await read_snapshot(*args, now=now, **kwargs)

    class Applier(moves.Applier):  # type: ignore[misc,name-defined]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            seen["records"] = self.clock()

    monkeypatch.setattr(store, "read_snapshot", reading)
    monkeypatch.setattr(moves, "Applier", Applier)
    assert main(["defrag", command]) == 0
    capsys.readouterr()
    expected = {"snapshot"} | ({"records"} if command == "apply" else set())
    assert set(seen) == expected
    for what, moment in seen.items():
        assert abs(moment - CLUSTER_NOW) <= timedelta(seconds=1), what

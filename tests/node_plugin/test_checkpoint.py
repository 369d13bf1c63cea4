from __future__ import annotations

import json
from pathlib import Path

from dra_gateway.node_plugin.checkpoint import Checkpoint, ClaimEntry


def test_entries_survive_a_reload(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    checkpoint = Checkpoint(path)
    entry = ClaimEntry(uid="u1", namespace="ml", name="c", state="PrepareCompleted",
                       devices=[{"device_name": "gpu-0"}])
    checkpoint.commit("u1", entry)
    assert Checkpoint(path).get("u1") == entry
    checkpoint.commit("u1", None)
    assert Checkpoint(path).entries() == []
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.json"]


def test_an_unreadable_checkpoint_is_set_aside_not_fatal(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.json"
    path.write_text(json.dumps({"version": 1, "claims": {"u1": {"state": "Exploded"}}}))
    assert Checkpoint(path).entries() == []
    assert not path.exists()
    assert [p.name.split("-")[0] for p in tmp_path.iterdir()] == ["checkpoint.json.corrupt"]

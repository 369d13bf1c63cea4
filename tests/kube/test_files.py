from __future__ import annotations

import stat
from pathlib import Path

import pytest
import yaml

from dra_gateway.devkit.sim.server import write_kubeconfig
from dra_gateway.kube.files import atomic_write


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_an_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path) -> None:
    target = tmp_path / "spec.json"
    target.write_bytes(b"old")
    atomic_write(target, b"new")
    assert target.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["spec.json"]
    assert _mode(target) == 0o644


def test_a_failed_atomic_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "tls.key"
    target.write_bytes(b"old")
    with pytest.raises(TypeError):
        atomic_write(target, "not bytes")  # type: ignore[arg-type]
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["tls.key"]


def test_a_kubeconfig_over_a_world_readable_file_becomes_private(tmp_path: Path) -> None:
    # The token must not stay readable by others because an earlier file was.
    path = tmp_path / "kubeconfig"
    path.write_text("stale: true\n" * 1000)
    path.chmod(0o644)
    write_kubeconfig(path, "http://127.0.0.1:1", token="secret")
    assert _mode(path) == 0o600
    document = yaml.safe_load(path.read_text())
    assert document["users"][0]["user"]["token"] == "secret"

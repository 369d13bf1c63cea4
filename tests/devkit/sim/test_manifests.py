from __future__ import annotations

from pathlib import Path

import pytest

from dra_gateway.devkit.sim.manifests import ManifestError, read_manifests


def test_a_manifest_that_is_not_yaml_is_one_line_naming_file_and_place(tmp_path: Path) -> None:
    seed = tmp_path / "seed.yaml"
    seed.write_text("apiVersion: v1\nkind: [\n")
    with pytest.raises(ManifestError) as raised:
        read_manifests([seed])
    assert str(raised.value) == (
        f"manifest {seed} is not valid YAML or JSON at line 3, column 1: expected the node "
        "content, but found '<stream end>'")


def test_a_binary_manifest_is_refused_naming_the_file(tmp_path: Path) -> None:
    seed = tmp_path / "seed.bin"
    seed.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ManifestError) as raised:
        read_manifests([seed])
    assert str(raised.value) == (
        f"manifest {seed} is not a text file (not UTF-8): give YAML or JSON manifests")


async def test_a_seed_saved_from_a_cluster_loads_despite_its_resource_version() -> None:
    from dra_gateway.devkit.sim.memory import MemoryCluster

    cluster = MemoryCluster()
    (created,) = await cluster.load([{
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "saved", "resourceVersion": "123456"}, "data": {"a": "b"}}])
    assert created["metadata"]["namespace"] == "default"
    assert created["metadata"]["resourceVersion"] != "123456"
    await cluster.close()

"""`connect` hands out the right backend and explains a bad configuration."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_gateway.kube.cluster.connect import ClusterConfigError, connect
from dra_gateway.kube.cluster.memory import MemoryCluster


async def test_memory_gives_a_fresh_in_memory_cluster() -> None:
    first, second = await connect("memory"), await connect("memory")
    assert isinstance(first, MemoryCluster)
    assert first is not second


async def test_a_missing_kubeconfig_names_the_file_and_the_fix(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(ClusterConfigError) as caught:
        await connect("kube", str(missing))
    assert str(caught.value) == (
        f"kubeconfig {missing} does not exist: pass the file written by "
        "`dra-gateway cluster serve --kubeconfig FILE` or a real cluster's kubeconfig")


async def test_an_unusable_kubeconfig_is_a_config_error(tmp_path: Path) -> None:
    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nkind: Config\ncurrent-context: nowhere\n")
    with pytest.raises(ClusterConfigError, match=f"cannot load the kubeconfig {broken}"):
        await connect("kube", str(broken))

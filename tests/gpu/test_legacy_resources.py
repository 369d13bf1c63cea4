"""The one list of legacy resource names knows every name of the reference, of the right kind.

`REFERENCE` is the reference's table of resource names ("Legacy and vendor GPU request
protocols"), copied name by name, with the older names stacks still accept. The table itself is
kept beside this test (data/vendor-resource-names.md) and read in every run, so that a name
added there and not to the list fails here.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from dra_gateway.gpu.legacy_resources import (
    LEGACY_RESOURCES,
    is_legacy_gpu_resource,
    legacy_resource,
)

# Every row of the reference's "Resource names" table; `nvidia.com/mig-<profile>` by two
# profiles. "gpu": a legacy stack hands out GPUs or shares of them under it.
REFERENCE = {
    "nvidia.com/gpu": "gpu",
    "nvidia.com/gpu.shared": "gpu",
    "nvidia.com/mig-1g.5gb": "gpu",
    "nvidia.com/mig-3g.20gb": "gpu",
    "nvidia.com/gpumem": "gpu",
    "nvidia.com/gpumem-percentage": "gpu",
    "nvidia.com/gpucores": "gpu",
    "nvidia.com/priority": "hint",
    "koordinator.sh/gpu-core": "gpu",
    "koordinator.sh/gpu-memory": "gpu",
    "koordinator.sh/gpu-memory-ratio": "gpu",
    "koordinator.sh/gpu.shared": "gpu",
    "koordinator.sh/gpu": "gpu",
    "aliyun.com/gpu-mem": "gpu",
    "aliyun.com/gpu-count": "gpu",
    "tke.cloud.tencent.com/qgpu-core": "gpu",
    "tke.cloud.tencent.com/qgpu-memory": "gpu",
    "volcano.sh/vgpu-number": "gpu",
    "volcano.sh/vgpu-memory": "gpu",
    "volcano.sh/vgpu-cores": "gpu",
    "aliyun.com/gpu-core.percentage": "gpu",
    "amd.com/gpu": "gpu",
    "gpu.intel.com/i915": "other",
    "gpu.intel.com/xe": "other",
    "k8s.amazonaws.com/vgpu": "gpu",
    "aws.amazon.com/neuron": "other",
    "aws.amazon.com/neuroncore": "other",
    "habana.ai/gaudi": "other",
    "google.com/tpu": "other",
}
# Older names the stacks still accept: Koordinator's kubernetes.io names, Volcano's gpu-*.
OLDER = {
    "kubernetes.io/gpu-core": "gpu",
    "kubernetes.io/gpu-memory": "gpu",
    "kubernetes.io/gpu-memory-ratio": "gpu",
    "kubernetes.io/gpu": "gpu",
    "volcano.sh/gpu-number": "gpu",
    "volcano.sh/gpu-memory": "gpu",
}

_REFERENCE_FILE = Path(__file__).resolve().parent / "data" / "vendor-resource-names.md"


@pytest.mark.parametrize(("name", "kind"), sorted({**REFERENCE, **OLDER}.items()))
def test_every_name_of_the_reference_is_listed_with_its_kind(name: str, kind: str) -> None:
    entry = legacy_resource(name)
    assert entry is not None, f"{name} is missing from gpu/legacy_resources.py"
    assert entry.kind == kind
    assert is_legacy_gpu_resource(name) is (kind == "gpu")


def test_the_list_holds_nothing_the_reference_does_not_name() -> None:
    listed = {r.name for r in LEGACY_RESOURCES}
    named = {name for name in {**REFERENCE, **OLDER} if not name.startswith("nvidia.com/mig-")}
    assert listed == named | {"nvidia.com/mig-*"}
    assert len(listed) == len(LEGACY_RESOURCES), "a name is listed twice"


def test_the_reference_table_as_it_is_now() -> None:
    text = _REFERENCE_FILE.read_text()
    table = text.split("## Resource names", 1)[1].split("\n## ", 1)[0]
    names = set()
    for row in table.splitlines():
        if not row.startswith("| `"):
            continue
        first = row.split("|")[1]
        names.update(re.findall(r"`([^`]+)`", first))
    names = {n.replace("<profile>", "1g.5gb") for n in names if "/" in n}
    assert names, "the reference's table of resource names was not found"
    assert sorted(n for n in names if legacy_resource(n) is None) == []
    assert names <= set(REFERENCE) | {"nvidia.com/mig-1g.5gb"}


@pytest.mark.parametrize("name", [
    "nvidia.com/mig-7g.80gb", "volcano.sh/vgpu-new", "koordinator.sh/gpu-new",
    "kubernetes.io/gpu-new", "volcano.sh/gpu-cores", "aliyun.com/gpu-new",
    "tke.cloud.tencent.com/qgpu-new"])
def test_an_unlisted_member_of_a_gpu_family_is_a_gpu_name(name: str) -> None:
    assert is_legacy_gpu_resource(name)


@pytest.mark.parametrize("name", ["cpu", "memory", "example.com/nic", "nvidia.com/priority",
                                  "gpu.intel.com/i915", "google.com/tpu", "rdma/hca"])
def test_names_that_hand_out_no_gpu_are_not_gpu_names(name: str) -> None:
    assert not is_legacy_gpu_resource(name)

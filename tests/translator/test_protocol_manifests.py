"""The protocols of issue 14 on manifests written as each project's own examples write them.

gpushare's fractional GiB and its unit warnings, HAMi's dynamic MIG, node policy and card
selection annotations, Koordinator's kubernetes.io names, Volcano's earlier GPU share, HAMi's
AMD names and every vendor rule that ships disabled. Each expectation is exact, so a rule whose
unit, trigger or selector changes fails here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from testkit import EXAMPLES

from dra_gateway.kube import names
from dra_gateway.kube.cel import compile_selector
from dra_gateway.translator.rules import RuleSet, load_rules
from dra_gateway.translator.translate import Untranslated, translate

from .translator_support import (
    checked,
    gpu_device,
    mig_device,
    only_request,
    parameters_of,
    run_cli,
)

MIB = 2**20
GIB = 2**30
BASE = {"apiVersion": "dra-gateway.io/v1alpha1", "kind": "GpuShareConfig"}


def manifest(text: str) -> dict[str, Any]:
    pod: dict[str, Any] = yaml.safe_load(text)
    return pod


def selectors(plan: Any) -> list[str]:
    """The request's selectors but the one every HAMi-core share gets (its library's)."""
    return [s["cel"]["expression"] for s in only_request(plan)["exactly"].get("selectors", [])
            if "hamiCore" not in s["cel"]["expression"]]


def gpushare_pod(gpu_mem: Any) -> dict[str, Any]:
    # As gpushare-scheduler-extender's samples write it: a Pod asking for gpu-mem alone.
    return manifest(f"""
apiVersion: v1
kind: Pod
metadata:
  name: binpack-1
  namespace: research
spec:
  containers:
    - name: binpack-1
      image: cheyang/gpu-player:v2
      resources:
        limits:
          aliyun.com/gpu-mem: {gpu_mem}
""")


def mib_rules(tmp_path: Path) -> RuleSet:
    (tmp_path / "mib.yaml").write_text(
        "apiVersion: dra-gateway.io/v1alpha1\nkind: TranslationRules\n"
        "overrides:\n  - rule: gpushare\n    units: {aliyun.com/gpu-mem: Mi}\n")
    return load_rules(tmp_path / "mib.yaml")


# ---- Alibaba gpushare ---------------------------------------------------------------------------


def test_gpushare_five_and_a_half_gib_is_5632_mib_of_one_card(builtin_rules: RuleSet) -> None:
    original = gpushare_pod("5.5")
    plan = translate(original, builtin_rules)
    assert (plan.refusal, plan.warnings) == (None, [])
    patched = checked(plan, original)
    assert only_request(plan)["exactly"] == {
        "deviceClassName": names.GPU_CLASS, "allocationMode": "ExactCount", "count": 1,
        "capacity": {"requests": {"memory": "5632Mi", "cores": "1"}}}
    assert parameters_of(plan, "binpack-1") == {**BASE, "memory": 5632 * MIB,
                                                "enforcement": "none"}
    assert "limits" not in patched["spec"]["containers"][0]["resources"]


def test_gpushare_mib_read_as_gib_is_translated_with_a_warning(builtin_rules: RuleSet) -> None:
    # 8138 is a card's memory in MiB; read in the default GiB it is nearly 8 TiB.
    plan = translate(gpushare_pod(8138), builtin_rules)
    assert plan.refusal is None
    assert plan.warnings == [
        'container "binpack-1": aliyun.com/gpu-mem asks for more than 1 TiB per card: if this '
        "cluster counts it in MiB, set units: {aliyun.com/gpu-mem: Mi} with an override of rule "
        "gpushare (rule gpushare)"]


def test_gpushare_gib_read_as_mib_is_translated_with_a_warning(tmp_path: Path) -> None:
    plan = translate(gpushare_pod(8), mib_rules(tmp_path))
    assert plan.refusal is None
    assert plan.warnings == [
        'container "binpack-1": aliyun.com/gpu-mem asks for less than 256 MiB: if this cluster '
        "counts it in GiB, remove the override that sets units: {aliyun.com/gpu-mem: Mi} "
        "(rule gpushare)"]
    assert only_request(plan)["exactly"]["capacity"] == {"requests": {"memory": "8Mi",
                                                                      "cores": "1"}}


def test_gpushare_in_mib_takes_the_value_as_mib_without_a_warning(tmp_path: Path) -> None:
    plan = translate(gpushare_pod(8138), mib_rules(tmp_path))
    assert (plan.refusal, plan.warnings) == (None, [])
    assert only_request(plan)["exactly"]["capacity"] == {"requests": {"memory": "8138Mi",
                                                                      "cores": "1"}}
    assert parameters_of(plan, "binpack-1") == {**BASE, "memory": 8138 * MIB,
                                                "enforcement": "none"}


# ---- HAMi -------------------------------------------------------------------------------------


def hami_pod(annotations: dict[str, str], limits: dict[str, Any]) -> dict[str, Any]:
    # HAMi's examples/nvidia: a Pod named gpu-pod with a ubuntu container.
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "gpu-pod", "namespace": "default", "annotations": annotations},
            "spec": {"containers": [{"name": "ubuntu-container", "image": "ubuntu:18.04",
                                     "command": ["bash", "-c", "sleep 86400"],
                                     "resources": {"limits": limits}}]}}


def test_hami_dynamic_mig_offers_the_smallest_fitting_profiles_first_on_listed_cards(
        builtin_rules: RuleSet) -> None:
    original = hami_pod({"nvidia.com/vgpu-mode": "mig",
                         "nvidia.com/use-gpuuuid": "GPU-a, GPU-b",
                         "nvidia.com/nouse-gpuuuid": "GPU-c"},
                        {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 8000})
    plan = translate(original, builtin_rules)
    assert (plan.refusal, plan.rules_applied) == (None, ["hami-mig"])
    checked(plan, original)
    request = only_request(plan)
    assert "exactly" not in request
    subs = request["firstAvailable"]
    # 8000 MiB: no 1g.5gb; the 7 smallest that hold it, smallest first, then any instance.
    assert [s["name"] for s in subs] == ["1g-10gb", "2g-10gb", "1g-18gb", "1g-20gb", "2g-20gb",
                                         "3g-20gb", "4g-20gb", "any"]
    assert {(s["deviceClassName"], s["count"]) for s in subs} == {(names.MIG_CLASS, 2)}
    capacity = 'device.capacity["gpu.dra-gateway.io"]'
    attrs = 'device.attributes["gpu.dra-gateway.io"]'
    memory = f'"memory" in {capacity} && {capacity}.memory.compareTo(quantity("8388608000")) >= 0'
    allowed = f'"parentUUID" in {attrs} && {attrs}.parentUUID in ["GPU-a", "GPU-b"]'
    denied = f'!("parentUUID" in {attrs}) || !({attrs}.parentUUID == "GPU-c")'
    assert [s["cel"]["expression"] for s in subs[0]["selectors"]] == [
        f'"profile" in {attrs} && {attrs}.profile == "1g.10gb"', memory, allowed, denied]
    assert [s["cel"]["expression"] for s in subs[-1]["selectors"]] == [memory, allowed, denied]
    at_least, allowed_sel, denied_sel = (compile_selector(s) for s in (memory, allowed, denied))
    assert at_least.matches(mig_device(memory="10Gi", parent="GPU-a"))
    assert not at_least.matches(mig_device(memory="5Gi", parent="GPU-a"))
    assert allowed_sel.matches(mig_device(memory="10Gi", parent="GPU-b"))
    assert not allowed_sel.matches(mig_device(memory="10Gi", parent="GPU-c"))
    assert not denied_sel.matches(mig_device(memory="10Gi", parent="GPU-c"))


def test_hami_mig_mode_compute_asks_for_enough_slices(builtin_rules: RuleSet) -> None:
    """gpucores 50 of 7 slices is 3.5: at least 4g; the last alternative reads the compute the
    node plugin publishes (cores, percent of the card)."""
    original = hami_pod({"nvidia.com/vgpu-mode": "mig"}, {"nvidia.com/gpucores": 50})
    plan = translate(original, builtin_rules)
    assert plan.rules_applied == ["hami-mig"]
    checked(plan, original)
    subs = only_request(plan)["firstAvailable"]
    assert [s["name"] for s in subs] == ["4g-20gb", "4g-40gb", "7g-40gb", "4g-71gb", "7g-80gb",
                                         "7g-141gb", "any"]
    capacity = 'device.capacity["gpu.dra-gateway.io"]'
    assert [s["cel"]["expression"] for s in subs[-1]["selectors"]] == [
        f'"cores" in {capacity} && {capacity}.cores.compareTo(quantity("50")) >= 0']


def test_hami_node_policy_is_the_policy_when_no_gpu_policy_is_given(
        builtin_rules: RuleSet) -> None:
    plan = translate(hami_pod({"hami.io/node-scheduler-policy": "spread"},
                              {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}), builtin_rules)
    assert plan.warnings == []
    assert parameters_of(plan, "ubuntu-container") == {
        **BASE, "memory": 3000 * MIB, "enforcement": "hami-core", "policy": "spread"}


def test_hami_gpu_policy_wins_over_a_different_node_policy_with_a_warning(
        builtin_rules: RuleSet) -> None:
    plan = translate(hami_pod({"hami.io/gpu-scheduler-policy": "binpack",
                               "hami.io/node-scheduler-policy": "spread"},
                              {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}), builtin_rules)
    assert plan.warnings == [
        'container "ubuntu-container": hami.io/gpu-scheduler-policy and '
        "hami.io/node-scheduler-policy differ; the gateway has one policy for node and card, "
        "and the GPU one applies (rule hami)"]
    assert parameters_of(plan, "ubuntu-container")["policy"] == "binpack"  # type: ignore[index]


def test_equal_hami_policies_give_no_warning(builtin_rules: RuleSet) -> None:
    plan = translate(hami_pod({"hami.io/gpu-scheduler-policy": "binpack",
                               "hami.io/node-scheduler-policy": "binpack"},
                              {"nvidia.com/gpu": 1}), builtin_rules)
    assert plan.warnings == []


@pytest.mark.parametrize(("annotations", "matching", "other"), [
    ({"nvidia.com/use-gputype": "A100,V100"},
     {"productName": "NVIDIA A100-SXM4-40GB"}, {"productName": "Tesla T4"}),
    ({"nvidia.com/use-gputype": "a100"},
     {"productName": "NVIDIA A100-PCIE-80GB"}, {"productName": "NVIDIA H100 80GB HBM3"}),
    ({"nvidia.com/nouse-gputype": "1080,2080"},
     {"productName": "NVIDIA A10"}, {"productName": "NVIDIA GeForce RTX 2080 Ti"}),
    ({"nvidia.com/use-gpuuuid": "GPU-123456"}, {"uuid": "GPU-123456"}, {"uuid": "GPU-654321"}),
    ({"nvidia.com/nouse-gpuuuid": "GPU-123456,GPU-7"},
     {"uuid": "GPU-654321"}, {"uuid": "GPU-7"}),
], ids=["use-gputype", "use-gputype ignores case", "nouse-gputype", "use-gpuuuid",
        "nouse-gpuuuid"])
def test_hami_card_annotations_select_cards_as_hami_matches_them(
        builtin_rules: RuleSet, annotations: dict[str, str], matching: dict[str, str],
        other: dict[str, str]) -> None:
    plan = translate(hami_pod(annotations, {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000}),
                     builtin_rules)
    (selector,) = selectors(plan)
    compiled = compile_selector(selector)
    assert compiled.matches(gpu_device(**matching))
    assert not compiled.matches(gpu_device(**other))


# ---- Koordinator and Volcano ------------------------------------------------------------------


def koord_pod(limits: dict[str, Any]) -> dict[str, Any]:
    # Koordinator's fine-grained device scheduling proposal: a demo-pod with one main container.
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "demo-pod", "namespace": "default"},
            "spec": {"schedulerName": "koord-scheduler",
                     "containers": [{"name": "main", "image": "nginx",
                                     "resources": {"limits": limits, "requests": limits}}]}}


@pytest.mark.parametrize(("limits", "count", "capacity", "parameters"), [
    ({"kubernetes.io/gpu-core": 100, "kubernetes.io/gpu-memory": "8Gi"}, 1,
     {"memory": "8Gi", "cores": "100"}, {"memory": 8 * GIB, "cores": 100}),
    ({"kubernetes.io/gpu-core": 50, "kubernetes.io/gpu-memory-ratio": 50}, 1,
     {"cores": "50"}, {"memoryPercent": 50, "cores": 50}),
    ({"kubernetes.io/gpu-core": 30, "kubernetes.io/gpu-memory": "10Gi"}, 1,
     {"memory": "10Gi", "cores": "30"}, {"memory": 10 * GIB, "cores": 30}),
    ({"kubernetes.io/gpu": 50}, 1, {"cores": "50"}, {"memoryPercent": 50, "cores": 50}),
    ({"kubernetes.io/gpu": 200}, 2, None, {}),
    ({"kubernetes.io/gpu-core": 200, "kubernetes.io/gpu-memory-ratio": 200}, 2, None, {}),
], ids=["a whole card by bytes", "half a card", "cores and bytes", "kubernetes.io/gpu half",
        "kubernetes.io/gpu two cards", "two whole cards by ratio"])
def test_koordinator_legacy_names_give_counts_memory_and_cores(
        builtin_rules: RuleSet, limits: dict[str, Any], count: int,
        capacity: dict[str, str] | None, parameters: dict[str, Any]) -> None:
    original = koord_pod(limits)
    plan = translate(original, builtin_rules)
    assert (plan.refusal, plan.rules_applied) == (None, ["koordinator-legacy"])
    patched = checked(plan, original)
    exactly = only_request(plan)["exactly"]
    assert exactly["count"] == count
    assert exactly.get("capacity") == ({"requests": capacity} if capacity else None)
    assert parameters_of(plan, "main") == {**BASE, **parameters, "enforcement": "hami-core"}
    assert set(patched["spec"]["containers"][0]["resources"]) == {"claims"}


def test_koordinator_legacy_core_without_memory_is_refused(builtin_rules: RuleSet) -> None:
    plan = translate(koord_pod({"kubernetes.io/gpu-core": 30}), builtin_rules)
    assert plan.refusal is not None
    assert plan.refusal.message == (
        'container "main": kubernetes.io/gpu-core needs kubernetes.io/gpu-memory or '
        "gpu-memory-ratio (rule koordinator-legacy)")


def volcano_pod(limits: dict[str, Any]) -> dict[str, Any]:
    # Volcano's GPU sharing user guide: gpu-pod1 for the volcano scheduler.
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "gpu-pod1",
                                                            "namespace": "default"},
            "spec": {"schedulerName": "volcano",
                     "containers": [{"name": "cuda-container", "image": "nvidia/cuda:9.0-devel",
                                     "command": ["sleep"], "args": ["100000"],
                                     "resources": {"limits": limits}}]}}


@pytest.mark.parametrize(("limits", "count", "capacity", "parameters"), [
    ({"volcano.sh/gpu-memory": 1024}, 1, {"memory": "1Gi", "cores": "1"}, {"memory": GIB}),
    ({"volcano.sh/gpu-memory": 3000}, 1, {"memory": "3000Mi", "cores": "1"},
     {"memory": 3000 * MIB}),
    ({"volcano.sh/gpu-number": 2}, 2, None, {}),
], ids=["1024 MiB", "3000 MiB", "two cards"])
def test_volcano_earlier_gpu_share_is_mib_of_one_card_or_whole_cards(
        builtin_rules: RuleSet, limits: dict[str, Any], count: int,
        capacity: dict[str, str] | None, parameters: dict[str, Any]) -> None:
    original = volcano_pod(limits)
    plan = translate(original, builtin_rules)
    assert (plan.refusal, plan.rules_applied) == (None, ["volcano-gpu-share"])
    checked(plan, original)
    exactly = only_request(plan)["exactly"]
    assert exactly["count"] == count
    assert exactly.get("capacity") == ({"requests": capacity} if capacity else None)
    assert parameters_of(plan, "cuda-container") == {**BASE, **parameters,
                                                     "enforcement": "none"}


def test_volcano_share_and_whole_cards_together_are_refused(builtin_rules: RuleSet) -> None:
    plan = translate(volcano_pod({"volcano.sh/gpu-memory": 1024, "volcano.sh/gpu-number": 1}),
                     builtin_rules)
    assert plan.refusal is not None
    assert plan.refusal.message == (
        'container "cuda-container": set volcano.sh/gpu-memory (a share of one card) or '
        "volcano.sh/gpu-number, not both (rule volcano-gpu-share)")


# ---- AMD through HAMi -------------------------------------------------------------------------


def test_amd_gpumem_and_gpucores_are_removed_with_warnings(builtin_rules: RuleSet) -> None:
    # HAMi's examples/amd/use_cores.yaml.
    original = manifest("""
apiVersion: v1
kind: Pod
metadata:
  name: amd-gpu-cores
  namespace: default
spec:
  containers:
    - name: rocm
      image: rocm/dev-ubuntu-24.04:7.2.4
      command: ["bash", "-c", "sleep infinity"]
      resources:
        limits:
          amd.com/gpu: 1
          amd.com/gpumem: 4096
          amd.com/gpucores: 25
""")
    plan = translate(original, builtin_rules)
    assert plan.refusal is None
    patched = checked(plan, original)
    assert patched["spec"]["containers"][0]["resources"] == {
        "claims": [{"name": "dra-gateway", "request": "rocm"}]}
    assert only_request(plan)["exactly"] == {"deviceClassName": names.AMD_GPU_CLASS,
                                             "allocationMode": "ExactCount", "count": 1}
    assert plan.warnings == [
        'container "rocm": amd.com/gpumem is not enforced: the pod gets whole cards of the AMD '
        "class (rule amd-gpu)",
        'container "rocm": amd.com/gpumem-percentage and amd.com/gpucores are not enforced: the '
        "pod gets whole cards of the AMD class (rule amd-gpu)"]


# ---- vendors whose rules ship disabled --------------------------------------------------------

# (rule, limits as the vendor's or HAMi's example writes them)
DISABLED: list[tuple[str, dict[str, Any]]] = [
    ("iluvatar", {"iluvatar.ai/vgpu": 1, "iluvatar.ai/vcuda-core": 50,
                  "iluvatar.ai/vcuda-memory": 64}),
    ("iluvatar", {"iluvatar.ai/BI-V150-vgpu": 1, "iluvatar.ai/BI-V150.vCore": 50,
                  "iluvatar.ai/BI-V150.vMem": 64}),
    ("metax-sgpu", {"metax-tech.com/sgpu": 1, "metax-tech.com/vcore": 60,
                    "metax-tech.com/vmemory": "2048Mi"}),
    ("hygon-dcu", {"hygon.com/dcunum": 1, "hygon.com/dcumem": 2000, "hygon.com/dcucores": 60}),
    ("cambricon-mlu", {"cambricon.com/vmlu": 1, "cambricon.com/mlu.smlu.vmemory": 20,
                       "cambricon.com/mlu.smlu.vcore": 10}),
    ("cambricon-mlu", {"cambricon.com/mlunum": 1, "cambricon.com/mlumem": 10240}),
    ("enflame-gcu", {"enflame.com/vgcu": 1, "enflame.com/vgcu-percentage": 22}),
    ("mthreads-gpu", {"mthreads.com/vgpu": 1, "mthreads.com/sgpu-memory": 32,
                      "mthreads.com/sgpu-core": 8}),
    ("ascend-npu", {"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 2000}),
    ("ascend-npu", {"huawei.com/Ascend310P": 1}),
    ("kunlunxin-xpu", {"kunlunxin.com/vxpu": 1, "kunlunxin.com/vxpu-memory": 24576}),
    ("aws-neuron", {"aws.amazon.com/neuron": 1}),
    ("aws-neuroncore", {"aws.amazon.com/neuroncore": 2}),
    ("aws-neurondevice", {"aws.amazon.com/neurondevice": 1}),
    ("google-tpu", {"google.com/tpu": 4}),
    ("intel-gpu", {"intel.com/gpu": 1}),
]


# Disabled rules whose names an enabled rule reads: NVIDIA's-driver twins of the MIG rules
# (test_mig_nvidia_driver.py); their pods are translated onto the gateway's class.
DISABLED_TWINS = ("gke-mig-nvidia-dra", "nvidia-mig-nvidia-dra", "nvidia-mig-single-nvidia-dra")


def test_every_disabled_rule_has_a_manifest_here(builtin_rules: RuleSet) -> None:
    assert sorted({rule for rule, _ in DISABLED} | set(DISABLED_TWINS)) == sorted(
        builtin_rules.disabled)
    assert not set(DISABLED_TWINS) & set(builtin_rules.disabled_resources.values())


@pytest.mark.parametrize(("rule", "limits"), DISABLED,
                         ids=[f"{rule} {next(iter(limits))}" for rule, limits in DISABLED])
def test_a_disabled_vendor_rule_leaves_the_pod_alone_and_names_itself(
        builtin_rules: RuleSet, rule: str, limits: dict[str, Any]) -> None:
    original = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "gpu-pod", "namespace": "default"},
                "spec": {"containers": [{"name": "main", "image": "ubuntu:18.04",
                                         "resources": {"limits": {"cpu": "1", **limits}}}]}}
    plan = translate(original, builtin_rules)
    assert (plan.refusal, plan.patch, plan.templates) == (None, [], [])
    assert plan.untranslated == [Untranslated("main", resource, rule) for resource in limits]
    assert plan.warnings == [
        f'container "main": {", ".join(limits)} left untranslated: rule {rule} is disabled; '
        f"enable it with an override naming the DeviceClass that serves it (overrides: [{{rule: "
        f"{rule}, enabled: true, className: <class>}}])"]


def test_translate_prints_a_line_for_each_disabled_vendor_pod(
        capsys: pytest.CaptureFixture[str]) -> None:
    path = EXAMPLES / "pods-other-vendors" / "accelerators.yaml"
    code, out, err = run_cli(capsys, "translate", "-f", str(path))
    assert code == 0
    pods = [d["metadata"]["name"] for d in yaml.safe_load_all(path.read_text())
            if d["kind"] == "Pod"]
    lines = err.splitlines()
    untranslated = {line.split(" ", 2)[2].split(":", 1)[0]: line for line in lines
                    if "left untranslated" in line}
    # Every pod but AMD's (its rule is enabled) says which rule to enable.
    assert sorted(untranslated) == sorted(f"accelerators/{p}" for p in pods
                                          if p != "rocm-infer")
    assert untranslated["accelerators/mthreads-sgpu"] == (
        'warning: Pod accelerators/mthreads-sgpu: container "main": mthreads.com/vgpu, '
        "mthreads.com/sgpu-memory, mthreads.com/sgpu-core left untranslated: rule mthreads-gpu "
        "is disabled; enable it with an override naming the DeviceClass that serves it "
        "(overrides: [{rule: mthreads-gpu, enabled: true, className: <class>}])")
    rewritten = [d for d in yaml.safe_load_all(out) if d["kind"] == "Pod"]
    assert [d["metadata"]["name"] for d in rewritten] == pods

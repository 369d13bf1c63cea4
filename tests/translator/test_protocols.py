"""Every protocol of the built-in rules, table-driven, with units checked on the output."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gateway.kube import names
from dra_gateway.translator.errors import RulesError
from dra_gateway.translator.rules import RuleSet, load_rules
from dra_gateway.translator.translate import translate

from .translator_support import checked, ctr, only_request, parameters_of, pod

GPU = names.GPU_CLASS
MIG = names.MIG_CLASS
MIB = 2**20
GIB = 2**30
BASE = {"apiVersion": "dra-gateway.io/v1alpha1", "kind": "GpuShareConfig"}
PRODUCT = 'device.attributes["gpu.dra-gateway.io"].productName'


def share(**fields: Any) -> dict[str, Any]:
    return {**BASE, **fields}


# (id, limits, annotations, class, count, capacity requests, GpuShareConfig or None, gated)
CASES: list[tuple[str, dict[str, Any], dict[str, str], str, int, dict[str, str] | None,
                  dict[str, Any] | None, bool]] = [
    ("nvidia whole gpu", {"nvidia.com/gpu": 1}, {}, GPU, 1, None, share(enforcement="none"),
     True),
    ("nvidia four gpus", {"nvidia.com/gpu": "4"}, {}, GPU, 4, None, share(enforcement="none"),
     True),
    ("hami priority beside whole gpus", {"nvidia.com/gpu": 2, "nvidia.com/priority": 1}, {},
     GPU, 2, None, share(enforcement="none"), True),
    ("hami priority beside a share", {"nvidia.com/gpumem": 8000, "nvidia.com/priority": 0}, {},
     GPU, 1, {"memory": "8000Mi", "cores": "1"},
     share(memory=8000 * MIB, enforcement="hami-core"), True),
    ("nvidia time-sliced replica", {"nvidia.com/gpu.shared": 1}, {}, GPU, 1,
     {"memory": "1Mi", "cores": "10"},
     share(cores=10, enforcement="none"), True),
    ("nvidia mig profile", {"nvidia.com/mig-1g.5gb": 2}, {}, MIG, 2, None,
     share(enforcement="none"), True),
    ("hami memory in MiB per card", {"nvidia.com/gpumem": 8000}, {}, GPU, 1,
     {"memory": "8000Mi", "cores": "1"}, share(memory=8000 * MIB, enforcement="hami-core"),
     True),
    ("hami cores per card times two cards",
     {"nvidia.com/gpu": 2, "nvidia.com/gpucores": 30}, {}, GPU, 2,
     {"memory": "1Mi", "cores": "30"},
     share(cores=30, enforcement="hami-core"), True),
    ("hami memory and cores", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": "4096",
                               "nvidia.com/gpucores": "25"}, {}, GPU, 1,
     {"memory": "4Gi", "cores": "25"}, share(memory=4 * GIB, cores=25, enforcement="hami-core"),
     True),
    ("hami memory percentage stays relative", {"nvidia.com/gpumem-percentage": 50}, {}, GPU, 1,
     {"cores": "1"}, share(memoryPercent=50, enforcement="hami-core"), True),
    ("hami 100 percent memory and cores is a whole card",
     {"nvidia.com/gpumem-percentage": 100, "nvidia.com/gpucores": 100}, {}, GPU, 1, None,
     share(enforcement="hami-core"), True),
    ("hami mps mode and policy", {"nvidia.com/gpumem": 1024},
     {"nvidia.com/vgpu-mode": "mps", "hami.io/gpu-scheduler-policy": "binpack"}, GPU, 1,
     {"memory": "1Gi", "cores": "1"}, share(memory=GIB, enforcement="mps", policy="binpack"),
     True),
    ("koordinator half a card", {"koordinator.sh/gpu-core": 50,
                                 "koordinator.sh/gpu-memory-ratio": 50}, {}, GPU, 1,
     {"cores": "50"}, share(memoryPercent=50, cores=50, enforcement="hami-core"), True),
    ("koordinator bytes", {"koordinator.sh/gpu-core": 30, "koordinator.sh/gpu-memory": "10Gi"},
     {}, GPU, 1, {"memory": "10Gi", "cores": "30"},
     share(memory=10 * GIB, cores=30, enforcement="hami-core"), True),
    ("koordinator two whole cards", {"koordinator.sh/gpu-core": 200,
                                     "koordinator.sh/gpu-memory-ratio": 200}, {}, GPU, 2, None,
     share(enforcement="hami-core"), True),
    ("koordinator gpu.shared splits evenly",
     {"koordinator.sh/gpu.shared": 2, "koordinator.sh/gpu-core": 100,
      "koordinator.sh/gpu-memory": "16Gi"}, {}, GPU, 2, {"memory": "8Gi", "cores": "50"},
     share(memory=8 * GIB, cores=50, enforcement="hami-core"), True),
    ("koordinator deprecated gpu", {"koordinator.sh/gpu": 25}, {}, GPU, 1, {"cores": "25"},
     share(memoryPercent=25, cores=25, enforcement="hami-core"), True),
    ("gpushare GiB", {"aliyun.com/gpu-mem": 8}, {}, GPU, 1, {"memory": "8Gi", "cores": "1"},
     share(memory=8 * GIB, enforcement="none"), True),
    ("gpushare total split over cards", {"aliyun.com/gpu-mem": 8, "aliyun.com/gpu-count": 2},
     {}, GPU, 2, {"memory": "4Gi", "cores": "1"}, share(memory=4 * GIB, enforcement="none"), True),
    ("gpushare split rounds down to MiB", {"aliyun.com/gpu-mem": 1, "aliyun.com/gpu-count": 3},
     {}, GPU, 3, {"memory": "341Mi", "cores": "1"}, share(memory=341 * MIB, enforcement="none"),
     True),
    ("gpushare count alone is whole cards", {"aliyun.com/gpu-count": 2}, {}, GPU, 2, None,
     share(enforcement="none"), True),
    ("cgpu core percentage", {"aliyun.com/gpu-mem": 4, "aliyun.com/gpu-core.percentage": 30},
     {}, GPU, 1, {"memory": "4Gi", "cores": "30"},
     share(memory=4 * GIB, cores=30, enforcement="hami-core"), True),
    ("qgpu share", {"tke.cloud.tencent.com/qgpu-core": 50,
                    "tke.cloud.tencent.com/qgpu-memory": 4}, {}, GPU, 1,
     {"memory": "4Gi", "cores": "50"}, share(memory=4 * GIB, cores=50, enforcement="hami-core"),
     True),
    ("qgpu 100 is a whole card", {"tke.cloud.tencent.com/qgpu-core": 100}, {}, GPU, 1, None,
     share(enforcement="hami-core"), True),
    ("qgpu 200 splits memory over two cards",
     {"tke.cloud.tencent.com/qgpu-core": 200, "tke.cloud.tencent.com/qgpu-memory": 40}, {}, GPU,
     2, {"memory": "20Gi", "cores": "100"},
     share(memory=20 * GIB, cores=100, enforcement="hami-core"), True),
    ("volcano vgpu", {"volcano.sh/vgpu-number": 2, "volcano.sh/vgpu-memory": 4096,
                      "volcano.sh/vgpu-cores": 25}, {}, GPU, 2, {"memory": "4Gi", "cores": "25"},
     share(memory=4 * GIB, cores=25, enforcement="hami-core"), True),
    ("aws vgpu slices", {"k8s.amazonaws.com/vgpu": 3}, {}, GPU, 1,
     {"memory": "1Mi", "cores": "30"},
     share(cores=30, enforcement="mps"), True),
    ("amd whole gpus", {"amd.com/gpu": 2}, {}, names.AMD_GPU_CLASS, 2, None, None, False),
    ("intel i915", {"gpu.intel.com/i915": 1}, {}, names.INTEL_GPU_CLASS, 1, None, None, False),
    ("intel xe", {"gpu.intel.com/xe": 2}, {}, names.INTEL_GPU_CLASS, 2, None, None, False),
    ("habana gaudi", {"habana.ai/gaudi": 8}, {}, names.GAUDI_CLASS, 8, None, None, False),
]


@pytest.mark.parametrize(("limits", "annotations", "device_class", "count", "capacity",
                          "parameters", "gated"),
                         [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_protocol_translates_with_its_units(
        builtin_rules: RuleSet, limits: dict[str, Any], annotations: dict[str, str],
        device_class: str, count: int, capacity: dict[str, str] | None,
        parameters: dict[str, Any] | None, gated: bool) -> None:
    original = pod(ctr("main", limits={"cpu": "1", **limits}), annotations=annotations)
    plan = translate(original, builtin_rules)
    assert plan.refusal is None
    patched = checked(plan, original)
    exactly = only_request(plan)["exactly"]
    assert exactly["deviceClassName"] == device_class
    assert exactly["allocationMode"] == "ExactCount"
    assert exactly["count"] == count
    assert exactly.get("capacity") == ({"requests": capacity} if capacity else None)
    assert parameters_of(plan, "main") == parameters
    assert patched["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "1"}, "claims": [{"name": "dra-gateway", "request": "main"}]}
    gates = patched["spec"].get("schedulingGates", [])
    assert (gates == [{"name": names.SCHEDULING_GATE}]) is gated


@pytest.mark.parametrize(("mode", "requests", "limits"), [
    ("requests only", {"nvidia.com/gpumem": "2048"}, None),
    ("limits only", None, {"nvidia.com/gpumem": "2048"}),
    ("both", {"nvidia.com/gpumem": "2048"}, {"nvidia.com/gpumem": 2048}),
])
def test_requests_only_limits_only_and_both_give_the_same_claim(
        builtin_rules: RuleSet, mode: str, requests: dict[str, Any] | None,
        limits: dict[str, Any] | None) -> None:
    original = pod(ctr("main", limits=limits, requests=requests))
    plan = translate(original, builtin_rules)
    patched = checked(plan, original)
    assert only_request(plan)["exactly"]["capacity"] == {"requests": {"memory": "2Gi",
                                                                      "cores": "1"}}
    assert patched["spec"]["containers"][0]["resources"] == {
        "claims": [{"name": "dra-gateway", "request": "main"}]}


def test_hami_type_and_uuid_annotations_become_guarded_selectors(builtin_rules: RuleSet) -> None:
    annotations = {"nvidia.com/use-gputype": "A100, H100", "nvidia.com/nouse-gputype": "MIG",
                   "nvidia.com/use-gpuuuid": "GPU-1,GPU-2", "nvidia.com/nouse-gpuuuid": "GPU-3"}
    plan = translate(pod(ctr("main", limits={"nvidia.com/gpumem": 1000}),
                         annotations=annotations), builtin_rules)
    selectors = [s["cel"]["expression"] for s in only_request(plan)["exactly"]["selectors"]]
    attrs = 'device.attributes["gpu.dra-gateway.io"]'
    assert selectors == [
        f'"productName" in {attrs} && ({PRODUCT}.lowerAscii().contains("a100") || '
        f'{PRODUCT}.lowerAscii().contains("h100"))',
        f'!("productName" in {attrs}) || !({PRODUCT}.lowerAscii().contains("mig"))',
        f'"uuid" in {attrs} && {attrs}.uuid in ["GPU-1", "GPU-2"]',
        f'!("uuid" in {attrs}) || !({attrs}.uuid == "GPU-3")',
        # HAMi-core enforces the share: only cards whose node has its library.
        f'"hamiCore" in {attrs} && {attrs}.hamiCore == true',
    ]


@pytest.mark.parametrize(("limits", "annotations", "selected"), [
    ({"nvidia.com/gpumem": 1000}, {}, True),
    ({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 30}, {}, True),
    # MPS enforces it instead, and a whole card has nothing to enforce.
    ({"nvidia.com/gpumem": 1000}, {"nvidia.com/vgpu-mode": "mps"}, False),
    ({"nvidia.com/gpu": 1}, {}, False),
], ids=["memory share", "compute share", "mps share", "whole card"])
def test_a_hami_core_share_selects_cards_whose_node_has_the_library(
        builtin_rules: RuleSet, limits: dict[str, int], annotations: dict[str, str],
        selected: bool) -> None:
    from dra_gateway.kube.cel import compile_selector, device_view

    plan = translate(pod(ctr("main", limits=limits), annotations=annotations), builtin_rules)
    expressions = [s["cel"]["expression"] for s in
                   only_request(plan)["exactly"].get("selectors", [])]
    hami = [e for e in expressions if "hamiCore" in e]
    assert bool(hami) == selected, expressions
    if not selected:
        return
    compiled = compile_selector(hami[0])

    def card(**attributes: Any) -> Any:
        return device_view(names.DRIVER, {"name": "gpu-0", "attributes": attributes})

    assert compiled.matches(card(hamiCore={"bool": True})) is True
    assert compiled.matches(card(hamiCore={"bool": False})) is False
    # A card published before the attribute existed, or another driver's: not selected, no error.
    assert compiled.matches(card(uuid={"string": "GPU-1"})) is False


def test_selectors_match_devices_and_never_error(builtin_rules: RuleSet) -> None:
    from dra_gateway.kube.cel import compile_selector, device_view

    plan = translate(pod(ctr("main", limits={"nvidia.com/gpu": 1}),
                         annotations={"nvidia.com/use-gputype": "a100"}), builtin_rules)
    (selector,) = only_request(plan)["exactly"]["selectors"]
    compiled = compile_selector(selector["cel"]["expression"])

    def device(**attributes: str) -> Any:
        return device_view(names.DRIVER, {"name": "gpu-0", "attributes": {
            k: {"string": v} for k, v in attributes.items()}})

    assert compiled.matches(device(productName="NVIDIA A100-SXM4-80GB"))
    assert not compiled.matches(device(productName="Tesla T4"))
    assert not compiled.matches(device(uuid="GPU-1"))


def test_annotation_values_cannot_inject_cel(builtin_rules: RuleSet) -> None:
    hostile = 'x") || true || ("'
    plan = translate(pod(ctr("main", limits={"nvidia.com/gpu": 1}),
                         annotations={"nvidia.com/use-gpuuuid": hostile}), builtin_rules)
    (selector,) = only_request(plan)["exactly"]["selectors"]
    assert selector["cel"]["expression"].endswith('.uuid == "x\\") || true || (\\""')


def test_mig_profile_selects_on_the_profile_attribute(builtin_rules: RuleSet) -> None:
    plan = translate(pod(ctr("main", limits={"nvidia.com/mig-3g.40gb": 1})), builtin_rules)
    (selector,) = only_request(plan)["exactly"]["selectors"]
    assert selector["cel"]["expression"] == (
        '"profile" in device.attributes["gpu.dra-gateway.io"] && '
        'device.attributes["gpu.dra-gateway.io"].profile == "3g.40gb"')


def test_numa_bind_constrains_the_cards_of_a_request(builtin_rules: RuleSet) -> None:
    original = pod(ctr("main", limits={"nvidia.com/gpu": 2}),
                   annotations={"nvidia.com/numa-bind": "true"})
    plan = translate(original, builtin_rules)
    checked(plan, original)
    assert plan.templates[0]["spec"]["spec"]["devices"]["constraints"] == [
        {"requests": ["main"], "matchAttribute": "gpu.dra-gateway.io/numaNode"}]


def test_the_align_annotation_makes_the_cards_share_a_domain(builtin_rules: RuleSet) -> None:
    for value, attribute in (("pcieRoot", "resource.kubernetes.io/pcieRoot"),
                             ("numaNode", "gpu.dra-gateway.io/numaNode"),
                             ("nvlinkIsland", "gpu.dra-gateway.io/nvlinkIsland")):
        original = pod(ctr("main", limits={"nvidia.com/gpu": 4}),
                       annotations={"dra-gateway.io/align": value})
        plan = translate(original, builtin_rules)
        checked(plan, original)
        assert plan.templates[0]["spec"]["spec"]["devices"]["constraints"] == [
            {"requests": ["main"], "matchAttribute": attribute}], value
    # One card shares everything with itself: no constraint.
    single = translate(pod(ctr("main", limits={"nvidia.com/gpu": 1}),
                           annotations={"dra-gateway.io/align": "pcieRoot"}), builtin_rules)
    assert "constraints" not in single.templates[0]["spec"]["spec"]["devices"]
    refused = translate(pod(ctr("main", limits={"nvidia.com/gpu": 2}),
                            annotations={"dra-gateway.io/align": "pcie"}), builtin_rules)
    assert refused.refusal is not None
    assert "set it to pcieRoot, numaNode or nvlinkIsland, or remove it" in \
        refused.refusal.message


def test_a_rule_constraint_names_another_domain_s_attribute_or_is_refused(
        tmp_path: Any) -> None:
    (tmp_path / "bad.yaml").write_text(
        "apiVersion: dra-gateway.io/v1alpha1\nkind: TranslationRules\nrules:\n"
        "  - name: odd\n    resources: {example.com/gpu: {}}\n    device:\n"
        "      className: gpu.dra-gateway.io\n      count: 'r[\"example.com/gpu\"]'\n"
        "      constraints: [{matchAttribute: 'example.com/x/y'}]\n")
    with pytest.raises(RulesError) as caught:
        load_rules(tmp_path / "bad.yaml")
    assert '"example.com/x/y" is not an attribute name (an identifier, or domain/identifier ' \
        'such as resource.kubernetes.io/pcieRoot)' in str(caught.value)


def test_gpushare_units_are_a_setting(tmp_path: Any) -> None:
    (tmp_path / "units.yaml").write_text(
        "apiVersion: dra-gateway.io/v1alpha1\nkind: TranslationRules\n"
        "overrides:\n  - rule: gpushare\n    units: {aliyun.com/gpu-mem: Mi}\n")
    rules = load_rules(tmp_path / "units.yaml")
    plan = translate(pod(ctr("main", limits={"aliyun.com/gpu-mem": 8000})), rules)
    assert only_request(plan)["exactly"]["capacity"] == {"requests": {"memory": "8000Mi",
                                                                      "cores": "1"}}
    assert parameters_of(plan, "main") == share(memory=8000 * MIB, enforcement="none")


def test_invalid_policy_annotation_is_a_warning_not_a_refusal(builtin_rules: RuleSet) -> None:
    plan = translate(pod(ctr("main", limits={"nvidia.com/gpu": 1}),
                         annotations={"hami.io/gpu-scheduler-policy": "fastest"}), builtin_rules)
    assert plan.refusal is None
    assert plan.warnings == ['container "main": policy "fastest" is not one of default, '
                             "binpack, spread, first-fit; the cluster default applies"]
    assert parameters_of(plan, "main") == share(enforcement="none")


@pytest.mark.parametrize("limits", [
    {"nvidia.com/priority": 1},
    {"nvidia.com/gpu": 0, "nvidia.com/priority": 1},
], ids=["priority alone", "zero gpus with a priority"])
def test_a_priority_hint_alone_asks_for_no_card(builtin_rules: RuleSet,
                                                 limits: dict[str, Any]) -> None:
    plan = translate(pod(ctr("main", limits=limits)), builtin_rules)
    assert plan.refusal is None
    assert plan.patch == []
    assert plan.templates == []


@pytest.mark.parametrize("zero", ["nvidia.com/gpucores", "nvidia.com/gpumem",
                                  "nvidia.com/gpumem-percentage"])
def test_a_zero_hami_share_beside_whole_gpus_is_still_translated(
        builtin_rules: RuleSet, zero: str) -> None:
    # Charts default the HAMi amounts to 0: the cards asked for must not be left behind for a
    # device plugin that the DRA cluster does not run (nor be refused by /validate).
    original = pod(ctr("main", limits={"nvidia.com/gpu": 2, zero: 0}))
    plan = translate(original, builtin_rules)
    assert plan.refusal is None
    after = checked(plan, original)
    assert "limits" not in after["spec"]["containers"][0]["resources"]
    assert only_request(plan)["exactly"] == {
        "deviceClassName": GPU, "allocationMode": "ExactCount", "count": 2}
    assert parameters_of(plan, "main") == share(enforcement="hami-core")

"""The legacy MIG request forms other than nvidia.com/mig-<profile> (issue 47): NVIDIA's single
strategy, GKE's partition size, HAMi's and Volcano's MIG modes, all onto mig.dra-gateway.io."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gateway.kube import names
from dra_gateway.translator.rules import RulesError, RuleSet, load_rules
from dra_gateway.translator.translate import translate

from .translator_support import checked, ctr, only_request, pod

A100_1G = "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"
ATTRS = 'device.attributes["gpu.dra-gateway.io"]'


def profile_selector(profile: str) -> str:
    return f'"profile" in {ATTRS} && {ATTRS}.profile == "{profile}"'


def required(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": list(t)} for t in terms]}}}


def term(key: str, *values: str, operator: str = "In") -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


def translated(builtin_rules: RuleSet, limits: dict[str, Any], **spec: Any) -> Any:
    original = pod(ctr("main", limits=limits), **spec)
    plan = translate(original, builtin_rules)
    if plan.refusal is None:
        checked(plan, original)  # strict 1.34 schemas
    return plan


@pytest.mark.parametrize(("spec", "profile"), [
    ({"nodeSelector": {"nvidia.com/gpu.product": A100_1G}}, "1g.5gb"),
    ({"nodeSelector": {"nvidia.com/gpu.product": A100_1G, "nvidia.com/mig.strategy": "single"}},
     "1g.5gb"),
    # Time-sliced MIG devices: GPU feature discovery adds -SHARED.
    ({"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-MIG-3g.40gb-SHARED"}},
     "3g.40gb"),
    ({"affinity": required([term("nvidia.com/gpu.product", A100_1G)])}, "1g.5gb"),
    # Every term pins the same value: the node has it whichever term matches.
    ({"affinity": required([term("nvidia.com/gpu.product", A100_1G), term("zone", "a")],
                           [term("nvidia.com/gpu.product", A100_1G)])}, "1g.5gb"),
])
def test_single_strategy_gives_n_instances_of_the_selected_profile(
        builtin_rules: RuleSet, spec: dict[str, Any], profile: str) -> None:
    plan = translated(builtin_rules, {"nvidia.com/gpu": 2}, **spec)
    assert (plan.refusal, plan.rules_applied, plan.warnings) == (None, ["nvidia-mig-single"], [])
    assert only_request(plan)["exactly"] == {
        "deviceClassName": names.MIG_CLASS, "allocationMode": "ExactCount", "count": 2,
        "selectors": [{"cel": {"expression": profile_selector(profile)}}]}


@pytest.mark.parametrize("spec", [
    {},
    {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"}},  # a card model
    {"affinity": required([term("nvidia.com/gpu.product", A100_1G, "NVIDIA-A100-SXM4-40GB")])},
    {"affinity": required([term("nvidia.com/gpu.product", A100_1G, operator="NotIn")])},
    # Terms are alternatives: one that does not pin the label says nothing of the node.
    {"affinity": required([term("nvidia.com/gpu.product", A100_1G)], [term("zone", "a")])},
    {"nodeSelector": {"nvidia.com/mig.strategy": "mixed"}},
])
def test_a_plain_gpu_request_without_the_mig_labels_stays_whole_cards(
        builtin_rules: RuleSet, spec: dict[str, Any]) -> None:
    plan = translated(builtin_rules, {"nvidia.com/gpu": 2}, **spec)
    assert (plan.refusal, plan.rules_applied, plan.warnings) == (None, ["nvidia-gpu"], [])
    assert only_request(plan)["exactly"] == {
        "deviceClassName": names.GPU_CLASS, "allocationMode": "ExactCount", "count": 2}


def test_single_strategy_without_a_profile_offers_the_smallest_first_with_a_warning(
        builtin_rules: RuleSet) -> None:
    plan = translated(builtin_rules, {"nvidia.com/gpu": 1},
                      nodeSelector={"nvidia.com/mig.strategy": "single"})
    assert plan.rules_applied == ["nvidia-mig-single"]
    assert plan.warnings == [
        'container "main": nodeSelector nvidia.com/mig.strategy: single names no MIG profile; '
        "the smallest free instance is taken (select nvidia.com/gpu.product: "
        "<model>-MIG-<profile> to choose one) (rule nvidia-mig-single)"]
    subs = only_request(plan)["firstAvailable"]
    assert [s["name"] for s in subs] == ["1g-5gb", "1g-10gb", "2g-10gb", "1g-18gb", "1g-20gb",
                                         "2g-20gb", "3g-20gb", "any"]
    assert subs[0]["selectors"] == [{"cel": {"expression": profile_selector("1g.5gb")}}]
    assert "selectors" not in subs[-1]


@pytest.mark.parametrize(("node_selector", "message"), [
    ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-big"},
     'container "main": nodeSelector nvidia.com/gpu.product names no MIG profile after -MIG- '
     "(GPU feature discovery writes <model>-MIG-<profile>, e.g. "
     "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb): select the label's value as the node has it (rule "
     "nvidia-mig-single)"),
    ({"nvidia.com/gpu.product": A100_1G, "nvidia.com/mig.strategy": "mixed"},
     'container "main": nodeSelector nvidia.com/gpu.product names a MIG profile, which GPU '
     "feature discovery labels only where nvidia.com/mig.strategy is single: select "
     "nvidia.com/mig.strategy=single, or ask for nvidia.com/mig-<profile> (mixed strategy) "
     "(rule nvidia-mig-single)"),
    ({"cloud.google.com/gke-gpu-partition-size": "half"},
     'container "main": nodeSelector cloud.google.com/gke-gpu-partition-size is a MIG profile '
     "such as 1g.5gb or 3g.20gb: select the partition size the node pool was created with "
     "(rule gke-mig)"),
])
def test_a_bad_mig_label_is_refused_naming_the_field_and_the_fix(
        builtin_rules: RuleSet, node_selector: dict[str, str], message: str) -> None:
    plan = translated(builtin_rules, {"nvidia.com/gpu": 1}, nodeSelector=node_selector)
    assert plan.refusal is not None
    assert plan.refusal.message == message


def test_gke_partition_size_gives_n_instances_of_that_profile(builtin_rules: RuleSet) -> None:
    plan = translated(builtin_rules, {"nvidia.com/gpu": 3}, nodeSelector={
        "cloud.google.com/gke-gpu-partition-size": "1g.5gb",
        "cloud.google.com/gke-accelerator": "nvidia-tesla-a100"})
    assert (plan.refusal, plan.rules_applied) == (None, ["gke-mig"])
    assert only_request(plan)["exactly"] == {
        "deviceClassName": names.MIG_CLASS, "allocationMode": "ExactCount", "count": 3,
        "selectors": [{"cel": {"expression": profile_selector("1g.5gb")}}]}
    by_affinity = translated(builtin_rules, {"nvidia.com/gpu": 3}, affinity=required(
        [term("cloud.google.com/gke-gpu-partition-size", "1g.5gb")]))
    assert by_affinity.templates == plan.templates


@pytest.mark.parametrize(("limits", "spec", "rule"), [
    # A bad amount is refused by the rule that applies, not by a MIG rule whose labels the
    # pod does not select.
    ({"nvidia.com/gpu": "0.5"}, {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100"}},
     "nvidia-gpu"),
    ({"nvidia.com/gpu": "0.5"}, {"nodeSelector": {"nvidia.com/gpu.product": A100_1G}},
     "nvidia-mig-single"),
    ({"nvidia.com/gpu": "0.5"}, {"nodeSelector": {
        "cloud.google.com/gke-gpu-partition-size": "1g.5gb"}}, "gke-mig"),
    # A leftover names the rule that would have taken it from this pod.
    ({"nvidia.com/gpu": 1, "aliyun.com/gpu-mem": 4}, {}, "nvidia-gpu"),
])
def test_a_refusal_names_a_rule_whose_conditions_hold(
        builtin_rules: RuleSet, limits: dict[str, Any], spec: dict[str, Any],
        rule: str) -> None:
    plan = translated(builtin_rules, limits, **spec)
    assert plan.refusal is not None
    assert f"(rule {rule})" in plan.refusal.message or f"nvidia.com/gpu (rule {rule})" in (
        plan.refusal.message), plan.refusal.message
    other_mig_rules = {"nvidia-mig-single", "gke-mig", "hami-mig", "volcano-mig"} - {rule}
    assert not any(f"rule {name}" in plan.refusal.message for name in other_mig_rules)


@pytest.mark.parametrize(("annotations", "limits"), [
    ({"nvidia.com/vgpu-mode": "mig"}, {"nvidia.com/gpu": 2, "nvidia.com/gpumem": 20000,
                                       "nvidia.com/gpucores": 30}),
    ({"volcano.sh/vgpu-mode": "mig"}, {"volcano.sh/vgpu-number": 2,
                                       "volcano.sh/vgpu-memory": 20000,
                                       "volcano.sh/vgpu-cores": 30}),
])
def test_hami_and_volcano_mig_modes_offer_the_same_smallest_fitting_profiles(
        builtin_rules: RuleSet, annotations: dict[str, str], limits: dict[str, Any]) -> None:
    """20000 MiB and 30% of 7 slices (2.1: at least 3g), smallest memory first."""
    plan = translated(builtin_rules, limits, annotations=annotations)
    assert plan.refusal is None
    subs = only_request(plan)["firstAvailable"]
    assert [s["name"] for s in subs] == ["3g-20gb", "4g-20gb", "3g-40gb", "4g-40gb", "7g-40gb",
                                         "3g-71gb", "4g-71gb", "any"]
    assert {s["count"] for s in subs} == {2}
    capacity = 'device.capacity["gpu.dra-gateway.io"]'
    assert [s["cel"]["expression"] for s in subs[-1]["selectors"]] == [
        f'"memory" in {capacity} && {capacity}.memory.compareTo(quantity("20971520000")) >= 0',
        f'"cores" in {capacity} && {capacity}.cores.compareTo(quantity("30")) >= 0']


def test_volcano_without_its_mig_mode_stays_a_hami_core_share(builtin_rules: RuleSet) -> None:
    plan = translated(builtin_rules, {"volcano.sh/vgpu-memory": 20000})
    assert plan.rules_applied == ["volcano-vgpu"]
    assert only_request(plan)["exactly"]["deviceClassName"] == names.GPU_CLASS


def test_the_two_mig_modes_share_one_profile_table() -> None:
    builtin = Path(__file__).resolve().parents[2] / "translator" / "builtin"

    def table(file: str, rule: str) -> str:
        (spec,) = [r for r in yaml.safe_load((builtin / file).read_text())["rules"]
                   if r["name"] == rule]
        return " ".join(" ".join(v["expression"].split()) for v in spec["variables"]
                        if v["name"] == "knownProfiles")

    assert table("nvidia.yaml", "hami-mig") == table("volcano.yaml", "volcano-mig") != ""


HEADER = "apiVersion: dra-gateway.io/v1alpha1\nkind: TranslationRules\n"


def test_the_mig_rules_on_nvidia_gpu_decide_extended_names_as_nvidia_gpu(
        tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(HEADER + "overrides:\n  - {rule: nvidia-gpu, extendedResourceNames: "
                    "translate}\n  - {rule: gke-mig, extendedResourceNames: defer}\n")
    rules = load_rules(site)
    decided = {r.name: r.extended_resource_names for r in rules.rules
               if r.name in ("nvidia-gpu", "nvidia-mig-single", "gke-mig")}
    # An override of the follower's own wins.
    assert decided == {"nvidia-gpu": "translate", "nvidia-mig-single": "translate",
                       "gke-mig": "defer"}


def test_extended_resource_names_from_a_missing_rule_is_a_load_error(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text(HEADER + """rules:
  - name: my-npu
    extendedResourceNamesFrom: no-such-rule
    resources: {example.com/npu: {}}
    device: {className: npu.example.com}
""")
    with pytest.raises(RulesError) as error:
        load_rules(site)
    assert 'site.yaml: rules[0].extendedResourceNamesFrom: "no-such-rule": no rule has that ' \
        "name; name a rule that sets extendedResourceNames itself, or set " \
        "extendedResourceNames here" in str(error.value)

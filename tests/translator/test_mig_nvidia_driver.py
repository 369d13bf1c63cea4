"""The legacy MIG forms onto NVIDIA's DRA driver (issue 47): the built-in rules
nvidia-mig-nvidia-dra, nvidia-mig-single-nvidia-dra and gke-mig-nvidia-dra ship disabled; an
administrator who enables them gets claims of mig.nvidia.com selecting the driver's `profile`
attribute, allocated by kube-scheduler, with no gateway config."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gateway.kube import names
from dra_gateway.translator.rules import RulesError, RuleSet, load_rules
from dra_gateway.translator.translate import TranslationPlan, translate

from .translator_support import checked, ctr, only_request, pod

HEADER = "apiVersion: dra-gateway.io/v1alpha1\nkind: TranslationRules\n"
# Each NVIDIA-driver rule with the gateway rule it stands in for.
TWINS = {"nvidia-mig-nvidia-dra": "nvidia-mig",
         "nvidia-mig-single-nvidia-dra": "nvidia-mig-single",
         "gke-mig-nvidia-dra": "gke-mig"}
NVIDIA_ATTRS = 'device.attributes["gpu.nvidia.com"]'
GATEWAY_ATTRS = 'device.attributes["gpu.dra-gateway.io"]'
A100_1G = "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb"


def nvidia_profile(profile: str) -> dict[str, Any]:
    return {"cel": {"expression":
                    f'"profile" in {NVIDIA_ATTRS} && {NVIDIA_ATTRS}.profile == "{profile}"'}}


def enabling(*rules: str, extra: str = "") -> RuleSet:
    return load_rules({"site.yaml": HEADER + "overrides:\n" + "".join(
        f"  - {{rule: {rule}, enabled: true}}\n" for rule in rules) + extra})


@pytest.fixture(scope="module")
def nvidia_driver_rules() -> RuleSet:
    return enabling(*TWINS)


def translated(rules: RuleSet, limits: dict[str, Any], **spec: Any) -> tuple[TranslationPlan,
                                                                             dict[str, Any]]:
    original = pod(ctr("main", limits=limits), **spec)
    plan = translate(original, rules)
    assert plan.refusal is None, plan.refusal
    return plan, checked(plan, original)  # strict 1.34 schemas


def on_nvidias_driver(plan: TranslationPlan, patched: dict[str, Any]) -> None:
    """No gateway config, no scheduling gate: kube-scheduler allocates NVIDIA's devices."""
    (template,) = plan.templates
    assert "config" not in template["spec"]["spec"]["devices"]
    assert "schedulingGates" not in patched["spec"]
    assert patched["spec"]["containers"][0]["resources"] == {
        "claims": [{"name": "dra-gateway", "request": "main"}]}


def test_the_rules_ship_disabled_above_their_gateway_twins(builtin_rules: RuleSet,
                                                           nvidia_driver_rules: RuleSet) -> None:
    assert set(TWINS) <= set(builtin_rules.disabled)
    assert not set(TWINS) & set(builtin_rules.rule_names)
    assert not set(TWINS) & set(nvidia_driver_rules.disabled)
    for rule, twin in TWINS.items():
        mirror = nvidia_driver_rules.rule(rule)
        assert mirror.precedence > nvidia_driver_rules.rule(twin).precedence
        assert (mirror.class_name, mirror.driver) == (names.NVIDIA_MIG_CLASS,
                                                      names.NVIDIA_GPU_CLASS)
        assert (mirror.gateway_class, mirror.gated) == (False, False)
    # The single-strategy and GKE ones keep their order (GKE's label wins over the product's).
    assert nvidia_driver_rules.rule("gke-mig-nvidia-dra").precedence > \
        nvidia_driver_rules.rule("nvidia-mig-single-nvidia-dra").precedence


@pytest.mark.parametrize(("resource", "profile"), [
    ("nvidia.com/mig-1g.10gb", "1g.10gb"),
    ("nvidia.com/mig-1g.10gb.me", "1g.10gb+me"),  # the device plugin's "." for "+"
])
def test_mixed_strategy_gives_n_instances_of_nvidias_mig_class(
        nvidia_driver_rules: RuleSet, resource: str, profile: str) -> None:
    plan, patched = translated(nvidia_driver_rules, {resource: 2})
    assert (plan.rules_applied, plan.warnings) == (["nvidia-mig-nvidia-dra"], [])
    assert only_request(plan) == {"name": "main", "exactly": {
        "deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount", "count": 2,
        "selectors": [nvidia_profile(profile)]}}
    on_nvidias_driver(plan, patched)


def test_disabled_by_default_the_gateways_mig_class_serves(builtin_rules: RuleSet) -> None:
    plan, patched = translated(builtin_rules, {"nvidia.com/mig-1g.10gb": 2})
    assert plan.rules_applied == ["nvidia-mig"]
    assert only_request(plan)["exactly"] == {
        "deviceClassName": names.MIG_CLASS, "allocationMode": "ExactCount", "count": 2,
        "selectors": [{"cel": {"expression": f'"profile" in {GATEWAY_ATTRS} && '
                                             f'{GATEWAY_ATTRS}.profile == "1g.10gb"'}}]}
    (template,) = plan.templates
    assert template["spec"]["spec"]["devices"]["config"][0]["opaque"]["driver"] == names.DRIVER
    assert patched["spec"]["schedulingGates"] == [{"name": "dra-gateway.io/allocation"}]


@pytest.mark.parametrize("spec", [
    {"nodeSelector": {"nvidia.com/gpu.product": A100_1G}},
    {"nodeSelector": {"nvidia.com/gpu.product": A100_1G + "-SHARED",
                      "nvidia.com/mig.strategy": "single"}},
])
def test_single_strategy_onto_nvidias_driver(nvidia_driver_rules: RuleSet,
                                             spec: dict[str, Any]) -> None:
    plan, patched = translated(nvidia_driver_rules, {"nvidia.com/gpu": 3}, **spec)
    assert (plan.rules_applied, plan.warnings) == (["nvidia-mig-single-nvidia-dra"], [])
    assert only_request(plan)["exactly"] == {
        "deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount", "count": 3,
        "selectors": [nvidia_profile("1g.5gb")]}
    on_nvidias_driver(plan, patched)


def test_single_strategy_without_a_profile_offers_the_smallest_of_nvidias_first(
        nvidia_driver_rules: RuleSet) -> None:
    plan, patched = translated(nvidia_driver_rules, {"nvidia.com/gpu": 1},
                               nodeSelector={"nvidia.com/mig.strategy": "single"})
    assert plan.rules_applied == ["nvidia-mig-single-nvidia-dra"]
    assert plan.warnings == [
        'container "main": nodeSelector nvidia.com/mig.strategy: single names no MIG profile; '
        "the smallest free instance is taken (select nvidia.com/gpu.product: "
        "<model>-MIG-<profile> to choose one) (rule nvidia-mig-single-nvidia-dra)"]
    subs = only_request(plan)["firstAvailable"]
    assert [s["name"] for s in subs] == ["1g-5gb", "1g-10gb", "2g-10gb", "1g-18gb", "1g-20gb",
                                         "2g-20gb", "3g-20gb", "any"]
    assert {s["deviceClassName"] for s in subs} == {"mig.nvidia.com"}
    assert subs[0]["selectors"] == [nvidia_profile("1g.5gb")]
    assert "selectors" not in subs[-1]
    on_nvidias_driver(plan, patched)


def test_gke_partition_size_onto_nvidias_driver(nvidia_driver_rules: RuleSet) -> None:
    plan, patched = translated(nvidia_driver_rules, {"nvidia.com/gpu": 1}, nodeSelector={
        "cloud.google.com/gke-gpu-partition-size": "3g.20gb"})
    assert (plan.rules_applied, plan.warnings) == (["gke-mig-nvidia-dra"], [])
    assert only_request(plan)["exactly"] == {
        "deviceClassName": "mig.nvidia.com", "allocationMode": "ExactCount", "count": 1,
        "selectors": [nvidia_profile("3g.20gb")]}
    on_nvidias_driver(plan, patched)


@pytest.mark.parametrize(("node_selector", "rule"), [
    ({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-big"}, "nvidia-mig-single-nvidia-dra"),
    ({"cloud.google.com/gke-gpu-partition-size": "half"}, "gke-mig-nvidia-dra"),
])
def test_a_bad_mig_label_is_refused_by_the_enabled_rule(
        nvidia_driver_rules: RuleSet, node_selector: dict[str, str], rule: str) -> None:
    plan = translate(pod(ctr("main", limits={"nvidia.com/gpu": 1}), nodeSelector=node_selector),
                     nvidia_driver_rules)
    assert plan.refusal is not None
    assert plan.refusal.message.endswith(f"(rule {rule})"), plan.refusal.message


def test_a_plain_gpu_request_stays_whole_cards_of_the_gateway(
        nvidia_driver_rules: RuleSet) -> None:
    plan, _ = translated(nvidia_driver_rules, {"nvidia.com/gpu": 2},
                         nodeSelector={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB"})
    assert plan.rules_applied == ["nvidia-gpu"]
    assert only_request(plan)["exactly"]["deviceClassName"] == names.GPU_CLASS


def test_each_rule_is_enabled_on_its_own() -> None:
    rules = enabling("nvidia-mig-nvidia-dra")
    mixed, _ = translated(rules, {"nvidia.com/mig-2g.20gb": 1})
    single, _ = translated(rules, {"nvidia.com/gpu": 1},
                           nodeSelector={"nvidia.com/gpu.product": A100_1G})
    assert (mixed.rules_applied, single.rules_applied) == (["nvidia-mig-nvidia-dra"],
                                                           ["nvidia-mig-single"])
    assert only_request(single)["exactly"]["deviceClassName"] == names.MIG_CLASS


def test_the_gateway_twin_may_be_disabled_too() -> None:
    rules = enabling(*TWINS, extra="".join(f"  - {{rule: {twin}, enabled: false}}\n"
                                           for twin in TWINS.values()))
    plan, patched = translated(rules, {"nvidia.com/mig-1g.10gb": 1})
    assert plan.rules_applied == ["nvidia-mig-nvidia-dra"]
    on_nvidias_driver(plan, patched)


def test_with_both_disabled_the_hint_names_the_gateways_rule() -> None:
    rules = load_rules({"site.yaml": HEADER + "overrides: [{rule: nvidia-mig, enabled: false}]\n"})
    plan = translate(pod(ctr("main", limits={"nvidia.com/mig-1g.10gb": 1})), rules)
    assert (plan.patch, plan.templates) == ([], [])
    assert "rule nvidia-mig is disabled" in plan.warnings[0]


def test_a_site_rule_at_the_same_precedence_is_a_load_error() -> None:
    with pytest.raises(RulesError) as caught:
        enabling("nvidia-mig-nvidia-dra", extra="""rules:
  - name: site-mig
    precedence: 11
    resources: {nvidia.com/mig-*: {}}
    device: {className: mig.dra-gateway.io, count: 'r["nvidia.com/mig-*"]'}
""")
    assert "with no precedence between them" in str(caught.value)


def test_one_pod_may_mix_the_gateways_cards_and_nvidias_mig(
        nvidia_driver_rules: RuleSet) -> None:
    original = pod(ctr("train", limits={"nvidia.com/gpu": 1}),
                   ctr("infer", limits={"nvidia.com/mig-1g.10gb": 1}))
    plan = translate(original, nvidia_driver_rules)
    assert plan.refusal is None
    patched = checked(plan, original)
    (template,) = plan.templates
    devices = template["spec"]["spec"]["devices"]
    assert [(r["name"], r["exactly"]["deviceClassName"]) for r in devices["requests"]] == [
        ("train", names.GPU_CLASS), ("infer", "mig.nvidia.com")]
    # The gateway's config goes to its own request only; its allocator gates the pod.
    assert [entry["requests"] for entry in devices["config"]] == [["train"]]
    assert patched["spec"]["schedulingGates"] == [{"name": "dra-gateway.io/allocation"}]


def test_the_single_and_gke_rules_decide_extended_names_as_nvidia_gpu() -> None:
    rules = enabling(*TWINS, extra="  - {rule: nvidia-gpu, extendedResourceNames: translate}\n")
    assert {name: rules.rule(name).extended_resource_names for name in TWINS} == {
        "nvidia-mig-nvidia-dra": "defer", "nvidia-mig-single-nvidia-dra": "translate",
        "gke-mig-nvidia-dra": "translate"}

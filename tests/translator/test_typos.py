"""Typos caught where the user looks: resource names no rule reads under the rules' vendor
domains, unknown fields of a rules document, and every bad amount of a pod at once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dra_gateway.translator.explaining import explain
from dra_gateway.translator.extended import ExtendedResources
from dra_gateway.translator.rules import RulesError, RuleSet, load_rules
from dra_gateway.translator.translate import translate
from dra_gateway.translator.typos import WARNING_LIMIT


def _pod(*containers: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"},
            "spec": {"containers": [{"name": name, "image": "x", "resources": {"limits": limits}}
                                    for name, limits in containers]}}


def test_a_name_under_a_rules_domain_no_rule_reads_is_warned_about_with_a_did_you_mean(
        builtin_rules: RuleSet) -> None:
    plan = translate(_pod(("a", {"nvidia.com/gpu-typo": "1"}),
                          ("b", {"nvidia.com/gpu": "1", "nvidia.com/gpumemory": "1000"}),
                          ("c", {"volcano.sh/vgpu-memroy": "1000", "cpu": "1",
                                 "example.com/fpga": "1"})), builtin_rules)
    assert plan.refusal is None
    assert [w for w in plan.warnings if "dra-gateway rule" in w] == [
        'container "a": nvidia.com/gpu-typo: no dra-gateway rule reads it; did you mean '
        "nvidia.com/gpu?",
        'container "b": nvidia.com/gpumemory: no dra-gateway rule reads it; did you mean '
        "nvidia.com/gpumem?",
        'container "c": volcano.sh/vgpu-memroy: no dra-gateway rule reads it; did you mean '
        "volcano.sh/vgpu-memory?",
    ]
    assert [(u.container, u.resource, u.suggestion) for u in plan.unknown] == [
        ("a", "nvidia.com/gpu-typo", "nvidia.com/gpu"),
        ("b", "nvidia.com/gpumemory", "nvidia.com/gpumem"),
        ("c", "volcano.sh/vgpu-memroy", "volcano.sh/vgpu-memory")]


def test_a_name_under_a_rules_domain_far_from_every_known_one_is_still_warned_about(
        builtin_rules: RuleSet) -> None:
    plan = translate(_pod(("a", {"koordinator.sh/zzzzzzzz-qqqq": "1"})), builtin_rules)
    assert plan.warnings == ['container "a": koordinator.sh/zzzzzzzz-qqqq: no dra-gateway rule '
                             "reads it; the pod waits for a node offering it"]


def test_the_vendor_domains_are_those_of_the_loaded_rules(tmp_path: Path) -> None:
    (tmp_path / "fpga.yaml").write_text("""\
apiVersion: dra-gateway.io/v1alpha1
kind: TranslationRules
rules:
  - name: fpga
    resources: {example.com/fpga: {}}
    device: {className: fpga.example.com, count: 'r["example.com/fpga"]'}
""")
    rules = load_rules(tmp_path, builtin=False)
    assert rules.vendor_domains == frozenset({"example.com"})
    plan = translate(_pod(("a", {"example.com/fgpa-board": "1", "nvidia.com/gpu-typo": "1"})),
                     rules)
    assert plan.warnings == ['container "a": example.com/fgpa-board: no dra-gateway rule reads '
                             "it; did you mean example.com/fpga?"]
    builtin = load_rules()
    assert {"nvidia.com", "koordinator.sh", "volcano.sh", "aliyun.com",
            "tke.cloud.tencent.com"} <= builtin.vendor_domains
    # Only the enabled rules' domains: a disabled vendor's own names are its plugin's business.
    assert "huawei.com" not in builtin.vendor_domains


def test_a_name_a_device_class_declares_or_a_disabled_rule_reads_is_no_typo(
        builtin_rules: RuleSet) -> None:
    extended = ExtendedResources.from_device_classes([{
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "x"},
        "spec": {"extendedResourceName": "nvidia.com/gpu-typo"}}])
    plan = translate(_pod(("a", {"nvidia.com/gpu-typo": "1", "google.com/tpu": "1"})),
                     builtin_rules, extended=extended)
    assert plan.unknown == []
    assert not [w for w in plan.warnings if "dra-gateway rule" in w]


def test_a_typo_warning_is_one_line_within_the_limit_and_keeps_its_did_you_mean(
        builtin_rules: RuleSet) -> None:
    long_name = "c" * 63
    plan = translate(_pod((long_name, {"nvidia.com/gpumemory" + "x" * 200: "1"}),
                          ("d\nnewline", {"nvidia.com/gpu\nmem": "1"})), builtin_rules)
    assert len(plan.warnings) == 2
    for warning in plan.warnings:
        assert len(warning) <= WARNING_LIMIT, warning
        assert "\n" not in warning
        assert warning.isprintable()
    assert plan.warnings[0].endswith("no dra-gateway rule reads it; the pod waits for a node "
                                     "offering it")
    assert plan.warnings[1] == ('container "d\\nnewline": nvidia.com/gpu\\nmem: no dra-gateway '
                                "rule reads it; did you mean nvidia.com/gpumem?")


def test_the_explanation_gives_a_typo_the_reason_its_warning_gives(
        builtin_rules: RuleSet) -> None:
    pod = _pod(("a", {"nvidia.com/gpu": "1", "nvidia.com/gpumemory": "1000"}))
    plan = translate(pod, builtin_rules)
    explanation = explain(pod, builtin_rules, plan=plan)
    (container,) = explanation.containers
    (left,) = [item for item in container.left if item.resource == "nvidia.com/gpumemory"]
    assert left.reason == "no dra-gateway rule reads it; did you mean nvidia.com/gpumem?"
    assert f"nvidia.com/gpumemory: {left.reason}" in explanation.warnings[0]


def test_every_bad_amount_of_a_pod_is_refused_at_once(builtin_rules: RuleSet) -> None:
    plan = translate(_pod(("a", {"nvidia.com/gpu": "1.5", "nvidia.com/gpumem": "-3"}),
                          ("b", {"nvidia.com/gpu": "1"}),
                          ("c", {"nvidia.com/gpu": "abc"})), builtin_rules)
    assert plan.refusal is not None
    assert plan.refusal.message == (
        '2 containers are refused: container "a": 2 problems: nvidia.com/gpu is 1.5, not a '
        "whole number; ask for whole units; nvidia.com/gpumem is -3, a negative amount (rule "
        'hami); container "c": nvidia.com/gpu: invalid quantity "abc": a quantity starts with '
        'a number, e.g. "40Gi" or "500m" (rule nvidia-gpu)')
    assert (plan.refusal.container, plan.refusal.rule) == ("a", "hami")
    assert plan.refusal.resource == "nvidia.com/gpu, nvidia.com/gpumem"


def test_one_bad_amount_is_refused_as_before(builtin_rules: RuleSet) -> None:
    plan = translate(_pod(("a", {"nvidia.com/gpu": "-1"})), builtin_rules)
    assert plan.refusal is not None
    assert plan.refusal.message == ('container "a": nvidia.com/gpu is -1, a negative amount '
                                    "(rule nvidia-gpu)")


@pytest.mark.parametrize(("document", "expected"), [
    ("rules:\n- name: r\n  precedance: 10\n  resources: {example.com/a: {}}\n"
     "  device: {className: a.example.com}\n",
     "rules[0].precedance: unknown field; did you mean precedence?"),
    ("rules:\n- name: r\n  resources: {example.com/a: {}}\n  device: {clasName: a.example.com}\n",
     "rules[0].device.clasName: unknown field; did you mean className?"),
    ("rules:\n- name: r\n  resources: {example.com/a: {unti: Mi}}\n"
     "  device: {className: a.example.com}\n",
     'rules[0].resources["example.com/a"].unti: unknown field; did you mean unit?'),
    ("rules:\n- name: r\n  resources: {example.com/a: {}}\n  device: {className: a.example.com,"
     " selectors: [{attribute: x, vaules: '\"y\"'}]}\n",
     "rules[0].device.selectors[0].vaules: unknown field; did you mean values?"),
    ("overrides:\n- rule: nvidia-gpu\n  enabeld: false\n",
     "overrides[0].enabeld: unknown field; did you mean enabled?"),
    ("overide: []\n", "overide: unknown field; did you mean overrides?"),
    ("rules:\n- name: r\n  zzzzzz: 1\n  resources: {example.com/a: {}}\n"
     "  device: {className: a.example.com}\n", "rules[0].zzzzzz: unknown field"),
])
def test_an_unknown_rules_field_is_refused_with_the_closest_valid_name(
        tmp_path: Path, document: str, expected: str) -> None:
    path = tmp_path / "extra.yaml"
    path.write_text("apiVersion: dra-gateway.io/v1alpha1\nkind: TranslationRules\n" + document)
    with pytest.raises(RulesError) as caught:
        load_rules(path)
    assert f"{path}: {expected}" in caught.value.errors, caught.value.errors

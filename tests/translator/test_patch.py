"""The pod patch: claims, removed resources, gate, annotation; and pods left alone."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dra_gateway.kube import names
from dra_gateway.translator.rules import RuleSet
from dra_gateway.translator.translate import escape_pointer, translate

from .translator_support import checked, ctr, only_request, pod

GATE = {"name": names.SCHEDULING_GATE}
CLAIM = "dra-gateway"


def test_a_whole_gpu_pod_gets_the_complete_patch(builtin_rules: RuleSet) -> None:
    original = pod(ctr("main", limits={"nvidia.com/gpu": 1, "cpu": "2"},
                       requests={"nvidia.com/gpu": 1, "cpu": "1"}))
    plan = translate(original, builtin_rules)
    template = plan.templates[0]["metadata"]["name"]
    annotation = json.dumps({"containers": {"main": {
        "limits": {"nvidia.com/gpu": "1"}, "request": "main", "requests": {"nvidia.com/gpu": "1"},
        "rule": "nvidia-gpu"}}, "gated": True}, separators=(",", ":"), sort_keys=True)
    assert plan.patch == [
        {"op": "add", "path": "/spec/resourceClaims",
         "value": [{"name": CLAIM, "resourceClaimTemplateName": template}]},
        {"op": "add", "path": "/spec/containers/0/resources/claims",
         "value": [{"name": CLAIM, "request": "main"}]},
        {"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu"},
        {"op": "remove", "path": "/spec/containers/0/resources/requests/nvidia.com~1gpu"},
        {"op": "add", "path": "/metadata/annotations",
         "value": {names.ANNOTATION_TRANSLATED: annotation}},
        {"op": "add", "path": "/spec/schedulingGates", "value": [GATE]},
    ]
    assert plan.rules_applied == ["nvidia-gpu"]
    assert plan.templates[0]["metadata"] == {
        "name": template, "namespace": "team-a",
        "labels": {names.LABEL_MANAGED_BY: names.MANAGED_BY}}
    assert template.startswith("dra-gateway-")
    assert len(template) == len("dra-gateway-") + 10


def test_existing_claims_gates_and_annotations_are_appended_to(builtin_rules: RuleSet) -> None:
    original = pod(
        ctr("main", resources={"limits": {"nvidia.com/gpu": 1}, "claims": [{"name": "fpga"}]}),
        annotations={"team": "vision"},
        resourceClaims=[{"name": "fpga", "resourceClaimTemplateName": "fpga"}],
        schedulingGates=[{"name": "example.com/quota"}])
    plan = translate(original, builtin_rules)
    patched = checked(plan, original)
    spec = patched["spec"]
    assert [c["name"] for c in spec["resourceClaims"]] == ["fpga", CLAIM]
    assert spec["containers"][0]["resources"] == {
        "claims": [{"name": "fpga"}, {"name": CLAIM, "request": "main"}]}
    assert spec["schedulingGates"] == [{"name": "example.com/quota"}, GATE]
    assert patched["metadata"]["annotations"]["team"] == "vision"
    assert names.ANNOTATION_TRANSLATED in patched["metadata"]["annotations"]


def test_one_template_for_the_pod_and_one_request_per_container(builtin_rules: RuleSet) -> None:
    original = pod(ctr("a", limits={"nvidia.com/gpu": 1}), ctr("sidecar-free"),
                   ctr("b", limits={"nvidia.com/gpumem": 1000}),
                   init=(ctr("sidecar", limits={"nvidia.com/gpucores": 10},
                             restartPolicy="Always"),))
    plan = translate(original, builtin_rules)
    patched = checked(plan, original)
    (template,) = plan.templates
    devices = template["spec"]["spec"]["devices"]
    assert [r["name"] for r in devices["requests"]] == ["sidecar", "a", "b"]
    assert [c["requests"] for c in devices["config"]] == [["sidecar"], ["a"], ["b"]]
    assert patched["spec"]["initContainers"][0]["resources"]["claims"] == [
        {"name": CLAIM, "request": "sidecar"}]
    assert "resources" not in patched["spec"]["containers"][1]
    assert plan.rules_applied == ["hami", "nvidia-gpu"]


def test_an_init_container_covered_by_an_app_container_shares_its_devices(
        builtin_rules: RuleSet) -> None:
    original = pod(ctr("train", limits={"nvidia.com/gpu": 2}),
                   init=(ctr("warmup", limits={"nvidia.com/gpu": 1}),))
    plan = translate(original, builtin_rules)
    patched = checked(plan, original)
    assert only_request(plan)["name"] == "train"
    assert patched["spec"]["initContainers"][0]["resources"] == {
        "claims": [{"name": CLAIM, "request": "train"}]}
    record = json.loads(patched["metadata"]["annotations"][names.ANNOTATION_TRANSLATED])
    assert record["containers"]["warmup"]["request"] == "train"


def test_an_init_container_asking_for_something_else_gets_its_own_request(
        builtin_rules: RuleSet) -> None:
    original = pod(ctr("train", limits={"nvidia.com/gpu": 1}),
                   init=(ctr("prepare", limits={"nvidia.com/gpumem": 2000}),))
    plan = translate(original, builtin_rules)
    checked(plan, original)
    requests = plan.templates[0]["spec"]["spec"]["devices"]["requests"]
    assert [r["name"] for r in requests] == ["prepare", "train"]


def test_identical_requests_share_one_template_name(builtin_rules: RuleSet) -> None:
    first = translate(pod(ctr("main", limits={"nvidia.com/gpu": 1}), name="a"), builtin_rules)
    second = translate(pod(ctr("main", requests={"nvidia.com/gpu": "1"}), name="b",
                           namespace="team-b"), builtin_rules)
    other = translate(pod(ctr("main", limits={"nvidia.com/gpu": 2})), builtin_rules)
    assert first.templates[0]["metadata"]["name"] == second.templates[0]["metadata"]["name"]
    assert first.templates[0]["metadata"]["name"] != other.templates[0]["metadata"]["name"]
    assert second.templates[0]["metadata"]["namespace"] == "team-b"


def test_a_pod_without_namespace_gets_a_template_without_one(builtin_rules: RuleSet) -> None:
    plan = translate(pod(ctr("main", limits={"nvidia.com/gpu": 1}), namespace=None),
                     builtin_rules)
    assert "namespace" not in plan.templates[0]["metadata"]


def test_only_translated_keys_are_removed_and_other_resources_stay(
        builtin_rules: RuleSet) -> None:
    original = pod(ctr("main", limits={"cpu": "1", "nvidia.com/gpu": 1, "example.com/fpga": 1},
                       requests={"nvidia.com/gpu": 1}))
    patched = checked(translate(original, builtin_rules), original)
    assert patched["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "1", "example.com/fpga": 1},
        "claims": [{"name": CLAIM, "request": "main"}]}


UNCHANGED: list[tuple[str, dict[str, Any]]] = [
    ("gpu-free", pod(ctr("web", limits={"cpu": "1", "memory": "1Gi"}))),
    ("no resources at all", pod(ctr("web"))),
    ("unknown vendor", pod(ctr("fpga", limits={"example.com/fpga": 2}))),
    ("KEP-5004 name", pod(ctr("main", limits={
        "deviceclass.resource.kubernetes.io/gpu.nvidia.com": 1}))),
    ("DRA-native on another class", pod(
        ctr("cuda", resources={"claims": [{"name": "gpu"}]}),
        resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "nvidia-single"}])),
    ("zero amounts", pod(ctr("main", limits={"nvidia.com/gpu": 0}))),
    ("disabled vendor", pod(ctr("tpu", limits={"google.com/tpu": 4}))),
]


@pytest.mark.parametrize("original", [c[1] for c in UNCHANGED], ids=[c[0] for c in UNCHANGED])
def test_pods_that_need_nothing_come_out_unchanged(builtin_rules: RuleSet,
                                                   original: dict[str, Any]) -> None:
    plan = translate(original, builtin_rules)
    assert (plan.patch, plan.templates, plan.refusal, plan.rules_applied) == ([], [], None, [])


def test_translating_a_translated_pod_does_nothing(builtin_rules: RuleSet) -> None:
    original = pod(ctr("main", limits={"nvidia.com/gpumem": 3000}),
                   annotations={"nvidia.com/use-gputype": "H100"})
    once = checked(translate(original, builtin_rules), original)
    again = translate(once, builtin_rules)
    assert (again.patch, again.templates, again.refusal) == ([], [], None)


def test_a_pod_using_gateway_templates_natively_is_gated(builtin_rules: RuleSet) -> None:
    native = pod(ctr("main", resources={"claims": [{"name": "gpu"}]}),
                 resourceClaims=[{"name": "gpu",
                                  "resourceClaimTemplateName": "dra-gateway-0123456789"}])
    plan = translate(native, builtin_rules)
    assert plan.patch == [{"op": "add", "path": "/spec/schedulingGates", "value": [GATE]}]
    assert plan.templates == []


def test_class_lookup_gates_pods_whose_own_claims_use_a_gateway_class(
        builtin_rules: RuleSet) -> None:
    seen: list[tuple[str, str, str]] = []

    def lookup(kind: str, namespace: str, name: str) -> frozenset[str] | None:
        seen.append((kind, namespace, name))
        return {"shared-a100": frozenset({names.GPU_CLASS}),
                "nvidia": frozenset({names.NVIDIA_GPU_CLASS})}.get(name)

    gated = pod(ctr("main"), resourceClaims=[{"name": "g", "resourceClaimName": "shared-a100"}],
                schedulingGates=[{"name": "other"}])
    plain = pod(ctr("main"), resourceClaims=[{"name": "g", "resourceClaimTemplateName": "nvidia"}])
    assert translate(gated, builtin_rules, class_lookup=lookup).patch == [
        {"op": "add", "path": "/spec/schedulingGates/-", "value": GATE}]
    assert translate(plain, builtin_rules, class_lookup=lookup).patch == []
    assert seen == [("ResourceClaim", "team-a", "shared-a100"),
                    ("ResourceClaimTemplate", "team-a", "nvidia")]


def test_scheduler_served_classes_are_not_gated(builtin_rules: RuleSet) -> None:
    original = pod(ctr("main", limits={"amd.com/gpu": 1}))
    plan = translate(original, builtin_rules)
    patched = checked(plan, original)
    assert "schedulingGates" not in patched["spec"]
    assert "config" not in plan.templates[0]["spec"]["spec"]["devices"]


def test_the_input_pod_is_not_modified(builtin_rules: RuleSet) -> None:
    original = pod(ctr("main", limits={"nvidia.com/gpu": 1}))
    before = json.dumps(original, sort_keys=True)
    translate(original, builtin_rules)
    translate(original, builtin_rules)  # the cached path too
    assert json.dumps(original, sort_keys=True) == before


def test_json_pointer_escaping() -> None:
    assert escape_pointer("a/b~c") == "a~1b~0c"


def test_a_native_gateway_pod_with_zero_legacy_amounts_is_still_gated(
        builtin_rules: RuleSet) -> None:
    native = pod(ctr("main", resources={"limits": {"nvidia.com/gpu": 0},
                                        "claims": [{"name": "gpu"}]}),
                 resourceClaims=[{"name": "gpu",
                                  "resourceClaimTemplateName": "dra-gateway-0123456789"}])
    assert translate(native, builtin_rules).patch == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [GATE]}]


def test_changing_a_returned_template_does_not_change_later_plans(
        builtin_rules: RuleSet) -> None:
    original = pod(ctr("main", limits={"nvidia.com/gpu": 3}))
    first = translate(original, builtin_rules)
    first.templates[0]["spec"]["spec"]["devices"]["requests"][0]["exactly"]["count"] = 99
    first.templates[0]["metadata"]["labels"]["x"] = "y"
    second = translate(original, builtin_rules)
    assert only_request(second)["exactly"]["count"] == 3
    assert second.templates[0]["metadata"]["labels"] == {
        names.LABEL_MANAGED_BY: names.MANAGED_BY}


def test_malformed_values_are_refused_not_crashed_on(builtin_rules: RuleSet) -> None:
    plan = translate(pod(ctr("main", limits={"nvidia.com/gpu": [1]}),
                         annotations={"nvidia.com/use-gputype": "A100"}), builtin_rules)
    assert plan.refusal is not None
    assert plan.refusal.message == (
        'container "main": nvidia.com/gpu: invalid quantity "[1]": a quantity starts with a '
        'number, e.g. "40Gi" or "500m" (rule nvidia-gpu)')


def test_a_translated_pod_template_that_lost_its_gate_gets_it_back(
        builtin_rules: RuleSet) -> None:
    original = pod(ctr("main", limits={"nvidia.com/gpu": 1}))
    translated = checked(translate(original, builtin_rules), original)
    del translated["spec"]["schedulingGates"]
    again = translate(translated, builtin_rules)
    assert (again.patch, again.templates) == (
        [{"op": "add", "path": "/spec/schedulingGates", "value": [GATE]}], [])


def test_retranslating_a_scheduler_served_pod_adds_no_gate(builtin_rules: RuleSet) -> None:
    original = pod(ctr("main", limits={"amd.com/gpu": 1}))
    translated = checked(translate(original, builtin_rules), original)
    assert translate(translated, builtin_rules).patch == []


def test_class_lookup_overrides_the_template_name_heuristic(builtin_rules: RuleSet) -> None:
    native = pod(ctr("main", resources={"claims": [{"name": "gpu"}]}),
                 resourceClaims=[{"name": "gpu",
                                  "resourceClaimTemplateName": "dra-gateway-0123456789"}])
    amd = frozenset({names.AMD_GPU_CLASS})
    assert translate(native, builtin_rules, class_lookup=lambda *_: amd).patch == []
    assert translate(native, builtin_rules, class_lookup=lambda *_: None).patch == [
        {"op": "add", "path": "/spec/schedulingGates", "value": [GATE]}]


def test_a_container_without_a_name_is_pointed_at_its_request_too(
        builtin_rules: RuleSet) -> None:
    # Mutating admission runs before the API server validates the pod: a container may come
    # without a name, and its request is then named "" (a request all the same).
    unnamed = pod({"resources": {"limits": {"nvidia.com/gpu": 1}}})
    patch = translate(unnamed, builtin_rules).patch
    assert {"op": "add", "path": "/spec/containers/0/resources/claims",
            "value": [{"name": CLAIM, "request": ""}]} in patch
    assert {"op": "remove", "path": "/spec/containers/0/resources/limits"} in patch

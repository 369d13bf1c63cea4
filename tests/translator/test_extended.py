"""Names DeviceClasses declare as spec.extendedResourceName: left to kube-scheduler, or taken back
by a rule (`extendedResourceNames: translate`), and said so."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from testkit import EXAMPLES

from dra_gateway.cli import main
from dra_gateway.kube import names
from dra_gateway.translator.extended import (
    ExtendedResources,
    deferred_resources,
    device_class_objects,
    report,
)
from dra_gateway.translator.rules import RulesError, RuleSet, load_rules
from dra_gateway.translator.translate import translate

from .translator_support import checked, ctr, only_request, pod


def device_class(name: str, resource: str | None, *, created: str | None = None
                 ) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if created is not None:
        meta["creationTimestamp"] = created
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": "true"}}]}
    if resource is not None:
        spec["extendedResourceName"] = resource
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": meta,
            "spec": spec}


NVIDIA_GPU = ExtendedResources.from_device_classes(
    [device_class("gpu.nvidia.com", "nvidia.com/gpu")])

TAKE_BACK = """
apiVersion: dra-gateway.io/v1alpha1
kind: TranslationRules
overrides:
  - rule: nvidia-gpu
    extendedResourceNames: translate
"""


def rules_with(text: str, tmp_path: Path) -> RuleSet:
    path = tmp_path / "site.yaml"
    path.write_text(text)
    return load_rules(path)


def test_a_name_a_device_class_declares_is_left_to_kube_scheduler_with_a_warning(
        builtin_rules: RuleSet) -> None:
    original = pod(ctr("main", {"nvidia.com/gpu": "2"}))
    plan = translate(original, builtin_rules, extended=NVIDIA_GPU)
    assert (plan.patch, plan.templates, plan.refusal) == ([], [], None)
    (warning,) = plan.warnings
    assert warning == (
        'container "main": nvidia.com/gpu left to kube-scheduler: DeviceClass gpu.nvidia.com '
        "declares nvidia.com/gpu (spec.extendedResourceName); extendedResourceNames: "
        "translate on rule nvidia-gpu would translate it")
    # The API server may truncate admission warnings over 256 characters.
    assert len(warning) <= 256
    (use,) = plan.extended
    assert (use.container, use.resource, use.device_class, use.rule, use.action) == (
        "main", "nvidia.com/gpu", "gpu.nvidia.com", "nvidia-gpu", "deferred")


def test_without_declarations_the_same_pod_is_translated(builtin_rules: RuleSet) -> None:
    original = pod(ctr("main", {"nvidia.com/gpu": "2"}))
    for extended in (None, ExtendedResources(),
                     ExtendedResources.from_device_classes(
                         [device_class("gpu.amd.com", "amd.com/gpu"),
                          device_class("plain.example.com", None)])):
        plan = translate(original, builtin_rules, extended=extended)
        assert only_request(plan)["exactly"]["count"] == 2
        assert (plan.warnings, plan.extended) == ([], [])


def test_a_hami_container_with_a_declared_name_is_left_whole(builtin_rules: RuleSet) -> None:
    # Splitting the request (nvidia.com/gpu to the scheduler, the memory to the gateway) would
    # give the container two allocators: the whole HAMi request stays.
    original = pod(ctr("main", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"}))
    plan = translate(original, builtin_rules, extended=NVIDIA_GPU)
    assert plan.patch == []
    (warning,) = plan.warnings
    assert warning.startswith('container "main": nvidia.com/gpu, nvidia.com/gpumem left to '
                              "kube-scheduler: DeviceClass gpu.nvidia.com declares "
                              "nvidia.com/gpu")
    assert "rule hami" in warning
    assert [(u.rule, u.resources) for u in plan.extended] == [
        ("hami", ("nvidia.com/gpu", "nvidia.com/gpumem"))]
    # A HAMi request without the declared name is the gateway's as before.
    plan = translate(pod(ctr("main", {"nvidia.com/gpumem": "8000"})), builtin_rules,
                     extended=NVIDIA_GPU)
    assert plan.templates
    assert plan.extended == []


def test_the_other_containers_of_the_pod_are_still_translated(builtin_rules: RuleSet) -> None:
    original = pod(ctr("cuda", {"nvidia.com/gpu": "1"}), ctr("rocm", {"amd.com/gpu": "1"}))
    plan = translate(original, builtin_rules, extended=NVIDIA_GPU)
    patched = checked(plan, original)
    assert only_request(plan)["name"] == "rocm"
    cuda, rocm = patched["spec"]["containers"]
    assert cuda["resources"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert rocm["resources"] == {"claims": [{"name": "dra-gateway", "request": "rocm"}]}
    record = patched["metadata"]["annotations"][names.ANNOTATION_TRANSLATED]
    assert "cuda" not in record
    assert len(plan.warnings) == 1


def test_a_rule_set_to_translate_takes_the_name_back(builtin_rules: RuleSet,
                                                     tmp_path: Path) -> None:
    rules = rules_with(TAKE_BACK, tmp_path)
    assert rules.rule("nvidia-gpu").extended_resource_names == "translate"
    assert rules.rule("hami").extended_resource_names == "defer"
    original = pod(ctr("main", {"nvidia.com/gpu": "2"}))
    plan = translate(original, rules, extended=NVIDIA_GPU)
    checked(plan, original)
    assert only_request(plan)["exactly"] == {
        "deviceClassName": names.GPU_CLASS, "allocationMode": "ExactCount", "count": 2}
    assert plan.warnings == []
    (use,) = plan.extended
    assert (use.rule, use.action, use.device_class) == ("nvidia-gpu", "translated",
                                                          "gpu.nvidia.com")
    # The setting is the rule's: HAMi still steps aside.
    plan = translate(pod(ctr("main", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"})),
                     rules, extended=NVIDIA_GPU)
    assert plan.patch == []
    assert [u.action for u in plan.extended] == ["deferred"]


def test_a_rule_of_its_own_may_say_translate(tmp_path: Path) -> None:
    text = (EXAMPLES / "rules" / "new-vendor.yaml"
            ).read_text()
    assert "extendedResourceNames" not in text
    text = text.replace("    device:\n", "    extendedResourceNames: translate\n    device:\n", 1)
    rules = rules_with(text, tmp_path)
    extended = ExtendedResources.from_device_classes(
        [device_class("npu.example.com", "example.com/npu")])
    plan = translate(pod(ctr("main", {"example.com/npu": "1"})), rules, extended=extended)
    assert plan.templates
    assert [u.action for u in plan.extended] == ["translated"]


def test_an_unknown_extended_resource_names_value_is_a_load_error_with_its_path(
        tmp_path: Path) -> None:
    with pytest.raises(RulesError) as caught:
        rules_with(TAKE_BACK.replace("translate", "Translate"), tmp_path)
    (error,) = caught.value.errors
    assert error.endswith("site.yaml: overrides[0].extendedResourceNames: must be 'defer' or "
                          "'translate', not \"Translate\"")


def test_a_dra_gateway_class_declaring_a_name_is_still_left_to_kube_scheduler(
        builtin_rules: RuleSet) -> None:
    extended = ExtendedResources.from_device_classes(
        [device_class(names.GPU_CLASS, "nvidia.com/gpu")])
    plan = translate(pod(ctr("main", {"nvidia.com/gpu": "1"})), builtin_rules,
                     extended=extended)
    assert plan.patch == []
    (warning,) = plan.warnings
    assert f"DeviceClass {names.GPU_CLASS} (a dra-gateway class: no shares) declares" in warning
    assert len(warning) <= 256


def test_a_zero_amount_of_a_declared_name_is_left_alone_without_a_word(
        builtin_rules: RuleSet) -> None:
    plan = translate(pod(ctr("main", {"nvidia.com/gpu": "0"})), builtin_rules,
                     extended=NVIDIA_GPU)
    assert (plan.patch, plan.warnings, plan.extended) == ([], [], [])


def test_the_shape_cache_tells_clusters_with_and_without_the_declaration_apart(
        tmp_path: Path) -> None:
    rules = load_rules()  # its own cache
    original = pod(ctr("main", {"nvidia.com/gpu": "1"}))
    assert translate(original, rules).templates
    assert not translate(original, rules, extended=NVIDIA_GPU).templates
    assert translate(original, rules).templates
    other = ExtendedResources.from_device_classes([device_class("x.example.com",
                                                                "nvidia.com/gpu")])
    assert "DeviceClass x.example.com" in translate(original, rules, extended=other).warnings[0]


def test_the_class_created_last_serves_a_name_several_classes_declare() -> None:
    extended = ExtendedResources.from_device_classes([
        device_class("b.example.com", "nvidia.com/gpu", created="2026-01-01T00:00:00Z"),
        device_class("old.example.com", "nvidia.com/gpu", created="2025-01-01T00:00:00Z"),
        device_class("a.example.com", "nvidia.com/gpu", created="2026-01-01T00:00:00Z"),
        device_class("odd.example.com", ""),
        {"metadata": {"name": "broken.example.com"}, "spec": {"extendedResourceName": 3}},
    ])
    assert extended.classes == {
        "nvidia.com/gpu": ("a.example.com", "b.example.com", "old.example.com")}


def test_device_classes_are_read_from_objects_and_lists_and_other_kinds_skipped() -> None:
    first, second = device_class("a.example.com", "a.example.com/x"), device_class("b", None)
    documents = [first, {"apiVersion": "v1", "kind": "List", "items": [second, {"kind": "Pod"}]},
                 {"kind": "ConfigMap"}, "text", None]
    assert device_class_objects(documents) == [first, second]


def test_deferred_resources_are_the_declared_name_and_its_rules_companions(
        builtin_rules: RuleSet, tmp_path: Path) -> None:
    container = ["nvidia.com/gpu", "nvidia.com/gpumem", "cpu"]
    assert deferred_resources(container, builtin_rules, NVIDIA_GPU) == {
        "nvidia.com/gpu", "nvidia.com/gpumem"}
    assert deferred_resources(["nvidia.com/gpumem"], builtin_rules, NVIDIA_GPU) == set()
    assert deferred_resources(container, builtin_rules, ExtendedResources()) == set()
    everything_translates = rules_with(TAKE_BACK + """
  - rule: hami
    extendedResourceNames: translate
  - rule: hami-mig
    extendedResourceNames: translate
""", tmp_path)
    assert deferred_resources(container, everything_translates, NVIDIA_GPU) == set()


def test_the_report_names_classes_and_the_rules_that_defer_or_translate(
        builtin_rules: RuleSet, tmp_path: Path) -> None:
    extended = ExtendedResources.from_device_classes([
        device_class("gpu.nvidia.com", "nvidia.com/gpu", created="2026-01-01T00:00:00Z"),
        device_class(names.GPU_CLASS, "nvidia.com/gpu", created="2025-01-01T00:00:00Z"),
        device_class("unrelated.example.com", "example.com/fpga"),
    ])
    (line,) = report(builtin_rules, extended)
    assert line.startswith(
        "nvidia.com/gpu: DeviceClasses gpu.nvidia.com, gpu.dra-gateway.io declare nvidia.com/gpu "
        "(spec.extendedResourceName); kube-scheduler uses gpu.nvidia.com, the newest; rules "
        "gke-mig, hami, hami-mig, nvidia-gpu, nvidia-mig-single leave it to kube-scheduler (set "
        "extendedResourceNames: translate on a rule to translate it)")
    assert "rule hami: nvidia.com/gpucores, nvidia.com/gpumem" in line
    own = ExtendedResources.from_device_classes([device_class(names.GPU_CLASS,
                                                              "nvidia.com/gpu")])
    lines = report(rules_with(TAKE_BACK, tmp_path), own)
    # The MIG rules on nvidia.com/gpu decide as nvidia-gpu does (extendedResourceNamesFrom).
    assert ("rules gke-mig, nvidia-gpu, nvidia-mig-single translate it anyway "
            "(extendedResourceNames: translate)") in lines[0]
    assert lines[1] == (
        "nvidia.com/gpu: gpu.dra-gateway.io is a dra-gateway DeviceClass: kube-scheduler "
        "allocates its devices for nvidia.com/gpu itself, outside the gateway's allocator "
        "(whole devices, no shares, no enforcement); remove spec.extendedResourceName from "
        "DeviceClass gpu.dra-gateway.io, or set extendedResourceNames: translate on rules "
        "hami, hami-mig")


# ---- the CLI -----------------------------------------------------------------------------------


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def test_rules_check_notes_the_names_a_device_class_file_declares(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    classes = tmp_path / "classes.yaml"
    classes.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [
        device_class("gpu.nvidia.com", "nvidia.com/gpu")]}))
    rules = tmp_path / "site.yaml"
    rules.write_text(TAKE_BACK)
    code, out, err = run(capsys, "rules", "check", str(rules), "--device-classes", str(classes))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].startswith("ok: ")
    assert lines[1].startswith("note: nvidia.com/gpu: DeviceClass gpu.nvidia.com declares "
                               "nvidia.com/gpu (spec.extendedResourceName); rules hami, hami-mig "
                               "leave it to kube-scheduler (set extendedResourceNames: translate "
                               "on a rule to translate it); ")
    assert lines[1].endswith("; rules gke-mig, nvidia-gpu, nvidia-mig-single translate it "
                             "anyway (extendedResourceNames: translate)")
    # Without the file, nothing to note.
    code, out, _ = run(capsys, "rules", "check", str(rules))
    assert (code, len(out.splitlines())) == (0, 1)


def test_rules_check_names_a_device_class_file_it_cannot_read(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rules = tmp_path / "site.yaml"
    rules.write_text(TAKE_BACK)
    code, out, err = run(capsys, "rules", "check", str(rules), "--device-classes",
                         str(tmp_path / "missing.yaml"))
    assert (code, out) == (2, "")
    assert err.startswith(f"error: cannot read --device-classes {tmp_path / 'missing.yaml'}: ")
    empty = tmp_path / "empty.yaml"
    empty.write_text(yaml.safe_dump({"kind": "ConfigMap"}))
    code, out, err = run(capsys, "rules", "check", str(rules), "--device-classes", str(empty))
    assert code == 0
    assert err == (f"warning: --device-classes {empty} holds no DeviceClass; pass the output of "
                   "`kubectl get deviceclasses -o yaml`\n")


def test_translate_leaves_declared_names_in_place_as_the_webhook_does(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    deployment = {"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "d", "namespace": "a"},
                  "spec": {"template": {"spec": {"containers": [
                      {"name": "main", "image": "x",
                       "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}}}
    manifests = tmp_path / "in.yaml"
    manifests.write_text(yaml.safe_dump(deployment))
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(yaml.safe_dump(
        device_class("gpu.nvidia.com", "nvidia.com/gpu")).encode())))
    code, out, err = run(capsys, "translate", "-f", str(manifests), "--device-classes", "-")
    assert code == 0
    assert list(yaml.safe_load_all(out)) == [deployment]
    assert err == (
        "warning: Deployment a/d (spec.template): container \"main\": nvidia.com/gpu left to "
        "kube-scheduler: DeviceClass gpu.nvidia.com declares nvidia.com/gpu "
        "(spec.extendedResourceName); extendedResourceNames: translate on rule nvidia-gpu "
        "would translate it\n")
    code, _, err = run(capsys, "translate", "-f", "-", "--device-classes", "-")
    assert (code, err) == (2, "error: - (standard input) can be given only once, to -f or to "
                              "--device-classes\n")

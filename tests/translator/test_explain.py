"""`dra-gateway translate --explain`: per container, the rule that fired or why none did, what
each legacy key became, and what stays in the container and why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from testkit import EXAMPLES

from dra_gateway.translator import containers
from dra_gateway.translator.explaining import explain
from dra_gateway.translator.manifests import rewrite_manifests
from dra_gateway.translator.rules import RuleSet

from .translator_support import ctr, pod, run_cli

EXAMPLE_FILES = sorted([*(EXAMPLES / "pods").glob("*.yaml"),
                        *(EXAMPLES / "pods-other-vendors").glob("*.yaml")])


def write(tmp_path: Path, *documents: dict[str, Any]) -> str:
    path = tmp_path / "pods.yaml"
    path.write_text(yaml.safe_dump_all(documents))
    return str(path)


def explained(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[Any]]:
    code, out, _ = run_cli(capsys, "translate", "--explain", "-o", "json", *args)
    return code, json.loads(out)


def test_text_names_the_rule_the_amounts_and_what_they_became(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run_cli(capsys, "translate", "--explain", "-f",
                             str(EXAMPLES / "pods" / "gpushare.yaml"))
    assert (code, err) == (0, "")
    template = out.split("ResourceClaimTemplate ", 1)[1].split(",", 1)[0]
    assert out.splitlines() == [
        f"Pod research/gpushare-notebook: translated: "
        f"ResourceClaimTemplate {template}, scheduling gate dra-gateway.io/allocation",
        '  container "jupyter": rule gpushare (builtin/alibaba.yaml) -> request "jupyter"',
        "    aliyun.com/gpu-mem: 5.5 (x Gi = 5632Mi) -> capacity memory 5632Mi, config memory "
        "5632Mi",
        "    device: 1 device of class gpu.dra-gateway.io, capacity memory 5632Mi, cores 1",
        "    config: GpuShareConfig memory 5632Mi, enforcement none",
    ]


def test_json_says_which_annotation_became_a_selector_and_which_the_policy(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, (entry,) = explained(capsys, "-f", str(EXAMPLES / "pods" / "hami-placement.yaml"))
    assert code == 0
    assert (entry["where"], entry["outcome"], entry["gated"]) == (
        "Pod inference/train-small", "translated", True)
    (container,) = entry["containers"]
    assert (container["rule"], container["request"], container["outcome"]) == (
        "hami", "trainer", "translated")
    became = {key["key"]: key["became"] for key in container["keys"]}
    assert became == {
        "nvidia.com/gpu": ["count 1"],
        "nvidia.com/gpucores": ["capacity cores 25", "config cores 25"],
        "nvidia.com/gpumem": ["capacity memory 10000Mi", "config memory 10000Mi"],
        "nvidia.com/nouse-gputype": ["selector 1"],
        "hami.io/node-scheduler-policy": ["config policy spread"],
    }
    gpumem = next(k for k in container["keys"] if k["key"] == "nvidia.com/gpumem")
    assert gpumem == {"key": "nvidia.com/gpumem", "kind": "resource", "value": "10000",
                      "amount": 10000 * 2**20, "unit": "Mi", "became": gpumem["became"]}
    assert container["config"]["policy"] == "spread"
    assert container["left"] == []


def test_what_stays_in_a_container_is_named_with_its_reason(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = write(tmp_path, pod(
        ctr("main", limits={"nvidia.com/gpumem": 4000, "cpu": "2", "iluvatar.ai/vgpu": 1}),
        ctr("hint", limits={"nvidia.com/priority": 1}),
        ctr("idle", limits={"nvidia.com/gpu": 0})))
    code, (entry,) = explained(capsys, "-f", source)
    assert code == 0
    main, hint, idle = entry["containers"]
    assert main["left"] == [
        {"resource": "cpu", "reason": "not a GPU resource any enabled rule reads"},
        {"resource": "iluvatar.ai/vgpu", "reason": "only rule iluvatar reads it, and it is "
         "disabled (the warning says how to enable it)"}]
    assert (hint["outcome"], hint["rule"]) == ("no-rule", "")
    assert hint["why"] == (
        "no enabled rule applies: rule hami-mig reads nvidia.com/priority but applies only to a "
        "container asking for nvidia.com/gpucores or nvidia.com/gpumem or "
        "nvidia.com/gpumem-percentage; rule hami reads nvidia.com/priority but applies only to a "
        "container asking for nvidia.com/gpucores or nvidia.com/gpumem or "
        "nvidia.com/gpumem-percentage; rule gke-mig reads nvidia.com/priority but applies only "
        "to a container asking for nvidia.com/gpu; rule nvidia-mig-single reads "
        "nvidia.com/priority but applies only to a container asking for nvidia.com/gpu; rule "
        "nvidia-gpu reads nvidia.com/priority but applies only to a container asking for "
        "nvidia.com/gpu")
    assert hint["left"] == [{"resource": "nvidia.com/priority",
                             "reason": "no enabled rule applies"}]
    assert (idle["outcome"], idle["rule"], idle["left"]) == (
        "zero", "nvidia-gpu", [{"resource": "nvidia.com/gpu", "reason": "a zero amount"}])


def test_a_rule_whose_annotation_is_missing_is_named_with_what_it_needs(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rules = tmp_path / "mig-only.yaml"
    rules.write_text("""\
apiVersion: dra-gateway.io/v1alpha1
kind: TranslationRules
overrides:
  - {rule: hami, enabled: false}
""")
    source = write(tmp_path, pod(ctr("main", limits={"nvidia.com/gpumem": 4000})))
    code, (entry,) = explained(capsys, "-f", source, "--rules", str(rules))
    assert code == 0
    (container,) = entry["containers"]
    assert container["why"] == ("no enabled rule applies: rule hami-mig needs annotation "
                                "nvidia.com/vgpu-mode: mig")


def test_an_init_container_sharing_a_request_says_whose(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = write(tmp_path, pod(ctr("main", limits={"nvidia.com/gpu": 2}),
                                 init=(ctr("warm", limits={"nvidia.com/gpu": 1}),)))
    _, (entry,) = explained(capsys, "-f", source)
    warm, main = entry["containers"]
    assert (warm["kind"], warm["outcome"], warm["request"]) == (
        "initContainer", "shares-request", "main")
    assert warm["why"] == ('container "main"\'s request covers this init container\'s, so it '
                           "uses that request (the scheduler counts the larger of the two)")
    assert (main["outcome"], main["request"]) == ("translated", "main")


def test_a_name_a_device_class_declares_is_explained_as_left_to_kube_scheduler(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    classes = tmp_path / "classes.yaml"
    classes.write_text("apiVersion: resource.k8s.io/v1\nkind: DeviceClass\nmetadata:\n"
                       "  name: gpu.nvidia.com\nspec:\n  extendedResourceName: nvidia.com/gpu\n")
    source = write(tmp_path, pod(ctr("main", limits={"nvidia.com/gpu": 1})))
    code, (entry,) = explained(capsys, "-f", source, "--device-classes", str(classes))
    assert (code, entry["outcome"]) == (0, "unchanged")
    (container,) = entry["containers"]
    assert (container["outcome"], container["rule"]) == ("deferred", "nvidia-gpu")
    assert container["left"] == [{"resource": "nvidia.com/gpu", "reason": (
        "DeviceClass gpu.nvidia.com declares nvidia.com/gpu: kube-scheduler serves the "
        "container")}]


def test_a_refused_pod_is_explained_and_exits_1(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = write(tmp_path, pod(ctr("main", limits={"aliyun.com/gpu-mem": 4,
                                                     "aliyun.com/gpu-core.percentage": 120}),
                                 ctr("side", limits={"nvidia.com/gpu": 1})))
    code, out, err = run_cli(capsys, "translate", "--explain", "-f", source)
    assert code == 1
    message = ('container "main": aliyun.com/gpu-core.percentage is a share of one card, at '
               "most 100 (rule gpushare)")
    assert err == f"error: Pod team-a/p: {message}\n"
    assert out.splitlines() == [
        f"Pod team-a/p: refused: {message}",
        f'  container "main": refused: {message}',
        "    left aliyun.com/gpu-core.percentage: the pod is refused",
        "    left aliyun.com/gpu-mem: the pod is refused",
        '  container "side": refused: the pod is refused (container "main"), so nothing of it '
        "is translated",
        "    left nvidia.com/gpu: the pod is refused",
    ]


def test_a_pod_translated_before_is_said_so(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = write(tmp_path, pod(ctr("main", limits={"nvidia.com/gpu": 1}),
                                 annotations={"dra-gateway.io/translated": "{}"}))
    _, (entry,) = explained(capsys, "-f", source)
    assert entry["outcome"] == "translated-before"
    assert entry["containers"][0]["left"] == [{"resource": "nvidia.com/gpu",
                                               "reason": "translated before"}]


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=[p.name for p in EXAMPLE_FILES])
def test_the_explanation_of_every_example_matches_its_translation(
        builtin_rules: RuleSet, path: Path) -> None:
    result = rewrite_manifests(list(yaml.safe_load_all(path.read_text())), builtin_rules)
    assert result.pods
    for found in result.pods:
        assert found.plan is not None
        explanation = explain(found.pod, builtin_rules, plan=found.plan)
        # A request with alternatives (firstAvailable) is explained by its first.
        requests = {r["name"]: r.get("exactly") or {
                        k: v for k, v in r["firstAvailable"][0].items() if k != "name"}
                    for t in found.plan.templates
                    for r in t["spec"]["spec"]["devices"]["requests"]}
        for container in explanation.containers:
            if container.outcome == "translated":
                assert requests[container.request] == container.device, found.where
            elif container.outcome == "shares-request":
                assert container.request in requests
            else:
                assert container.name not in requests
        assert found.plan.warnings == list(explanation.warnings)


def test_the_explanation_says_which_pod_group_a_pod_belongs_to_and_why(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    kueue = pod(ctr("main", limits={"nvidia.com/gpu": 2}), name="w0", annotations={
        "kueue.x-k8s.io/pod-group-total-count": "4", "dra-gateway.io/group-models": "Any"})
    kueue["metadata"]["labels"] = {"kueue.x-k8s.io/pod-group-name": "train"}
    volcano = pod(ctr("main", limits={"nvidia.com/gpu": 2}), name="w1",
                  annotations={"scheduling.k8s.io/group-name": "job-1"})
    odd = pod(ctr("main", limits={"nvidia.com/gpu": 1}), name="w2", annotations={
        "dra-gateway.io/group": "g", "dra-gateway.io/group-size": "many"})
    code, out, _ = run_cli(capsys, "translate", "--explain", "-f",
                           write(tmp_path, kueue, volcano, odd))
    assert code == 0
    assert ("  pod group team-a/train (kueue): 4 member(s) allocated together, all or nothing, "
            "from label kueue.x-k8s.io/pod-group-name=train, annotation "
            "kueue.x-k8s.io/pod-group-total-count=4; dra-gateway.io/group-models=Any\n") in out
    assert ("  pod group team-a/job-1 (volcano), from annotation scheduling.k8s.io/group-name="
            "job-1: its size is PodGroup job-1's, read in the cluster\n") in out
    assert "  pod group team-a/g cannot be used: dra-gateway.io/group-size is 'many'" in out
    code, (entry,) = explained(capsys, "-f", write(tmp_path, kueue))
    assert entry["group"].startswith("pod group team-a/train (kueue)")
    _, (plain,) = explained(capsys, "-f", write(tmp_path, pod(ctr("main", limits={
        "nvidia.com/gpu": 1}))))
    assert plain["group"] == ""


def test_the_explanation_is_read_from_the_translation_without_planning_again(
        builtin_rules: RuleSet, monkeypatch: pytest.MonkeyPatch) -> None:
    (path,) = [p for p in EXAMPLE_FILES if p.name == "hami-placement.yaml"]
    (found,) = rewrite_manifests(list(yaml.safe_load_all(path.read_text())), builtin_rules).pods
    assert found.plan is not None

    def planned_again(*args: object, **kwargs: object) -> None:
        raise AssertionError("a container was planned again")

    # Every container's planning starts by choosing its rule.
    monkeypatch.setattr(containers, "_choose_rule", planned_again)
    explanation = explain(found.pod, builtin_rules, plan=found.plan)
    assert explanation.outcome == "translated"
    assert [c.outcome for c in explanation.containers] == ["translated"]

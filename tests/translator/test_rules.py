"""Loading rules: sources, overrides, precedence, and errors with their field paths."""

from __future__ import annotations

from pathlib import Path

import pytest
from testkit import EXAMPLES

from dra_gateway.kube import names
from dra_gateway.translator.rules import RulesError, RuleSet, load_rules
from dra_gateway.translator.translate import translate

from .translator_support import checked, ctr, only_request, parameters_of, pod

HEADER = "apiVersion: dra-gateway.io/v1alpha1\nkind: TranslationRules\n"
UNITS = 'use one of "", "Ki", "Mi", "Gi", "Ti", "k", "M", "G", "T"'


def load_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str,
               builtin: bool = True) -> str:
    monkeypatch.chdir(tmp_path)
    Path("extra.yaml").write_text(text)
    with pytest.raises(RulesError) as caught:
        load_rules("extra.yaml", builtin=builtin)
    return str(caught.value)


def test_builtin_rules_cover_every_protocol(builtin_rules: RuleSet) -> None:
    assert builtin_rules.legacy_resource_names() == frozenset({
        "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/gpumem",
        "nvidia.com/gpumem-percentage", "nvidia.com/gpucores", "nvidia.com/priority",
        "koordinator.sh/gpu-core", "koordinator.sh/gpu-memory", "koordinator.sh/gpu-memory-ratio",
        "koordinator.sh/gpu.shared", "koordinator.sh/gpu", "aliyun.com/gpu-mem",
        "aliyun.com/gpu-count", "aliyun.com/gpu-core.percentage",
        "tke.cloud.tencent.com/qgpu-core", "tke.cloud.tencent.com/qgpu-memory",
        "volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores",
        "amd.com/gpu", "gpu.intel.com/i915", "gpu.intel.com/xe", "habana.ai/gaudi",
        "k8s.amazonaws.com/vgpu", "amd.com/gpumem", "amd.com/gpumem-percentage",
        "amd.com/gpucores", "volcano.sh/gpu-memory",
        "volcano.sh/gpu-number", "kubernetes.io/gpu", "kubernetes.io/gpu-core",
        "kubernetes.io/gpu-memory", "kubernetes.io/gpu-memory-ratio"})
    assert builtin_rules.legacy_resource_prefixes() == frozenset({"nvidia.com/mig-"})
    assert builtin_rules.annotation_keys() == frozenset({
        "nvidia.com/use-gputype", "nvidia.com/nouse-gputype", "nvidia.com/use-gpuuuid",
        "nvidia.com/nouse-gpuuuid", "nvidia.com/numa-bind", "hami.io/gpu-scheduler-policy",
        "hami.io/node-scheduler-policy", "nvidia.com/vgpu-mode", "dra-gateway.io/align",
        "volcano.sh/vgpu-mode"})
    assert builtin_rules.disabled == (
        "ascend-npu", "aws-neuron", "aws-neuroncore", "aws-neurondevice", "cambricon-mlu",
        "enflame-gcu", "gke-mig-nvidia-dra", "google-tpu", "hygon-dcu", "iluvatar", "intel-gpu",
        "kunlunxin-xpu", "metax-sgpu", "mthreads-gpu", "nvidia-mig-nvidia-dra",
        "nvidia-mig-single-nvidia-dra")


def test_unknown_unit_is_reported_with_its_path(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    message = load_error(tmp_path, monkeypatch, HEADER + """\
rules:
  - name: npu-mem
    resources:
      example.com/npu-mem: {unit: Gb}
    device: {className: gpu.dra-gateway.io, memory: 'r["example.com/npu-mem"]'}
""")
    assert message == ('1 rule failed to load: extra.yaml: rules[0].resources["example.com/'
                       f'npu-mem"].unit: unknown unit "Gb"; {UNITS}')


def test_every_broken_rule_is_reported_at_once(tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    message = load_error(tmp_path, monkeypatch, HEADER + """\
rules:
  - name: fine
    resources: {example.com/a: {}}
    device: {className: a.example.com, count: 'r["example.com/a"]'}
  - name: Bad_Name
    resources: {example.com/b: {}}
    device: {className: b.example.com, colour: blue}
  - name: typo
    resources: {example.com/c: {}}
    device: {className: c.example.com, count: 'rr["example.com/c"]'}
  - name: wrong-type
    resources: {example.com/d: {}}
    device: {className: d.example.com, count: '"two"'}
  - name: shares-on-a-foreign-class
    resources: {example.com/e: {}}
    device: {className: e.example.com, cores: "50"}
overrides:
  - rule: nope
    enabled: false
""")
    assert message == (
        "4 rules and 1 override failed to load: "
        "extra.yaml: rules[1].name: \"Bad_Name\" is not a rule name (lower-case letters, "
        "digits, '-' and '.', at most 63); "
        "extra.yaml: rules[1].device.colour: unknown field; "
        'extra.yaml: overrides[0].rule: no rule named "nope"; '
        "extra.yaml: rules[4].device.cores: shares need a gateway class (gpu.dra-gateway.io or "
        "mig.dra-gateway.io); e.example.com takes whole devices; "
        'extra.yaml: rules[2].device.count: CEL expression "rr["example.com/c"]": '
        "undeclared reference to 'rr'; "
        'extra.yaml: rules[3].device.count: gives str "two", expected int')


def test_wrong_api_version_and_kind_are_named(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    message = load_error(tmp_path, monkeypatch, "apiVersion: v1\nkind: ConfigMap\n")
    assert message == (
        "1 document failed to load: extra.yaml: apiVersion: must be 'dra-gateway.io/v1alpha1', "
        'not "v1"; extra.yaml: kind: must be \'TranslationRules\', not "ConfigMap"')


def test_the_summary_counts_documents_rules_and_overrides_apart(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text("rules: [\n")
    (tmp_path / "b.yaml").write_bytes(b"\xff\xfe")
    (tmp_path / "c.yaml").write_text(HEADER + """\
overrides:
  - {rule: nope, enabled: false}
rules:
  - {name: Bad_Name, resources: {example.com/x: {}}, device: {className: x.example.com}}
""")
    with pytest.raises(RulesError) as raised:
        load_rules(tmp_path / "a.yaml", tmp_path / "b.yaml", tmp_path / "c.yaml")
    assert raised.value.failed == {"document": 2, "rule": 1, "override": 1}
    assert raised.value.summary == "1 rule, 1 override and 2 documents failed to load"


def test_two_rules_on_one_resource_without_precedence_is_a_load_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    message = load_error(tmp_path, monkeypatch, HEADER + """\
rules:
  - name: my-gpu
    resources: {nvidia.com/gpu: {}}
    device: {className: gpu.nvidia.com, count: 'r["nvidia.com/gpu"]'}
""")
    assert message == (
        '1 rule failed to load: extra.yaml: rules[0].precedence: rule "my-gpu" reads '
        'nvidia.com/gpu like rules "gke-mig" and "hami" and "hami-mig" and "nvidia-gpu" and '
        '"nvidia-mig-single", with no precedence '
        'between them; '
        "give it a different precedence, reuse the name to replace a rule, or disable one")


def test_enabling_a_rule_without_a_class_is_a_load_error() -> None:
    with pytest.raises(RulesError) as caught:
        load_rules({"enable.yaml": HEADER + "overrides: [{rule: aws-neuron, enabled: true}]\n"})
    assert str(caught.value) == (
        "1 rule failed to load: builtin/vendors.yaml: rules[4].device.className: required for "
        "an enabled rule: name the DeviceClass that serves these devices")


def test_unreadable_sources_are_load_errors(tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    Path("bad.yaml").write_text(HEADER + "rules: [\n")
    with pytest.raises(RulesError) as caught:
        load_rules("bad.yaml", "missing.yaml")
    assert caught.value.errors == [
        "bad.yaml: not valid YAML (line 4: expected the node content, but found '<stream end>')",
        "missing.yaml: cannot be read: No such file or directory"]


def test_a_character_yaml_refuses_is_named_with_its_line_on_one_line() -> None:
    # PyYAML refuses it while reading, with a message of several lines quoting the input
    # (found by the rules fuzz target); the error reaches Events and /readyz as one line.
    with pytest.raises(RulesError) as caught:
        load_rules(("ConfigMap dra-gateway/site", {"rules.yaml": HEADER + "rules: [\x06]\n"}),
                   builtin=False)
    assert caught.value.errors == [
        "ConfigMap dra-gateway/site key rules.yaml: not valid YAML (line 3: special characters "
        "are not allowed (U+0006))"]


def test_a_problem_quoting_text_of_several_lines_stays_one_line() -> None:
    # Found by the rules fuzz target: a trigger written over two lines was quoted raw.
    document = HEADER + """\
rules:
  - name: site
    resources: {example.com/gpu: {}}
    match:
      resources: ["example.com/gpu\\n  or more"]
    device: {className: gpu.dra-gateway.io}
"""
    with pytest.raises(RulesError) as caught:
        load_rules(("ConfigMap dra-gateway/site", {"rules.yaml": document}), builtin=False)
    assert caught.value.errors == [
        'ConfigMap dra-gateway/site key rules.yaml: rules[0].match.resources[0]: '
        '"example.com/gpu\\n  or more" is not one of the rule\'s resources']


def test_rules_come_from_files_folders_and_configmap_data(tmp_path: Path) -> None:
    rule = HEADER + """\
rules:
  - name: {name}
    resources: {{example.com/{name}: {{}}}}
    device: {{className: {name}.example.com, count: 'r["example.com/{name}"]'}}
"""
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "b.yaml").write_text(rule.format(name="b"))
    (tmp_path / "folder" / "ignored.txt").write_text("not rules")
    (tmp_path / "a.yaml").write_text(rule.format(name="a"))
    rules = load_rules(tmp_path / "a.yaml", tmp_path / "folder",
                       {"c.yaml": rule.format(name="c")}, builtin=False)
    assert rules.rule_names == ("a", "b", "c")


def test_a_new_vendor_an_override_and_a_disabled_rule_need_only_rule_files() -> None:
    rules = load_rules(EXAMPLES / "rules")
    original = pod(ctr("npu", limits={"example.com/npu": 2}),
                   ctr("cuda", limits={"nvidia.com/gpu": 1}),
                   ctr("rocm", limits={"amd.com/gpu": 1}),
                   ctr("share", limits={"aliyun.com/gpu-mem": 2048}),
                   ctr("neuron", limits={"aws.amazon.com/neuron": 1}),
                   annotations={"example.com/npu-generation": "v5"})
    plan = translate(original, rules)
    patched = checked(plan, original)
    (template,) = plan.templates
    requests = {r["name"]: r["exactly"] for r in template["spec"]["spec"]["devices"]["requests"]}
    assert requests["npu"] == {
        "deviceClassName": "npu.example.com", "allocationMode": "ExactCount", "count": 2,
        "selectors": [{"cel": {"expression": '"generation" in device.attributes['
                               '"npu.example.com"] && device.attributes["npu.example.com"]'
                               '.generation == "v5"'}}]}
    assert requests["cuda"] == {"deviceClassName": "gpu.nvidia.com",
                                "allocationMode": "ExactCount", "count": 1}
    assert "rocm" not in requests  # amd-gpu is disabled: the container is left as it was
    assert patched["spec"]["containers"][2]["resources"] == {"limits": {"amd.com/gpu": 1}}
    assert requests["share"]["capacity"] == {"requests": {"memory": "2Gi",  # MiB now
                                                          "cores": "1"}}
    assert requests["neuron"]["deviceClassName"] == "neuron.aws.com"
    assert parameters_of(plan, "cuda") is None  # the scheduler serves NVIDIA's class
    assert parameters_of(plan, "share") is not None
    assert plan.rules_applied == ["aws-neuron", "example-npu", "gpushare", "nvidia-gpu"]


def test_a_higher_precedence_rule_wins_when_its_conditions_hold(tmp_path: Path) -> None:
    (tmp_path / "mig-mode.yaml").write_text(HEADER + """\
rules:
  - name: hami-mig-mode
    precedence: 30
    match:
      resources: [nvidia.com/gpumem]
      annotations: {nvidia.com/vgpu-mode: mig}
      when: 'r["nvidia.com/gpumem"] <= 10240 * 1048576'
    resources:
      nvidia.com/gpu: {}
      nvidia.com/gpumem: {unit: Mi}
    device:
      className: mig.dra-gateway.io
      count: 'r["nvidia.com/gpu"] > 0 ? r["nvidia.com/gpu"] : 1'
      selectors:
        - cel: 'device.attributes["gpu.dra-gateway.io"].profile == "1g.10gb"'
""")
    rules = load_rules(tmp_path / "mig-mode.yaml")
    mig = {"nvidia.com/vgpu-mode": "mig"}
    small = translate(pod(ctr("main", limits={"nvidia.com/gpumem": 8000}), annotations=mig),
                      rules)
    assert small.rules_applied == ["hami-mig-mode"]
    assert only_request(small)["exactly"]["deviceClassName"] == names.MIG_CLASS
    large = translate(pod(ctr("main", limits={"nvidia.com/gpumem": 20000}), annotations=mig),
                      rules)
    assert large.rules_applied == ["hami-mig"]  # the built-in dynamic-MIG rule, below it
    plain = translate(pod(ctr("main", limits={"nvidia.com/gpumem": 8000})), rules)
    assert plain.rules_applied == ["hami"]


def test_a_rule_replaced_by_name_takes_its_new_definition(tmp_path: Path) -> None:
    (tmp_path / "r.yaml").write_text(HEADER + """\
rules:
  - name: amd-gpu
    precedence: 10
    resources: {amd.com/gpu: {}}
    device: {className: gpu.amd.example, count: 'r["amd.com/gpu"] * 1'}
""")
    rules = load_rules(tmp_path / "r.yaml")
    plan = translate(pod(ctr("main", limits={"amd.com/gpu": 3})), rules)
    assert only_request(plan)["exactly"]["deviceClassName"] == "gpu.amd.example"
    assert rules.rule("amd-gpu").source == str(tmp_path / "r.yaml")


def test_configmap_sources_are_named_in_errors() -> None:
    with pytest.raises(RulesError) as caught:
        load_rules(("ConfigMap dra-gateway/site", {"rules": HEADER + "rules: 3\n"}))
    assert str(caught.value) == (
        "1 document failed to load: ConfigMap dra-gateway/site key rules: rules: Input should be a "
        "valid list")


def test_a_rule_can_match_on_the_node_selector(tmp_path: Path) -> None:
    (tmp_path / "h100.yaml").write_text(HEADER + """\
rules:
  - name: h100-whole
    precedence: 40
    match:
      resources: [nvidia.com/gpumem]
      nodeSelector: {nvidia.com/gpu.product: null}
    nodeSelector: [nvidia.com/gpu.product]
    resources:
      nvidia.com/gpu: {}
      nvidia.com/gpumem: {unit: Mi}
    device:
      className: gpu.dra-gateway.io
      count: 'r["nvidia.com/gpu"] > 0 ? r["nvidia.com/gpu"] : 1'
      selectors:
        - attribute: productName
          op: containsAnyIgnoreCase
          values: 'nodeSelector["nvidia.com/gpu.product"].replace("-", " ")'
""")
    rules = load_rules(tmp_path / "h100.yaml")
    assert "nvidia.com/gpu.product" in rules.node_selector_keys()
    pinned = pod(ctr("main", limits={"nvidia.com/gpumem": 1000}),
                 nodeSelector={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
    plan = translate(pinned, rules)
    assert plan.rules_applied == ["h100-whole"]
    (selector,) = only_request(plan)["exactly"]["selectors"]
    assert selector["cel"]["expression"].endswith('.contains("nvidia h100 80gb hbm3")')
    loose = translate(pod(ctr("main", limits={"nvidia.com/gpumem": 1000})), rules)
    assert loose.rules_applied == ["hami"]


def test_the_reference_example_in_the_translator_readme_loads() -> None:
    import re

    readme = (Path(__file__).resolve().parents[2] / "translator" / "README.md").read_text()
    match = re.search(r"```yaml\n(.*?)```", readme, re.S)
    assert match is not None
    rules = load_rules({"readme.yaml": match.group(1)})
    assert "example-npu" in rules.rule_names
    assert "amd-gpu" in rules.disabled


def test_an_override_moves_nvidia_rules_to_nvidias_classes() -> None:
    # DESIGN: rules can retarget NVIDIA's classes where that driver serves the node. The
    # built-in rules read HAMi's policy annotation, which means nothing to another driver.
    rules = load_rules({"site.yaml": HEADER + (
        "overrides:\n"
        "  - {rule: nvidia-gpu, className: gpu.nvidia.com}\n"
        "  - {rule: nvidia-mig, className: mig.nvidia.com}\n")})
    original = pod(ctr("main", limits={"nvidia.com/gpu": 1}),
                   ctr("mig", limits={"nvidia.com/mig-1g.10gb": 1}),
                   annotations={"nvidia.com/use-gputype": "H100",
                                "hami.io/gpu-scheduler-policy": "binpack"})
    plan = translate(original, rules)
    patched = checked(plan, original)
    (template,) = plan.templates
    devices = template["spec"]["spec"]["devices"]
    assert "config" not in devices  # no GpuShareConfig for another driver
    assert [(r["exactly"]["deviceClassName"], r["exactly"]["selectors"][0]["cel"]["expression"])
            for r in devices["requests"]] == [
        ("gpu.nvidia.com", '"productName" in device.attributes["gpu.nvidia.com"] && '
         'device.attributes["gpu.nvidia.com"].productName.lowerAscii().contains("h100")'),
        ("mig.nvidia.com", '"profile" in device.attributes["gpu.nvidia.com"] && '
         'device.attributes["gpu.nvidia.com"].profile == "1g.10gb"')]
    assert "schedulingGates" not in patched["spec"]  # the scheduler allocates these classes


def test_an_override_cannot_move_a_share_to_a_class_of_whole_devices() -> None:
    with pytest.raises(RulesError) as caught:
        load_rules({"site.yaml": HEADER + "overrides: [{rule: hami, className: gpu.nvidia.com}]\n"})
    assert caught.value.errors[0] == (
        "builtin/nvidia.yaml: rules[1].device.memory: shares need a gateway class "
        "(gpu.dra-gateway.io or mig.dra-gateway.io); gpu.nvidia.com takes whole devices")

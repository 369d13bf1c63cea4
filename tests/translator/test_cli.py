"""`dra-gateway translate` and `dra-gateway rules check`: output, messages and exit codes."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from testkit import EXAMPLES

from dra_gateway.cli import main
from dra_gateway.kube import names
from dra_gateway.translator.manifests import pod_specs
from dra_gateway.translator.rules import load_rules


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def gpu_template(limits: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"containers": [{"name": "main", "image": "x",
                                     "resources": {"limits": limits}}]}}


STREAM: list[dict[str, Any]] = [
    {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d", "namespace": "a"},
     "spec": {"template": gpu_template({"nvidia.com/gpu": 1})}},
    {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "s", "namespace": "a"},
     "spec": {"template": gpu_template({"nvidia.com/gpumem": 4000})}},
    {"apiVersion": "apps/v1", "kind": "DaemonSet", "metadata": {"name": "ds"},
     "spec": {"template": gpu_template({"amd.com/gpu": 1})}},
    {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"name": "c", "namespace": "b"},
     "spec": {"jobTemplate": {"spec": {"template": gpu_template({"nvidia.com/gpu": 1})}}}},
    {"apiVersion": "kubeflow.org/v1", "kind": "MPIJob", "metadata": {"name": "m", "namespace": "a"},
     "spec": {"mpiReplicaSpecs": {"Launcher": {"template": gpu_template({"cpu": "1"})},
                                  "Worker": {"template": gpu_template({"nvidia.com/gpu": 8})}}}},
    {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
     "metadata": {"name": "j", "namespace": "a"},
     "spec": {"replicatedJobs": [{"name": "w", "template": {"spec": {
         "template": gpu_template({"koordinator.sh/gpu-core": 50,
                                   "koordinator.sh/gpu-memory-ratio": 50})}}}]}},
    {"apiVersion": "ray.io/v1", "kind": "RayJob", "metadata": {"name": "r", "namespace": "a"},
     "spec": {"rayClusterSpec": {
         "headGroupSpec": {"template": gpu_template({"cpu": "2"})},
         "workerGroupSpecs": [{"template": gpu_template({"nvidia.com/gpu": 1})}]}}},
    {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "job", "namespace": "a"},
     "spec": {"template": gpu_template({"nvidia.com/gpu": 1})}},
    {"apiVersion": "apps/v1", "kind": "ReplicaSet", "metadata": {"name": "rs"},
     "spec": {"template": gpu_template({"amd.com/gpu": "1"})}},
    {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
     "metadata": {"name": "pt", "namespace": "a"},
     "spec": {"pytorchReplicaSpecs": {
         "Master": {"template": gpu_template({"nvidia.com/mig-1g.10gb": 1})},
         "Worker": {"template": gpu_template({"nvidia.com/mig-1g.10gb": 1})}}}},
    {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm"}, "data": {"a": "b"}},
    {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "svc"},
     "spec": {"ports": [{"port": 80}]}},
]


def test_a_stream_of_workloads_is_rewritten_with_templates(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = tmp_path / "in.yaml"
    source.write_text(yaml.safe_dump_all(STREAM))
    code, out, err = run(capsys, "translate", "-f", str(source))
    assert (code, err) == (0, "")
    documents = list(yaml.safe_load_all(out))
    rewritten, templates = documents[:len(STREAM)], documents[len(STREAM):]
    assert rewritten[10:] == STREAM[10:]
    assert rewritten[4]["spec"]["mpiReplicaSpecs"]["Launcher"] == STREAM[4]["spec"][
        "mpiReplicaSpecs"]["Launcher"]
    for document in rewritten[:10]:
        for path, spec in pod_specs(document):
            if path.endswith("Launcher.template") or "headGroupSpec" in path:
                continue
            assert spec["spec"]["resourceClaims"][0]["name"] == "dra-gateway", path
            assert names.ANNOTATION_TRANSLATED in spec["metadata"]["annotations"]
            assert "limits" not in spec["spec"]["containers"][0]["resources"]
    assert [t["kind"] for t in templates] == ["ResourceClaimTemplate"] * len(templates)
    # a/whole gpu, a/hami, (no namespace)/amd, b/whole gpu, a/8 gpus, a/koordinator,
    # a/mig 1g.10gb; the RayJob worker and the Job reuse a/whole gpu, the ReplicaSet the AMD
    # one, and the PyTorchJob's worker its master's.
    assert len(templates) == 7
    for template in templates:
        kubernetes_validate.validate(template, "1.34", strict=True)
    gates = rewritten[0]["spec"]["template"]["spec"]["schedulingGates"]
    assert gates == [{"name": names.SCHEDULING_GATE}]
    assert "schedulingGates" not in rewritten[2]["spec"]["template"]["spec"]


def test_json_output_is_one_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "translate", "-f", str(EXAMPLES / "pods" / "hami.yaml"),
                       "-o", "json")
    documents = json.loads(out)
    assert code == 0
    assert [d["kind"] for d in documents] == ["Pod", "ResourceClaimTemplate"]
    exactly = documents[1]["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    assert exactly["capacity"] == {"requests": {"memory": "8000Mi", "cores": "30"}}


def test_standard_input_and_json_input(capsys: pytest.CaptureFixture[str],
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
           "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": 1}}}]}}
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(pod)))
    code, out, _ = run(capsys, "translate", "-f", "-", "-o", "json")
    assert code == 0
    assert [d["kind"] for d in json.loads(out)] == ["Pod", "ResourceClaimTemplate"]


def test_a_refusal_exits_1_and_names_document_container_and_resource(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = {"apiVersion": "apps/v1", "kind": "Deployment",
           "metadata": {"name": "half", "namespace": "ml"},
           "spec": {"template": gpu_template({"nvidia.com/gpu": "0.5"})}}
    source = tmp_path / "in.yaml"
    source.write_text(yaml.safe_dump_all([STREAM[0], bad]))
    code, out, err = run(capsys, "translate", "-f", str(source))
    assert code == 1
    assert err == ('error: Deployment ml/half (spec.template): container "main": '
                   "nvidia.com/gpu is 0.5, not a whole number; ask for whole units (rule "
                   "nvidia-gpu)\n")
    documents = list(yaml.safe_load_all(out))
    assert documents[1] == bad  # a refused document comes back as it was
    assert len(documents) == 3  # the good Deployment's template is still written


@pytest.mark.parametrize(("content", "message"), [
    ("kind: [unclosed\n", "is not valid YAML or JSON at line 2"),
    (None, "cannot read"),
])
def test_unreadable_input_exits_2(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                  content: str | None, message: str) -> None:
    source = tmp_path / "in.yaml"
    if content is not None:
        source.write_text(content)
    code, out, err = run(capsys, "translate", "-f", str(source))
    assert (code, out) == (2, "")
    assert err.startswith("error: ")
    assert message in err


def test_a_malformed_pod_spec_is_a_refusal_not_a_traceback(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    odd = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "odd"},
           "spec": {"containers": [{"name": "main", "resources": {"limits": [1]}}]}}
    source = tmp_path / "in.yaml"
    source.write_text(yaml.safe_dump(odd))
    code, out, err = run(capsys, "translate", "-f", str(source))
    assert code == 1
    assert err == ("error: Pod odd: the pod's spec.containers[0].resources.limits is not a "
                   "map of quantities; it is not a valid pod spec\n")
    assert list(yaml.safe_load_all(out)) == [odd]


def test_rules_that_are_not_text_are_a_load_error(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_bytes(b"\xff\xfe\x00garbage")
    code, out, _ = run(capsys, "rules", "check", str(rules))
    assert code == 1
    assert out == (f"1 document failed to load:\n  {rules}: not a text file (not UTF-8): rules are "
                   "YAML or JSON\n")


def test_broken_extra_rules_exit_2(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("apiVersion: dra-gateway.io/v1alpha1\nkind: TranslationRules\nrulez: []\n")
    code, _, err = run(capsys, "translate", "-f", str(EXAMPLES / "pods" / "hami.yaml"),
                       "--rules", str(rules))
    assert code == 2
    assert err == (f"error: 1 document failed to load: {rules}: rulez: unknown field; did you "
                   "mean rules?\n")


def test_rules_check_reports_every_error_with_its_path(capsys: pytest.CaptureFixture[str],
                                                       tmp_path: Path) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("""\
apiVersion: dra-gateway.io/v1alpha1
kind: TranslationRules
rules:
  - name: npu
    resources: {example.com/npu: {unit: Gb}}
    device: {className: npu.example.com}
  - name: tpu
    resources: {google.com/tpu: {}}
    device: {className: tpu.example.com, count: 'r["google.com/tpu"] +'}
""")
    code, out, _ = run(capsys, "rules", "check", str(broken))
    assert code == 1
    lines = out.splitlines()
    assert lines[0] == "2 rules failed to load:"
    assert lines[1] == (f'  {broken}: rules[0].resources["example.com/npu"].unit: unknown unit '
                        '"Gb"; use one of "", "Ki", "Mi", "Gi", "Ti", "k", "M", "G", "T"')
    assert lines[2].startswith(f"  {broken}: rules[1].device.count: CEL expression ")


def test_rules_check_accepts_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "rules", "check", str(EXAMPLES / "rules"))
    assert (code, out) == (0, "ok: 21 rules enabled, 15 disabled\n")


def test_example_pods_translate_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    examples = sorted((EXAMPLES / "pods").glob("*.yaml"))
    templates = 0
    for example in examples:
        code, out, err = run(capsys, "translate", "-f", str(example))
        assert (code, err) == (0, ""), example
        for document in yaml.safe_load_all(out):
            if document["kind"] == "ResourceClaimTemplate":
                kubernetes_validate.validate(document, "1.34", strict=True)
                templates += 1
    # Four files and seven templates when this was written: fewer means the walk saw less.
    assert len(examples) >= 4, examples
    assert templates >= 7, templates


def test_the_items_of_a_list_keep_their_own_namespaces(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # `kubectl get deployments -A -o yaml` writes one `kind: List` whose items carry the
    # namespaces: each needs the template in its own namespace, and refusals name the item.
    def listed(*limits: dict[str, Any]) -> Path:
        items = [{"apiVersion": "apps/v1", "kind": "Deployment",
                  "metadata": {"name": "train", "namespace": f"team-{i}"},
                  "spec": {"template": gpu_template(amounts)}}
                 for i, amounts in enumerate(limits)]
        source = tmp_path / "list.yaml"
        source.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}))
        return source

    code, out, err = run(capsys, "translate", "-f",
                         str(listed({"nvidia.com/gpu": 1}, {"nvidia.com/gpu": 1})))
    assert (code, err) == (0, "")
    _, *templates = yaml.safe_load_all(out)
    assert [t["metadata"]["namespace"] for t in templates] == ["team-0", "team-1"]
    assert templates[0]["metadata"]["name"] == templates[1]["metadata"]["name"]

    code, out, err = run(capsys, "translate", "-f",
                         str(listed({"nvidia.com/gpu": 1}, {"nvidia.com/gpu": "0.5"})))
    assert code == 1
    assert err == ('error: Deployment team-1/train (items[1].spec.template): container '
                   '"main": nvidia.com/gpu is 0.5, not a whole number; ask for whole units '
                   "(rule nvidia-gpu)\n")


def test_a_pod_template_with_empty_metadata_is_translated(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = tmp_path / "in.yaml"
    source.write_text("apiVersion: apps/v1\nkind: Deployment\n"
                      "metadata: {name: d, namespace: a}\n"
                      "spec:\n  template:\n    metadata:\n    spec:\n      containers:\n"
                      "      - name: main\n        resources: {limits: {nvidia.com/gpu: 1}}\n")
    code, out, err = run(capsys, "translate", "-f", str(source))
    assert (code, err) == (0, "")
    deployment, template = yaml.safe_load_all(out)
    assert names.ANNOTATION_TRANSLATED in deployment["spec"]["template"]["metadata"][
        "annotations"]
    assert template["metadata"]["namespace"] == "a"


def test_a_document_with_malformed_metadata_is_not_a_traceback(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = tmp_path / "in.yaml"
    source.write_text("apiVersion: apps/v1\nkind: Deployment\nmetadata: oops\n"
                      "spec:\n  template:\n    spec:\n      containers:\n"
                      "      - name: main\n        resources: {limits: {nvidia.com/gpu: x}}\n")
    code, _, err = run(capsys, "translate", "-f", str(source))
    assert code == 1
    assert err.startswith('error: Deployment #1 (spec.template): container "main": '
                          'nvidia.com/gpu: invalid quantity "x"')


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_unquoted_dates_are_read_as_kubernetes_reads_them(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, output: str) -> None:
    source = tmp_path / "in.yaml"
    source.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"
                      "data: {since: 2024-01-01}\n")
    code, out, err = run(capsys, "translate", "-f", str(source), "-o", output)
    assert (code, err) == (0, "")
    (document,) = json.loads(out) if output == "json" else yaml.safe_load_all(out)
    assert document["data"] == {"since": "2024-01-01"}


def test_json_output_writes_an_explicit_yaml_timestamp_as_text(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    source = tmp_path / "in.yaml"
    source.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n"
                      "data: {at: !!timestamp 2024-01-02}\n")
    code, out, err = run(capsys, "translate", "-f", str(source), "-o", "json")
    assert (code, err) == (0, "")
    assert json.loads(out)[0]["data"] == {"at": "2024-01-02"}


def test_filename_is_repeatable_and_read_in_order(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    # `-f a -f b`, as with kubectl; the second -f used to replace the first without a word.
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text(yaml.safe_dump(STREAM[10]))
    second.write_text(yaml.safe_dump(STREAM[11]))
    code, out, err = run(capsys, "translate", "-f", str(first), "-f", str(second))
    assert (code, err) == (0, "")
    assert list(yaml.safe_load_all(out)) == [STREAM[10], STREAM[11]]


def test_standard_input_twice_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "translate", "-f", "-", "-f", "-")
    assert (code, out) == (2, "")
    assert err == "error: -f - (standard input) can be given only once\n"


def test_standard_input_that_is_not_utf8_is_named_as_such(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    # A text stdin decodes with surrogateescape under a C locale: the YAML parser then blamed
    # an "unacceptable character #xdcff" instead of the encoding.
    stdin = io.TextIOWrapper(io.BytesIO(b"a: \xff\n"), encoding="utf-8",
                             errors="surrogateescape")
    monkeypatch.setattr("sys.stdin", stdin)
    code, out, err = run(capsys, "translate", "-f", "-")
    assert (code, out) == (2, "")
    assert err.startswith("error: standard input is not valid YAML or JSON: 'utf-8' codec "
                          "can't decode byte 0xff")


@pytest.mark.parametrize(("content", "message"), [
    ("", " holds no Kubernetes object (it is empty, or only comments)"),
    ("# nothing here\n", " holds no Kubernetes object (it is empty, or only comments)"),
    ("hello: world\n", ": document 1 is not a Kubernetes object: it has no apiVersion and no "
                       "kind"),
    ("apiVersion: v1\nkind: Pod\nmetadata: {name: a}\n---\n- 1\n- 2\n",
     ": document 2 is not a Kubernetes object: it is a list, not a mapping with apiVersion "
     "and kind"),
])
def test_what_is_no_manifest_is_said_not_echoed(capsys: pytest.CaptureFixture[str],
                                                tmp_path: Path, content: str,
                                                message: str) -> None:
    source = tmp_path / "in.yaml"
    source.write_text(content)
    code, out, err = run(capsys, "translate", "-f", str(source))
    assert (code, out) == (2, "")
    assert err == f"error: {source}{message}; pass Kubernetes manifests, as kubectl apply -f " \
                  "takes them\n"


def test_a_folder_is_read_as_kubectl_reads_it(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "a", "namespace": "ns"},
           **gpu_template({"nvidia.com/gpu": "1"})}
    (tmp_path / "b.yaml").write_text(yaml.safe_dump(pod))
    (tmp_path / "a.json").write_text(json.dumps({**pod, "metadata": {"name": "b"}}))
    (tmp_path / "notes.txt").write_text("not a manifest")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "c.yaml").write_text("hello: world\n")  # not recursed into
    code, out, err = run(capsys, "translate", "-f", str(tmp_path), "-o", "json")
    assert code == 0, err
    listed = json.loads(out)
    assert [d["metadata"]["name"] for d in listed if d["kind"] == "Pod"] == ["b", "a"]
    empty = tmp_path / "empty"
    empty.mkdir()
    code, out, err = run(capsys, "translate", "-f", str(empty))
    assert (code, err) == (2, f"error: folder {empty} holds no .yaml, .yml, .json file\n")


def test_a_name_close_to_a_legacy_one_is_warned_about(capsys: pytest.CaptureFixture[str],
                                                      tmp_path: Path) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"},
           **gpu_template({"nvidia.com/gpus": "1", "example.com/widget": "1"})}
    source = tmp_path / "in.yaml"
    source.write_text(yaml.safe_dump(pod))
    code, _, err = run(capsys, "translate", "-f", str(source))
    assert code == 0
    assert err == ('warning: Pod a/p: container "main": nvidia.com/gpus: no dra-gateway rule '
                   "reads it; did you mean nvidia.com/gpu?\n")


def test_the_site_overrides_example_translates_the_example_pods_it_enables(
        capsys: pytest.CaptureFixture[str]) -> None:
    """examples/rules/site-overrides.yaml enables the Neuron rule: the example Neuron pod
    (aws.amazon.com/neurondevice, the device plugin's current name) goes to the class it names."""
    code, out, _ = run(capsys, "translate", "-f",
                       str(EXAMPLES / "pods-other-vendors" / "accelerators.yaml"),
                       "--rules", str(EXAMPLES / "rules" / "site-overrides.yaml"), "-o", "json")
    assert code == 0
    listed = json.loads(out)
    (pod,) = [d for d in listed if d["metadata"]["name"] == "neuron-infer"]
    (claim,) = pod["spec"]["resourceClaims"]
    (template,) = [d for d in listed if d["kind"] == "ResourceClaimTemplate"
                   and d["metadata"]["name"] == claim["resourceClaimTemplateName"]]
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request["exactly"]["deviceClassName"] == "neuron.aws.com"
    assert request["exactly"]["count"] == 2


def _alias_bomb(levels: int = 9) -> str:
    """A pod whose env is a billion laughs: a few hundred bytes, 10**levels values expanded."""
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    for n in range(1, levels + 1):
        lines.append(f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * 10) + "]")
    return ("apiVersion: v1\nkind: Pod\nmetadata:\n  name: bomb\nanchors:\n"
            + "".join(f"  {line}\n" for line in lines)
            + f"spec:\n  containers:\n  - name: c\n    image: x\n    args: *a{levels}\n")


@pytest.mark.timeout(20)
def test_an_alias_bomb_is_refused_naming_the_file(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(_alias_bomb())
    code, out, err = run(capsys, "translate", "-f", str(bomb))
    assert (code, out) == (2, "")
    assert err.startswith(f"error: {bomb} is refused at line ")
    assert "aliases expand to more than 100000 nodes" in err
    # Rules files and --device-classes go through the same loader.
    code, out, err = run(capsys, "rules", "check", str(bomb))
    assert code == 1
    assert "aliases expand to more than 100000 nodes" in out
    code, _, err = run(capsys, "translate", "-f", str(tmp_path), "--device-classes", str(bomb))
    assert code == 2
    assert "aliases expand" in err


def test_a_few_aliases_still_load_and_a_recursive_one_is_refused(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    shared = tmp_path / "shared.yaml"
    shared.write_text(_alias_bomb(levels=2))  # 100 values from 12 written: fine
    code, out, err = run(capsys, "translate", "-f", str(shared))
    assert code == 0, err
    assert "- lol" in out
    loop = tmp_path / "loop.yaml"
    loop.write_text("apiVersion: v1\nkind: Pod\nmetadata: &m\n  name: x\n  self: *m\n")
    code, _, err = run(capsys, "translate", "-f", str(loop))
    assert code == 2
    assert err == (f"error: {loop} is refused at line 5: alias *m is inside the node it "
                   "names: a structure without end\n")


def test_input_past_the_size_cap_is_refused(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from dra_gateway.translator import yamlinput

    monkeypatch.setattr(yamlinput, "MAX_INPUT_BYTES", 10)
    big = tmp_path / "big.yaml"
    big.write_text("apiVersion: v1\nkind: Pod\n")
    code, _, err = run(capsys, "translate", "-f", str(big))
    assert code == 2
    assert err == f"error: {big} is larger than 0 MiB: refused; split it into several files\n"


def test_translate_and_its_explanation_name_a_typo_and_what_was_meant(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"},
           **gpu_template({"nvidia.com/gpu-typo": "1"})}
    source = tmp_path / "in.yaml"
    source.write_text(yaml.safe_dump(pod))
    said = ('container "main": nvidia.com/gpu-typo: no dra-gateway rule reads it; did you mean '
            "nvidia.com/gpu?")
    code, _, err = run(capsys, "translate", "-f", str(source))
    assert (code, err) == (0, f"warning: Pod a/p: {said}\n")
    code, out, err = run(capsys, "translate", "--explain", "-f", str(source))
    assert (code, err) == (0, f"warning: Pod a/p: {said}\n")
    assert out.splitlines()[-2:] == [
        "    left nvidia.com/gpu-typo: no dra-gateway rule reads it; did you mean "
        "nvidia.com/gpu?",
        f"  warning: {said}"]


def test_translate_reports_every_bad_amount_of_a_pod_at_once(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "a"},
           "spec": {"containers": [
               {"name": "a", "image": "x", "resources": {"limits": {
                   "nvidia.com/gpu": "1.5", "nvidia.com/gpumem": "-3"}}},
               {"name": "b", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "x"}}}]}}
    source = tmp_path / "in.yaml"
    source.write_text(yaml.safe_dump(pod))
    code, _, err = run(capsys, "translate", "-f", str(source))
    assert code == 1
    assert err == (
        'error: Pod a/p: 2 containers are refused: container "a": 2 problems: nvidia.com/gpu '
        "is 1.5, not a whole number; ask for whole units; nvidia.com/gpumem is -3, a negative "
        'amount (rule hami); container "b": nvidia.com/gpu: invalid quantity "x": a quantity '
        'starts with a number, e.g. "40Gi" or "500m" (rule nvidia-gpu)\n')


_RULES_DOCUMENT = """\
apiVersion: dra-gateway.io/v1alpha1
kind: TranslationRules
rules:
  - name: site-fpga
    precedance: 10
    resources: {example.com/fpga: {}}
    device: {className: fpga.example.com}
"""


def _config_map(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": "dra-gateway",
                         "labels": {names.RULES_LABEL: names.RULES_LABEL_VALUE}},
            "data": data}


def test_rules_check_checks_a_config_map_key_by_key_as_the_webhook_loads_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    good = _RULES_DOCUMENT.replace("precedance", "precedence")
    config_map = tmp_path / "cm.yaml"
    config_map.write_text(yaml.safe_dump(_config_map("site-rules", {
        "good.yaml": good, "typo.yaml": _RULES_DOCUMENT.replace("site-fpga", "other"),
        "override.yaml": "apiVersion: dra-gateway.io/v1alpha1\nkind: TranslationRules\n"
                         "overrides:\n  - rule: nvidia-gpu\n    enabeld: false\n"})))
    code, out, _ = run(capsys, "rules", "check", str(config_map))
    assert code == 1
    assert out == (
        "1 rule and 1 override failed to load:\n"
        "  ConfigMap dra-gateway/site-rules key override.yaml: overrides[0].enabeld: unknown "
        "field; did you mean enabled?\n"
        "  ConfigMap dra-gateway/site-rules key typo.yaml: rules[0].precedance: unknown field; "
        "did you mean precedence?\n")
    # As `kubectl get configmaps -o yaml` writes them: a List.
    listed = tmp_path / "list.yaml"
    listed.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": [
        _config_map("a", {"rules.yaml": good}),
        _config_map("b", {"rules.yaml": good.replace("site-fpga", "other-fpga").replace(
            "example.com/fpga", "example.com/fpga2")})]}))
    builtin = load_rules()
    code, out, _ = run(capsys, "rules", "check", str(listed))
    assert (code, out.splitlines()[0]) == (
        0, f"ok: {len(builtin.rules) + 2} rules enabled, {len(builtin.disabled)} disabled")


def test_rules_check_names_what_is_no_rules_config_map_beside_config_maps(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(yaml.safe_dump_all([
        _config_map("a", {}), {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}},
        {**_config_map("b", {}), "data": ["not", "a", "mapping"]}]))
    code, out, _ = run(capsys, "rules", "check", str(mixed))
    assert code == 1
    assert out == (
        "2 documents failed to load:\n"
        f"  {mixed}: document 2 is a Secret beside ConfigMaps; keep rules ConfigMaps and "
        "TranslationRules documents in separate files\n"
        "  ConfigMap dra-gateway/b: data: not a mapping of keys to rules documents\n")

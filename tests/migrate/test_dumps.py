"""Reading manifests offline: kubectl's output in, an inventory out, or one line naming the
file, document and problem."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_gateway.cli import main
from dra_gateway.migrate.dumps import DumpError, read_dumps
from dra_gateway.migrate.plan import build_plan
from dra_gateway.migrate.quotas import migrate_quotas, render_yaml
from dra_gateway.migrate.render import render_html, render_table
from dra_gateway.migrate.rules import rules_in_force
from dra_gateway.translator.rules import RulesError

from .conftest import deployment, namespace, pod, scenario, write_dump


def test_a_list_and_separate_documents_read_the_same(tmp_path: Path) -> None:
    as_list = read_dumps([str(write_dump(tmp_path / "list.yaml", scenario()))])
    as_docs = read_dumps([str(write_dump(tmp_path / "docs.yaml", scenario(), as_list=False))])
    assert as_list == as_docs
    assert len(as_list.pods) == 6
    assert [w["kind"] for w in as_list.workloads] == ["Deployment", "Job"]
    assert len(as_list.nodes) == 3
    assert len(as_list.resource_quotas) == 2


def test_several_files_add_up_and_unread_kinds_are_noted(tmp_path: Path) -> None:
    first = write_dump(tmp_path / "a.yaml", [namespace("a")])
    second = write_dump(tmp_path / "b.yaml", [
        pod("p", "a", {"nvidia.com/gpu": 1}),
        {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "a"}}])
    inventory = read_dumps([str(first), str(second)])
    assert [len(inventory.namespaces), len(inventory.pods)] == [1, 1]
    assert inventory.notes == ["not read (migrate does not use these kinds): 1 Service"]


def test_an_object_without_a_namespace_lands_in_default_as_with_kubectl(tmp_path: Path) -> None:
    obj = deployment("d", "x", {"nvidia.com/gpu": 1})
    del obj["metadata"]["namespace"]
    inventory = read_dumps([str(write_dump(tmp_path / "d.yaml", [obj]))])
    assert inventory.workloads[0]["metadata"]["namespace"] == "default"


@pytest.mark.parametrize(("text", "message"), [
    ("kind: Pod\nmetadata: {name: a\n",
     "{path}: document 1 is not YAML (line 3, column 1: expected ',' or '}}', but got "
     "'<stream end>'); fix the file or write it again with kubectl get -o yaml"),
    ("---\nkind: Namespace\nmetadata: {name: a}\n---\n- 1\n",
     "{path}: document 2 is a YAML list, not a Kubernetes object; give the output of kubectl "
     "get -o yaml"),
    ("kind: List\nitems:\n- kind: Pod\n  metadata: {namespace: a}\n",
     "{path}: document 1, item 1: Pod has no metadata.name; each object needs one"),
    ("kind: Pod\nmetadata: {name: a}\nspec: {containers: nope}\n",
     "{path}: document 1: Pod a: spec.containers is not a list"),
    ("kind: Deployment\nmetadata: {name: d}\nspec:\n  template:\n    spec:\n      containers:\n"
     "      - name: c\n        resources: {limits: {nvidia.com/gpu: [1]}}\n",
     "{path}: document 1: Deployment d: spec.template.spec.containers[0].resources.limits is "
     "not a map of quantities"),
    ("kind: Namespace\nmetadata: {name: a, labels: {x: true}}\n",
     "{path}: document 1: Namespace a: metadata.labels is not a map of strings (quote values "
     "such as \"true\")"),
    ("kind: List\nitems: 3\n", "{path}: document 1: List.items is a number, not a list of "
                               "objects"),
    ("metadata: {name: a}\n", "{path}: document 1: kind is missing; each object needs "
                              "apiVersion, kind and metadata.name"),
])
def test_an_unreadable_dump_names_file_document_and_problem(
        tmp_path: Path, text: str, message: str, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "dump.yaml"
    path.write_text(text)
    with pytest.raises(DumpError) as exc:
        read_dumps([str(path)])
    assert str(exc.value) == message.format(path=path)
    # The command line says the same in one line, exit code 2, no traceback.
    assert main(["migrate", "plan", "-f", str(path)]) == 2
    assert capsys.readouterr().err == f"error: {exc.value}\n"


def test_a_missing_file_or_a_folder_is_named_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(DumpError, match=r"nothing\.yaml does not exist; write it with kubectl"):
        read_dumps([str(tmp_path / "nothing.yaml")])
    with pytest.raises(DumpError, match="is a directory; pass the manifest files in it"):
        read_dumps([str(tmp_path)])
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(DumpError, match=r"is not a text file \(not UTF-8\)"):
        read_dumps([str(binary)])


def test_json_from_kubectl_reads_as_yaml(tmp_path: Path) -> None:
    path = tmp_path / "dump.json"
    path.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": scenario()}))
    assert read_dumps([str(path)]) == read_dumps([str(write_dump(tmp_path / "d.yaml",
                                                                 scenario()))])
    assert yaml.safe_load(path.read_text())["kind"] == "List"


# Properties ------------------------------------------------------------------------------------

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.sampled_from(["", "x", "1", "true"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(
        ["name", "kind", "spec", "containers", "limits", "nvidia.com/gpu", "items"]),
        inner, max_size=3),
    max_leaves=6)


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [path] if path else []
    if isinstance(value, dict):
        for key, item in value.items():
            out.extend(_paths(item, (*path, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            out.extend(_paths(item, (*path, index)))
    return out


@settings(max_examples=100, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_any_damaged_dump_is_refused_by_name_or_planned_never_a_crash(
        tmp_path: Path, data: st.DataObject) -> None:
    objects = scenario()
    target = data.draw(st.sampled_from(objects))
    path = data.draw(st.sampled_from(_paths(target)))
    parent = target
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = data.draw(_json)
    dump = write_dump(tmp_path / "dump.yaml", objects)
    problem = ""
    try:
        inventory = read_dumps([str(dump)])
    except DumpError as exc:
        problem = str(exc)
    if problem:
        assert problem.startswith(f"{dump}: document 1, item ")
        return
    try:
        rules = rules_in_force(inventory.rule_config_maps)
    except RulesError:
        return
    plan = build_plan(inventory, rules)
    render_table(plan)
    render_html(plan)
    json.dumps(plan.to_dict())
    render_yaml(migrate_quotas(inventory, rules))


@pytest.mark.timeout(20)
def test_an_alias_bomb_in_a_dump_is_refused(tmp_path: Path) -> None:
    lines = ['a0: &a0 ["l", "l", "l", "l", "l", "l", "l", "l", "l", "l"]'] + [
        f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * 10) + "]" for n in range(1, 10)]
    dump = tmp_path / "dump.yaml"
    dump.write_text("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: x\n  labels:\n"
                    + "".join(f"    {line}\n" for line in lines))
    with pytest.raises(DumpError, match="aliases expand to more than 100000 nodes"):
        read_dumps([str(dump)])

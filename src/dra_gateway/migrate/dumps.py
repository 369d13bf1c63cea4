"""Reading a cluster offline: files of manifests (`kubectl get ... -o yaml`) into a
`ClusterObjects`.

A file holds a `List` (what kubectl writes for several objects) or several YAML documents;
each object is filed by kind (`ClusterObjects.add`). Everything that could make the plan wrong or
crash it is refused here with one line naming the file, the document (and item) and the fix:
`DumpError`. Objects of kinds migrate does not read are counted in the inventory's notes.

This module reads files only; it must not translate, plan or talk to a cluster.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from dra_gateway.migrate.inventory import WORKLOAD_KINDS, ClusterObjects, Object
from dra_gateway.translator.manifests import pod_specs
from dra_gateway.translator.pods import pod_shape_problem
from dra_gateway.translator.yamlinput import ManifestLoader

# Kinds of cluster-scoped objects: every other kind migrate reads lives in a namespace.
_CLUSTER_SCOPED = ("Namespace", "Node", "GPUSharingPolicy")


class DumpError(ValueError):
    """A manifest file migrate cannot read; the message names the file, document and fix."""


def read_dumps(paths: Sequence[str]) -> ClusterObjects:
    """The objects of every file in `paths` ("-" is standard input), in order."""
    inventory = ClusterObjects()
    ignored: dict[str, int] = {}
    for path in paths:
        for where, obj in _objects(path, _text(path)):
            _check(where, obj)
            if not inventory.add(_defaulted(obj)):
                kind = str(obj.get("kind"))
                ignored[kind] = ignored.get(kind, 0) + 1
    if ignored:
        kinds = ", ".join(f"{count} {kind}" for kind, count in sorted(ignored.items()))
        inventory.notes.append(f"not read (migrate does not use these kinds): {kinds}")
    return inventory


def _text(path: str) -> str:
    if path == "-":
        import sys

        return sys.stdin.read()
    file = Path(path)
    if file.is_dir():
        raise DumpError(f"{path} is a directory; pass the manifest files in it (-f FILE, "
                        "repeatable)")
    try:
        return file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DumpError(f"{path} does not exist; write it with kubectl get pods,deployments,"
                        "namespaces,nodes,resourcequotas -A -o yaml > FILE") from None
    except UnicodeDecodeError:
        raise DumpError(f"{path} is not a text file (not UTF-8); pass YAML or JSON manifests"
                        ) from None
    except OSError as exc:
        raise DumpError(f"cannot read {path}: {exc.strerror or exc}") from None


def _objects(path: str, text: str) -> Iterator[tuple[str, Any]]:
    """(how messages name it, object) for each object; a List's items are objects of their own."""
    # The translator's bounded loader: an alias bomb in a dump is refused, not expanded.
    documents = yaml.load_all(text, Loader=ManifestLoader)
    index = 0
    while True:
        try:
            document = next(documents)
        except StopIteration:
            return
        except yaml.YAMLError as exc:
            raise DumpError(f"{path}: document {index + 1} is not YAML ({_yaml_problem(exc)}); "
                            "fix the file or write it again with kubectl get -o yaml") from None
        index += 1
        if document is None:
            continue
        where = f"{path}: document {index}"
        if not isinstance(document, dict):
            raise DumpError(f"{where} is a YAML {_kind_of(document)}, not a Kubernetes object; "
                            "give the output of kubectl get -o yaml")
        kind = document.get("kind")
        if isinstance(kind, str) and kind.endswith("List") and "items" in document:
            items = document["items"]
            if not isinstance(items, list):
                raise DumpError(f"{where}: {kind}.items is a {_kind_of(items)}, not a list of "
                                "objects")
            for number, item in enumerate(items):
                yield f"{where}, item {number + 1}", item
        else:
            yield where, document


def _check(where: str, obj: Any) -> None:
    if not isinstance(obj, dict):
        raise DumpError(f"{where} is a {_kind_of(obj)}, not a Kubernetes object")
    kind = obj.get("kind")
    if not isinstance(kind, str) or not kind:
        raise DumpError(f"{where}: kind is missing; each object needs apiVersion, kind and "
                        "metadata.name")
    meta = obj.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise DumpError(f"{where}: {kind} has no metadata.name; each object needs one")
    assert isinstance(meta, dict)
    label = f"{where}: {kind} {name}"
    if not isinstance(meta.get("namespace", ""), str):
        raise DumpError(f"{label}: metadata.namespace is not a string")
    for key in ("labels", "annotations"):
        value = meta.get(key)
        if value is not None and not (isinstance(value, dict)
                                      and all(isinstance(v, str) for v in value.values())):
            raise DumpError(f"{label}: metadata.{key} is not a map of strings (quote values "
                            "such as \"true\")")
    if kind == "Pod":
        if not isinstance(obj.get("spec"), dict):
            raise DumpError(f"{label}: spec is not an object with containers")
        problem = pod_shape_problem(obj)
        if problem:
            raise DumpError(f"{label}: {problem}")
    elif kind in WORKLOAD_KINDS:
        found = list(pod_specs(obj))
        if kind in WORKLOAD_KINDS and not found:
            raise DumpError(f"{label} holds no pod template (no spec.containers anywhere)")
        for path, pod in found:
            problem = pod_shape_problem(pod)
            if problem:
                at = f"{path}." if path else ""
                raise DumpError(f"{label}: {at}{problem}")
    if kind in ("Node", "ResourceQuota", "ConfigMap"):
        section, key = {"Node": ("status", "allocatable"), "ResourceQuota": ("spec", "hard"),
                        "ConfigMap": ("data", "")}[kind]
        value = obj.get(section)
        if key and isinstance(value, dict):
            value = value.get(key)
        if value is not None and not (isinstance(value, dict) and all(
                isinstance(v, str | int | float) and not isinstance(v, bool)
                for v in value.values())):
            field = f"{section}.{key}" if key else section
            raise DumpError(f"{label}: {field} is not a map of "
                            f"{'strings' if kind == 'ConfigMap' else 'quantities'}")


def _defaulted(obj: Object) -> Object:
    """The object with the namespace kubectl would give it when the manifest leaves it out."""
    if obj.get("kind") in _CLUSTER_SCOPED or obj["metadata"].get("namespace"):
        return obj
    out = copy.copy(obj)
    out["metadata"] = {**obj["metadata"], "namespace": "default"}
    return out


def _kind_of(value: Any) -> str:
    return {"list": "list", "str": "string", "int": "number", "float": "number",
            "bool": "boolean"}.get(type(value).__name__, type(value).__name__)


def _yaml_problem(exc: yaml.YAMLError) -> str:
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).split("\n")[0]
    if mark is not None:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return str(problem)

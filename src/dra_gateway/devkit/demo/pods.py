"""The pods the demo creates: Pods and workloads read from manifests, each workload expanded
into the pods its controller would create (the embedded cluster runs no controllers).

It must not talk to a cluster or start processes: it only reads and expands manifests.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    pass
from dra_gateway.devkit.demo.common import DemoError

# Most pods the demo creates (workloads' replicas included): its nodes hold a dozen GPUs.
MAX_PODS = 500


@dataclass(frozen=True, slots=True)
class DemoPod:
    """A pod to create, and the manifest document it came from."""

    pod: dict[str, Any]
    source: str  # e.g. "Deployment research/notebook"

    @property
    def namespace(self) -> str:
        return str(self.pod["metadata"].get("namespace") or "default")

    @property
    def name(self) -> str:
        return str(self.pod["metadata"]["name"])


def _replicas(document: Any, path: str) -> int:
    """Replicas of the pod template at `path` (its parent's `replicas`, else 1)."""
    parts = [p for p in path.replace("[", ".[").split(".") if p]
    parent: Any = document
    for part in parts[:-1]:
        parent = parent[int(part[1:-1])] if part.startswith("[") else parent[part]
    value = parent.get("replicas") if isinstance(parent, dict) else None
    if isinstance(value, bool) or not isinstance(value, int):
        return 1
    return max(value, 0)


def _role(path: str) -> str:
    """`spec.pytorchReplicaSpecs.Worker.template` -> "worker"; a plain pod template -> ""."""
    parts = [p for p in path.split(".") if p and not p.startswith("[")]
    if len(parts) >= 2 and parts[-1] == "template" and parts[-2] not in ("spec", "jobTemplate"):
        return parts[-2].lower()
    return ""


def _objects(documents: Sequence[Any], source: str) -> Iterator[tuple[int, str, Any]]:
    """(index, how messages name it, object) per object; the items of a `kind: List` (what
    `kubectl get -o yaml` writes) are objects of their own."""
    for index, document in enumerate(documents):
        where = f"{source} (document {index + 1})"
        items = document.get("items") if isinstance(document, dict) else None
        if (isinstance(items, list) and isinstance(document.get("kind"), str)
                and document["kind"].endswith("List")):
            for number, item in enumerate(items):
                yield number, f"{where[:-1]}, item {number + 1})", item
        else:
            yield index, where, document


def pods_of(documents: Sequence[Any], source: str) -> list[DemoPod]:
    """The pods to create for manifests: Pods as they are, workloads expanded to their pods."""
    from dra_gateway.translator.manifests import describe, pod_specs

    pods: list[DemoPod] = []
    for index, where, document in _objects(documents, source):
        if not isinstance(document, dict) or not isinstance(document.get("metadata"), dict):
            raise DemoError("reading pods", f"{where}: expected a Kubernetes object with "
                            "apiVersion, kind and metadata")
        meta = document["metadata"]
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise DemoError("reading pods", f"{where}: metadata.name is required")
        namespace = str(meta.get("namespace") or "default")
        found = list(pod_specs(document))
        if not found:
            raise DemoError("reading pods", f"{where}: {describe(document, index)} holds no pod "
                            "(no spec.containers anywhere); give Pods or workloads")
        label = describe(document, index)
        if document.get("kind") == "Pod" and not found[0][0]:
            pod = dict(document)
            pod["metadata"] = {**meta, "namespace": namespace}
            pods.append(DemoPod(pod, label))
            continue
        for path, template in found:
            role = _role(path)
            replicas = _replicas(document, path)
            if len(pods) + replicas > MAX_PODS:
                # Each replica becomes a pod here: a production replica count hung the demo.
                raise DemoError("reading pods", f"{where}: {label} asks for {replicas} "
                                f"replicas; the demo creates at most {MAX_PODS} pods on its "
                                "three nodes: lower its replicas")
            for replica in range(replicas):
                pod_meta = dict(template.get("metadata") or {})
                pod_meta["name"] = "-".join(p for p in (name, role, str(replica)) if p)
                pod_meta["namespace"] = namespace
                pod = {"apiVersion": "v1", "kind": "Pod", "metadata": pod_meta,
                       "spec": template["spec"]}
                pods.append(DemoPod(pod, label))
    seen: set[tuple[str, str]] = set()
    for item in pods:
        key = (item.namespace, item.name)
        if key in seen:
            raise DemoError("reading pods", f"pod {item.namespace}/{item.name} ({item.source}) "
                            "appears twice; give each pod or workload its own name")
        seen.add(key)
    return pods


def read_pods(paths: Sequence[Path]) -> list[DemoPod]:
    import yaml

    pods: list[DemoPod] = []
    for path in paths:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise DemoError("reading pods", f"cannot read {path}: {exc.strerror or exc}; pass "
                            "an existing manifest file to --pods") from None
        except UnicodeDecodeError:
            raise DemoError("reading pods", f"{path} is not a text file (not UTF-8): pass YAML "
                            "or JSON manifests to --pods") from None
        try:
            documents = [d for d in yaml.safe_load_all(text) if d is not None]
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f" at line {mark.line + 1}" if mark is not None else ""
            problem = getattr(exc, "problem", None) or exc
            raise DemoError("reading pods", f"{path} is not valid YAML{where}: "
                            f"{problem}") from None
        pods.extend(pods_of(documents, str(path)))
    if not pods:
        raise DemoError("reading pods", f"no pods in {', '.join(map(str, paths))}: give at "
                        "least one Pod or workload")
    return pods

"""Reading Kubernetes manifests (YAML or JSON files, multi-document, `kind: List`) as objects.

Used to seed the embedded cluster from files. Pure file parsing: it must not talk to a cluster;
`MemoryCluster.load` creates what it returns.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from dra_gateway.kube.resources import by_kind


class ManifestError(ValueError):
    """A manifest file that cannot be read; the message names the file and document."""


def read_manifests(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """Every object in `paths`, in order; `List` kinds are flattened into their items."""
    objects: list[dict[str, Any]] = []
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ManifestError(f"cannot read manifest {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise ManifestError(f"manifest {path} is not a text file (not UTF-8): give YAML or "
                                f"JSON manifests") from None
        try:
            documents = list(yaml.safe_load_all(text))
        except yaml.YAMLError as exc:
            raise ManifestError(f"manifest {path} is not valid YAML or JSON{_where(exc)}") \
                from None
        for index, document in enumerate(documents):
            if document is None:
                continue
            where = f"{path} (document {index + 1})"
            if not isinstance(document, dict):
                raise ManifestError(f"{where}: expected a Kubernetes object (a mapping with "
                                    f"apiVersion and kind), got {type(document).__name__}")
            if str(document.get("kind", "")).endswith("List") and "items" in document:
                items = document.get("items") or []
                for position, item in enumerate(items):
                    objects.append(_checked(item, f"{where} items[{position}]"))
            else:
                objects.append(_checked(document, where))
    return objects


def _where(exc: yaml.YAMLError) -> str:
    """`at line L, column C: problem`, on one line (PyYAML's own text spans several)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    return f"{at}: {problem}"


def _checked(obj: Any, where: str) -> dict[str, Any]:
    if not isinstance(obj, dict):
        raise ManifestError(f"{where}: expected a Kubernetes object, got {type(obj).__name__}")
    try:
        by_kind(str(obj.get("apiVersion")), str(obj.get("kind")))
    except KeyError as exc:
        raise ManifestError(f"{where}: {exc.args[0]}") from None
    if not isinstance(obj.get("metadata"), dict) or not (
            obj["metadata"].get("name") or obj["metadata"].get("generateName")):
        raise ManifestError(f"{where}: metadata.name is required")
    return obj

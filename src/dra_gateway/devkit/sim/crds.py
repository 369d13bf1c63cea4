"""The gateway's CustomResourceDefinitions, read from the chart (`chart_crds`, a link to
helm/dra-gateway/crds), as the embedded API serves them: their names (short names, categories),
printer columns and structural schemas.

One source for the simulator's discovery, OpenAPI documents, Tables and schema enforcement, so
the embedded API cannot drift from what the chart installs. Read once, on first use; this module
must not decide anything about an object (that is `structural`'s).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from dra_gateway.kube.resources import ALL, ResourceType

CRD_DIR = Path(__file__).parent / "chart_crds"


@dataclass(frozen=True, slots=True)
class PrinterColumn:
    name: str
    type: str
    json_path: str
    description: str = ""
    priority: int = 0
    format: str = ""


@dataclass(frozen=True, slots=True)
class Definition:
    """One served version of a CRD."""

    rt: ResourceType
    schema: dict[str, Any]  # openAPIV3Schema
    printer_columns: tuple[PrinterColumn, ...]
    singular: str
    short_names: tuple[str, ...]
    categories: tuple[str, ...]


@functools.cache
def _definitions() -> dict[ResourceType, Definition]:
    found: dict[ResourceType, Definition] = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text(encoding="utf-8"))
        spec = crd["spec"]
        names = spec["names"]
        for version in spec["versions"]:
            if not version.get("served", True):
                continue
            rt = next((r for r in ALL if r.group == spec["group"]
                       and r.version == version["name"] and r.plural == names["plural"]), None)
            if rt is None:
                continue  # a version the project does not name: not served here
            columns = tuple(PrinterColumn(
                c["name"], c["type"], c["jsonPath"], c.get("description", ""),
                int(c.get("priority", 0)), c.get("format", ""))
                for c in version.get("additionalPrinterColumns") or [])
            found[rt] = Definition(rt, version["schema"]["openAPIV3Schema"], columns,
                                   names.get("singular", names["kind"].lower()),
                                   tuple(names.get("shortNames") or ()),
                                   tuple(names.get("categories") or ()))
    return found


def definition(rt: ResourceType) -> Definition | None:
    """The chart's definition of `rt`, or None when `rt` is not one of the chart's CRDs."""
    return _definitions().get(rt)


def definitions() -> list[Definition]:
    return list(_definitions().values())

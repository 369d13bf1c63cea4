"""Values crossing into and out of the engine: quantities and versions as marker maps.

The engine cannot carry Python objects, so a quantity is a one-key map
`{"\\x00k8s.quantity": "<value in billionths>"}` and a semantic version a one-key map
`{"\\x00k8s.semver": "<version without build metadata>"}`. Maps have no ordering in CEL, so
`<` between quantities is an error (as in Kubernetes, where it does not type-check), and `==`
compares by value. `type_name` names a value as CEL's error messages name its type.

The parse caches here are shared by every caller: the maps they return must never be mutated.
This module converts values only: it must not compile or evaluate expressions.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import lru_cache
from typing import Any, Final

from dra_gateway.kube.cel.errors import Failure
from dra_gateway.kube.quantity import Quantity
from dra_gateway.kube.semver import Semver

QUANTITY_KEY: Final = "\x00k8s.quantity"
SEMVER_KEY: Final = "\x00k8s.semver"
NANO: Final = 10**9
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1


def quantity_value(q: Quantity) -> dict[str, str]:
    """The CEL value standing for a quantity."""
    return {QUANTITY_KEY: str(q.nanos)}


def semver_value(v: Semver) -> dict[str, str]:
    """The CEL value standing for a semantic version (build metadata does not compare)."""
    return {SEMVER_KEY: str(Semver(v.major, v.minor, v.patch, v.prerelease))}


def to_engine(value: Any) -> Any:
    """Python value to what the engine can carry: quantities and versions become marker maps."""
    if isinstance(value, Quantity):
        return quantity_value(value)
    if isinstance(value, Semver):
        return semver_value(value)
    if isinstance(value, Mapping):
        return {k: to_engine(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_engine(v) for v in value]
    if is_int(value) and not INT64_MIN <= value <= INT64_MAX:
        # The engine would silently turn it into an inexact double.
        raise Failure(f"integer {value} does not fit in a CEL int (64 bits)")
    return value


def from_engine(value: Any) -> Any:
    """Engine result to Python: marker maps become `Quantity` (decimal format) and `Semver`."""
    if isinstance(value, dict):
        if len(value) == 1:
            if QUANTITY_KEY in value:
                return Quantity(int(value[QUANTITY_KEY]))
            if SEMVER_KEY in value:
                return semver_of(value[SEMVER_KEY])
        return {k: from_engine(v) for k, v in value.items()}
    if isinstance(value, list):
        return [from_engine(v) for v in value]
    return value


@lru_cache(maxsize=4096)
def parse_quantity(text: str) -> dict[str, str]:
    # The result is shared by every caller (and every view): never mutated.
    return quantity_value(Quantity.parse(text))


@lru_cache(maxsize=4096)
def semver_of(text: str) -> Semver:
    return Semver.parse(text)


@lru_cache(maxsize=4096)
def version_value(text: str) -> dict[str, str]:
    # Shared between views (every card of a node reports the same driver version): never mutated.
    return semver_value(Semver.parse(text))


def type_name(value: Any) -> str:
    """The CEL type of an engine value, as error messages name it."""
    if isinstance(value, dict) and len(value) == 1:
        if QUANTITY_KEY in value:
            return "quantity"
        if SEMVER_KEY in value:
            return "semver"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "map"
    if value is None:
        return "null"
    return type(value).__name__


def is_int(value: Any) -> bool:
    """A CEL int: a Python int that is not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


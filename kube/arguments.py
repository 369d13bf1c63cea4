"""Argument types the components' command lines share (light imports only).

Checked at the flag, so that a value the API server would refuse is named where it was given,
not at the first write far from it.
"""

from __future__ import annotations

import argparse
import math
import re
from typing import Final

# RFC 1123 label, as namespace and Service names are.
DNS_LABEL: Final = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")


def namespace(value: str) -> str:
    """An argparse type: `value` if it is a namespace name (a DNS label)."""
    if not DNS_LABEL.match(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a namespace name (a DNS label: lowercase letters, digits, '-')")
    return value


def label_key(value: str) -> str:
    """An argparse type: `value` if it is a label key (`name` or `prefix/name`)."""
    from dra_gateway.kube.objects import is_label_key

    if not is_label_key(value):
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a label key (name or prefix/name, as "
            "topology.kubernetes.io/zone)")
    return value


_DURATION_PART: Final = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ms|s|m|h)")
_UNIT_SECONDS: Final = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def duration(value: str) -> float:
    """An argparse type: seconds from a Go-style duration (`90s`, `2m`, `1m30s`, `500ms`, `1h`)
    or a plain number of seconds (`120`); never negative."""
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        parts = _DURATION_PART.findall(text)
        if not parts or "".join(number + unit for number, unit in parts) != text:
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a duration: give seconds (120) or a duration such as 90s, "
                "2m, 1m30s or 500ms") from None
        seconds = sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)
    if not math.isfinite(seconds) or seconds < 0:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration of zero or more seconds")
    return seconds

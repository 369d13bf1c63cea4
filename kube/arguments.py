"""Argument types the components' command lines share (light imports only).

Checked at the flag, so that a value the API server would refuse is named where it was given,
not at the first write far from it.
"""

from __future__ import annotations

import argparse
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

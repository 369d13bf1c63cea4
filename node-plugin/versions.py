"""Version strings as DRA `version` attributes: semantic versions 2.0 (`1.2.3`, no `v`).

NVIDIA reports versions as `9.0` (compute capability), `535.104.05` (driver, zero-padded) or
`12040` (CUDA driver as an integer); Kubernetes accepts only strict semver, so they are
normalised here. Pure functions, no I/O.
"""

from __future__ import annotations

import re

_PART = re.compile(r"^[0-9]+$")
_MAX_DIGITS = 18  # in MAJOR, MINOR and PATCH, as Kubernetes 1.38 validates `version` attributes


def semver(text: str) -> str:
    """`"9.0"` -> `"9.0.0"`, `"535.104.05"` -> `"535.104.5"`, `"v12.4"` -> `"12.4.0"`.

    A fourth numeric part becomes build metadata (`"31.0.15.3623"` -> `"31.0.15+3623"`), which
    semver orders as equal, so comparisons stay on the first three. Raises ValueError with the
    text when it is not made of 1 to 4 dot-separated numbers of at most 18 digits each.
    """
    raw = text.strip()
    if raw[:1] in ("v", "V"):
        raw = raw[1:]
    parts = raw.split(".")
    if not 1 <= len(parts) <= 4 or not all(_PART.match(p) for p in parts):
        raise ValueError(f'invalid version "{text}": expected numbers such as "9.0" or '
                         '"535.104.05"')
    numbers = [str(int(p)) for p in parts]
    while len(numbers) < 3:
        numbers.append("0")
    if any(len(n) > _MAX_DIGITS for n in numbers[:3]):
        # Kubernetes 1.38 refuses them: each number must fit CEL's int64.
        raise ValueError(f'invalid version "{text}": each number must have at most '
                         f'{_MAX_DIGITS} digits')
    return ".".join(numbers[:3]) + (f"+{numbers[3]}" if len(numbers) == 4 else "")


def cuda_version_from_int(value: int) -> str:
    """NVML's CUDA driver version integer (`12040`) as text (`"12.4"`)."""
    if value <= 0:
        raise ValueError(f"invalid CUDA driver version {value}")
    return f"{value // 1000}.{(value % 1000) // 10}"



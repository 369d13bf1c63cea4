"""Semantic versions as Kubernetes' CEL `semver` library reads them.

Device attributes of type `version` (driver and CUDA versions, compute capabilities) and the
`semver()` CEL function both go through here, so a selector compares versions exactly as the
scheduler does. Parsing follows blang/semver v4 `Parse` (which Kubernetes uses): exactly
MAJOR.MINOR.PATCH, no leading zeros, optional `-prerelease` and `+build`; `normalize=True` follows
Kubernetes' `normalizeAndParse` (drops one leading "v", fills a missing minor or patch with 0,
strips leading zeros). Ordering follows semver 2.0: build metadata is ignored, a prerelease sorts
before its release, numeric identifiers sort before alphanumeric ones.

This module only parses and compares; it must not import anything beyond the standard library.
"""

from __future__ import annotations

import json
from functools import total_ordering
from typing import Final

_DIGITS: Final = frozenset("0123456789")
_ALPHANUM: Final = frozenset("0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-")
_UINT64_MAX: Final = 2**64 - 1


class SemverError(ValueError):
    """A text that is not a semantic version; the message names the text and what is wrong."""

    def __init__(self, text: str, reason: str) -> None:
        super().__init__(
            f"invalid semantic version {json.dumps(text, ensure_ascii=False)}: {reason}"
        )
        self.text = text
        self.reason = reason


def _number(text: str, part: str, what: str) -> int:
    if not part:
        raise SemverError(text, f"the {what} number is empty")
    if not set(part) <= _DIGITS:
        raise SemverError(text, f"invalid character(s) in the {what} number {part!r}")
    if len(part) > 1 and part[0] == "0":
        raise SemverError(text, f"the {what} number must not have leading zeros ({part!r})")
    value = int(part)
    if value > _UINT64_MAX:
        raise SemverError(text, f"the {what} number {part} is out of range")
    return value


@total_ordering
class Semver:
    """An immutable, hashable semantic version; equality and order ignore build metadata."""

    __slots__ = ("build", "major", "minor", "patch", "prerelease")

    major: int
    minor: int
    patch: int
    prerelease: tuple[int | str, ...]
    build: tuple[str, ...]

    def __init__(
        self,
        major: int,
        minor: int,
        patch: int,
        prerelease: tuple[int | str, ...] = (),
        build: tuple[str, ...] = (),
    ) -> None:
        for name, value in (("major", major), ("minor", minor), ("patch", patch)):
            object.__setattr__(self, name, value)
        object.__setattr__(self, "prerelease", prerelease)
        object.__setattr__(self, "build", build)

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Semver is immutable")

    @classmethod
    def parse(cls, text: str, *, normalize: bool = False) -> Semver:
        """Parse `text`; raises `SemverError` naming the text and the problem."""
        if not isinstance(text, str):
            raise SemverError(str(text), 'a version must be a string such as "1.2.3"')
        source = text
        if normalize:
            text = _normalized(text)
        if not text:
            raise SemverError(source, "empty")
        parts = text.split(".", 2)
        if len(parts) != 3:
            raise SemverError(source, 'expected MAJOR.MINOR.PATCH, e.g. "1.2.3"')
        major = _number(source, parts[0], "major")
        minor = _number(source, parts[1], "minor")
        rest = parts[2]
        build: tuple[str, ...] = ()
        if "+" in rest:
            rest, _, build_text = rest.partition("+")
            build = tuple(build_text.split("."))
            for item in build:
                if not item:
                    raise SemverError(source, "build metadata has an empty identifier")
                if not set(item) <= _ALPHANUM:
                    raise SemverError(source, f"invalid character(s) in build metadata {item!r}")
        prerelease: tuple[int | str, ...] = ()
        if "-" in rest:
            rest, _, pre_text = rest.partition("-")
            prerelease = tuple(_prerelease(source, item) for item in pre_text.split("."))
        patch = _number(source, rest, "patch")
        return cls(major, minor, patch, prerelease, build)

    def compare(self, other: Semver) -> int:
        """-1, 0 or 1 by semver 2.0 precedence (blang/semver `Compare`)."""
        mine = (self.major, self.minor, self.patch)
        theirs = (other.major, other.minor, other.patch)
        if mine != theirs:
            return 1 if mine > theirs else -1
        if not self.prerelease or not other.prerelease:
            # A release sorts after any of its prereleases.
            return (not self.prerelease) - (not other.prerelease)
        for a, b in zip(self.prerelease, other.prerelease, strict=False):
            if a == b:
                continue
            if isinstance(a, int) and isinstance(b, int):
                return 1 if a > b else -1
            if isinstance(a, int):
                return -1
            if isinstance(b, int):
                return 1
            return 1 if a > b else -1
        return (len(self.prerelease) > len(other.prerelease)) - (
            len(self.prerelease) < len(other.prerelease)
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Semver):
            return NotImplemented
        return self.compare(other) == 0

    def __lt__(self, other: Semver) -> bool:
        if not isinstance(other, Semver):
            return NotImplemented
        return self.compare(other) < 0

    def __hash__(self) -> int:
        return hash((self.major, self.minor, self.patch, self.prerelease))

    def __str__(self) -> str:
        text = f"{self.major}.{self.minor}.{self.patch}"
        if self.prerelease:
            text += "-" + ".".join(str(p) for p in self.prerelease)
        if self.build:
            text += "+" + ".".join(self.build)
        return text

    def __repr__(self) -> str:
        return f"Semver({str(self)!r})"

    def __reduce__(self) -> tuple[type[Semver], tuple[object, ...]]:
        return (Semver, (self.major, self.minor, self.patch, self.prerelease, self.build))


def _prerelease(source: str, item: str) -> int | str:
    if not item:
        raise SemverError(source, "the prerelease has an empty identifier")
    if set(item) <= _DIGITS:
        if len(item) > 1 and item[0] == "0":
            raise SemverError(
                source, f"a numeric prerelease identifier must not have leading zeros ({item!r})"
            )
        value = int(item)
        if value > _UINT64_MAX:
            raise SemverError(source, f"the prerelease number {item} is out of range")
        return value
    if not set(item) <= _ALPHANUM:
        raise SemverError(source, f"invalid character(s) in prerelease {item!r}")
    return item


def _normalized(source: str) -> str:
    """Kubernetes' `normalizeAndParse` rewriting: "v01.2" becomes "1.2.0"."""
    text = source.removeprefix("v")
    parts = text.split(".", 2)
    for i, part in enumerate(parts):
        if len(part) > 1:
            stripped = part.lstrip("0")
            if not stripped or stripped[0] not in _DIGITS:
                stripped = "0" + stripped
            parts[i] = stripped
    if len(parts) < 3:
        if any(ch in parts[-1] for ch in "+-"):
            raise SemverError(source, "a short version cannot carry a prerelease or build metadata")
        parts += ["0"] * (3 - len(parts))
    return ".".join(parts)


def is_semver(text: str, *, normalize: bool = False) -> bool:
    """Whether `text` parses (Kubernetes CEL `isSemver`)."""
    try:
        Semver.parse(text, normalize=normalize)
    except SemverError:
        return False
    return True

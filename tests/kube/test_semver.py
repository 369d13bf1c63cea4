"""Semantic versions as Kubernetes' CEL semver library (blang/semver v4) reads them."""

from __future__ import annotations

import itertools

import pytest

from dra_gateway.kube.semver import Semver, SemverError, is_semver


@pytest.mark.parametrize(
    ("text", "parts", "prerelease", "build"),
    [
        ("1.2.3", (1, 2, 3), (), ()),
        ("0.1.0-alpha.1", (0, 1, 0), ("alpha", 1), ()),
        ("1.0.0-rc.1+build.5", (1, 0, 0), ("rc", 1), ("build", "5")),
        ("1.0.0+20130313144700", (1, 0, 0), (), ("20130313144700",)),
        ("10.20.30-x-y-z.0", (10, 20, 30), ("x-y-z", 0), ()),
    ],
)
def test_strict_parsing(
    text: str, parts: tuple[int, int, int], prerelease: tuple[object, ...], build: tuple[str, ...]
) -> None:
    version = Semver.parse(text)
    assert (version.major, version.minor, version.patch) == parts
    assert version.prerelease == prerelease
    assert version.build == build
    assert str(version) == text


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("1.0", 'expected MAJOR.MINOR.PATCH, e.g. "1.2.3"'),
        ("v1.0.0", "invalid character(s) in the major number 'v1'"),
        ("01.0.0", "the major number must not have leading zeros ('01')"),
        ("1.0.00", "the patch number must not have leading zeros ('00')"),
        ("1.0.0-01", "a numeric prerelease identifier must not have leading zeros ('01')"),
        ("1.0.0-", "the prerelease has an empty identifier"),
        ("1.0.0+", "build metadata has an empty identifier"),
        ("1.0.0-a_b", "invalid character(s) in prerelease 'a_b'"),
        ("200K", 'expected MAJOR.MINOR.PATCH, e.g. "1.2.3"'),
    ],
)
def test_invalid_versions_are_refused_with_a_reason(text: str, reason: str) -> None:
    with pytest.raises(SemverError) as caught:
        Semver.parse(text)
    assert str(caught.value) == f'invalid semantic version "{text}": {reason}'
    assert not is_semver(text)


@pytest.mark.parametrize(
    ("text", "normalized"),
    [
        ("v1.0.0", "1.0.0"),
        ("1.0", "1.0.0"),
        ("1", "1.0.0"),
        ("01.01.01", "1.1.1"),
        ("v2.00.3-rc.1", "2.0.3-rc.1"),
    ],
)
def test_normalization_follows_kubernetes(text: str, normalized: str) -> None:
    assert str(Semver.parse(text, normalize=True)) == normalized
    assert is_semver(text, normalize=True)


def test_a_short_version_with_a_prerelease_is_refused_even_when_normalizing() -> None:
    with pytest.raises(SemverError, match="a short version cannot carry a prerelease"):
        Semver.parse("1.0-rc", normalize=True)


def test_precedence_follows_semver_2() -> None:
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1",
        "1.10.0",
        "2.0.0",
    ]
    versions = [Semver.parse(t) for t in ordered]
    shuffled = versions[1::2] + versions[0::2]
    assert sorted(shuffled) == versions
    for a, b in itertools.pairwise(versions):
        assert a.compare(b) == -1
        assert b.compare(a) == 1


def test_build_metadata_does_not_compare() -> None:
    a, b = Semver.parse("1.0.0+a"), Semver.parse("1.0.0+b")
    assert a == b
    assert hash(a) == hash(b)
    assert a.compare(b) == 0

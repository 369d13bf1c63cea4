"""ResourceQuotas on legacy GPU names become GPUQuotas counting the same thing."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_gateway.gpu.legacy_resources import LEGACY_RESOURCES
from dra_gateway.kube.quantity import parse_quantity
from dra_gateway.policy.legacyquotas import (
    KNOWN_NAMES,
    SOURCE_ANNOTATION,
    Route,
    convert_resource_quota,
    legacy_name,
)

from .conftest import assert_valid_gpu_quota, resource_quota

MI = 1 << 20
GI = 1 << 30


def _hard(quota: dict[str, Any] | None) -> dict[str, Any]:
    assert quota is not None
    return dict(quota["spec"]["hard"])


def test_card_counts_become_devices_under_every_prefix() -> None:
    for key in ("requests.nvidia.com/gpu", "nvidia.com/gpu", "limits.nvidia.com/gpu"):
        result = convert_resource_quota(resource_quota("gpus", "team-a", {key: 4}))
        assert result is not None
        assert _hard(result.gpu_quota) == {"devices": 4}
        assert_valid_gpu_quota(result.gpu_quota or {})


def test_hami_memory_is_mebibytes_and_cores_are_percent() -> None:
    result = convert_resource_quota(resource_quota("hami", "team-a", {
        "limits.nvidia.com/gpumem": 3000, "limits.nvidia.com/gpucores": 150}))
    assert result is not None
    assert _hard(result.gpu_quota) == {"memory": "3000Mi", "cores": 150}
    assert parse_quantity(_hard(result.gpu_quota)["memory"]).value() == 3000 * MI


@pytest.mark.parametrize(("key", "value", "hard"), [
    ("volcano.sh/vgpu-memory", 2048, {"memory": "2Gi"}),
    ("volcano.sh/vgpu-number", 3, {"devices": 3}),
    ("aliyun.com/gpu-mem", 40, {"memory": "40Gi"}),
    ("tke.cloud.tencent.com/qgpu-memory", 8, {"memory": "8Gi"}),
    ("tke.cloud.tencent.com/qgpu-core", 250, {"cores": 250}),
    ("koordinator.sh/gpu-memory", "16Gi", {"memory": "16Gi"}),
    ("koordinator.sh/gpu-core", 300, {"cores": 300}),
    ("nvidia.com/mig-1g.10gb", 7, {"devices": 7}),
])
def test_each_vendor_unit_is_read_as_the_reference_says(key: str, value: Any,
                                                        hard: dict[str, Any]) -> None:
    result = convert_resource_quota(resource_quota("q", "ns", {f"requests.{key}": value}))
    assert result is not None
    assert _hard(result.gpu_quota) == hard
    assert_valid_gpu_quota(result.gpu_quota or {})


def test_the_gpu_quota_names_its_resource_quota_and_refuses_as_it_did() -> None:
    result = convert_resource_quota(resource_quota("gpus", "team-a", {"nvidia.com/gpu": 2}))
    assert result is not None
    assert result.gpu_quota is not None
    meta = result.gpu_quota["metadata"]
    assert (meta["name"], meta["namespace"]) == ("gpus", "team-a")
    assert meta["annotations"] == {SOURCE_ANNOTATION: "gpus"}
    assert result.gpu_quota["spec"]["admission"] == "Refuse"


def test_one_name_under_two_prefixes_keeps_the_stricter_limit() -> None:
    result = convert_resource_quota(resource_quota("q", "ns", {
        "requests.nvidia.com/gpu": 4, "limits.nvidia.com/gpu": 2}))
    assert result is not None
    assert _hard(result.gpu_quota) == {"devices": 2}
    assert result.warnings == ()


def test_two_names_counting_cards_add_up_with_a_warning() -> None:
    result = convert_resource_quota(resource_quota("q", "ns", {
        "requests.nvidia.com/gpu": 4, "requests.volcano.sh/vgpu-number": 2}))
    assert result is not None
    assert _hard(result.gpu_quota) == {"devices": 6}
    assert result.warnings == (
        "devices is the sum of the limits on nvidia.com/gpu, volcano.sh/vgpu-number (6): the "
        "gateway counts them together, so one name may now use what another left",)


def test_what_has_no_equivalent_is_said_not_dropped() -> None:
    result = convert_resource_quota(resource_quota("q", "ns", {
        "requests.nvidia.com/gpu": 4, "limits.nvidia.com/gpumem-percentage": 50,
        "requests.amd.com/gpu": 2, "cpu": 8},
        scopeSelector={"matchExpressions": [{"scopeName": "PriorityClass", "operator": "In",
                                             "values": ["high"]}]}))
    assert result is not None
    assert _hard(result.gpu_quota) == {"devices": 4}
    assert [u.key for u in result.unconverted] == ["limits.nvidia.com/gpumem-percentage",
                                                   "requests.amd.com/gpu"]
    assert result.messages() == [
        "ResourceQuota ns/q: spec.scopeSelector has no GPUQuota equivalent: the GPUQuota counts "
        "every pod of the namespace",
        "ResourceQuota ns/q: spec.hard['limits.nvidia.com/gpumem-percentage'] = 50 has no "
        "GPUQuota equivalent: a percentage of each card's memory, while a GPUQuota counts "
        "bytes; set spec.hard.memory by hand (percent x the cards' memory)",
        "ResourceQuota ns/q: spec.hard['requests.amd.com/gpu'] = 2 has no GPUQuota equivalent: "
        "AMD's driver allocates these, not the gateway; keep the ResourceQuota for them",
    ]


def test_a_quota_of_only_unconvertible_names_produces_no_gpu_quota_but_says_why() -> None:
    result = convert_resource_quota(resource_quota("q", "ns", {"amd.com/gpu": 2}))
    assert result is not None
    assert result.gpu_quota is None
    assert len(result.unconverted) == 1


def test_a_quota_without_gpu_names_is_not_a_gpu_quota() -> None:
    assert convert_resource_quota(resource_quota("q", "ns", {"cpu": 8, "pods": 10})) is None


def test_a_fraction_of_a_card_is_refused_by_name() -> None:
    result = convert_resource_quota(resource_quota("q", "ns", {"nvidia.com/gpu": "1500m"}))
    assert result is not None
    assert result.gpu_quota is None
    (item,) = result.unconverted
    assert item.reason == "1500m is not a whole number of units; write a whole amount"


def test_the_rules_in_force_set_the_unit_and_which_names_the_gateway_counts() -> None:
    routes = {
        "aliyun.com/gpu-mem": Route("gpushare", "gpu.dra-gateway.io", True, unit=MI),
        "nvidia.com/gpu": Route("site-gpu", "gpu.nvidia.com", False),
    }
    result = convert_resource_quota(
        resource_quota("q", "ns", {"aliyun.com/gpu-mem": 512, "nvidia.com/gpu": 2}),
        route=routes.get)
    assert result is not None
    assert _hard(result.gpu_quota) == {"memory": "512Mi"}
    (item,) = result.unconverted
    assert item.reason.startswith("rule site-gpu translates it to gpu.nvidia.com, a class "
                                  "another driver allocates")


def test_a_name_only_a_disabled_rule_reads_is_not_counted() -> None:
    result = convert_resource_quota(
        resource_quota("q", "ns", {"google.com/tpu": 4}),
        route=lambda name: Route("google-tpu", "", False, enabled=False))
    assert result is not None
    assert result.gpu_quota is None
    assert result.unconverted[0].reason.startswith("only rule google-tpu reads it")


def test_every_legacy_name_of_the_core_has_its_gpu_quota_facts() -> None:
    # One list of names (gpu.legacy_resources): a name added there needs its facts here.
    assert set(KNOWN_NAMES) == {r.name for r in LEGACY_RESOURCES}
    for entry in LEGACY_RESOURCES:
        probe = entry.name.replace("*", "1g.10gb")
        assert legacy_name(probe) is KNOWN_NAMES[entry.name]


# Properties ------------------------------------------------------------------------------------

_CONVERTIBLE = sorted(n for n, f in KNOWN_NAMES.items()
                      if f.dimension is not None and not n.endswith("*"))
_ANY_GPU = sorted(n for n in KNOWN_NAMES if not n.endswith("*"))
_key = st.tuples(st.sampled_from(["", "requests.", "limits."]), st.sampled_from(_ANY_GPU))
_hard_strategy = st.dictionaries(_key, st.integers(0, 10**6), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(hard=_hard_strategy)
def test_every_gpu_key_is_converted_or_explained_and_the_result_is_a_valid_gpu_quota(
        hard: dict[tuple[str, str], int]) -> None:
    keys = {prefix + name: value for (prefix, name), value in hard.items()}
    result = convert_resource_quota(resource_quota("q", "ns", keys))
    assert result is not None
    accounted = [c.key for c in result.converted] + [u.key for u in result.unconverted]
    assert sorted(accounted) == sorted(keys)
    if result.gpu_quota is not None:
        assert_valid_gpu_quota(result.gpu_quota)
    else:
        assert not result.converted


@settings(max_examples=200, deadline=None)
@given(hard=st.dictionaries(st.tuples(st.sampled_from(["", "requests.", "limits."]),
                                      st.sampled_from(_CONVERTIBLE)),
                            st.integers(0, 10**6), min_size=1, max_size=8))
def test_each_dimension_is_the_sum_over_names_of_the_strictest_prefix(
        hard: dict[tuple[str, str], int]) -> None:
    keys = {prefix + name: value for (prefix, name), value in hard.items()}
    result = convert_resource_quota(resource_quota("q", "ns", keys))
    assert result is not None
    expected: dict[str, dict[str, int]] = {}
    for (_, name), value in hard.items():
        facts = legacy_name(name)
        assert facts is not None
        assert facts.dimension is not None
        per_name = expected.setdefault(facts.dimension, {})
        per_name[name] = min(per_name.get(name, value * facts.unit), value * facts.unit)
    got = _hard(result.gpu_quota)
    assert set(got) == set(expected)
    for dimension, per_name in expected.items():
        amount = got[dimension]
        if dimension == "memory":
            amount = parse_quantity(amount).value()
        assert amount == sum(per_name.values())


def test_a_mistaken_unit_is_said_with_what_to_write_not_converted() -> None:
    result = convert_resource_quota(resource_quota("q", "ns", {
        "requests.nvidia.com/gpumem": "8Gi", "requests.nvidia.com/gpu": 2}))
    assert result is not None
    assert result.gpu_quota is not None
    assert result.gpu_quota["spec"]["hard"] == {"devices": 2}
    (item,) = result.unconverted
    assert item.reason == ("nvidia.com/gpumem counts MiB: 8Gi would mean 8Pi; write 8192 (a "
                           "mistaken unit; fix the ResourceQuota)")
    # Koordinator counts bytes: its suffix is read as written.
    koordinator = convert_resource_quota(resource_quota("q", "ns", {
        "requests.koordinator.sh/gpu-memory": "8Gi"}))
    assert koordinator is not None
    assert koordinator.gpu_quota is not None
    assert koordinator.gpu_quota["spec"]["hard"] == {"memory": "8Gi"}

"""Kubernetes 1.38's rules for the DRA fields the gateway writes (kube/api_rules.py).

The same values are sent to a real 1.38 API server in tests/e2e/test_kubernetes_1_38.py, which
checks that the server refuses exactly what these checks refuse.
"""

from __future__ import annotations

import pytest

from dra_gateway.kube.api_rules import (
    MAX_CAPACITY_ENTRIES,
    QUALIFIED_NAME_RE,
    allocation_problems,
    capacity_problems,
    claim_spec_problems,
    qualified_name_problem,
    slice_device_problems,
    slice_problems,
    version_problem,
)

VALID_NAMES = ["memory", "cores", "_x", "A_1", "x" * 32, "gpu.dra-gateway.io/memory",
               "resource.kubernetes.io/pcieRoot", "a/b", f"{'a' * 63}/x",
               # The domain's case is not checked (the API lowers it, as for CSI drivers).
               "Example.com/memory"]
INVALID_NAMES = ["", "1memory", "mem-ory", "mem.ory", "x" * 33, "a/b/c", "/memory", "example.com/",
                 "-a.com/x", "a..b/x", f"{'a' * 64}/x", "a_b.com/x"]


@pytest.mark.parametrize("name", VALID_NAMES)
def test_qualified_names_the_api_accepts(name: str) -> None:
    assert qualified_name_problem(name) is None
    assert QUALIFIED_NAME_RE.match(name)


@pytest.mark.parametrize("name", INVALID_NAMES)
def test_qualified_names_the_api_refuses_say_why(name: str) -> None:
    problem = qualified_name_problem(name)
    assert problem
    assert not QUALIFIED_NAME_RE.match(name)


def test_a_consumed_capacity_must_be_named_counted_and_not_negative() -> None:
    path = "status.allocation.devices.results[0].consumedCapacity"
    assert capacity_problems({"memory": "4Gi", "cores": "0"}, path) == []
    assert capacity_problems({"memory": "-1"}, path) == [
        f"{path}[memory]: -1 must be greater than or equal to 0"]
    assert capacity_problems({"memory": "lots"}, path)[0].startswith(
        f'{path}[memory]: invalid quantity "lots"')
    assert capacity_problems({"a/b/c": "1"}, path) == [
        f"{path}[a/b/c]: must not contain more than one slash"]
    many = {f"c{i}": "1" for i in range(MAX_CAPACITY_ENTRIES + 1)}
    assert capacity_problems(many, path) == [f"{path}: has 33 entries, at most 32 are allowed"]
    assert capacity_problems({f"c{i}": "1" for i in range(MAX_CAPACITY_ENTRIES)}, path) == []


def test_allocation_problems_name_the_result_and_the_lists_past_their_limit() -> None:
    result = {"request": "r", "driver": "d.io", "pool": "p", "device": "x"}
    allocation = {"devices": {"results": [result, {**result, "consumedCapacity": {
        "memory": "-1Gi"}}]}}
    assert allocation_problems(allocation) == [
        "status.allocation.devices.results[1].consumedCapacity[memory]: -1Gi must be greater "
        "than or equal to 0"]
    assert allocation_problems({"devices": {"results": [result] * 33}}) == [
        "status.allocation.devices.results: has 33 entries, at most 32 are allowed"]
    config = {"source": "FromClaim", "opaque": {"driver": "d.io", "parameters": {}}}
    assert allocation_problems({"devices": {"results": [result], "config": [config] * 65}}) == [
        "status.allocation.devices.config: has 65 entries, at most 64 are allowed"]
    assert allocation_problems({"devices": {"results": [result], "config": [config] * 64}}) == []
    assert allocation_problems(None) == []


def test_claim_spec_problems_cover_exactly_and_every_first_available_choice() -> None:
    spec = {"devices": {"requests": [
        {"name": "a", "exactly": {"deviceClassName": "c", "capacity": {"requests": {
            "memory": "1Gi"}}}},
        {"name": "b", "firstAvailable": [
            {"name": "x", "deviceClassName": "c", "capacity": {"requests": {"cores": "-5"}}},
            {"name": "y", "deviceClassName": "c", "capacity": {"requests": {"9lives": "1"}}}]},
    ]}}
    problems = claim_spec_problems(spec)
    assert problems[0] == ("spec.devices.requests[1].firstAvailable[0].capacity.requests[cores]: "
                           "-5 must be greater than or equal to 0")
    assert problems[1].startswith(
        "spec.devices.requests[1].firstAvailable[1].capacity.requests[9lives]: the name '9lives' "
        "must be a C identifier")
    assert len(problems) == 2
    assert claim_spec_problems({"devices": {"requests": spec["devices"]["requests"][:1]}}) == []


@pytest.mark.parametrize("version", ["1.2.3", "0.0.0", f"{'9' * 18}.0.0", "1.2.3-rc.1+b.5",
                                     "1.2.3-x" + "9" * 30, "1.2.3+" + "0" * 40])
def test_versions_1_38_accepts(version: str) -> None:
    assert version_problem(version) is None


@pytest.mark.parametrize("version", [f"{'9' * 19}.0.0", f"1.{'1' * 19}.0", "1.2", "01.2.3",
                                     f"1.2.3-{'1' * 19}", "v1.2.3", "1.2.3+" + "0" * 60])
def test_versions_1_38_refuses(version: str) -> None:
    assert version_problem(version)


def test_a_device_node_selector_has_exactly_one_term() -> None:
    term = {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n"]}]}
    one = {"name": "d", "nodeSelector": {"nodeSelectorTerms": [term]}}
    two = {"name": "d", "nodeSelector": {"nodeSelectorTerms": [term, term]}}
    assert slice_device_problems(one, "spec.devices[0]") == []
    assert slice_device_problems(two, "spec.devices[0]") == [
        "spec.devices[0].nodeSelector.nodeSelectorTerms: has 2 terms, must have exactly one"]
    assert slice_problems({"spec": {"perDeviceNodeSelection": True, "devices": [one, two]}}) == [
        "spec.devices[1].nodeSelector.nodeSelectorTerms: has 2 terms, must have exactly one"]
    assert slice_problems({"spec": {"nodeSelector": {"nodeSelectorTerms": [term, term]},
                                    "devices": []}}) == [
        "spec.nodeSelector.nodeSelectorTerms: must have exactly one term"]


def test_a_device_with_a_long_version_or_a_bad_name_is_named() -> None:
    device = {"name": "d", "attributes": {"driverVersion": {"version": f"{'5' * 19}.0.0"},
                                          "bad-name": {"string": "x"}},
              "capacity": {"a/b/c": {"value": "1"}}}
    problems = slice_device_problems(device, "spec.devices[3]")
    assert [p.split(":")[0] for p in problems] == [
        "spec.devices[3].attributes[driverVersion].version",
        "spec.devices[3].attributes[bad-name]", "spec.devices[3].capacity[a/b/c]"]

"""Loading GPUQuota and GPUSharingPolicy documents: what is refused, with which message."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gateway.policy.models import PolicyError, parse_quota, parse_sharing

from .conftest import quota, sharing


@pytest.mark.parametrize(("document", "message"), [
    (quota(memory="12 Gi"), "GPUQuota team-a/team-a-gpu: 1 error: spec.hard.memory: memory "
                            "'12 Gi' is not a quantity"),
    (quota(memory="1.5"), "GPUQuota team-a/team-a-gpu: 1 error: spec.hard.memory: memory must "
                          "be a whole number of bytes, got 1.5"),
    (quota(cores=-1), "GPUQuota team-a/team-a-gpu: 1 error: spec.hard.cores: Input should be "
                      "greater than or equal to 0"),
    (quota(gpus=1), "GPUQuota team-a/team-a-gpu: 1 error: spec.hard.gpus: Extra inputs are not "
                    "permitted"),
    (quota(admission="Deny", memory="1Gi"), "spec.admission: Input should be 'Queue' or "
                                             "'Refuse'"),
    (quota(scope={"deviceClassNames": ["gpu.nvidia.com"]}, memory="1Gi"),
     "spec.scope.deviceClassNames: gpu.nvidia.com is not a dra-gateway device class"),
    (quota(scope={"selector": "device.attributes["}, memory="1Gi"),
     "spec.scope.selector: "),
])
def test_a_bad_quota_is_refused_naming_the_field(document: dict[str, Any], message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_quota(document)
    assert message in str(caught.value)


def test_a_quota_without_namespace_is_refused() -> None:
    document = quota(memory="1Gi")
    del document["metadata"]["namespace"]
    with pytest.raises(PolicyError, match=r"metadata\.namespace is required"):
        parse_quota(document)


def test_quota_memory_is_read_as_bytes() -> None:
    parsed = parse_quota(quota(memory="120Gi", cores=300, devices=4, claims=10))
    assert parsed.spec.hard.items() == [("memory", 120 << 30), ("cores", 300), ("devices", 4),
                                        ("claims", 10)]
    assert parsed.spec.admission == "Queue"


@pytest.mark.parametrize(("spec", "message"), [
    ({"isolation": {"mode": "Label"}}, "spec.isolation: mode Label needs labelKey"),
    ({"isolation": {"mode": "Namespace", "labelKey": "team"}},
     "labelKey is only read with mode Label, not Namespace"),
    ({"isolation": {"mode": "Label", "labelKey": "bad key"}}, "'bad key' is not a label key"),
    ({"allowedEnforcement": ["cuda"]}, "spec.allowedEnforcement.0: Input should be 'none', "
                                       "'hami-core' or 'mps'"),
    ({"maxClaimsPerDevice": 0}, "spec.maxClaimsPerDevice: Input should be greater than or "
                                "equal to 1"),
    ({"minShare": {"memory": "1 G"}}, "spec.minShare.memory: memory '1 G' is not a quantity"),
])
def test_a_bad_sharing_policy_is_refused_naming_the_field(spec: dict[str, Any],
                                                          message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_sharing(sharing(**spec))
    assert str(caught.value).startswith("GPUSharingPolicy tenants: 1 error: ")
    assert message in str(caught.value)

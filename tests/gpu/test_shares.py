"""The allocator's share record: in status.allocation (the annotation only repeats it for
people), one encoder, one tolerant decoder, entries matched to results."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from dra_gateway.gpu.shares import (
    RecordedShare,
    allocated_shares,
    encode_shares,
    recorded_shares,
    result_key,
    share_record,
    shares_by_result,
)
from dra_gateway.kube import names

SHARE = RecordedShare(request="gpu", driver=names.DRIVER, pool="node-1", device="gpu-0",
                      share_id="s-1", consumed_capacity={"memory": "8Gi", "cores": "30"})


def test_the_encoding_is_compact_json_in_the_documented_field_order() -> None:
    assert encode_shares([SHARE]) == (
        '[{"request":"gpu","driver":"gpu.dra-gateway.io","pool":"node-1","device":"gpu-0",'
        '"shareID":"s-1","consumedCapacity":{"memory":"8Gi","cores":"30"}}]')


def _allocation(entries: Any) -> dict[str, Any]:
    """An allocation whose GpuShareAllocation config holds `entries` as its shares."""
    return {"devices": {"config": [{"source": "FromClaim", "opaque": {
        "driver": names.DRIVER, "parameters": {
            "apiVersion": names.API_VERSION, "kind": names.KIND_GPU_SHARE_ALLOCATION,
            "shares": entries}}}]}}


def test_what_is_encoded_reads_back_as_the_same_records() -> None:
    other = RecordedShare(request="gpu/large", driver=names.DRIVER, pool="node-1",
                          device="gpu-0", share_id=None, consumed_capacity={"memory": "1Gi"})
    assert allocated_shares(_allocation(json.loads(encode_shares([SHARE, other])))) == [
        SHARE, other]


@pytest.mark.parametrize("entries", [None, "", {}, 3, "text"],
                         ids=["none", "empty", "object", "number", "string"])
def test_unreadable_shares_count_as_absent(entries: Any) -> None:
    assert allocated_shares(_allocation(entries)) == []


def test_entries_without_a_consumed_capacity_object_are_left_out() -> None:
    entries = [1, "x", {"request": "gpu"}, {"request": "gpu", "consumedCapacity": "8Gi"},
               SHARE.to_json()]
    assert allocated_shares(_allocation(entries)) == [SHARE]


def test_a_claim_without_a_record_in_its_allocation_records_nothing() -> None:
    assert recorded_shares({"metadata": {"name": "c"}}) == []
    assert recorded_shares({}) == []
    assert share_record([]) is None


def test_the_annotation_alone_records_nothing_a_tenant_may_write_it() -> None:
    claim: dict[str, Any] = {
        "metadata": {"annotations": {names.ANNOTATION_SHARES: encode_shares([SHARE])}},
        "status": {"allocation": {"devices": {"results": [], "config": []}}}}
    assert recorded_shares(claim) == []


def test_the_record_is_an_opaque_config_of_the_gateway_in_the_allocation() -> None:
    assert share_record([SHARE]) == {"source": "FromClaim", "requests": ["gpu"], "opaque": {
        "driver": names.DRIVER, "parameters": {
            "apiVersion": names.API_VERSION, "kind": "GpuShareAllocation",
            "shares": [SHARE.to_json()]}}}
    other_driver = {"source": "FromClaim", "opaque": {"driver": "gpu.nvidia.com",
                                                      "parameters": share_record([SHARE])}}
    assert allocated_shares({"devices": {"config": [other_driver]}}) == []


def test_a_claims_record_is_read_and_grouped_by_result_in_order() -> None:
    second = dataclasses.replace(SHARE, share_id="s-2")
    claim: dict[str, Any] = {"status": {"allocation": {"devices": {
        "config": [share_record([SHARE, second])]}}}}
    result = {"request": "gpu", "driver": names.DRIVER, "pool": "node-1", "device": "gpu-0"}
    grouped = shares_by_result(recorded_shares(claim))
    assert [s.share_id for s in grouped[result_key(result)]] == ["s-1", "s-2"]

"""The shares annotation: one encoder, one tolerant decoder, entries matched to results."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import pytest

from dra_gateway.kube import names
from dra_gateway.kube.shares import (
    RecordedShare,
    decode_shares,
    encode_shares,
    recorded_shares,
    result_key,
    shares_by_result,
)

SHARE = RecordedShare(request="gpu", driver=names.DRIVER, pool="node-1", device="gpu-0",
                      share_id="s-1", consumed_capacity={"memory": "8Gi", "cores": "30"})


def test_the_encoding_is_compact_json_in_the_documented_field_order() -> None:
    assert encode_shares([SHARE]) == (
        '[{"request":"gpu","driver":"gpu.dra-gateway.io","pool":"node-1","device":"gpu-0",'
        '"shareID":"s-1","consumedCapacity":{"memory":"8Gi","cores":"30"}}]')


def test_what_is_encoded_decodes_to_the_same_records() -> None:
    other = RecordedShare(request="gpu/large", driver=names.DRIVER, pool="node-1",
                          device="gpu-0", share_id=None, consumed_capacity={"memory": "1Gi"})
    assert decode_shares(encode_shares([SHARE, other])) == [SHARE, other]


@pytest.mark.parametrize("raw", [None, "", "{not json", "{}", "3", '"text"'],
                         ids=["none", "empty", "malformed", "object", "number", "string"])
def test_an_unreadable_annotation_counts_as_absent(raw: str | None) -> None:
    assert decode_shares(raw) == []


def test_entries_without_a_consumed_capacity_object_are_left_out() -> None:
    raw = json.dumps([1, "x", {"request": "gpu"}, {"request": "gpu", "consumedCapacity": "8Gi"},
                      SHARE.to_json()])
    assert decode_shares(raw) == [SHARE]


def test_a_claim_without_the_annotation_records_nothing() -> None:
    assert recorded_shares({"metadata": {"name": "c"}}) == []
    assert recorded_shares({}) == []


def test_a_claims_annotation_is_read_and_grouped_by_result_in_order() -> None:
    second = dataclasses.replace(SHARE, share_id="s-2")
    claim: dict[str, Any] = {"metadata": {"annotations": {
        names.ANNOTATION_SHARES: encode_shares([SHARE, second])}}}
    result = {"request": "gpu", "driver": names.DRIVER, "pool": "node-1", "device": "gpu-0"}
    grouped = shares_by_result(recorded_shares(claim))
    assert [s.share_id for s in grouped[result_key(result)]] == ["s-1", "s-2"]

"""The allocator's record of the shares a claim holds, in `status.allocation`.

Where the API server drops consumable-capacity fields (the DRAConsumableCapacity gate off), a
shared device's result carries no `shareID` or `consumedCapacity`; the allocator records them
in the allocation instead, as one opaque config of the gateway's driver among
`status.allocation.devices.config` (source FromClaim, `requests`: the shared results' names)
whose parameters are a `GpuShareAllocation` document: `{"apiVersion", "kind", "shares": [...]}`
with one entry per shared result, `{"request", "driver", "pool", "device", "shareID",
"consumedCapacity"}`. The planner reads it back to count what the claim holds, the node plugin
to size the container's limits, the demo to show it. Entries are matched to results by
request, driver, pool and device, in order.

Why there: the allocation is written through `/status`, which only holders of
`resourceclaims/status` may write, and the API server keeps it immutable once set, while
anyone who may update claims in the namespace may edit an annotation; shrinking one would
overcommit the card, removing one would free the container from its limits. The allocator
still writes the same list to the annotation `dra-gateway.io/shares` for people (kubectl,
the demo's history), and nothing reads it back: not even as a fallback for claims allocated
before the record moved, because a tenant could add one to an allocation without a record
(whole devices) and make it count as a share. Such older claims count as whole cards for the
planner, which is safe, until released.

This module is the one encoder and the one decoder. The decoder is tolerant: a missing or
malformed record, and any entry that is not an object with a `consumedCapacity` object, count
as absent, so that a claim stays readable. It must not interpret the quantities (callers parse
them) nor do I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from dra_gateway.kube import names, objects

ResultKey = tuple[str, str, str, str]
"""(request, driver, pool, device): how an entry is matched to an allocation result."""


@dataclass(frozen=True, slots=True)
class RecordedShare:
    """One shared device of an allocation, as the annotation records it."""

    request: str  # "req" or "req/sub", as in the allocation result
    driver: str
    pool: str
    device: str
    share_id: str | None
    # Capacity name to quantity, as written (the allocator writes quantity text such as "8Gi").
    consumed_capacity: Mapping[str, Any]

    @property
    def key(self) -> ResultKey:
        return self.request, self.driver, self.pool, self.device

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"request": self.request, "driver": self.driver,
                                 "pool": self.pool, "device": self.device}
        if self.share_id is not None:
            entry["shareID"] = self.share_id
        entry["consumedCapacity"] = dict(self.consumed_capacity)
        return entry


def result_key(result: Mapping[str, Any]) -> ResultKey:
    """The key of an allocation result (`status.allocation.devices.results[]`)."""
    return (str(result.get("request") or ""), str(result.get("driver") or ""),
            str(result.get("pool") or ""), str(result.get("device") or ""))


def share_record(shares: Iterable[RecordedShare]) -> dict[str, Any] | None:
    """The `status.allocation.devices.config` entry recording `shares`; None without any."""
    entries = list(shares)
    if not entries:
        return None
    requests = sorted({s.request for s in entries})
    return {"source": "FromClaim", "requests": requests, "opaque": {
        "driver": names.DRIVER,
        "parameters": {"apiVersion": names.API_VERSION, "kind": names.KIND_GPU_SHARE_ALLOCATION,
                       "shares": [s.to_json() for s in entries]}}}


def _decode_entries(data: Any) -> list[RecordedShare]:
    shares: list[RecordedShare] = []
    for entry in data if isinstance(data, list) else ():
        if not isinstance(entry, Mapping) or not isinstance(entry.get("consumedCapacity"),
                                                             Mapping):
            continue
        share_id = entry.get("shareID")
        shares.append(RecordedShare(
            request=str(entry.get("request") or ""), driver=str(entry.get("driver") or ""),
            pool=str(entry.get("pool") or ""), device=str(entry.get("device") or ""),
            share_id=str(share_id) if share_id is not None else None,
            consumed_capacity=entry["consumedCapacity"]))
    return shares


def allocated_shares(allocation: Mapping[str, Any] | None) -> list[RecordedShare]:
    """The shares an allocation records (its GpuShareAllocation configs), in order."""
    if not isinstance(allocation, Mapping):
        return []
    configs = (allocation.get("devices") or {}).get("config") or ()
    shares: list[RecordedShare] = []
    for config in configs if isinstance(configs, list) else ():
        opaque = config.get("opaque") if isinstance(config, Mapping) else None
        if not isinstance(opaque, Mapping) or opaque.get("driver") != names.DRIVER:
            continue
        params = opaque.get("parameters")
        if isinstance(params, Mapping) and params.get(
                "kind") == names.KIND_GPU_SHARE_ALLOCATION:
            shares.extend(_decode_entries(params.get("shares")))
    return shares


def encode_shares(shares: Iterable[RecordedShare]) -> str:
    """The annotation's value for `shares`, compact JSON in the given order."""
    return json.dumps([s.to_json() for s in shares], separators=(",", ":"))


def recorded_shares(claim: Mapping[str, Any]) -> list[RecordedShare]:
    """What a claim's allocation records, in order (empty when unallocated or without any).

    Never the annotation: that is for people only (see the module's docstring).
    """
    return allocated_shares(objects.status(claim).get("allocation"))


def shares_by_result(shares: Iterable[RecordedShare]) -> dict[ResultKey, list[RecordedShare]]:
    """Entries grouped by result key, each group in annotation order (for matching in turn)."""
    grouped: dict[ResultKey, list[RecordedShare]] = {}
    for share in shares:
        grouped.setdefault(share.key, []).append(share)
    return grouped


__all__ = ["RecordedShare", "ResultKey", "allocated_shares", "encode_shares",
           "recorded_shares", "result_key", "share_record", "shares_by_result"]

"""The shares annotation (`dra-gateway.io/shares`): the allocator's record of what a claim holds.

Where the API server drops consumable-capacity fields (the DRAConsumableCapacity gate off), a
shared device's result carries no `shareID` or `consumedCapacity`; the allocator records them
on the claim instead, as a JSON list with one entry per shared result:
`{"request", "driver", "pool", "device", "shareID", "consumedCapacity"}`. The planner reads it
back to count what the claim holds, the node plugin to size the container's limits, the demo
to show it. Entries are matched to results by request, driver, pool and device, in order.

This module is the one encoder and the one decoder. The decoder is tolerant: a missing or
malformed annotation, and any entry that is not an object with a `consumedCapacity` object,
count as absent, because the annotation is advice next to the allocation and must never make a
claim unreadable. It must not interpret the quantities (callers parse them) nor do I/O.
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


def encode_shares(shares: Iterable[RecordedShare]) -> str:
    """The annotation's value for `shares`, compact JSON in the given order."""
    return json.dumps([s.to_json() for s in shares], separators=(",", ":"))


def decode_shares(raw: str | None) -> list[RecordedShare]:
    """The entries of an annotation value, in order; anything unreadable is left out."""
    if not raw:
        return []
    try:
        data = json.loads(raw)
    except (TypeError, ValueError):
        return []
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


def recorded_shares(claim: Mapping[str, Any]) -> list[RecordedShare]:
    """What a claim's shares annotation records, in order (empty without one)."""
    raw = objects.annotations(claim).get(names.ANNOTATION_SHARES)
    return decode_shares(raw if isinstance(raw, str) else None)


def shares_by_result(shares: Iterable[RecordedShare]) -> dict[ResultKey, list[RecordedShare]]:
    """Entries grouped by result key, each group in annotation order (for matching in turn)."""
    grouped: dict[ResultKey, list[RecordedShare]] = {}
    for share in shares:
        grouped.setdefault(share.key, []).append(share)
    return grouped


__all__ = ["RecordedShare", "ResultKey", "decode_shares", "encode_shares", "recorded_shares",
           "result_key", "shares_by_result"]

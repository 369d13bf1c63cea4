"""Usage from allocated claims and the ledger's answer to a newcomer, whoever allocated."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gateway.gpu.shares import RecordedShare, share_record
from dra_gateway.kube import names
from dra_gateway.policy.amounts import Amounts, DeviceKey, charges_of
from dra_gateway.policy.models import parse_quota
from dra_gateway.policy.quotas import QuotaLedger, compile_quota

from .conftest import allocated, quota, share_spec

GI = 1 << 30
Cards = dict[DeviceKey, dict[str, Any]]


def _ledger(*documents: dict[str, Any]) -> QuotaLedger:
    ledger = QuotaLedger()
    ledger.set_quotas(compile_quota(parse_quota(d)) for d in documents)
    return ledger


@pytest.mark.parametrize(("claim", "expected"), [
    # A native share: consumedCapacity.
    (allocated(share_spec("10Gi", 30), ("gpu-0", {"memory": "10Gi", "cores": "30"})),
     Amounts(10 * GI, 30, 1, 1)),
    # A result without consumedCapacity holds the whole card (kube-scheduler's allocations).
    (allocated(share_spec(None, None, count=2), ("gpu-0", None), ("gpu-2", None)),
     Amounts(120 * GI, 200, 2, 1)),
    # Another class's results are not the gateway's to count.
    (allocated(share_spec("10Gi", 30, cls="gpu.nvidia.com"), ("gpu-0", None)), Amounts()),
])
def test_usage_of_an_allocated_claim(claim: dict[str, Any], expected: Amounts,
                                     cards: Cards) -> None:
    ledger = _ledger(quota(memory="1Ti"))
    ledger.set_claim("u", "team-a", charges_of(claim, cards.get))
    (q,) = ledger.quotas("team-a")
    assert ledger.used(q) == expected


def _recorded(claim: dict[str, Any], *shares: tuple[str, dict[str, str]]) -> dict[str, Any]:
    """`claim` with `shares` recorded in its allocation, as the allocator writes them where
    the API server drops consumedCapacity (gpu.shares)."""
    request = claim["spec"]["devices"]["requests"][0]["name"]
    claim["status"]["allocation"]["devices"]["config"] = [share_record(
        RecordedShare(request, names.DRIVER, "node-a", device, f"s-{device}", consumed)
        for device, consumed in shares)]
    return claim


def test_a_share_recorded_in_the_allocation_counts_its_share(cards: Cards) -> None:
    claim = _recorded(allocated(share_spec("10Gi", 30), ("gpu-0", None)),
                      ("gpu-0", {"memory": "10Gi", "cores": "30"}))
    (charge,) = charges_of(claim, cards.get)
    assert (charge.memory, charge.cores, charge.whole) == (10 * GI, 30, False)


_FORGED = ('[{"request": "gpu", "driver": "gpu.dra-gateway.io", "pool": "node-a", '
           '"device": "gpu-0", "consumedCapacity": {"memory": "1", "cores": "0"}}]')


@pytest.mark.parametrize("recorded", [False, True], ids=["whole card", "recorded share"])
def test_a_tenant_edited_shares_annotation_never_shrinks_a_charge(recorded: bool,
                                                                  cards: Cards) -> None:
    # A tenant with `edit` may annotate its own claim; the quota must charge what the
    # allocation holds: the whole card without a record, the recorded share with one.
    claim = allocated(share_spec(None, None), ("gpu-0", None))
    if recorded:
        claim = _recorded(claim, ("gpu-0", {"memory": "10Gi", "cores": "30"}))
    truth = charges_of(claim, cards.get)
    claim["metadata"]["annotations"] = {names.ANNOTATION_SHARES: _FORGED}
    assert charges_of(claim, cards.get) == truth
    expected = (10 * GI, 30) if recorded else (80 * GI, 100)
    assert [(c.memory, c.cores) for c in truth] == [expected]


@pytest.mark.parametrize("consumed", [{"memory": "lots", "cores": "30"},
                                      {"memory": "-1Gi", "cores": "30"},
                                      {"memory": "10Gi", "cores": "-5"}])
def test_a_share_the_api_would_refuse_charges_the_whole_card(consumed: dict[str, str],
                                                             cards: Cards) -> None:
    (charge,) = charges_of(allocated(share_spec("10Gi", 30), ("gpu-0", consumed)), cards.get)
    assert (charge.memory, charge.cores, charge.whole) == (80 * GI, 100, True)


def test_devices_count_once_however_many_claims_share_them(cards: Cards) -> None:
    ledger = _ledger(quota(devices=1))
    for uid in ("a", "b"):
        claim = allocated(share_spec("10Gi", 30), ("gpu-0", {"memory": "10Gi", "cores": "30"}))
        ledger.set_claim(uid, "team-a", charges_of(claim, cards.get))
    (q,) = ledger.quotas("team-a")
    assert ledger.used(q) == Amounts(20 * GI, 60, 1, 2)
    same = charges_of(allocated(share_spec("10Gi", 30),
                                ("gpu-0", {"memory": "10Gi", "cores": "30"})), cards.get)
    other = charges_of(allocated(share_spec("10Gi", 30),
                                 ("gpu-1", {"memory": "10Gi", "cores": "30"})), cards.get)
    assert ledger.excess("team-a", [same]) == []
    (exceeded,) = ledger.excess("team-a", [other])
    assert exceeded.message == ("exceeded quota team-a-gpu: requested devices=1, used "
                                "devices=1, limited devices=1")
    ledger.remove_claim("a")
    ledger.remove_claim("b")
    assert ledger.used(q) == Amounts()


def test_the_ledger_names_every_quota_and_amount_exceeded(cards: Cards) -> None:
    ledger = _ledger(quota(memory="120Gi", cores=200),
                     quota("h100s", devices=1, scope={
                         "selector": 'device.attributes["gpu.dra-gateway.io"].productName'
                                     '.contains("H100")'}))
    ledger.set_claim("a", "team-a", charges_of(
        allocated(share_spec(None, None), ("gpu-0", None)), cards.get))
    ledger.set_claim("b", "team-a", charges_of(
        allocated(share_spec("20Gi", 50), ("gpu-2", {"memory": "20Gi", "cores": "50"})),
        cards.get))
    new = charges_of(allocated(share_spec("40Gi", 60),
                               ("gpu-1", {"memory": "40Gi", "cores": "60"})), cards.get)
    assert [e.message for e in ledger.excess("team-a", [new])] == [
        "exceeded quota h100s: requested devices=1, used devices=1, limited devices=1",
        "exceeded quota team-a-gpu: requested memory=40Gi,cores=60, used memory=100Gi,"
        "cores=150, limited memory=120Gi,cores=200",
    ]
    # The A100 is outside the H100 quota's scope, and the other namespace has no quota.
    a100 = charges_of(allocated(share_spec("10Gi", 10),
                                ("gpu-2", {"memory": "10Gi", "cores": "10"})), cards.get)
    assert ledger.excess("team-a", [a100]) == []
    assert ledger.excess("team-b", [new]) == []


def test_quota_status_lists_the_limited_fields(cards: Cards) -> None:
    ledger = _ledger(quota(memory="120Gi", claims=4))
    ledger.set_claim("a", "team-a", charges_of(
        allocated(share_spec("10Gi", 30), ("gpu-0", {"memory": "10Gi", "cores": "30"})),
        cards.get))
    (q,) = ledger.quotas("team-a")
    assert ledger.status(q) == {"hard": {"memory": "120Gi", "claims": 4},
                                "used": {"memory": "10Gi", "claims": 1}}


def test_changing_the_quotas_recounts_the_claims_held(cards: Cards) -> None:
    ledger = _ledger(quota(memory="1Gi"))
    ledger.set_claim("a", "team-a", charges_of(
        allocated(share_spec("10Gi", 30), ("gpu-0", {"memory": "10Gi", "cores": "30"})),
        cards.get))
    ledger.set_quotas([compile_quota(parse_quota(quota("new", cores=50)))])
    (q,) = ledger.quotas("team-a")
    assert (q.name, ledger.used(q)) == ("new", Amounts(10 * GI, 30, 1, 1))

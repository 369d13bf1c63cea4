"""GPUQuota cohorts (policy/models.py, policy/quotas.py): `min` beside `hard`, lending and
borrowing within a cohort, the status parts, and the documents refused."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_gateway.kube import names
from dra_gateway.policy.amounts import Amounts, DeviceCharge
from dra_gateway.policy.models import PolicyError, parse_quota
from dra_gateway.policy.quotas import QuotaLedger, compile_quota


def quota(namespace: str, *, hard: dict[str, Any], min_: dict[str, Any] | None = None,
          cohort: str | None = "research") -> dict[str, Any]:
    spec: dict[str, Any] = {"hard": hard}
    if min_ is not None:
        spec["min"] = min_
        if cohort:
            spec["cohort"] = cohort
    return {"apiVersion": names.API_VERSION, "kind": "GPUQuota",
            "metadata": {"name": "gpu", "namespace": namespace}, "spec": spec}


def card(index: int, namespace: str = "", whole: bool = True) -> DeviceCharge:
    return DeviceCharge(key=(names.DRIVER, "pool", f"gpu-{namespace}-{index}"),
                        class_name=names.GPU_CLASS, memory=16 << 30, cores=100, whole=whole,
                        device=None)


def ledger(*quotas: dict[str, Any]) -> QuotaLedger:
    kept = QuotaLedger()
    kept.set_quotas([compile_quota(parse_quota(q)) for q in quotas])
    return kept


def test_a_quota_without_min_keeps_its_meaning() -> None:
    kept = ledger(quota("a", hard={"devices": 2}), quota("b", hard={"devices": 2}))
    a = kept.quotas("a")[0]
    assert a.cohort is None
    assert a.min == ()
    assert not kept.exceeds(a, Amounts(devices=2))
    assert kept.exceeds(a, Amounts(devices=3))
    assert kept.status(a) == {"hard": {"devices": 2}, "used": {"devices": 0}}
    assert kept.cohorts() == {}


def test_a_namespace_borrows_what_the_cohort_leaves_unused_up_to_hard() -> None:
    kept = ledger(quota("a", hard={"devices": 8}, min_={"devices": 4}),
                  quota("b", hard={"devices": 8}, min_={"devices": 4}))
    a, b = kept.quotas("a")[0], kept.quotas("b")[0]
    for i in range(6):
        assert not kept.excess("b", [[card(i, "b")]]), i
        kept.set_claim(f"b{i}", "b", [card(i, "b")])
    assert kept.borrowing(b)
    assert not kept.borrowing(a)
    assert kept.status(b)["borrowed"] == {"devices": 2}
    assert kept.status(a)["lent"] == {"devices": 2}
    assert kept.status(a)["min"] == {"devices": 4}
    # Two more: b reaches 8, its hard; the cohort uses all 8 guaranteed.
    kept.set_claim("b6", "b", [card(6, "b")])
    kept.set_claim("b7", "b", [card(7, "b")])
    (past,) = kept.excess("b", [[card(8, "b")]])
    assert past.cohort is None
    assert past.fields == ("devices",)
    # a's own guarantee is lent: a pod within it waits, and may take it back.
    (lent,) = kept.excess("a", [[card(0, "a")]])
    assert lent.reclaims
    assert lent.cohort is not None
    assert lent.message == (
        "quota gpu's guarantee is lent to its cohort: requested devices=1, used devices=0, "
        "min devices=4; cohort research uses devices=8 of its guarantees devices=8: pods "
        "borrowing it are preempted to take it back")
    assert kept.cohort_peers("a") == {"b": True}
    assert kept.cohort_peers("b") == {"a": False}


def test_borrowing_stops_where_the_cohort_has_nothing_left_to_lend() -> None:
    kept = ledger(quota("a", hard={"devices": 8}, min_={"devices": 2}),
                  quota("b", hard={"devices": 8}, min_={"devices": 2}))
    for i in range(2):
        kept.set_claim(f"a{i}", "a", [card(i, "a")])
    kept.set_claim("b0", "b", [card(0, "b")])
    # b within its guarantee: fine; past it, the cohort (4 guaranteed, 3 used) has 1 left.
    assert not kept.excess("b", [[card(1, "b")]])
    (short,) = kept.excess("b", [[card(1, "b")], [card(2, "b")]])
    assert not short.reclaims
    assert short.message.startswith("exceeded quota gpu's guarantee and its cohort has none "
                                    "left to lend: requested devices=2, used devices=1")


def test_a_field_limited_but_not_guaranteed_is_a_plain_ceiling() -> None:
    kept = ledger(quota("a", hard={"devices": 8, "claims": 3}, min_={"devices": 1}),
                  quota("b", hard={"devices": 8}, min_={"devices": 1}))
    kept.set_claim("a0", "a", [card(0, "a")])
    kept.set_claim("a1", "a", [card(1, "a")])  # borrows b's device
    assert kept.status(kept.quotas("a")[0])["borrowed"] == {"devices": 1}
    # A third card: the cohort guarantees two in all.
    (short,) = kept.excess("a", [[card(2, "a")]])
    assert short.fields == ("devices",)
    assert short.cohort is not None
    # A claim on a card it already touches costs only a claim: claims are no guarantee, only
    # their hard limit counts.
    assert not kept.excess("a", [[card(1, "a")]])
    kept.set_claim("a2", "a", [card(1, "a")])
    (ceiling,) = kept.excess("a", [[card(1, "a")]])
    assert ceiling.cohort is None
    assert ceiling.fields == ("claims",)


@pytest.mark.parametrize(("spec", "message"), [
    ({"hard": {"devices": 2}, "min": {"devices": 3}, "cohort": "c"},
     "min.devices (3) is above hard.devices (2): the guarantee is at most the ceiling"),
    ({"hard": {"memory": "40Gi"}, "min": {"memory": "80Gi"}, "cohort": "c"},
     "min.memory (80Gi) is above hard.memory (40Gi)"),
    ({"hard": {"devices": 2}, "min": {"cores": 100}, "cohort": "c"},
     "min.cores needs hard.cores: the ceiling that borrowing stops at"),
    ({"hard": {"devices": 2}, "min": {"devices": 1}},
     "min needs cohort: a guarantee is lent to and borrowed from the quotas of its cohort"),
    ({"hard": {"devices": 2}, "cohort": "c"}, "cohort needs min"),
    ({"hard": {"devices": 2}, "min": {"devices": 1}, "cohort": "Research_Team"},
     "'Research_Team' is not a cohort name"),
])
def test_bad_guarantees_are_refused_naming_the_field(spec: dict[str, Any], message: str) -> None:
    doc = {"apiVersion": names.API_VERSION, "kind": "GPUQuota",
           "metadata": {"name": "gpu", "namespace": "team-a"}, "spec": spec}
    with pytest.raises(PolicyError) as err:
        parse_quota(doc)
    assert "GPUQuota team-a/gpu" in str(err.value)
    assert message in str(err.value)


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.sampled_from("abc"), st.integers(1, 3),
                                st.booleans()), max_size=40),
       mins=st.tuples(st.integers(0, 4), st.integers(0, 4), st.integers(0, 4)))
def test_what_is_borrowed_never_exceeds_what_lenders_leave_unused(
        steps: list[tuple[str, int, bool]], mins: tuple[int, int, int]) -> None:
    """Claims come and go where the ledger lets them: no quota passes hard, and the cohort's
    borrowed total stays within what its lenders leave unused (lent adds up to it)."""
    kept = ledger(*(quota(ns, hard={"devices": 6}, min_={"devices": m})
                    for ns, m in zip("abc", mins, strict=True)))
    held: dict[str, list[str]] = {ns: [] for ns in "abc"}
    serial = 0
    for ns, count, leave in steps:
        if leave and held[ns]:
            kept.remove_claim(held[ns].pop(0))
        else:
            charges = [card(serial + i, ns) for i in range(count)]
            serial += count
            if not kept.excess(ns, [charges]):
                uid = f"{ns}-{serial}"
                kept.set_claim(uid, ns, charges)
                held[ns].append(uid)
        quotas = [kept.quotas(ns)[0] for ns in "abc"]
        used = [kept.used(q).devices for q in quotas]
        assert all(u <= 6 for u in used)
        borrowed = sum(max(0, u - m) for u, m in zip(used, mins, strict=True))
        unused = sum(max(0, m - u) for u, m in zip(used, mins, strict=True))
        assert borrowed <= unused
        assert sum(kept.lent(q).devices for q in quotas) == borrowed
        assert all(kept.lent(q).devices <= max(0, m - u)
                   for q, u, m in zip(quotas, used, mins, strict=True))

"""Who may be made to leave (allocator/planner/leaving.py): the one set of rules preemption,
cohort reclaim and defragmentation follow, each rule with the case that shows it."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gateway.allocator.planner.leaving import (
    Resident,
    blocked_by_budget,
    disruptions_allowed,
    movable,
    preemptible,
    protected,
    reclaimable,
    shares_a_claim,
)
from dra_gateway.kube import names


def _resident(*, priority: int = 0, namespace: str = "ml", node: str | None = "n1",
              shared: bool = False, claims: bool = True, fixed: str | None = None,
              budgets: tuple[str, ...] = (), annotations: dict[str, str] | None = None
              ) -> Resident:
    pod: dict[str, Any] = {"metadata": {"name": "p", "namespace": namespace, "uid": "u1",
                                        "annotations": annotations or {}},
                           "spec": {"nodeName": node} if node else {}}
    reserved = [{"resource": "pods", "name": "p", "uid": "u1"}]
    if shared:
        reserved.append({"resource": "pods", "name": "q", "uid": "u2"})
    claim = {"metadata": {"name": "c", "namespace": namespace},
             "status": {"reservedFor": reserved}}
    return Resident(pod, (claim,) if claims else (), priority, fixed, budgets)


def test_a_budget_with_no_disruption_left_protects_its_pods() -> None:
    resident = _resident(budgets=("ml/pdb",))
    assert protected(resident, {"ml/pdb": 0})
    assert protected(resident, {})  # a budget not read counts as allowing nothing
    assert not protected(resident, {"ml/pdb": 1})
    assert blocked_by_budget(resident, {"ml/pdb": 0}) == (
        "its PodDisruptionBudget ml/pdb allows no disruption now")
    assert not protected(_resident(), {})


def test_a_budget_allows_nothing_until_its_latest_spec_is_observed() -> None:
    stale = {"metadata": {"generation": 2},
             "status": {"observedGeneration": 1, "disruptionsAllowed": 3}}
    fresh = {"metadata": {"generation": 2},
             "status": {"observedGeneration": 2, "disruptionsAllowed": 3}}
    assert (disruptions_allowed(stale), disruptions_allowed(fresh)) == (0, 3)


@pytest.mark.parametrize(("resident", "expected"), [
    (_resident(priority=10), True),
    (_resident(priority=100), False),  # equal priority: kube-scheduler preempts only lower
    (_resident(priority=200), False),
    (_resident(priority=10, shared=True), False),  # leaving would free nothing
    (_resident(priority=10, node=None), False),  # not placed
    (_resident(priority=10, claims=False), False),  # holds no gateway device
    (_resident(priority=10, namespace="lender"), False),  # its cohort peer within guarantee
    (_resident(priority=10, namespace="borrower"), True),
    # `defrag: never` binds defrag only: preemption follows priority, as kube-scheduler does.
    (_resident(priority=10, annotations={names.ANNOTATION_DEFRAG: "never"},
               fixed="annotated never"), True),
])
def test_who_may_be_preempted(resident: Resident, expected: bool) -> None:
    assert preemptible(resident, 100, {"lender": False, "borrower": True}) is expected


def test_who_may_give_a_borrowed_guarantee_back() -> None:
    assert reclaimable(_resident(namespace="borrower", priority=1000), {"borrower"})
    assert not reclaimable(_resident(namespace="ml"), {"borrower"})
    assert not reclaimable(_resident(namespace="borrower", shared=True), {"borrower"})
    assert shares_a_claim(_resident(shared=True))


def test_who_defrag_may_move() -> None:
    assert movable(_resident(priority=5), 5, {})
    assert not movable(_resident(priority=6), 5, {})  # never for a pod of lower priority
    assert not movable(_resident(fixed="a bare pod"), 5, {})
    assert not movable(_resident(budgets=("ml/pdb",)), 5, {"ml/pdb": 0})
    assert movable(_resident(budgets=("ml/pdb",)), 5, {"ml/pdb": 1})

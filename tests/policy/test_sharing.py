"""card_refusal and combine: what a card allows a newcomer, given the sharing rules."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gateway.policy.models import PolicyError, parse_sharing
from dra_gateway.policy.sharing import NO_RULES, Holder, card_refusal, combine

from .conftest import sharing

H100 = "NVIDIA H100 80GB HBM3"


def _rules(namespace: str = "team-a", labels: dict[str, str] | None = None,
           **spec: Any) -> Any:
    return combine([parse_sharing(sharing(**spec))], namespace, labels or {})


@pytest.mark.parametrize(("rules", "whole", "product", "holders", "reason"), [
    (NO_RULES, False, H100, [Holder("", None)], None),
    (_rules(allowedModels=["*a100*"]), True, H100, [],
     "model 'NVIDIA H100 80GB HBM3' is not allowed by GPUSharingPolicy tenants (allowedModels)"),
    (_rules(allowedModels=["*H100*"]), False, H100, [], None),
    (_rules(maxClaimsPerDevice=2), False, H100, [Holder("", None)], None),
    (_rules(maxClaimsPerDevice=2), False, H100, [Holder("", None), Holder("", None)],
     "already holds 2 claims, the most a sharing policy allows is 2 (maxClaimsPerDevice)"),
    # A holder's own limit binds a newcomer without rules.
    (NO_RULES, False, H100, [Holder("", 1)],
     "already holds 1 claims, the most a sharing policy allows is 1 (maxClaimsPerDevice)"),
    (_rules(isolation={"mode": "Namespace"}), False, H100, [Holder("namespace=team-a", None)],
     None),
    (_rules(isolation={"mode": "Namespace"}), False, H100, [Holder("namespace=team-b", None)],
     "shared by namespace=team-b, isolated from namespace=team-a (isolation)"),
    # An isolated holder keeps out a newcomer without isolation, and the other way round.
    (NO_RULES, False, H100, [Holder("namespace=team-b", None)],
     "shared by namespace=team-b, isolated from a tenant without isolation (isolation)"),
    (_rules(isolation={"mode": "Namespace"}), False, H100, [Holder("", None)],
     "shared by a tenant without isolation, isolated from namespace=team-a (isolation)"),
    (_rules(labels={"team": "red"}, isolation={"mode": "Label", "labelKey": "team"}), False,
     H100, [Holder("team=red", None)], None),
    (_rules(labels={"team": "red"}, isolation={"mode": "Label", "labelKey": "team"}), False,
     H100, [Holder("team=blue", None)],
     "shared by team=blue, isolated from team=red (isolation)"),
    (_rules(exclusive=True), False, H100, [Holder("", None)],
     "shared, and GPUSharingPolicy tenants allows no shares (exclusive)"),
])
def test_what_a_card_allows(rules: Any, whole: bool, product: str, holders: list[Holder],
                            reason: str | None) -> None:
    assert card_refusal(rules, whole=whole, product_name=product, holders=holders) == reason


def test_policies_selecting_one_namespace_combine_to_the_strictest() -> None:
    policies = [parse_sharing(sharing("a", maxClaimsPerDevice=4, minShare={"memory": "2Gi"},
                                      allowedEnforcement=["hami-core", "mps"],
                                      isolation={"mode": "Label", "labelKey": "team"})),
                parse_sharing(sharing("b", maxClaimsPerDevice=2, minShare={"memory": "4Gi"},
                                      allowedEnforcement=["mps", "none"], requireCores=True,
                                      isolation={"mode": "Namespace"}))]
    rules = combine(policies, "team-a", {"team": "red"})
    assert rules.policies == ("a", "b")
    assert rules.max_claims_per_device == 2
    assert rules.min_memory == 4 << 30
    assert rules.enforcement == frozenset({"mps"})
    assert rules.require_cores
    assert rules.tenant == "namespace=team-a"


def test_a_namespace_without_the_isolation_label_is_its_own_tenant() -> None:
    rules = _rules("team-c", {}, isolation={"mode": "Label", "labelKey": "team"})
    assert rules.tenant == "namespace=team-c"


@pytest.mark.parametrize(("selector", "selected"), [
    (None, True),  # left out: the empty selector, every namespace
    ({"matchLabels": {"tier": "gold"}}, True),
    ({"matchLabels": {"tier": "silver"}}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gold", "silver"]}]},
     True),
    ({"matchExpressions": [{"key": "spot", "operator": "DoesNotExist"}]}, True),
    # Kubernetes refuses NotIn without values and Exists with values (the CRD too): such a
    # selector selects no namespace, by kube.nodeselectors' one LabelSelector reading.
    ({"matchExpressions": [{"key": "spot", "operator": "NotIn"}]}, False),
    ({"matchExpressions": [{"key": "tier", "operator": "Exists", "values": ["gold"]}]}, False),
])
def test_a_policys_namespace_selector_is_a_kubernetes_label_selector(
        selector: dict[str, Any] | None, selected: bool) -> None:
    policy = parse_sharing(sharing(selector=selector, exclusive=True))
    rules = combine([policy], "team-a", {"tier": "gold"})
    assert rules.exclusive is selected


def test_shares_are_mig_instances_if_any_policy_says_so() -> None:
    """Hardware isolation is the stricter; a policy that leaves it out serves shares in
    software, and does not undo another's MIG."""
    software = parse_sharing(sharing("a"))
    assert software.spec.shares.served_by == "Software"
    mig = parse_sharing(sharing("b", shares={"servedBy": "MIG"}))
    assert not combine([software], "team-a", {}).mig_shares
    assert combine([software, mig], "team-a", {}).mig_shares
    assert not NO_RULES.mig_shares


def test_an_unknown_way_to_serve_shares_is_refused_naming_the_field() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_sharing(sharing("a", shares={"servedBy": "mig"}))
    assert str(caught.value).startswith("GPUSharingPolicy a: 1 error: spec.shares.servedBy: ")
    assert "'Software' or 'MIG'" in str(caught.value)

"""check_admission: what /validate refuses at once, as a table of requests and policies."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gateway.kube import names
from dra_gateway.policy.admission import QuotaState, check_admission
from dra_gateway.policy.amounts import Amounts, requests_of
from dra_gateway.policy.catalog import Catalog
from dra_gateway.policy.models import parse_quota, parse_sharing
from dra_gateway.policy.quotas import compile_quota
from dra_gateway.policy.sharing import NO_RULES, combine

from .conftest import quota, share_spec, sharing

GI = 1 << 30


def _quota(used: Amounts | None = None, **kwargs: Any) -> QuotaState:
    return QuotaState(compile_quota(parse_quota(quota(**kwargs))), used or Amounts())


def _rules(**spec: Any) -> Any:
    return combine([parse_sharing(sharing(**spec))], "team-a", {})


@pytest.mark.parametrize(("claims", "quotas", "messages"), [
    # Within every limit: nothing to say.
    ([share_spec("10Gi", 30)], [_quota(memory="120Gi", cores=100)], []),
    # A request larger than the quota by itself can never run.
    ([share_spec("40Gi", 30)], [_quota(memory="30Gi")],
     ["pod team-a/p: exceeded quota team-a-gpu: requested memory=40Gi, used memory=0, limited "
      "memory=30Gi; the request alone is more than the quota allows, so it could never run: "
      "ask for less or raise spec.hard"]),
    # Two claims of one pod add up.
    ([share_spec("20Gi", 30), share_spec("20Gi", 30, request="other")],
     [_quota(memory="30Gi", claims=1)],
     ["pod team-a/p: exceeded quota team-a-gpu: requested memory=40Gi,claims=2, used "
      "memory=0,claims=0, limited memory=30Gi,claims=1; the request alone"]),
    # Whole cards: 100 cores and one device each; their memory is the allocator's to count.
    ([share_spec(None, None, count=3)], [_quota(memory="1Gi", devices=2)],
     ["pod team-a/p: exceeded quota team-a-gpu: requested devices=3, used devices=0, limited "
      "devices=2; the request alone"]),
    # Queue (the default) does not refuse over current usage: the allocator queues the pod.
    ([share_spec("40Gi", 30)], [_quota(Amounts(memory=100 * GI), memory="120Gi")], []),
    # Refuse does, in ResourceQuota's words.
    ([share_spec("40Gi", 30)], [_quota(Amounts(memory=100 * GI), memory="120Gi",
                                       admission="Refuse")],
     ["pod team-a/p: exceeded quota team-a-gpu: requested memory=40Gi, used memory=100Gi, "
      "limited memory=120Gi"]),
    # A quota scoped to MIG does not count GPU shares.
    ([share_spec("40Gi", 30)], [_quota(memory="1Gi",
                                       scope={"deviceClassNames": [names.MIG_CLASS]})], []),
    # A selector-scoped quota is the allocator's: only the card tells whether it counts.
    ([share_spec(None, None, count=3)],
     [_quota(devices=2, scope={"selector": 'device.attributes["gpu.dra-gateway.io"]'
                                           '.productName.contains("H100")'})], []),
])
def test_quotas_at_admission(claims: list[dict[str, Any]], quotas: list[QuotaState],
                             messages: list[str]) -> None:
    found = check_admission(what="pod team-a/p", claims=[requests_of(c) for c in claims],
                            quotas=quotas, sharing=NO_RULES)
    assert len(found) == len(messages)
    for violation, message in zip(found, messages, strict=True):
        assert violation.message.startswith(message)
        assert violation.policy == "GPUQuota team-a/team-a-gpu"


def test_a_refusing_quota_charges_only_the_claims_the_object_adds() -> None:
    # A pod naming an existing (allocated) claim and using a template: the named claim is in
    # the usage already, so only the template's claim is added to it; both still count
    # against the quota by itself.
    named, made = requests_of(share_spec("40Gi", 30)), requests_of(share_spec("10Gi", 30))
    refusing = [_quota(Amounts(memory=100 * GI), memory="120Gi", admission="Refuse")]
    assert check_admission(what="pod team-a/p", claims=[named, made], quotas=refusing,
                           sharing=NO_RULES, charged=[made]) == []
    found = check_admission(what="pod team-a/p", claims=[named, made], quotas=refusing,
                            sharing=NO_RULES)
    assert [v.message for v in found] == [
        "pod team-a/p: exceeded quota team-a-gpu: requested memory=50Gi, used memory=100Gi, "
        "limited memory=120Gi"]
    over_by_itself = [_quota(memory="45Gi", admission="Refuse")]
    found = check_admission(what="pod team-a/p", claims=[named, made], quotas=over_by_itself,
                            sharing=NO_RULES, charged=[made])
    assert [v.reason for v in found] == ["QuotaNeverFits"]
    # Nothing added: no usage check at all, however full the quota.
    full = [_quota(Amounts(memory=200 * GI), memory="120Gi", admission="Refuse")]
    assert check_admission(what="pod team-a/p", claims=[named], quotas=full,
                           sharing=NO_RULES, charged=[]) == []


@pytest.mark.parametrize(("claim", "spec", "reason", "message"), [
    (share_spec("10Gi", 30), {"exclusive": True}, "SharingForbidden",
     "pod team-a/p: request 'gpu' asks for a share of a GPU, but GPUSharingPolicy tenants makes "
     "the namespace exclusive (whole cards only); ask for whole GPUs"),
    (share_spec("2Gi", 30), {"minShare": {"memory": "4Gi"}}, "ShareTooSmall",
     "pod team-a/p: request 'gpu' asks for memory=2Gi per GPU, below the minimum share "
     "memory=4Gi of GPUSharingPolicy tenants"),
    (share_spec("8Gi", 5), {"minShare": {"cores": 10}}, "ShareTooSmall",
     "pod team-a/p: request 'gpu' asks for cores=5 per GPU, below the minimum share cores=10 "
     "of GPUSharingPolicy tenants"),
    (share_spec("8Gi", None), {"requireCores": True}, "ComputeRequired",
     "pod team-a/p: request 'gpu' asks for a share of GPU memory without compute (cores), but "
     "GPUSharingPolicy tenants requires compute with every share; add a cores request"),
    (share_spec("8Gi", 20, enforcement="none"), {"allowedEnforcement": ["hami-core", "mps"]},
     "EnforcementForbidden",
     "pod team-a/p: request 'gpu' is enforced by 'none', but GPUSharingPolicy tenants allows "
     "only hami-core, mps (allowedEnforcement)"),
    (share_spec("8Gi", 20), {"shares": {"servedBy": "MIG"}}, "MIGRequired",
     "pod team-a/p: request 'gpu' asks for a share of a GPU, but GPUSharingPolicy tenants "
     "serves the namespace's shares with MIG instances (shares.servedBy: MIG); ask for a MIG "
     "instance (deviceClassName mig.dra-gateway.io) or a whole GPU, or use the legacy names, "
     "which are translated to MIG instances"),
    (share_spec(None, 50, enforcement="mps"), {"shares": {"servedBy": "MIG"}}, "MIGRequired",
     "pod team-a/p: request 'gpu' asks for a share of a GPU, but GPUSharingPolicy tenants "
     "serves the namespace's shares with MIG instances (shares.servedBy: MIG); ask for a MIG "
     "instance (deviceClassName mig.dra-gateway.io) or a whole GPU, or use the legacy names, "
     "which are translated to MIG instances"),
])
def test_sharing_rules_at_admission(claim: dict[str, Any], spec: dict[str, Any], reason: str,
                                    message: str) -> None:
    found = check_admission(what="pod team-a/p", claims=[requests_of(claim)], quotas=[],
                            sharing=_rules(**spec))
    assert [(v.reason, v.message) for v in found] == [(reason, message)]


@pytest.mark.parametrize("spec", [
    {"exclusive": True}, {"minShare": {"memory": "40Gi", "cores": 50}}, {"requireCores": True},
    {"allowedEnforcement": ["mps"]}, {"shares": {"servedBy": "MIG"}},
])
def test_whole_cards_pass_every_sharing_rule(spec: dict[str, Any]) -> None:
    assert check_admission(what="pod team-a/p", claims=[requests_of(share_spec(None, None))],
                           quotas=[], sharing=_rules(**spec)) == []


@pytest.mark.parametrize("served_by", ["MIG", "Software"])
def test_mig_instances_pass_where_shares_are_mig_instances(served_by: str) -> None:
    claim = share_spec("10Gi", None, cls=names.MIG_CLASS, enforcement="none")
    assert check_admission(what="pod team-a/p", claims=[requests_of(claim)], quotas=[],
                           sharing=_rules(shares={"servedBy": served_by})) == []


def _fallback_spec(later_share: bool) -> dict[str, Any]:
    """A MIG instance first, then (firstAvailable) a share of a card or a whole card."""
    later: dict[str, Any] = {"name": "card", "deviceClassName": names.GPU_CLASS,
                             "allocationMode": "ExactCount", "count": 1}
    if later_share:
        later["capacity"] = {"requests": {"memory": "8Gi", "cores": "20"}}
    return {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
        {"name": "mig", "deviceClassName": names.MIG_CLASS, "allocationMode": "ExactCount",
         "count": 1}, later]}]}}


@pytest.mark.parametrize(("spec", "reason", "message"), [
    ({"shares": {"servedBy": "MIG"}}, "MIGRequired",
     "pod team-a/p: request 'gpu' offers a share of a GPU (firstAvailable alternative "
     "'card'), but GPUSharingPolicy tenants serves the namespace's shares with MIG instances "
     "(shares.servedBy: MIG); offer MIG instances (deviceClassName mig.dra-gateway.io) or "
     "whole GPUs"),
    ({"exclusive": True}, "SharingForbidden",
     "pod team-a/p: request 'gpu' offers a share of a GPU (firstAvailable alternative "
     "'card'), but GPUSharingPolicy tenants makes the namespace exclusive (whole cards only); "
     "offer whole GPUs"),
])
def test_a_share_offered_as_a_later_alternative_is_judged_as_the_first(
        spec: dict[str, Any], reason: str, message: str) -> None:
    """A tenant cannot slip a share past the rules behind a first alternative they allow:
    the allocator falls back to it when the first does not fit."""
    found = check_admission(what="pod team-a/p", claims=[requests_of(_fallback_spec(True))],
                            quotas=[], sharing=_rules(**spec))
    assert [(v.reason, v.message) for v in found] == [(reason, message)]
    assert check_admission(what="pod team-a/p", claims=[requests_of(_fallback_spec(False))],
                           quotas=[], sharing=_rules(**spec)) == []
    assert check_admission(what="pod team-a/p", claims=[requests_of(_fallback_spec(True))],
                           quotas=[], sharing=_rules(maxClaimsPerDevice=2)) == []


def test_a_later_alternatives_share_may_be_said_in_its_own_config() -> None:
    spec = _fallback_spec(False)
    spec["devices"]["config"] = [{"requests": ["gpu/card"], "opaque": {
        "driver": names.DRIVER, "parameters": {
            "apiVersion": names.API_VERSION, "kind": names.KIND_GPU_SHARE_CONFIG,
            "memory": 8 << 30}}}]
    (shape,) = requests_of(spec)
    assert shape.later_shares == ("card",)


def test_a_policy_applies_only_to_the_namespaces_it_selects() -> None:
    catalog = Catalog.build(
        sharing=[sharing(selector={"matchLabels": {"tier": "prod"}}, exclusive=True)],
        namespaces=[{"metadata": {"name": "prod", "labels": {"tier": "prod"}}},
                    {"metadata": {"name": "dev", "labels": {"tier": "dev"}}}])
    assert catalog.sharing_for("prod").exclusive
    assert catalog.sharing_for("dev").empty
    assert catalog.sharing_for("unseen").empty


def test_a_selector_on_the_namespace_name_label_matches_without_labels() -> None:
    catalog = Catalog.build(
        sharing=[sharing(selector={"matchExpressions": [
            {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["team-a"]}]},
            exclusive=True)],
        namespaces=[{"metadata": {"name": "team-a"}}])
    assert catalog.sharing_for("team-a").exclusive
    assert catalog.sharing_for("team-b").empty


def test_the_catalog_keeps_the_error_of_a_broken_policy_and_the_rest() -> None:
    catalog = Catalog.build(quotas=[quota(memory="1 Gi"), quota("ok", memory="1Gi")])
    assert [s.quota.name for s in catalog.quotas_for("team-a")] == ["ok"]
    assert catalog.errors == ("GPUQuota team-a/team-a-gpu: 1 error: spec.hard.memory: memory "
                              "'1 Gi' is not a quantity: "
                              + catalog.errors[0].split("is not a quantity: ", 1)[1],)


def test_the_catalog_reads_usage_from_the_quota_status() -> None:
    document = quota(memory="120Gi")
    document["status"] = {"used": {"memory": "100Gi", "claims": 3}}
    (state,) = Catalog.build(quotas=[document]).quotas_for("team-a")
    assert state.used == Amounts(memory=100 * GI, claims=3)

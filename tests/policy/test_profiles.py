"""The allowed-models check at admission: device profiles, the models a request's selectors
reach among them, and when /validate refuses a request whose cards are all of forbidden models."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gateway.kube import names
from dra_gateway.policy.admission import check_admission
from dra_gateway.policy.amounts import RequestShape, requests_of
from dra_gateway.policy.models import parse_sharing
from dra_gateway.policy.profiles import (
    DeviceProfile,
    DeviceProfiles,
    ModelReach,
    model_lookup,
    product_name,
    profile_device,
    profile_signature,
)
from dra_gateway.policy.sharing import SharingRules, combine

from .conftest import share_spec, sharing

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"
ATTRS = 'device.attributes["gpu.dra-gateway.io"]'
CLASS_SELECTORS = {
    names.GPU_CLASS: (f"device.driver == '{names.DRIVER}' && {ATTRS}.type == 'gpu'",),
    names.MIG_CLASS: (f"device.driver == '{names.DRIVER}' && {ATTRS}.type == 'mig'",),
}


def _device(index: int, product: str, *, kind: str = "gpu") -> dict[str, Any]:
    attributes: dict[str, Any] = {
        "type": {"string": kind}, "uuid": {"string": f"GPU-{product}-{index}"},
        "pcieBusID": {"string": f"0000:{index:02x}:00.0"}, "productName": {"string": product},
        "architecture": {"string": "Hopper" if "H100" in product else "Ampere"}}
    if kind == "mig":
        attributes["profile"] = {"string": "3g.40gb"}
        attributes["parentUUID"] = {"string": f"GPU-{product}-{index}"}
    return {"name": f"{kind}-{index}", "attributes": attributes,
            "capacity": {"memory": {"value": "80Gi"}, "cores": {"value": "100"}}}


def _profiles(*devices: dict[str, Any], generation: int = 1) -> DeviceProfiles:
    found: dict[str, DeviceProfile] = {}
    for device in devices:
        signature = profile_signature(names.DRIVER, device)
        found.setdefault(signature, DeviceProfile(signature, names.DRIVER,
                                                  profile_device(names.DRIVER, device),
                                                  product_name(names.DRIVER, device)))
    return DeviceProfiles(tuple(found.values()), generation)


CLUSTER = _profiles(*(_device(i, p) for i in range(4) for p in (H100, A100)),
                    _device(9, A100, kind="mig"))


def _rules(*lists: list[str]) -> SharingRules:
    return combine([parse_sharing(sharing(f"models-{n}", allowedModels=patterns))
                    for n, patterns in enumerate(lists)], "team-a", {})


def _claim(*selectors: str, cls: str = names.GPU_CLASS, memory: str | None = "10Gi",
           first_available: list[dict[str, Any]] | None = None) -> list[RequestShape]:
    spec = share_spec(memory, 30 if memory else None, cls=cls)
    request = spec["devices"]["requests"][0]
    if selectors:
        request["exactly"]["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    if first_available is not None:
        request["firstAvailable"] = [request.pop("exactly"), *first_available]
    return requests_of(spec)


def _found(claim: list[RequestShape], rules: SharingRules,
           profiles: DeviceProfiles = CLUSTER, reach: ModelReach | None = None) -> list[str]:
    lookup = model_lookup(reach or ModelReach(), profiles, CLASS_SELECTORS.get)
    return [f"{v.reason}: {v.message}" for v in check_admission(
        what="pod team-a/train", claims=[claim], quotas=[], sharing=rules, models=lookup,
        places=["spec.resourceClaims[0] ResourceClaimTemplate t: spec.spec"])]


def _product_is(model: str) -> str:
    return f'{ATTRS}.productName == "{model}"'


@pytest.mark.parametrize(("claim", "allowed", "messages"), [
    # Only H100s match, and only A100s are allowed: it could never run.
    (_claim(_product_is(H100)), [["*A100*"]],
     ["ModelForbidden: pod team-a/train: request 'gpu' (spec.resourceClaims[0] "
      "ResourceClaimTemplate t: spec.spec.devices.requests[0]) can run only on NVIDIA H100 80GB "
      "HBM3, which GPUSharingPolicy models-0 does not allow (allowedModels: *A100*); ask for an "
      "allowed model"]),
    # One matching model allowed: the allocator picks among the cards.
    (_claim(f'{ATTRS}.productName.lowerAscii().contains("100")'), [["*A100*"]], []),
    # No selector: every card of the class, A100s among them.
    (_claim(), [["*A100*"]], []),
    # Whole cards are checked too, and so are MIG instances (of the MIG class's cards only).
    (_claim(_product_is(H100), memory=None), [["*A100*"]], ["ModelForbidden"]),
    (_claim(cls=names.MIG_CLASS), [["*H100*"]],
     ["ModelForbidden: pod team-a/train: request 'gpu' (spec.resourceClaims[0] "
      "ResourceClaimTemplate t: spec.spec.devices.requests[0]) can run only on "
      "NVIDIA A100-SXM4-80GB, which GPUSharingPolicy models-0 does not allow (allowedModels: "
      "*H100*); ask for an allowed model"]),
    # Several policies: every list must allow the model; all are named.
    (_claim(), [["*A100*", "*H100*"], ["*H100*"]],
     []),
    (_claim(cls=names.MIG_CLASS), [["*A100*", "*H100*"], ["*H100*"]],
     ["ModelForbidden: pod team-a/train: request 'gpu' (spec.resourceClaims[0] "
      "ResourceClaimTemplate t: spec.spec.devices.requests[0]) can run only on "
      "NVIDIA A100-SXM4-80GB, which GPUSharingPolicies models-0, models-1 do not allow "
      "(allowedModels: [*A100*, *H100*] and [*H100*]); ask for an allowed model"]),
    # Patterns match as the allocator matches them: whole name, case-insensitive.
    (_claim(_product_is(H100)), [["*h100*"]], []),
    (_claim(_product_is(H100)), [["H100"]], ["ModelForbidden"]),
    # Matching no card at all: the cards may come later, the allocator decides.
    (_claim(_product_is("NVIDIA B200")), [["*A100*"]], []),
    # A selector the profiles cannot judge: an error (a missing attribute), an identity
    # attribute, a macro over the attributes; the allocator reports or decides.
    (_claim(f'{ATTRS}.noSuchAttribute == "x"'), [["*A100*"]], []),
    (_claim(f'{ATTRS}.uuid == "GPU-{H100}-0"'), [["*A100*"]], []),
    (_claim(f'{ATTRS}.exists(k, k == "productName") && {_product_is(H100)}'), [["*A100*"]],
     []),
    # firstAvailable: any alternative that reaches an allowed model is enough.
    (_claim(_product_is(H100), first_available=[{
        "name": "mig", "deviceClassName": names.MIG_CLASS}]), [["*A100*"]], []),
    (_claim(_product_is(H100), first_available=[{
        "name": "other", "deviceClassName": names.GPU_CLASS,
        "selectors": [{"cel": {"expression": f'{ATTRS}.architecture == "Hopper"'}}]}]),
     [["*A100*"]], ["ModelForbidden"]),
    # An alternative of another driver's class may land on cards no policy reads.
    (_claim(_product_is(H100), first_available=[{
        "name": "nvidia", "deviceClassName": "gpu.nvidia.com"}]), [["*A100*"]], []),
], ids=["only-forbidden", "one-allowed", "no-selector", "whole-card", "mig", "two-policies",
        "two-policies-mig", "case-insensitive", "whole-name", "no-card", "cel-error",
        "identity", "macro", "first-available-allowed", "first-available-forbidden",
        "first-available-other-driver"])
def test_a_request_is_refused_only_when_every_card_it_matches_is_forbidden(
        claim: list[RequestShape], allowed: list[list[str]], messages: list[str]) -> None:
    found = _found(claim, _rules(*allowed))
    assert len(found) == len(messages), found
    for text, message in zip(found, messages, strict=True):
        assert text.startswith(message)


def test_a_native_claim_names_the_request_field() -> None:
    shapes = _claim(_product_is(H100))
    lookup = model_lookup(ModelReach(), CLUSTER, CLASS_SELECTORS.get)
    found = check_admission(what="ResourceClaim team-a/c", claims=[shapes], quotas=[],
                            sharing=_rules(["*A100*"]), models=lookup,
                            fields={"gpu": "spec.devices.requests[0]"})
    assert [v.message for v in found] == [
        "ResourceClaim team-a/c: request 'gpu' (spec.devices.requests[0]) can run only on "
        "NVIDIA H100 80GB HBM3, which GPUSharingPolicy models-0 does not allow (allowedModels: "
        "*A100*); ask for an allowed model"]


def test_an_unknown_device_class_leaves_it_to_the_allocator() -> None:
    lookup = model_lookup(ModelReach(), CLUSTER, lambda _: None)
    assert check_admission(what="pod team-a/p", claims=[_claim(_product_is(H100))], quotas=[],
                           sharing=_rules(["*A100*"]), models=lookup) == []


def test_rules_without_models_never_evaluate_selectors() -> None:
    reach = ModelReach()
    assert _found(_claim(_product_is(H100)), _rules(), reach=reach) == []
    assert _found(_claim(_product_is(H100)),
                  combine([parse_sharing(sharing(exclusive=False, maxClaimsPerDevice=2))],
                          "team-a", {}), reach=reach) == []
    assert reach.evaluations == 0


def test_verdicts_are_remembered_per_selectors_and_profile_generation() -> None:
    reach = ModelReach()
    claim, rules = _claim(_product_is(H100)), _rules(["*A100*"])
    for _ in range(3):
        assert len(_found(claim, rules, reach=reach)) == 1
    assert reach.evaluations == 1
    # Other selectors, another answer.
    assert _found(_claim(_product_is(A100)), rules, reach=reach) == []
    assert reach.evaluations == 2
    # The same cards under a new generation: evaluated again, once.
    newer = DeviceProfiles(CLUSTER.profiles, CLUSTER.generation + 1)
    for _ in range(2):
        assert len(_found(claim, rules, profiles=newer, reach=reach)) == 1
    assert reach.evaluations == 3
    # No card of the model left: allowed (it may come back).
    only_a100 = _profiles(_device(0, A100), generation=CLUSTER.generation + 2)
    assert _found(claim, rules, profiles=only_a100, reach=reach) == []


def test_a_selector_over_the_cost_budget_leaves_it_to_the_allocator() -> None:
    # Each evaluation is charged its estimated cost; a budget below one selector's stops the
    # check before anything runs.
    reach = ModelReach(cost_limit=1)
    assert _found(_claim(_product_is(H100)), _rules(["*A100*"]), reach=reach) == []


def test_devices_alike_but_for_their_identity_are_one_profile() -> None:
    assert len(CLUSTER.profiles) == 3  # H100, A100, A100 MIG
    assert {p.product_name for p in CLUSTER.profiles} == {H100, A100}
    one, other = _device(0, H100), _device(1, H100)
    assert profile_signature(names.DRIVER, one) == profile_signature(names.DRIVER, other)
    other["capacity"]["memory"]["value"] = "94Gi"
    assert profile_signature(names.DRIVER, one) != profile_signature(names.DRIVER, other)
    qualified = {"name": "q", "attributes": {f"{names.DRIVER}/uuid": {"string": "GPU-q"},
                                             "productName": {"string": H100}}}
    assert "uuid" not in str(profile_device(names.DRIVER, qualified))

"""/validate of ResourceClaims and ResourceClaimTemplates written natively, against GPU policies.

Each rule is a row, run for a claim and for a template of the same spec (a claim's spec is a
template's spec.spec); the messages name the object and the request's field.
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import kubernetes_validate
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import Cluster
from dra_gateway.kube.resources import GPU_QUOTAS, GPU_SHARING_POLICIES, NAMESPACES
from dra_gateway.policy.amounts import Amounts
from dra_gateway.webhook.app import STATE

Client = TestClient[web.Request, web.Application]
NAMESPACE = "team-a"
CLAIM = "ResourceClaim"
TEMPLATE = "ResourceClaimTemplate"
_RESOURCES = {CLAIM: "resourceclaims", TEMPLATE: "resourceclaimtemplates"}


def _share(memory: str | None = "10Gi", cores: int | None = 30, *, count: int = 1,
           enforcement: str = "hami-core", cls: str = names.GPU_CLASS,
           request: str = "gpu") -> dict[str, Any]:
    """One request of a claim spec; whole cards when memory and cores are None."""
    exactly: dict[str, Any] = {"deviceClassName": cls, "allocationMode": "ExactCount",
                               "count": count}
    amounts = {k: v for k, v in (("memory", memory),
                                 ("cores", None if cores is None else str(cores))) if v}
    if amounts:
        exactly["capacity"] = {"requests": amounts}
    return {"name": request, "exactly": exactly,
            "parameters": {"apiVersion": names.API_VERSION, "kind": names.KIND_GPU_SHARE_CONFIG,
                           "enforcement": enforcement,
                           **({"cores": cores} if cores is not None else {})}}


def _spec(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {
        "requests": [{"name": r["name"], "exactly": r["exactly"]} for r in requests],
        "config": [{"requests": [r["name"]],
                    "opaque": {"driver": names.DRIVER, "parameters": r["parameters"]}}
                   for r in requests if r["exactly"]["deviceClassName"] in names.GATEWAY_CLASSES]}}


def _object(kind: str, spec: dict[str, Any], *, name: str = "c",
            **metadata: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind,
            "metadata": {"name": name, "namespace": NAMESPACE, **metadata},
            "spec": spec if kind == CLAIM else {"spec": spec}}


def _review(obj: dict[str, Any], *, uid: str = "c-1") -> dict[str, Any]:
    kind = {"group": "resource.k8s.io", "version": "v1", "kind": obj["kind"]}
    resource = {"group": "resource.k8s.io", "version": "v1",
                "resource": _RESOURCES[obj["kind"]]}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": uid, "kind": kind, "resource": resource, "requestKind": kind,
        "requestResource": resource, "name": obj["metadata"]["name"], "namespace": NAMESPACE,
        "operation": "CREATE", "userInfo": {"username": "alice"}, "object": obj,
        "oldObject": None, "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}}}


def _quota(*, admission: str = "Queue", used: dict[str, Any] | None = None,
           namespace: str = NAMESPACE, **hard: Any) -> dict[str, Any]:
    quota: dict[str, Any] = {"apiVersion": names.API_VERSION, "kind": "GPUQuota",
                             "metadata": {"name": "team-a-gpu", "namespace": namespace},
                             "spec": {"hard": hard, "admission": admission}}
    if used is not None:
        quota["status"] = {"used": used}
    return quota


def _sharing(**spec: Any) -> dict[str, Any]:
    return {"apiVersion": names.API_VERSION, "kind": "GPUSharingPolicy",
            "metadata": {"name": "tenants"},
            "spec": {"namespaceSelector": {"matchLabels": {"tier": "shared"}}, **spec}}


async def _install(client: Client, cluster: Cluster, policies: list[dict[str, Any]]) -> None:
    await cluster.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": NAMESPACE,
                                                   "labels": {"tier": "shared"}}})
    used = 0
    for policy in copy.deepcopy(policies):
        if policy["kind"] != "GPUQuota":
            await cluster.create(GPU_SHARING_POLICIES, policy)
            continue
        namespace = policy["metadata"]["namespace"]
        status = policy.pop("status", None)
        created = await cluster.create(GPU_QUOTAS, policy, namespace=namespace)
        if status is not None:
            # As the allocator writes usage: through the status subresource.
            used += 1
            created["status"] = status
            await cluster.update(GPU_QUOTAS, created, namespace=namespace,
                                 subresource="status")
    state = client.app[STATE]
    for _ in range(300):
        catalog = state.policies.catalog
        if state.policies.synced and len(catalog.quotas) + len(catalog.sharing) == len(
                policies) and sum(q.used != Amounts() for q in catalog.quotas) == used:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the webhook did not see {len(policies)} policies")


async def _verdict(client: Client, obj: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post("/validate", data=orjson.dumps(_review(obj)))
    assert resp.status == 200, await resp.text()
    answer: dict[str, Any] = (await resp.json())["response"]
    assert answer["uid"] == "c-1"
    return answer


def _both(verdict: tuple[str, str] | None) -> dict[str, tuple[str, str] | None]:
    return {CLAIM: verdict, TEMPLATE: verdict}


_NEVER = ("the request alone is more than the quota allows, so it could never run: ask for "
          "less or raise spec.hard")

# (label, policies, requests, {kind: (reason, message) or None}); "{what}" is the object,
# "{spec}" its claim spec's path ("spec" or "spec.spec").
CASES: list[tuple[str, list[dict[str, Any]], list[dict[str, Any]],
                  dict[str, tuple[str, str] | None]]] = [
    ("larger than the hard quota by itself",
     [_quota(memory="30Gi")], [_share("40Gi", 30)],
     {CLAIM: ("QuotaNeverFits",
              "{what} ({spec}.devices.requests[0]): exceeded quota team-a-gpu: requested "
              "memory=40Gi, used memory=0, limited memory=30Gi; " + _NEVER),
      TEMPLATE: ("QuotaNeverFits",
                 "{what} ({spec}.devices.requests[0]): exceeded quota team-a-gpu: requested "
                 "memory=40Gi, used memory=0, limited memory=30Gi; " + _NEVER)}),
    ("more whole cards than the quota's devices",
     [_quota(devices=2)], [_share(None, None, count=3)],
     _both(("QuotaNeverFits",
             "{what} ({spec}.devices.requests[0]): exceeded quota team-a-gpu: requested "
             "devices=3, used devices=0, limited devices=2; " + _NEVER))),
    ("two requests adding up past the quota",
     [_quota(memory="30Gi")], [_share("20Gi", 30), _share("20Gi", 30, request="other")],
     _both(("QuotaNeverFits",
             "{what} ({spec}.devices.requests[0], {spec}.devices.requests[1]): exceeded quota "
             "team-a-gpu: requested memory=40Gi, used memory=0, limited memory=30Gi; " + _NEVER))),
    # A claim will hold what it asks: a Refuse-mode quota refuses it over current usage. A
    # template holds nothing until a pod uses it, and the pod is checked then.
    ("over a refusing quota's current usage",
     [_quota(memory="120Gi", admission="Refuse", used={"memory": "100Gi"})],
     [_share("40Gi", 30)],
     {CLAIM: ("QuotaExceeded",
              "{what} ({spec}.devices.requests[0]): exceeded quota team-a-gpu: requested "
              "memory=40Gi, used memory=100Gi, limited memory=120Gi"),
      TEMPLATE: None}),
    ("over a queueing quota's current usage",
     [_quota(memory="120Gi", used={"memory": "100Gi"})], [_share("40Gi", 30)],
     {CLAIM: None, TEMPLATE: None}),
    ("within the quota",
     [_quota(memory="120Gi", admission="Refuse", used={"memory": "10Gi"})],
     [_share("40Gi", 30)], {CLAIM: None, TEMPLATE: None}),
    ("a quota of another namespace",
     [_quota(memory="1Gi", namespace="team-b")], [_share("40Gi", 30)],
     {CLAIM: None, TEMPLATE: None}),
    ("a share in an exclusive namespace",
     [_sharing(exclusive=True)], [_share("10Gi", 30)],
     _both(("SharingForbidden",
             "{what}: request 'gpu' ({spec}.devices.requests[0]) asks for a share of a GPU, but "
             "GPUSharingPolicy tenants makes the namespace exclusive (whole cards only); ask "
             "for whole GPUs"))),
    ("whole cards in an exclusive namespace",
     [_sharing(exclusive=True)], [_share(None, None, count=2)],
     {CLAIM: None, TEMPLATE: None}),
    ("a share below the minimum memory",
     [_sharing(minShare={"memory": "4Gi"})], [_share("2Gi", 30)],
     _both(("ShareTooSmall",
             "{what}: request 'gpu' ({spec}.devices.requests[0]) asks for memory=2Gi per GPU, "
             "below the minimum share memory=4Gi of GPUSharingPolicy tenants"))),
    ("a share below the minimum compute",
     [_sharing(minShare={"cores": 10})], [_share("8Gi", 5)],
     _both(("ShareTooSmall",
             "{what}: request 'gpu' ({spec}.devices.requests[0]) asks for cores=5 per GPU, "
             "below the minimum share cores=10 of GPUSharingPolicy tenants"))),
    ("a share without compute where compute is required",
     [_sharing(requireCores=True)], [_share("8Gi", None)],
     _both(("ComputeRequired",
             "{what}: request 'gpu' ({spec}.devices.requests[0]) asks for a share of GPU "
             "memory without compute (cores), but GPUSharingPolicy tenants requires compute "
             "with every share; add a cores request"))),
    ("a forbidden enforcement mode",
     [_sharing(allowedEnforcement=["hami-core", "mps"])],
     [_share("8Gi", 20, enforcement="none")],
     _both(("EnforcementForbidden",
             "{what}: request 'gpu' ({spec}.devices.requests[0]) is enforced by 'none', but "
             "GPUSharingPolicy tenants allows only hami-core, mps (allowedEnforcement)"))),
    ("the second request breaking a rule, the first another driver's",
     [_sharing(exclusive=True)],
     [_share(None, None, cls="gpu.nvidia.com", request="nv"), _share("10Gi", 30)],
     _both(("SharingForbidden",
             "{what}: request 'gpu' ({spec}.devices.requests[1]) asks for a share of a GPU, but "
             "GPUSharingPolicy tenants makes the namespace exclusive (whole cards only); ask "
             "for whole GPUs"))),
    ("a share where shares are MIG instances",
     [_sharing(shares={"servedBy": "MIG"})], [_share("10Gi", 30)],
     _both(("MIGRequired",
             "{what}: request 'gpu' ({spec}.devices.requests[0]) asks for a share of a GPU, but "
             "GPUSharingPolicy tenants serves the namespace's shares with MIG instances "
             "(shares.servedBy: MIG); ask for a MIG instance (deviceClassName "
             "mig.dra-gateway.io) or a whole GPU, or use the legacy names, which are "
             "translated to MIG instances"))),
    ("a MIG instance or a whole card where shares are MIG instances",
     [_sharing(shares={"servedBy": "MIG"})],
     [_share("10Gi", None, cls=names.MIG_CLASS, enforcement="none", request="mig"),
      _share(None, None)],
     {CLAIM: None, TEMPLATE: None}),
    ("another driver's claim, whatever the policies",
     [_sharing(exclusive=True), _quota(memory="1Gi")],
     [_share("10Gi", 30, cls="gpu.nvidia.com")], {CLAIM: None, TEMPLATE: None}),
]


def _cases() -> list[Any]:
    return [pytest.param(policies, requests, kind, expected[kind], id=f"{label} ({kind})")
            for label, policies, requests, expected in CASES for kind in (CLAIM, TEMPLATE)]


@pytest.mark.parametrize(("policies", "requests", "kind", "expected"), _cases())
async def test_a_native_claim_or_template_meets_the_gpu_policies_at_create(
        client: Client, cluster: Cluster, policies: list[dict[str, Any]],
        requests: list[dict[str, Any]], kind: str, expected: tuple[str, str] | None) -> None:
    await _install(client, cluster, policies)
    obj = _object(kind, _spec(*requests))
    answer = await _verdict(client, obj)
    if expected is None:
        assert answer["allowed"] is True
        assert "status" not in answer
        return
    reason, message = expected
    what = f"{kind} {NAMESPACE}/c"
    assert answer["allowed"] is False
    assert answer["status"] == {"code": 403, "reason": reason, "message": message.format(
        what=what, spec="spec" if kind == CLAIM else "spec.spec")}


async def test_every_violation_of_a_claim_is_listed_in_one_message(
        client: Client, cluster: Cluster) -> None:
    await _install(client, cluster, [_sharing(minShare={"memory": "4Gi"}, requireCores=True),
                                     _quota(memory="1Gi")])
    answer = await _verdict(client, _object(CLAIM, _spec(_share("2Gi", None))))
    assert answer["status"]["reason"] == "ShareTooSmall"
    assert answer["status"]["message"] == (
        "ResourceClaim team-a/c: request 'gpu' (spec.devices.requests[0]) asks for memory=2Gi "
        "per GPU, below the minimum share memory=4Gi of GPUSharingPolicy tenants; "
        "ResourceClaim team-a/c: request 'gpu' (spec.devices.requests[0]) asks for a share of "
        "GPU memory without compute (cores), but GPUSharingPolicy tenants requires compute with "
        "every share; add a cores request; ResourceClaim team-a/c (spec.devices.requests[0]): "
        "exceeded quota team-a-gpu: requested memory=2Gi, used memory=0, limited memory=1Gi; "
        + _NEVER)


async def test_the_gateways_own_templates_and_claims_made_for_pods_pass(
        client: Client, cluster: Cluster) -> None:
    # /mutate translated a pod that /validate checks itself, and the claim controller makes a
    # claim for a pod /validate already checked: neither is refused nor counted again (a
    # Refuse-mode quota at its limit would otherwise refuse the claim of an admitted pod).
    await _install(client, cluster, [
        _sharing(exclusive=True),
        _quota(memory="120Gi", admission="Refuse", used={"memory": "120Gi"})])
    spec = _spec(_share("10Gi", 30))
    managed = {names.LABEL_MANAGED_BY: names.MANAGED_BY}
    translated = _object(TEMPLATE, spec, name="dra-gateway-0123456789abcdef", labels=managed)
    owned = _object(CLAIM, spec, name="train-0-gpu-x7k2p", ownerReferences=[{
        "apiVersion": "v1", "kind": "Pod", "name": "train-0", "uid": "0b7c3f4e-1",
        "controller": True, "blockOwnerDeletion": True}])
    for obj in (translated, owned):
        assert (await _verdict(client, obj))["allowed"] is True, obj["metadata"]["name"]
    # The marks are checked together: a template labelled so under a name of its own is not
    # the gateway's, nor a claim a pod merely owns without controlling it.
    labelled = _object(TEMPLATE, spec, name="mine", labels=managed)
    merely_owned = _object(CLAIM, spec, ownerReferences=[{
        "apiVersion": "v1", "kind": "Pod", "name": "train-0", "uid": "0b7c3f4e-1"}])
    for obj in (labelled, merely_owned):
        assert (await _verdict(client, obj))["status"]["reason"] == "SharingForbidden"


async def test_a_claim_is_allowed_untouched_without_policies(client: Client) -> None:
    answer = await _verdict(client, _object(CLAIM, _spec(_share("1Ti", 1))))
    assert answer == {"uid": "c-1", "allowed": True}


@pytest.mark.parametrize("operation", ["UPDATE", "DELETE"])
async def test_only_creation_is_checked(client: Client, cluster: Cluster,
                                        operation: str) -> None:
    await _install(client, cluster, [_sharing(exclusive=True)])
    review = _review(_object(CLAIM, _spec(_share("10Gi", 30))))
    review["request"]["operation"] = operation
    if operation == "DELETE":
        review["request"]["oldObject"], review["request"]["object"] = \
            review["request"]["object"], None
    resp = await client.post("/validate", data=orjson.dumps(review))
    assert (await resp.json())["response"]["allowed"] is True


async def test_a_claim_review_of_another_group_is_a_bad_request(client: Client) -> None:
    review = _review(_object(CLAIM, _spec(_share())))
    review["request"]["resource"]["group"] = "example.com"
    resp = await client.post("/validate", data=orjson.dumps(review))
    assert resp.status == 400
    assert await resp.text() == (
        "request c-1 is for resource 'resourceclaims' of group 'example.com', not pods; this "
        "webhook serves pods, resourceclaims and resourceclaimtemplates: fix the webhook "
        "configuration's rules\n")


async def test_a_claim_without_a_spec_is_a_bad_request(client: Client) -> None:
    obj = _object(CLAIM, {})
    del obj["spec"]
    resp = await client.post("/validate", data=orjson.dumps(_review(obj)))
    assert resp.status == 400
    assert await resp.text() == "request c-1 carries a ResourceClaim without a spec\n"


def test_the_objects_under_review_are_valid_kubernetes_objects() -> None:
    for _, _, requests, _ in CASES:
        for kind in (CLAIM, TEMPLATE):
            kubernetes_validate.validate(_object(kind, _spec(*requests)), "1.34", strict=True)

"""/validate against GPUQuotas and GPUSharingPolicies, read by the webhook's own watches."""

from __future__ import annotations

import asyncio
from typing import Any

import jsonpatch
import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient

from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import Cluster
from dra_gateway.kube.resources import (
    GPU_QUOTAS,
    GPU_SHARING_POLICIES,
    NAMESPACES,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from dra_gateway.webhook.app import STATE

from .conftest import decoded_patch, hami_pod, review

Client = TestClient[web.Request, web.Application]


def _quota(memory: str, *, admission: str = "Queue", namespace: str = "inference",
           used: str | None = None) -> dict[str, Any]:
    quota: dict[str, Any] = {
        "apiVersion": names.API_VERSION, "kind": "GPUQuota",
        "metadata": {"name": "inference-gpu", "namespace": namespace},
        "spec": {"hard": {"memory": memory}, "admission": admission}}
    if used is not None:
        quota["status"] = {"used": {"memory": used}}
    return quota


async def _policies_seen(client: Client, count: int) -> None:
    state = client.app[STATE]
    for _ in range(200):
        catalog = state.policies.catalog
        if state.policies.synced and len(catalog.quotas) + len(catalog.sharing) == count:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the webhook did not see {count} policies")


async def _translated_verdict(client: Client) -> dict[str, Any]:
    pod = hami_pod()
    mutated = await client.post("/mutate", data=orjson.dumps(review(pod)))
    translated = jsonpatch.apply_patch(pod, decoded_patch(await mutated.json()))
    resp = await client.post("/validate", data=orjson.dumps(review(translated, uid="v-1")))
    assert resp.status == 200
    answer: dict[str, Any] = (await resp.json())["response"]
    return answer


async def test_a_pod_larger_than_its_quota_is_refused_at_once(client: Client,
                                                              cluster: Cluster) -> None:
    await cluster.create(GPU_QUOTAS, _quota("4Gi"), namespace="inference")
    await _policies_seen(client, 1)
    answer = await _translated_verdict(client)
    assert answer["allowed"] is False
    assert answer["status"] == {"code": 403, "reason": "QuotaNeverFits", "message": (
        "pod inference/llm-serve: exceeded quota inference-gpu: requested memory=8000Mi, used "
        "memory=0, limited memory=4Gi; the request alone is more than the quota allows, so it "
        "could never run: ask for less or raise spec.hard")}


async def test_a_queueing_quota_lets_the_pod_wait_for_the_allocator(client: Client,
                                                                     cluster: Cluster) -> None:
    await cluster.create(GPU_QUOTAS, _quota("10Gi", used="8Gi"), namespace="inference")
    await _policies_seen(client, 1)
    assert (await _translated_verdict(client))["allowed"] is True


async def test_a_refusing_quota_refuses_over_current_usage(client: Client,
                                                           cluster: Cluster) -> None:
    created = await cluster.create(GPU_QUOTAS, _quota("10Gi", admission="Refuse"),
                                   namespace="inference")
    await _policies_seen(client, 1)
    assert (await _translated_verdict(client))["allowed"] is True
    # The allocator writes usage into the status; the webhook reads it from its watch.
    created["status"] = {"used": {"memory": "8Gi"}}
    await cluster.update(GPU_QUOTAS, created, namespace="inference", subresource="status")
    state = client.app[STATE]
    for _ in range(200):
        if state.policies.catalog.quotas_for("inference")[0].used.memory:
            break
        await asyncio.sleep(0.01)
    answer = await _translated_verdict(client)
    assert answer["status"]["reason"] == "QuotaExceeded"
    assert answer["status"]["message"] == (
        "pod inference/llm-serve: exceeded quota inference-gpu: requested memory=8000Mi, used "
        "memory=8Gi, limited memory=10Gi")


async def test_an_exclusive_namespace_refuses_shares_until_the_policy_goes(
        client: Client, cluster: Cluster) -> None:
    await cluster.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": "inference",
                                                   "labels": {"tier": "production"}}})
    await cluster.create(GPU_SHARING_POLICIES, {
        "apiVersion": names.API_VERSION, "kind": "GPUSharingPolicy",
        "metadata": {"name": "production-exclusive"},
        "spec": {"namespaceSelector": {"matchLabels": {"tier": "production"}},
                 "exclusive": True}})
    await _policies_seen(client, 1)
    answer = await _translated_verdict(client)
    assert answer["status"]["reason"] == "SharingForbidden"
    assert answer["status"]["message"] == (
        "pod inference/llm-serve: request 'server' asks for a share of a GPU, but "
        "GPUSharingPolicy production-exclusive makes the namespace exclusive (whole cards "
        "only); ask for whole GPUs")
    await cluster.delete(GPU_SHARING_POLICIES, "production-exclusive")
    await _policies_seen(client, 0)
    assert (await _translated_verdict(client))["allowed"] is True


async def test_a_quota_of_another_namespace_does_not_apply(client: Client,
                                                           cluster: Cluster) -> None:
    await cluster.create(GPU_QUOTAS, _quota("1Gi", namespace="training"), namespace="training")
    await _policies_seen(client, 1)
    assert (await _translated_verdict(client))["allowed"] is True


async def test_a_quota_status_write_is_taken_in_without_building_the_catalog_again(
        client: Client, cluster: Cluster) -> None:
    # The allocator writes GPUQuota status every few seconds: the webhook keeps the compiled
    # quota and the combined sharing rules, and reads the new usage.
    await cluster.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": "inference",
                                                   "labels": {"tier": "production"}}})
    await cluster.create(GPU_SHARING_POLICIES, {
        "apiVersion": names.API_VERSION, "kind": "GPUSharingPolicy",
        "metadata": {"name": "production"},
        "spec": {"namespaceSelector": {"matchLabels": {"tier": "production"}},
                 "maxClaimsPerDevice": 4}})
    created = await cluster.create(GPU_QUOTAS, _quota("10Gi", admission="Refuse"),
                                   namespace="inference")
    await _policies_seen(client, 2)
    watch = client.app[STATE].policies
    before = watch.catalog
    created["status"] = {"used": {"memory": "8Gi"}}
    await cluster.update(GPU_QUOTAS, created, namespace="inference", subresource="status")
    for _ in range(200):
        if watch.catalog.quotas_for("inference")[0].used.memory:
            break
        await asyncio.sleep(0.01)
    after = watch.catalog
    assert after.quotas_for("inference")[0].used.memory == 8 << 30
    assert after.quotas_for("inference")[0].quota is before.quotas_for("inference")[0].quota
    assert after.sharing_for("inference") is before.sharing_for("inference")
    assert after.sharing_for("inference").max_claims_per_device == 4
    # A change of the spec compiles the quota again.
    created = await cluster.get(GPU_QUOTAS, "inference-gpu", namespace="inference")
    created["spec"]["hard"]["memory"] = "20Gi"
    await cluster.update(GPU_QUOTAS, created, namespace="inference")
    for _ in range(200):
        if watch.catalog.quotas_for("inference")[0].quota.hard_amounts()["memory"] == 20 << 30:
            break
        await asyncio.sleep(0.01)
    assert watch.catalog.quotas_for("inference")[0].quota.hard_amounts()["memory"] == 20 << 30
    assert (await _translated_verdict(client))["allowed"] is True


async def test_a_refusing_quota_does_not_charge_again_a_claim_the_pod_names(
        client: Client, cluster: Cluster) -> None:
    # A ResourceClaim shared by several pods is charged once, when allocated (and checked when
    # it was created): a second pod naming it adds nothing to the quota's usage.
    pod = hami_pod()
    mutated = await client.post("/mutate", data=orjson.dumps(review(pod)))
    translated = jsonpatch.apply_patch(pod, decoded_patch(await mutated.json()))
    entry = translated["spec"]["resourceClaims"][0]
    template = await cluster.get(RESOURCE_CLAIM_TEMPLATES, entry["resourceClaimTemplateName"],
                                 namespace="inference")
    await cluster.create(RESOURCE_CLAIMS, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "shared", "namespace": "inference"},
        "spec": template["spec"]["spec"]}, namespace="inference")
    sharing = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "llm-serve-2", "namespace": "inference"},
               "spec": {"schedulingGates": [{"name": names.SCHEDULING_GATE}],
                        "resourceClaims": [{"name": "gpu", "resourceClaimName": "shared"}],
                        "containers": [{"name": "main", "image": "example.com/llm:1",
                                        "resources": {"claims": [{"name": "gpu"}]}}]}}
    # The shared claim's 8000Mi is in the usage already.
    await cluster.create(GPU_QUOTAS, _quota("10Gi", admission="Refuse", used="8000Mi"),
                         namespace="inference")
    await _policies_seen(client, 1)
    resp = await client.post("/validate", data=orjson.dumps(review(sharing, uid="v-2")))
    assert (await resp.json())["response"] == {"uid": "v-2", "allowed": True}
    # A pod whose template makes a fresh claim is charged and refused.
    answer = await _translated_verdict(client)
    assert answer["status"]["message"] == (
        "pod inference/llm-serve: exceeded quota inference-gpu: requested memory=8000Mi, used "
        "memory=8000Mi, limited memory=10Gi")


def _legacy_pod(name: str, gpus: int = 1) -> dict[str, Any]:
    """A pod that opts out of translation and keeps nvidia.com/gpu for its legacy plugin."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "inference", "uid": f"uid-{name}",
                         "annotations": {names.TRANSLATION_LABEL: "disabled"}},
            "spec": {"containers": [{"name": "main", "image": "cuda:12", "resources": {
                "limits": {"nvidia.com/gpu": str(gpus)}}}]}}


async def _legacy_verdict(client: Client, pod: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post("/validate", data=orjson.dumps(review(pod, uid=pod["metadata"]
                                                                   ["name"])))
    assert resp.status == 200
    answer: dict[str, Any] = (await resp.json())["response"]
    return answer


async def _grant_opt_out(cluster: Cluster) -> None:
    await cluster.create(NAMESPACES, {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "inference", "labels": {names.POD_OPT_OUT_LABEL: "allowed"}}})


async def test_a_legacy_pod_over_the_quota_both_worlds_hold_is_refused_naming_it(
        client: Client, cluster: Cluster) -> None:
    await _grant_opt_out(cluster)
    # Two translated cards are allocated (the allocator's status says so); Queue or not, a
    # legacy plugin's pod cannot wait for the quota.
    quota = {"apiVersion": names.API_VERSION, "kind": "GPUQuota",
             "metadata": {"name": "gpus", "namespace": "inference"},
             "spec": {"hard": {"devices": 2}}, "status": {"used": {"devices": 2}}}
    await cluster.create(GPU_QUOTAS, quota, namespace="inference")
    await _policies_seen(client, 1)
    answer = await _legacy_verdict(client, _legacy_pod("legacy-0"))
    assert answer["allowed"] is False
    assert answer["status"] == {"code": 403, "reason": "QuotaExceeded", "message": (
        "pod inference/legacy-0 keeps its legacy GPU requests, which a legacy device plugin "
        "serves and GPUQuota inference/gpus counts together with the namespace's translated "
        "pods: exceeded quota gpus: requested devices=1, used devices=2, limited devices=2; "
        "wait for GPU pods of the namespace to end, or raise spec.hard")}
    # Larger than the quota by itself: ask for less.
    alone = await _legacy_verdict(client, _legacy_pod("legacy-big", gpus=3))
    assert alone["status"]["message"].endswith("ask for less or raise spec.hard")


async def test_legacy_pods_admitted_a_moment_ago_count_before_the_status_does(
        client: Client, cluster: Cluster) -> None:
    await _grant_opt_out(cluster)
    quota = {"apiVersion": names.API_VERSION, "kind": "GPUQuota",
             "metadata": {"name": "gpus", "namespace": "inference"},
             "spec": {"hard": {"devices": 2}}}
    await cluster.create(GPU_QUOTAS, quota, namespace="inference")
    await _policies_seen(client, 1)
    assert (await _legacy_verdict(client, _legacy_pod("a")))["allowed"] is True
    assert (await _legacy_verdict(client, _legacy_pod("b")))["allowed"] is True
    third = await _legacy_verdict(client, _legacy_pod("c"))
    assert third["allowed"] is False
    assert "requested devices=1, used devices=2, limited devices=2" in \
        third["status"]["message"]
    # A pod without GPUs, or one translated, is no legacy pod.
    plain = _legacy_pod("plain")
    plain["spec"]["containers"][0]["resources"] = {}
    assert (await _legacy_verdict(client, plain))["allowed"] is True


async def test_a_legacy_whole_card_costs_the_smallest_card_published(
        client: Client, cluster: Cluster) -> None:
    await _grant_opt_out(cluster)
    await cluster.create(RESOURCE_SLICES, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": "gpu-1"},
        "spec": {"driver": names.DRIVER, "nodeName": "gpu-1",
                 "pool": {"name": "gpu-1", "generation": 0, "resourceSliceCount": 1},
                 "devices": [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}},
                              "capacity": {"memory": {"value": size},
                                           "cores": {"value": "100"}}}
                             for i, size in enumerate(("80Gi", "40Gi"))]}})
    quota = {"apiVersion": names.API_VERSION, "kind": "GPUQuota",
             "metadata": {"name": "mem", "namespace": "inference"},
             "spec": {"hard": {"memory": "60Gi"}}, "status": {"used": {"memory": "30Gi"}}}
    await cluster.create(GPU_QUOTAS, quota, namespace="inference")
    await _policies_seen(client, 1)
    profiles = client.app[STATE].device_profiles
    for _ in range(200):
        if len(profiles.profiles.profiles) == 2:
            break
        await asyncio.sleep(0.01)
    # A whole card holds at least the smallest card's memory: 30Gi + 40Gi passes 60Gi.
    answer = await _legacy_verdict(client, _legacy_pod("whole"))
    assert answer["allowed"] is False
    assert "requested memory=40Gi, used memory=30Gi, limited memory=60Gi" in \
        answer["status"]["message"]


async def _mutated_request(client: Client, cluster: Cluster) -> dict[str, Any]:
    """The device request of the template /mutate made for the HAMi pod."""
    pod = hami_pod()
    mutated = await client.post("/mutate", data=orjson.dumps(review(pod)))
    translated = jsonpatch.apply_patch(pod, decoded_patch(await mutated.json()))
    (claim,) = translated["spec"]["resourceClaims"]
    template = await cluster.get(RESOURCE_CLAIM_TEMPLATES, claim["resourceClaimTemplateName"],
                                 namespace="inference")
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    verdict = await client.post("/validate", data=orjson.dumps(review(translated, uid="v-2")))
    assert (await verdict.json())["response"]["allowed"] is True
    return request  # type: ignore[no-any-return]


async def test_a_mig_namespaces_shares_are_translated_to_mig_instances_while_the_policy_holds(
        client: Client, cluster: Cluster) -> None:
    """A policy saying shares.servedBy: MIG turns the HAMi pod's share into the smallest MIG
    instances that hold it at the next pod, and its removal turns it back (the webhook's plan
    cache keys on it); the namespace's label selects it."""
    await cluster.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": "inference",
                                                   "labels": {"isolation": "hardware"}}})
    before = await _mutated_request(client, cluster)
    assert before["exactly"]["deviceClassName"] == names.GPU_CLASS
    await cluster.create(GPU_SHARING_POLICIES, {
        "apiVersion": names.API_VERSION, "kind": "GPUSharingPolicy",
        "metadata": {"name": "hardware-isolation"},
        "spec": {"namespaceSelector": {"matchLabels": {"isolation": "hardware"}},
                 "shares": {"servedBy": "MIG"}}})
    await _policies_seen(client, 1)
    during = await _mutated_request(client, cluster)
    subs = during["firstAvailable"]
    assert {s["deviceClassName"] for s in subs} == {names.MIG_CLASS}
    # 8000 MiB and 30% of the compute: 3 slices at least.
    assert [s["name"] for s in subs] == ["3g-20gb", "4g-20gb", "3g-40gb", "4g-40gb",
                                         "7g-40gb", "3g-71gb", "4g-71gb", "any"]
    await cluster.delete(GPU_SHARING_POLICIES, "hardware-isolation")
    await _policies_seen(client, 0)
    assert await _mutated_request(client, cluster) == before

"""/validate against a GPUSharingPolicy's allowedModels: the webhook mirrors the gateway driver's
ResourceSlices as device profiles and refuses at once a request whose selectors match only cards
of models the namespace may not use."""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import jsonpatch
import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient
from testkit import eventually

from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import Cluster, Forbidden, NotFound
from dra_gateway.kube.resources import (
    DEVICE_CLASSES,
    GPU_SHARING_POLICIES,
    NAMESPACES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from dra_gateway.node_plugin.deviceclasses import device_classes
from dra_gateway.webhook.app import STATE, create_app
from dra_gateway.webhook.settings import WebhookSettings

from .conftest import ClientFactory, RefusedList, decoded_patch, hami_pod, review

Client = TestClient[web.Request, web.Application]

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def _slice(node: str, product: str, cards: int = 4, driver: str = names.DRIVER
           ) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{driver}"},
            "spec": {"driver": driver, "nodeName": node,
                     "pool": {"name": node, "generation": 0, "resourceSliceCount": 1},
                     "devices": [{
                         "name": f"gpu-{i}",
                         "attributes": {"type": {"string": "gpu"},
                                        "uuid": {"string": f"GPU-{node}-{i}"},
                                        "productName": {"string": product},
                                        "index": {"int": i},
                                        # The node has HAMi-core, which the pods' shares ask.
                                        "hamiCore": {"bool": True}},
                         "capacity": {"memory": {"value": "80Gi"}, "cores": {"value": "100"}},
                     } for i in range(cards)]}}


async def _cluster_with_policy(client: Client, cluster: Cluster, allowed: list[str]) -> None:
    for obj in device_classes():
        await cluster.create(DEVICE_CLASSES, obj)
    await cluster.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": "inference",
                                                   "labels": {"team": "llm"}}})
    await cluster.create(GPU_SHARING_POLICIES, {
        "apiVersion": names.API_VERSION, "kind": "GPUSharingPolicy",
        "metadata": {"name": "a100-only"},
        "spec": {"namespaceSelector": {"matchLabels": {"team": "llm"}},
                 "allowedModels": allowed}})
    state = client.app[STATE]
    await _until(lambda: len(state.policies.catalog.sharing) == 1
                 and state.device_classes.selectors(names.GPU_CLASS) is not None)


async def _until(condition: Any) -> None:
    for _ in range(300):
        if condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the webhook's mirrors did not catch up")


async def _profiles(client: Client, count: int) -> None:
    watch = client.app[STATE].device_profiles
    await _until(lambda: watch.synced and len(watch.profiles.profiles) == count)


async def _verdict(client: Client, gpu_types: str) -> dict[str, Any]:
    pod = hami_pod()
    pod["metadata"]["annotations"]["nvidia.com/use-gputype"] = gpu_types
    mutated = await client.post("/mutate", data=orjson.dumps(review(pod)))
    translated = jsonpatch.apply_patch(pod, decoded_patch(await mutated.json()))
    resp = await client.post("/validate", data=orjson.dumps(review(translated)))
    assert resp.status == 200
    answer: dict[str, Any] = (await resp.json())["response"]
    return answer


async def test_a_pod_asking_only_for_a_forbidden_model_is_refused(client: Client,
                                                                   cluster: Cluster) -> None:
    await _cluster_with_policy(client, cluster, ["*A100*"])
    await cluster.create(RESOURCE_SLICES, _slice("gpu-h100-1", H100))
    await cluster.create(RESOURCE_SLICES, _slice("gpu-a100-1", A100))
    await _profiles(client, 8)  # index tells cards apart; uuid does not
    answer = await _verdict(client, "H100")
    assert answer["allowed"] is False
    status = answer["status"]
    assert status["reason"] == "ModelForbidden"
    template = status["message"].split("ResourceClaimTemplate ")[1].split(":")[0]
    assert status["message"] == (
        f"pod inference/llm-serve: request 'server' (spec.resourceClaims[0] "
        f"ResourceClaimTemplate {template}: spec.spec.devices.requests[0]) can run only on "
        f"NVIDIA H100 80GB HBM3, which GPUSharingPolicy a100-only does not allow "
        f"(allowedModels: *A100*); ask for an allowed model")
    # An allowed model, and a choice of both: the allocator places them on an A100.
    assert (await _verdict(client, "A100"))["allowed"] is True
    assert (await _verdict(client, "A100,H100"))["allowed"] is True
    # Repeated reviews answer from the remembered verdicts.
    reach = client.app[STATE].reach
    evaluated = reach.evaluations
    assert (await _verdict(client, "H100"))["allowed"] is False
    assert reach.evaluations == evaluated


async def test_the_profiles_follow_the_slices(client: Client, cluster: Cluster) -> None:
    await _cluster_with_policy(client, cluster, ["*A100*"])
    watch = client.app[STATE].device_profiles
    await _profiles(client, 0)
    # No H100 published (yet): the pod may wait for one, the allocator decides.
    assert (await _verdict(client, "H100"))["allowed"] is True
    await cluster.create(RESOURCE_SLICES, _slice("gpu-h100-1", H100, cards=2))
    await _profiles(client, 2)
    assert (await _verdict(client, "H100"))["status"]["reason"] == "ModelForbidden"
    # Another node of the same cards, or a republished slice: no new profile, no new
    # generation, the verdicts stay.
    generation = watch.profiles.generation
    await cluster.create(RESOURCE_SLICES, _slice("gpu-h100-2", H100, cards=2))
    republished = copy.deepcopy(await cluster.get(RESOURCE_SLICES, "gpu-h100-1-" + names.DRIVER))
    republished["spec"]["pool"]["generation"] = 1
    await cluster.update(RESOURCE_SLICES, republished)
    # Another driver's slices are not mirrored.
    await cluster.create(RESOURCE_SLICES, _slice("gpu-x", A100, driver="gpu.nvidia.com"))
    await cluster.create(RESOURCE_SLICES, _slice("gpu-h100-3", H100, cards=3))
    await _profiles(client, 3)
    assert watch.profiles.generation == generation + 1
    # The last H100 of index 2 gone: one profile less; the last H100 at all: none, allowed.
    await cluster.delete(RESOURCE_SLICES, "gpu-h100-3-" + names.DRIVER)
    await _profiles(client, 2)
    for node in ("gpu-h100-1", "gpu-h100-2"):
        await cluster.delete(RESOURCE_SLICES, f"{node}-{names.DRIVER}")
    await _profiles(client, 0)
    assert (await _verdict(client, "H100"))["allowed"] is True


async def test_a_native_claim_asking_only_for_a_forbidden_model_is_refused(
        client: Client, cluster: Cluster) -> None:
    await _cluster_with_policy(client, cluster, ["*A100*"])
    await cluster.create(RESOURCE_SLICES, _slice("gpu-h100-1", H100))
    await _profiles(client, 4)
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
             "metadata": {"name": "h100", "namespace": "inference"},
             "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                 "deviceClassName": names.GPU_CLASS,
                 "selectors": [{"cel": {"expression": (
                     'device.attributes["gpu.dra-gateway.io"].productName.contains("H100")')}}],
             }}]}}}
    body = review(claim)
    body["request"]["kind"] = {"group": "resource.k8s.io", "version": "v1",
                               "kind": "ResourceClaim"}
    body["request"]["resource"] = {"group": "resource.k8s.io", "version": "v1",
                                   "resource": RESOURCE_CLAIMS.plural}
    resp = await client.post("/validate", data=orjson.dumps(body))
    answer = (await resp.json())["response"]
    assert answer["status"]["message"] == (
        "ResourceClaim inference/h100: request 'gpu' (spec.devices.requests[0]) can run only "
        "on NVIDIA H100 80GB HBM3, which GPUSharingPolicy a100-only does not allow "
        "(allowedModels: *A100*); ask for an allowed model")



async def test_readiness_waits_for_the_slices_and_names_the_missing_rbac(
        aiohttp_client: ClientFactory) -> None:
    settings = WebhookSettings(watch_config_maps=False, watch_retry_delay=0.05)
    client = await aiohttp_client(create_app(settings, RefusedList(RESOURCE_SLICES, Forbidden)))
    state = client.app[STATE]
    await eventually(lambda: state.device_profiles.problem is not None)
    resp = await client.get("/readyz")
    assert (resp.status, await resp.text()) == (
        503, "not ready: ResourceSlices not read yet (Forbidden; grant the webhook's "
             "ServiceAccount list and watch on resourceslices in API group resource.k8s.io, or "
             "start the webhook with --no-policies)\n")
    # An API server without them: no cards to judge models by, ready.
    served = await aiohttp_client(create_app(settings, RefusedList(RESOURCE_SLICES, NotFound)))
    await eventually(lambda: served.app[STATE].device_profiles.synced)
    assert (await served.get("/readyz")).status == 200

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import jsonpatch
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.resources import RESOURCE_CLAIM_TEMPLATES
from dra_gateway.webhook.app import create_app
from dra_gateway.webhook.settings import WebhookSettings
from dra_gateway.webhook.validation import (
    DEFAULT_CHECKS,
    PodUnderReview,
    Refusal,
)

from .conftest import ClientFactory, deadline_refusal, decoded_patch, hami_pod, plain_pod, review

Client = TestClient[web.Request, web.Application]


async def _validate(client: Client, pod: dict[str, Any], uid: str = "v-1") -> dict[str, Any]:
    resp = await client.post("/validate", data=orjson.dumps(review(pod, uid=uid)))
    assert resp.status == 200
    answer: dict[str, Any] = (await resp.json())["response"]
    assert "patch" not in answer
    assert "patchType" not in answer
    assert answer["uid"] == uid
    return answer


def _template(name: str, device_class: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": "inference"},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}}}


def _with_claim(pod: dict[str, Any], template: str, *, gated: bool) -> dict[str, Any]:
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    pod["spec"]["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    if gated:
        pod["spec"]["schedulingGates"] = [{"name": names.SCHEDULING_GATE}]
    return pod


async def test_a_translated_pod_is_allowed(client: Client) -> None:
    pod = hami_pod()
    mutated = await client.post("/mutate", data=orjson.dumps(review(pod)))
    translated = jsonpatch.apply_patch(pod, decoded_patch(await mutated.json()))
    assert await _validate(client, translated) == {"uid": "v-1", "allowed": True}


async def test_a_gpu_free_pod_is_allowed(client: Client) -> None:
    assert await _validate(client, plain_pod()) == {"uid": "v-1", "allowed": True}


async def test_an_untranslated_legacy_request_is_refused_while_enforcing(client: Client) -> None:
    pod = hami_pod()
    pod["spec"]["initContainers"] = [{"name": "warmup", "image": "busybox",
                                      "resources": {"requests": {"nvidia.com/gpu": "1"},
                                                    "limits": {"nvidia.com/gpu": "1"}}}]
    answer = await _validate(client, pod)
    assert answer["allowed"] is False
    assert answer["status"] == {"code": 403, "reason": "UntranslatedGpuRequest", "message": (
        "pod inference/llm-serve: container 'warmup' asks for nvidia.com/gpu "
        "(spec.initContainers[0].resources.limits[\"nvidia.com/gpu\"]) but was not translated to "
        "a DRA claim; enable the dra-gateway mutating webhook for namespace inference or request "
        "the GPU with a ResourceClaim; "
        "pod inference/llm-serve: container 'server' asks for nvidia.com/gpu "
        "(spec.containers[0].resources.limits[\"nvidia.com/gpu\"]) but was not translated to a "
        "DRA claim; enable the dra-gateway mutating webhook for namespace inference or request "
        "the GPU with a ResourceClaim; "
        "pod inference/llm-serve: container 'server' asks for nvidia.com/gpumem "
        "(spec.containers[0].resources.limits[\"nvidia.com/gpumem\"]) but was not translated to "
        "a DRA claim; enable the dra-gateway mutating webhook for namespace inference or request "
        "the GPU with a ResourceClaim; "
        "pod inference/llm-serve: container 'server' asks for nvidia.com/gpucores "
        "(spec.containers[0].resources.limits[\"nvidia.com/gpucores\"]) but was not translated to "
        "a DRA claim; enable the dra-gateway mutating webhook for namespace inference or request "
        "the GPU with a ResourceClaim")}


async def test_a_request_added_after_translation_is_refused_with_its_cause(
        client: Client) -> None:
    # A later mutating webhook adds a GPU container; the reinvoked /mutate changes nothing.
    pod = hami_pod()
    mutated = await client.post("/mutate", data=orjson.dumps(review(pod)))
    translated = jsonpatch.apply_patch(pod, decoded_patch(await mutated.json()))
    translated["spec"]["containers"].append(
        {"name": "injected", "image": "busybox",
         "resources": {"limits": {"nvidia.com/gpu": "1"}}})
    again = await (await client.post("/mutate", data=orjson.dumps(review(translated)))).json()
    assert "patch" not in again["response"]
    answer = await _validate(client, translated)
    assert answer["status"] == {"code": 403, "reason": "UntranslatedGpuRequest", "message": (
        "pod inference/llm-serve: container 'injected' asks for nvidia.com/gpu "
        "(spec.containers[1].resources.limits[\"nvidia.com/gpu\"]) but was not translated to a "
        "DRA claim; it was added after dra-gateway translated the pod (by another mutating "
        "webhook); have that webhook run before dra-gateway's, or request the GPU with a "
        "ResourceClaim")}


async def test_a_zero_legacy_request_passes_mutate_and_validate_unchanged(
        client: Client) -> None:
    # Charts often default to `nvidia.com/gpu: 0`: nothing to translate and nothing to refuse.
    pod = plain_pod()
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "0",
                                                            "nvidia.com/gpumem": 0}}
    mutated = await (await client.post("/mutate", data=orjson.dumps(review(pod)))).json()
    assert "patch" not in mutated["response"]
    assert await _validate(client, pod) == {"uid": "v-1", "allowed": True}


async def test_an_untranslated_legacy_request_is_allowed_when_not_enforcing(
    aiohttp_client: ClientFactory, cluster: MemoryCluster
) -> None:
    client = await aiohttp_client(create_app(
        WebhookSettings(enforce=False, watch_config_maps=False), cluster))
    assert (await _validate(client, hami_pod()))["allowed"] is True


async def test_the_translation_annotation_without_a_translation_is_refused(
    client: Client,
) -> None:
    pod = plain_pod()
    pod["metadata"]["annotations"] = {names.ANNOTATION_TRANSLATED: "{}"}
    answer = await _validate(client, pod)
    assert answer["status"] == {"code": 403, "reason": "TranslationMissing", "message": (
        "pod inference/web carries the annotation dra-gateway.io/translated "
        "(metadata.annotations) but no translation behind it: spec.resourceClaims has no claim "
        "'dra-gateway' from a dra-gateway-* ResourceClaimTemplate; remove the annotation and let "
        "the dra-gateway webhook translate the pod")}


async def test_the_gate_without_a_gateway_class_claim_is_refused(
    client: Client, cluster: MemoryCluster
) -> None:
    await cluster.create(RESOURCE_CLAIM_TEMPLATES, _template("nvidia-gpu", "gpu.nvidia.com"))
    pod = _with_claim(plain_pod(), "nvidia-gpu", gated=True)
    pod["metadata"] = {"generateName": "web-", "namespace": "inference"}
    answer = await _validate(client, pod)
    assert answer["status"] == {"code": 403, "reason": "GateWithoutGatewayClaim", "message": (
        "pod inference/web-* carries the scheduling gate dra-gateway.io/allocation "
        "(spec.schedulingGates) but none of its spec.resourceClaims uses a dra-gateway device "
        "class (gpu.dra-gateway.io, mig.dra-gateway.io), so nothing would ever lift the gate; "
        "remove the gate or request a dra-gateway device class")}


async def test_an_ungated_pod_with_a_gateway_class_claim_is_refused(
    client: Client, cluster: MemoryCluster
) -> None:
    await cluster.create(RESOURCE_CLAIM_TEMPLATES, _template("shared-gpu", "gpu.dra-gateway.io"))
    answer = await _validate(client, _with_claim(plain_pod(), "shared-gpu", gated=False))
    assert answer["status"] == {"code": 403, "reason": "UngatedGatewayClaim", "message": (
        "pod inference/web uses ResourceClaimTemplate shared-gpu of device class "
        "gpu.dra-gateway.io (spec.resourceClaims[0].resourceClaimTemplateName) without the "
        "scheduling gate dra-gateway.io/allocation; add spec.schedulingGates: "
        "[{name: dra-gateway.io/allocation}] (the dra-gateway mutating webhook adds it when it is "
        "enabled for namespace inference)")}
    gated = await _validate(client, _with_claim(plain_pod(), "shared-gpu", gated=True), uid="g")
    assert gated == {"uid": "g", "allowed": True}


async def test_a_native_gateway_claim_gets_the_gate_from_mutate(
    client: Client, cluster: MemoryCluster
) -> None:
    await cluster.create(RESOURCE_CLAIM_TEMPLATES, _template("shared-gpu", "gpu.dra-gateway.io"))
    pod = _with_claim(plain_pod(), "shared-gpu", gated=False)
    resp = await client.post("/mutate", data=orjson.dumps(review(pod)))
    patched = jsonpatch.apply_patch(pod, decoded_patch(await resp.json()))
    assert patched["spec"]["schedulingGates"] == [{"name": names.SCHEDULING_GATE}]
    assert (await _validate(client, patched))["allowed"] is True


class _NoMoreThanOneContainer:
    name = "one-container"

    def check(self, review: PodUnderReview) -> Sequence[Refusal]:
        if len(review.spec.get("containers") or ()) > 1:
            return [Refusal("TooManyContainers", f"{review.display_name}: one container only")]
        return ()


@pytest.mark.parametrize("containers", [1, 2])
async def test_further_checks_plug_into_validate(
    aiohttp_client: ClientFactory, cluster: MemoryCluster, containers: int
) -> None:
    client = await aiohttp_client(create_app(
        WebhookSettings(watch_config_maps=False), cluster,
        checks=(*DEFAULT_CHECKS, _NoMoreThanOneContainer())))
    pod = plain_pod()
    pod["spec"]["containers"] = pod["spec"]["containers"] * containers
    answer = await _validate(client, pod)
    if containers == 1:
        assert answer["allowed"] is True
    else:
        assert answer["status"] == {"code": 403, "reason": "TooManyContainers",
                                    "message": "pod inference/web: one container only"}


async def test_validate_refuses_only_what_mutate_would_have_translated(
    aiohttp_client: ClientFactory, cluster: MemoryCluster, tmp_path: Any
) -> None:
    # With nvidia-gpu disabled, plain nvidia.com/gpu stays with the device plugin: the HAMi
    # rule only reads it beside its own amounts. Neither it nor a lone HAMi priority hint
    # escaped a translation, so /validate lets them through while enforcing.
    (tmp_path / "site.yaml").write_text(
        "apiVersion: dra-gateway.io/v1alpha1\nkind: TranslationRules\n"
        "overrides: [{rule: nvidia-gpu, enabled: false}]\n")
    client = await aiohttp_client(create_app(
        WebhookSettings(watch_config_maps=False, rules_paths=(tmp_path / "site.yaml",)),
        cluster))
    for limits in ({"nvidia.com/gpu": "1"}, {"nvidia.com/priority": "1"}):
        pod = plain_pod()
        pod["spec"]["containers"][0]["resources"] = {"limits": limits}
        mutated = await (await client.post("/mutate", data=orjson.dumps(review(pod)))).json()
        assert "patch" not in mutated["response"]
        assert await _validate(client, pod) == {"uid": "v-1", "allowed": True}


class _HangingReads(MemoryCluster):
    """An API server that accepts the connection and never answers a read."""

    async def get(self, *args: Any, **kwargs: Any) -> Any:
        await asyncio.Event().wait()


async def test_a_read_that_hangs_is_cut_at_the_review_deadline_below_the_api_servers_timeout(
    aiohttp_client: ClientFactory,
) -> None:
    settings = WebhookSettings(namespace="dra-gateway", review_deadline=0.3,
                               watch_config_maps=False, watch_device_classes=False,
                               watch_policies=False, reconcile_webhooks=False)
    client = await aiohttp_client(create_app(settings, _HangingReads()))
    pod = _with_claim(plain_pod(), "team-template", gated=True)
    started = asyncio.get_running_loop().time()
    answer = await _validate(client, pod)
    assert asyncio.get_running_loop().time() - started < 2
    assert answer["allowed"] is False
    assert answer["status"] == deadline_refusal("0.3")

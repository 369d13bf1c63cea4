from __future__ import annotations

import asyncio
from typing import Any

import jsonpatch
import kubernetes_validate
import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import Object
from dra_gateway.kube.resources import RESOURCE_CLAIM_TEMPLATES, ResourceType
from dra_gateway.webhook.app import STATE, create_app
from dra_gateway.webhook.settings import WebhookSettings

from .conftest import ClientFactory, decoded_patch, hami_pod, plain_pod, review

Client = TestClient[web.Request, web.Application]

HAMI_KEYS = ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores")


async def _post(client: Client, path: str, body: Any) -> dict[str, Any]:
    resp = await client.post(path, data=orjson.dumps(body),
                             headers={"Content-Type": "application/json"})
    assert resp.status == 200, await resp.text()
    answer: dict[str, Any] = orjson.loads(await resp.read())
    return answer


async def test_a_hami_pod_comes_back_with_claims_a_gate_and_no_legacy_keys(
    client: Client, cluster: MemoryCluster
) -> None:
    pod = hami_pod()
    answer = await _post(client, "/mutate", review(pod, uid="hami-1"))
    assert answer["apiVersion"] == "admission.k8s.io/v1"
    assert answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == "hami-1"
    assert answer["response"]["allowed"] is True
    patched = jsonpatch.apply_patch(pod, decoded_patch(answer))
    kubernetes_validate.validate(patched, "1.34", strict=True)
    spec = patched["spec"]
    assert spec["schedulingGates"] == [{"name": names.SCHEDULING_GATE}]
    (claim,) = spec["resourceClaims"]
    limits = spec["containers"][0]["resources"].get("limits", {})
    assert not any(key in limits for key in HAMI_KEYS)
    assert spec["containers"][0]["resources"]["claims"][0]["name"] == claim["name"]
    assert names.ANNOTATION_TRANSLATED in patched["metadata"]["annotations"]
    template = await cluster.get(RESOURCE_CLAIM_TEMPLATES, claim["resourceClaimTemplateName"],
                                 namespace="inference")
    kubernetes_validate.validate(template, "1.34", strict=True)
    assert answer["response"]["auditAnnotations"]["resource-claim-templates"] == \
        claim["resourceClaimTemplateName"]


async def test_a_gpu_free_pod_is_allowed_without_a_patch(client: Client) -> None:
    answer = await _post(client, "/mutate", review(plain_pod(), uid="plain-1"))
    assert answer["response"] == {"uid": "plain-1", "allowed": True}


async def test_a_second_invocation_on_a_translated_pod_changes_nothing(client: Client) -> None:
    pod = hami_pod()
    first = await _post(client, "/mutate", review(pod))
    translated = jsonpatch.apply_patch(pod, decoded_patch(first))
    again = await _post(client, "/mutate", review(translated, uid="again"))
    assert again["response"] == {"uid": "again", "allowed": True}


async def test_a_dry_run_answers_the_patch_but_creates_no_template(
    client: Client, cluster: MemoryCluster
) -> None:
    answer = await _post(client, "/mutate", review(hami_pod(), dry_run=True))
    assert decoded_patch(answer)
    listed = await cluster.list(RESOURCE_CLAIM_TEMPLATES, namespace="inference")
    assert listed.items == []


async def test_identical_pods_share_one_template(client: Client, cluster: MemoryCluster) -> None:
    for i in range(3):
        pod = hami_pod()
        pod["metadata"]["name"] = f"llm-serve-{i}"
        await _post(client, "/mutate", review(pod))
    listed = await cluster.list(RESOURCE_CLAIM_TEMPLATES, namespace="inference")
    assert len(listed.items) == 1


async def test_an_existing_template_is_success(client: Client, cluster: MemoryCluster) -> None:
    pod = hami_pod()
    first = await _post(client, "/mutate", review(pod))
    name = jsonpatch.apply_patch(pod, decoded_patch(first))["spec"]["resourceClaims"][0][
        "resourceClaimTemplateName"]
    # As a second replica of the webhook would (an empty cache), meet the template already there.
    state = client.app[STATE]
    state.claim_specs.forget()
    again = await _post(client, "/mutate", review(pod, uid="second"))
    assert again["response"]["allowed"] is True
    assert await cluster.get(RESOURCE_CLAIM_TEMPLATES, name, namespace="inference")
    assert state.metrics.template_creates.labels("exists")._value.get() == 1


async def test_updates_and_deletes_are_allowed_untouched(client: Client) -> None:
    pod = hami_pod()
    for operation in ("UPDATE", "DELETE", "CONNECT"):
        answer = await _post(client, "/mutate", review(pod, uid=operation, operation=operation))
        assert answer["response"] == {"uid": operation, "allowed": True}


async def test_a_pod_the_rules_refuse_is_not_allowed_with_the_translators_message(
    client: Client,
) -> None:
    pod = hami_pod()
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] = 250
    answer = await _post(client, "/mutate", review(pod, uid="too-much"))
    response = answer["response"]
    assert response["uid"] == "too-much"
    assert response["allowed"] is False
    assert response["status"]["code"] == 403
    assert response["status"]["reason"] == "Forbidden"
    assert "gpucores" in response["status"]["message"]
    assert "patch" not in response


async def test_replicas_of_one_workload_reuse_the_plan(client: Client) -> None:
    pod = hami_pod()
    del pod["metadata"]["name"]
    pod["metadata"]["generateName"] = "llm-serve-"
    first = await _post(client, "/mutate", review(pod, uid="r-1"))
    second = await _post(client, "/mutate", review(pod, uid="r-2"))
    assert second["response"] == {**first["response"], "uid": "r-2"}
    metrics = client.app[STATE].metrics
    assert (metrics.plan_miss._value.get(), metrics.plan_hit._value.get()) == (1, 1)
    assert metrics.translations.labels("hami")._value.get() == 2


class _CountingCluster(MemoryCluster):
    def __init__(self) -> None:
        super().__init__()
        self.template_creates = 0

    async def create(self, rt: ResourceType, obj: Object, *, namespace: str | None = None,
                     dry_run: bool = False) -> Object:
        if rt is RESOURCE_CLAIM_TEMPLATES:
            self.template_creates += 1
            await asyncio.sleep(0.1)
        return await super().create(rt, obj, namespace=namespace, dry_run=dry_run)


async def test_concurrent_admissions_of_one_template_share_one_create(
    aiohttp_client: ClientFactory,
) -> None:
    cluster = _CountingCluster()
    client = await aiohttp_client(create_app(WebhookSettings(watch_config_maps=False), cluster))
    answers = await asyncio.gather(*(
        _post(client, "/mutate", review(hami_pod(), uid=f"c-{i}")) for i in range(5)))
    assert all(a["response"]["allowed"] for a in answers)
    assert cluster.template_creates == 1

from __future__ import annotations

from typing import Any

import jsonpatch
import kubernetes_validate
import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient

from dra_gateway.kube import names
from dra_gateway.kube.cluster.memory import MemoryCluster
from dra_gateway.kube.resources import RESOURCE_CLAIM_TEMPLATES

from .conftest import decoded_patch, hami_pod, plain_pod, review

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

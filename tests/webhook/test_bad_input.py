from __future__ import annotations

import asyncio
import io
import logging
from typing import Any

import jsonpatch
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube.cluster.port import ApiError, Object
from dra_gateway.kube.resources import RESOURCE_CLAIM_TEMPLATES, ResourceType
from dra_gateway.webhook.app import STATE, create_app
from dra_gateway.webhook.settings import WebhookSettings

from .conftest import ClientFactory, deadline_refusal, decoded_patch, hami_pod, review

Client = TestClient[web.Request, web.Application]


async def _status_and_text(client: Client, path: str, body: bytes) -> tuple[int, str]:
    resp = await client.post(path, data=body, headers={"Content-Type": "application/json"})
    return resp.status, await resp.text()


def _without(key: str) -> bytes:
    body = review(hami_pod(), uid="u-1")
    del body["request"][key]
    return orjson.dumps(body)


def _with_object_field(key: str, value: Any) -> bytes:
    body = review(hami_pod(), uid="u-1")
    body["request"]["object"][key] = value
    return orjson.dumps(body)


def _config_map_review() -> bytes:
    body = review(hami_pod(), uid="u-1")
    body["request"]["kind"] = {"group": "", "version": "v1", "kind": "ConfigMap"}
    body["request"]["resource"] = {"group": "", "version": "v1", "resource": "configmaps"}
    return orjson.dumps(body)


@pytest.mark.parametrize(("body", "reason"), [
    (b"{not json", "the body is not valid JSON: unexpected character, expected a string key: "
                   "line 1 column 2 (char 1)"),
    (b"[]", "the body is a list, not an AdmissionReview object"),
    (b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}',
     "the body is apiVersion 'admission.k8s.io/v1beta1' kind 'AdmissionReview'; this webhook "
     "serves admission.k8s.io/v1 AdmissionReview (set admissionReviewVersions: [v1])"),
    (b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}',
     "the AdmissionReview has no request object"),
    (_without("uid"), "the AdmissionReview request has no uid"),
    (_config_map_review(), "request u-1 is for resource 'configmaps' of group 'core', not pods; "
                           "this webhook serves pods only: fix the webhook configuration's rules"),
    (orjson.dumps({**review(hami_pod(), uid="u-1"),
                   "request": {**review(hami_pod(), uid="u-1")["request"], "object": [1]}}),
     "request u-1 (CREATE) carries a list as its object, not a pod"),
    (_with_object_field("spec", {"containers": ["nginx"]}),
     "request u-1: the pod's spec.containers[0] is not a container with a name; it is not a "
     "valid Pod"),
    (_with_object_field("kind", "Service"),
     "request u-1 carries an object that is not a pod with a spec"),
    (b"", "the body is not valid JSON: Input is a zero-length, empty document: line 1 column 1 "
          "(char 0)"),
])
@pytest.mark.parametrize("path", ["/mutate", "/validate"])
async def test_bad_bodies_get_400_with_a_one_line_reason(
    client: Client, path: str, body: bytes, reason: str
) -> None:
    status, text = await _status_and_text(client, path, body)
    if path == "/validate":
        # /validate also answers natively written claims and templates of gateway classes.
        reason = reason.replace("serves pods only",
                                "serves pods, resourceclaims and resourceclaimtemplates")
    assert (status, text) == (400, reason + "\n")


async def test_a_body_over_3_mib_gets_400(client: Client) -> None:
    pod = hami_pod()
    pod["metadata"]["annotations"]["padding"] = "x" * (3 * 1024 * 1024)
    resp = await client.post("/mutate", data=io.BytesIO(orjson.dumps(review(pod))))
    assert (resp.status, await resp.text()) == (
        400, "the body is larger than 3145728 bytes, the most an AdmissionReview may be\n")
    # The connection and the server are still fine.
    status, _ = await _status_and_text(client, "/mutate", orjson.dumps(review(hami_pod())))
    assert status == 200


async def test_a_pod_without_metadata_gets_a_patch_that_makes_it(client: Client) -> None:
    # Found by the /mutate fuzz target: the namespace of the request was added to a copy
    # of the pod, and the patch then added to metadata the pod as sent does not have.
    pod = hami_pod()
    del pod["metadata"]
    resp = await client.post("/mutate", data=orjson.dumps(review(pod, namespace="inference")))
    answer = (await resp.json())["response"]
    patch = decoded_patch({"response": answer})
    assert patch[0] == {"op": "add", "path": "/metadata", "value": {}}
    patched = jsonpatch.apply_patch(pod, patch)
    assert set(patched["metadata"]["annotations"]) == {"dra-gateway.io/translated"}


class _BrokenTemplates(MemoryCluster):
    """Refuses to create templates, as an API server under pressure would."""

    def __init__(self, failure: str) -> None:
        super().__init__()
        self.failure = failure

    async def create(self, rt: ResourceType, obj: Object, *, namespace: str | None = None,
                     dry_run: bool = False) -> Object:
        if rt is RESOURCE_CLAIM_TEMPLATES:
            if self.failure == "hang":
                await asyncio.sleep(30)
            raise ApiError("etcdserver: request timed out", code=500, reason="InternalError")
        return await super().create(rt, obj, namespace=namespace, dry_run=dry_run)


@pytest.mark.parametrize(("failure", "message"), [
    ("error", "the ResourceClaimTemplate inference/{name} for this pod could not be created "
              "(InternalError: etcdserver: request timed out); the pod was not admitted and can "
              "be retried (controllers retry on their own)"),
    ("hang", "the ResourceClaimTemplate inference/{name} for this pod could not be created "
             "within 0.2s; the pod was not admitted and can be retried (controllers retry on "
             "their own)"),
])
async def test_a_template_that_cannot_be_created_refuses_the_pod_as_retryable(
    aiohttp_client: ClientFactory, failure: str, message: str
) -> None:
    settings = WebhookSettings(template_timeout=0.2, watch_config_maps=False)
    client = await aiohttp_client(create_app(settings, _BrokenTemplates(failure)))
    resp = await client.post("/mutate", data=orjson.dumps(review(hami_pod(), uid="t-1")))
    answer = (await resp.json())["response"]
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 503
    assert answer["status"]["reason"] == "ServiceUnavailable"
    name = answer["status"]["message"].split("inference/")[1].split(" ")[0]
    assert name.startswith("dra-gateway-")
    assert answer["status"]["message"] == message.format(name=name)


async def test_a_template_creation_that_outlasts_the_review_deadline_is_cut_there(
    aiohttp_client: ClientFactory,
) -> None:
    # The template's own timeout is longer than what is left of the review: the review's
    # deadline, which bounds every API call of the review together, answers first.
    settings = WebhookSettings(template_timeout=5, review_deadline=0.3, watch_config_maps=False)
    client = await aiohttp_client(create_app(settings, _BrokenTemplates("hang")))
    started = asyncio.get_running_loop().time()
    resp = await client.post("/mutate", data=orjson.dumps(review(hami_pod(), uid="t-2")))
    assert asyncio.get_running_loop().time() - started < 3
    answer = (await resp.json())["response"]
    assert answer["allowed"] is False
    assert answer["status"] == deadline_refusal("0.3")


async def test_an_unexpected_error_is_a_generic_refusal_logged_with_the_uid(
    client: Client, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def explode(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr("dra_gateway.webhook.mutation.translate", explode)
    with caplog.at_level(logging.ERROR, logger="dra_gateway.webhook.app"):
        resp = await client.post("/mutate", data=orjson.dumps(review(hami_pod(), uid="err-1")))
    assert resp.status == 200
    answer = (await resp.json())["response"]
    assert answer == {"uid": "err-1", "allowed": False, "status": {
        "code": 500, "reason": "InternalError",
        "message": "the dra-gateway webhook failed to process this pod; it was not admitted and "
                   "can be retried (the webhook's logs carry the request UID)"}}
    (record,) = [r for r in caplog.records if r.getMessage() == "admission review failed"]
    assert record.uid == "err-1"  # type: ignore[attr-defined]
    assert record.exc_info is not None
    assert "boom" in str(record.exc_info[1])
    # The server keeps serving.
    monkeypatch.undo()
    resp = await client.post("/mutate", data=orjson.dumps(review(hami_pod(), uid="ok-1")))
    assert (await resp.json())["response"]["allowed"] is True
    assert client.app[STATE].metrics.internal_errors.labels("mutate")._value.get() == 1

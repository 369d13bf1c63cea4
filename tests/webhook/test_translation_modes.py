"""Moving namespace by namespace: the path the API server calls says the namespace's mode
(`enabled`, `audit`, or a label of unknown value), and a pod's own annotation can only hold it
back. In audit mode a pod is admitted unchanged and told, per container, what it would become;
nothing is created; a pod whose own claims use a gateway class is still gated."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube.resources import NAMESPACES, RESOURCE_CLAIM_TEMPLATES
from dra_gateway.translator import shapes
from dra_gateway.translator.containers import ContainerPlan, Found, Skipped

from .conftest import decoded_patch, hami_pod, review

Client = TestClient[web.Request, web.Application]

HAMI_LINE = (
    'dra-gateway audit: container "server" (nvidia.com/gpu: 1, nvidia.com/gpucores: 30, '
    "nvidia.com/gpumem: 8000) would get 1 device of class gpu.dra-gateway.io, capacity memory "
    "8000Mi, cores 30 by rule hami, from ResourceClaimTemplate dra-gateway-98245090b0")


async def _post(client: Client, path: str, pod: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post(path, data=orjson.dumps(review(pod)),
                             headers={"Content-Type": "application/json"})
    assert resp.status == 200, await resp.text()
    answer: dict[str, Any] = orjson.loads(await resp.read())
    return answer


def _annotated(value: str) -> dict[str, Any]:
    pod = hami_pod()
    pod["metadata"]["annotations"]["dra-gateway.io/translation"] = value
    return pod


async def _metric(client: Client, line_start: str) -> float:
    text = await (await client.get("/metrics")).text()
    (line,) = [line for line in text.splitlines() if line.startswith(line_start)]
    return float(line.rsplit(" ", 1)[1])


async def test_an_audit_namespace_admits_a_hami_pod_unchanged_saying_what_it_would_become(
        client: Client, cluster: MemoryCluster) -> None:
    answer = (await _post(client, "/mutate/audit", hami_pod()))["response"]
    assert answer["allowed"] is True
    assert "patch" not in answer
    assert answer["warnings"] == [HAMI_LINE]
    assert answer["auditAnnotations"] == {
        "translation": "audit", "would-translate-by": "hami",
        "would-use-resource-claim-templates": "dra-gateway-98245090b0"}
    # Nothing is made for a pod left as it is.
    assert (await cluster.list(RESOURCE_CLAIM_TEMPLATES, namespace="inference")).items == []
    assert await _metric(
        client, 'dra_gateway_webhook_audit_translations_total{rule="hami"}') == 1.0
    assert await _metric(
        client, 'dra_gateway_webhook_pods_held_back_total{mode="audit"}') == 1.0
    # The translations of enabled namespaces are counted apart.
    text = await (await client.get("/metrics")).text()
    assert 'dra_gateway_webhook_translations_total{rule="hami"}' not in text


async def test_the_same_pod_in_an_enabled_namespace_is_translated(client: Client) -> None:
    answer = await _post(client, "/mutate", hami_pod())
    assert any(op["path"] == "/spec/resourceClaims" for op in decoded_patch(answer))
    assert "translation" not in answer["response"]["auditAnnotations"]


async def test_audit_mode_says_what_a_rule_would_refuse_and_still_admits_the_pod(
        client: Client) -> None:
    pod = hami_pod()
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpucores"] = 130
    refused = (await _post(client, "/mutate", pod))["response"]
    assert refused["allowed"] is False
    answer = (await _post(client, "/mutate/audit", pod))["response"]
    assert answer["allowed"] is True
    assert "patch" not in answer
    assert answer["warnings"][0].startswith("dra-gateway audit: would be refused: ")
    assert refused["status"]["message"][:60] in answer["warnings"][0]
    assert answer["auditAnnotations"]["would-be-refused"] == refused["status"]["message"]


async def _grant_opt_out(client: Client, cluster: MemoryCluster) -> None:
    """Label namespace inference dra-gateway.io/pod-opt-out=allowed and wait for the webhook's
    namespace mirror to see it."""
    await cluster.create(NAMESPACES, {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "inference", "labels": {"dra-gateway.io/pod-opt-out": "allowed"}}})
    for _ in range(200):
        if (await _post(client, "/mutate", _annotated("disabled")))["response"]["allowed"]:
            return
    raise AssertionError("the webhook never saw the namespace's grant")


async def test_a_pod_cannot_opt_out_where_its_namespace_does_not_grant_it(
        client: Client, cluster: MemoryCluster) -> None:
    for value in ("disabled", "audit"):
        answer = (await _post(client, "/mutate", _annotated(value)))["response"]
        assert answer["allowed"] is False
        assert answer["status"]["code"] == 403
        assert answer["status"]["message"] == (
            f'pod inference/llm-serve: metadata.annotations["dra-gateway.io/translation"] is '
            f'"{value}", but namespace inference does not let its pods opt out of translation '
            "(a legacy pod escapes the namespace's GPU policies); remove the annotation, or "
            "have a cluster administrator grant it: kubectl label namespace inference "
            "dra-gateway.io/pod-opt-out=allowed")
    assert (await cluster.list(RESOURCE_CLAIM_TEMPLATES, namespace="inference")).items == []
    # In an audit namespace the pod is legacy anyway: its annotation only says so.
    assert (await _post(client, "/mutate/audit", _annotated("disabled")))["response"]["allowed"]


async def test_a_pod_annotated_disabled_stays_legacy_where_its_namespace_grants_it(
        client: Client, cluster: MemoryCluster) -> None:
    await _grant_opt_out(client, cluster)
    pod = _annotated("disabled")
    answer = (await _post(client, "/mutate", pod))["response"]
    assert answer["allowed"] is True
    assert "patch" not in answer
    assert answer["auditAnnotations"] == {"translation": "disabled"}
    assert "warnings" not in answer
    assert (await cluster.list(RESOURCE_CLAIM_TEMPLATES, namespace="inference")).items == []
    # /validate lets its legacy request through: the pod chose to keep it.
    assert (await _post(client, "/validate", pod))["response"]["allowed"] is True
    # Without the annotation, a legacy request that escaped translation is refused.
    escaped = (await _post(client, "/validate", hami_pod()))["response"]
    assert escaped["allowed"] is False
    assert "was not translated to a DRA claim" in escaped["status"]["message"]


async def test_a_pod_annotated_audit_in_an_enabled_namespace_is_audited(
        client: Client, cluster: MemoryCluster) -> None:
    await _grant_opt_out(client, cluster)
    answer = (await _post(client, "/mutate", _annotated("audit")))["response"]
    assert "patch" not in answer
    assert answer["warnings"] == [HAMI_LINE]


async def test_a_pod_cannot_enable_itself_in_an_audit_namespace(client: Client) -> None:
    answer = (await _post(client, "/mutate/audit", _annotated("enabled")))["response"]
    assert "patch" not in answer
    assert answer["auditAnnotations"]["translation"] == "audit"


async def test_an_unknown_pod_annotation_is_refused_where_the_pod_would_be_translated(
        client: Client) -> None:
    message = ('pod inference/llm-serve: metadata.annotations["dra-gateway.io/translation"] is '
               '"off", which is none of enabled, audit, disabled; set it to disabled to keep '
               "this pod's legacy GPU requests as they are, to audit to see what translation "
               "would do, or remove it")
    for path in ("/mutate", "/validate"):
        answer = (await _post(client, path, _annotated("off")))["response"]
        assert answer["allowed"] is False, path
        assert answer["status"]["message"] == message
    # Audit mode promises to change nothing: it warns instead.
    audited = (await _post(client, "/mutate/audit", _annotated("off")))["response"]
    assert audited["allowed"] is True
    assert f"dra-gateway: {message}" in audited["warnings"]
    assert (await _post(client, "/validate/audit", _annotated("off")))["response"]["allowed"]


async def test_a_namespace_label_of_unknown_value_admits_pods_unchanged_naming_the_value(
        client: Client, cluster: MemoryCluster) -> None:
    await cluster.create(NAMESPACES, {
        "apiVersion": "v1", "kind": "Namespace",
        "metadata": {"name": "inference", "labels": {"dra-gateway.io/translation": "on"}}})
    for _ in range(100):  # the webhook's namespace mirror catches up
        text = (await _post(client, "/mutate/unknown-mode", hami_pod()))["response"]
        if '"on"' in text["warnings"][0]:
            break
    answer = (await _post(client, "/mutate/unknown-mode", hami_pod()))["response"]
    assert "patch" not in answer
    assert answer["warnings"] == [
        'dra-gateway: namespace inference label dra-gateway.io/translation is "on", which is '
        "none of enabled, audit, disabled: the pod was admitted unchanged, as in audit mode; "
        "set the label to one of them", HAMI_LINE]
    assert (await _post(client, "/validate/audit", hami_pod()))["response"]["allowed"] is True


async def test_a_pod_with_native_gateway_claims_is_gated_in_audit_mode(client: Client) -> None:
    pod = hami_pod()
    pod["spec"]["resourceClaims"] = [{"name": "gpu",
                                      "resourceClaimTemplateName": "dra-gateway-0123456789"}]
    pod["spec"]["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    answer = await _post(client, "/mutate/audit", pod)
    assert decoded_patch(answer) == [{"op": "add", "path": "/spec/schedulingGates",
                                      "value": [{"name": "dra-gateway.io/allocation"}]}]


async def test_audit_mode_translates_a_pod_once_and_explains_from_that_translation(
        client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    planned: list[str] = []
    plan_container = shapes.plan_container

    def counted(found: Found, **kwargs: Any) -> ContainerPlan | Skipped:
        planned.append(found.name)
        return plan_container(found, **kwargs)

    monkeypatch.setattr(shapes, "plan_container", counted)
    pod = hami_pod()
    pod["metadata"]["labels"] = {"fresh": "shape"}  # not in the webhook's caches yet
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = 7000
    answer = (await _post(client, "/mutate/audit", pod))["response"]
    assert answer["warnings"][0].startswith('dra-gateway audit: container "server"')
    assert planned == ["server"]

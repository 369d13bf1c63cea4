"""A tenant who learns a template name from a dry run and creates that template first.

Template names are a hash of their spec, so a dry run of /mutate tells anyone the name the next
translated pod will use. A template made first under that name, with another class and
`allocationMode: All`, must never be used for someone else's pod: /mutate checks the stored
template on AlreadyExists, and /validate answers from stored objects only.
"""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.resources import NAMESPACES, RESOURCE_CLAIM_TEMPLATES
from dra_gateway.webhook.app import STATE
from dra_gateway.webhook.templates import comparable_spec, conflict

from .conftest import decoded_patch, hami_pod, review

Client = TestClient[web.Request, web.Application]


async def _post(client: Client, path: str, body: Any) -> dict[str, Any]:
    resp = await client.post(path, data=orjson.dumps(body))
    assert resp.status == 200, await resp.text()
    answer: dict[str, Any] = orjson.loads(await resp.read())["response"]
    return answer


async def _learned_template(client: Client) -> tuple[dict[str, Any], str]:
    """What a dry run tells the attacker: the translated pod and the template's name."""
    pod = hami_pod()
    answer = await _post(client, "/mutate", review(pod, dry_run=True))
    translated = jsonpatch.apply_patch(pod, decoded_patch({"response": answer}))
    return translated, translated["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]


def _squatted(name: str, *, label: bool) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "inference"}
    if label:
        meta["labels"] = {names.LABEL_MANAGED_BY: names.MANAGED_BY}
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": meta,
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                            "allocationMode": "All"}}]}}}}


async def test_a_squatted_template_with_the_gateway_label_refuses_the_pod_and_names_the_fix(
    client: Client, cluster: MemoryCluster
) -> None:
    _, name = await _learned_template(client)
    await cluster.create(RESOURCE_CLAIM_TEMPLATES, _squatted(name, label=True),
                         namespace="inference")
    answer = await _post(client, "/mutate", review(hami_pod(), uid="victim"))
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 409
    assert answer["status"]["reason"] == "AlreadyExists"
    assert answer["status"]["message"] == (
        f"the ResourceClaimTemplate inference/{name} this pod needs already exists with another "
        f"spec than dra-gateway translated the pod to (spec.spec.devices.requests[0] asks for "
        f"device class 'gpu.nvidia.com' with allocationMode All; spec.metadata: stored absent, "
        f'translated {{"labels": {{"app.kubernetes.io/managed-by": "dra-gateway"}}}}), so the '
        f"pod was not admitted; "
        f"delete it (kubectl delete resourceclaimtemplate -n inference {name}) and create the "
        f"pod again: dra-gateway then creates the template this pod was translated to")
    assert client.app[STATE].metrics.template_creates.labels("conflict")._value.get() == 1


async def test_a_squatted_template_without_the_gateway_label_refuses_the_pod(
    client: Client, cluster: MemoryCluster
) -> None:
    _, name = await _learned_template(client)
    await cluster.create(RESOURCE_CLAIM_TEMPLATES, _squatted(name, label=False),
                         namespace="inference")
    answer = await _post(client, "/mutate", review(hami_pod()))
    assert answer["allowed"] is False
    assert "was not made by dra-gateway (metadata.labels['app.kubernetes.io/managed-by'] is " \
        "None, not 'dra-gateway')" in answer["status"]["message"]


async def test_a_squatted_template_is_refused_again_after_the_first_refusal(
    client: Client, cluster: MemoryCluster
) -> None:
    _, name = await _learned_template(client)
    await cluster.create(RESOURCE_CLAIM_TEMPLATES, _squatted(name, label=True),
                         namespace="inference")
    for uid in ("first", "second"):
        answer = await _post(client, "/mutate", review(hami_pod(), uid=uid))
        assert answer["allowed"] is False, uid


async def test_validate_answers_from_the_stored_template_not_the_translation(
    client: Client, cluster: MemoryCluster
) -> None:
    translated, name = await _learned_template(client)
    await cluster.create(RESOURCE_CLAIM_TEMPLATES, _squatted(name, label=True),
                         namespace="inference")
    await _post(client, "/mutate", review(hami_pod()))
    # The translated pod, sent as if /mutate had let it through: the stored template uses no
    # gateway class, so the gate would never be lifted (and, ungated, kube-scheduler would hand
    # out every card of the node).
    answer = await _post(client, "/validate", review(translated))
    assert answer["allowed"] is False
    assert answer["status"]["reason"] == "GateWithoutGatewayClaim"


async def test_the_gateways_own_template_met_again_is_success(
    client: Client, cluster: MemoryCluster
) -> None:
    await _post(client, "/mutate", review(hami_pod()))
    client.app[STATE].claim_specs.forget()
    answer = await _post(client, "/mutate", review(hami_pod(), uid="again"))
    assert answer["allowed"] is True
    assert client.app[STATE].metrics.template_creates.labels("exists")._value.get() == 1


def test_api_defaults_and_quantity_spelling_do_not_count_as_another_spec() -> None:
    wanted = {"metadata": {"name": "dra-gateway-x",
                           "labels": {names.LABEL_MANAGED_BY: names.MANAGED_BY}},
              "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                  "deviceClassName": names.GPU_CLASS,
                  "capacity": {"requests": {"memory": "1024Mi"}}}}]}}}}
    stored = copy.deepcopy(wanted)
    exactly = stored["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    exactly.update(allocationMode="ExactCount", count=1,
                   capacity={"requests": {"memory": "1Gi"}})
    assert comparable_spec(stored) == comparable_spec(wanted)
    assert conflict(stored, wanted, "inference") is None
    exactly["count"] = 2
    assert conflict(stored, wanted, "inference") is not None


async def test_a_namespace_deleted_and_made_again_gets_its_templates_again(
    client: Client, cluster: MemoryCluster
) -> None:
    _, name = await _learned_template(client)
    state = client.app[STATE]
    pod = hami_pod()
    await _post(client, "/mutate", review(pod))  # creates the template, and caches it
    assert await cluster.get(RESOURCE_CLAIM_TEMPLATES, name, namespace="inference")
    # The namespace goes (its templates with it) and comes back under the same name.
    await cluster.delete(RESOURCE_CLAIM_TEMPLATES, name, namespace="inference")
    state.policies.change(NAMESPACES, "deleted", {"metadata": {"name": "inference"}}, None)
    await _post(client, "/mutate", review(pod))
    assert await cluster.get(RESOURCE_CLAIM_TEMPLATES, name, namespace="inference")


def test_consumable_capacity_dropped_by_the_server_does_not_count_as_another_spec() -> None:
    """An API server without DRAConsumableCapacity (off before 1.36) stores templates without
    `capacity`: another webhook replica, or the same one after a restart, must still take the
    template it made for the next pod of the same share (seen with the chart's two replicas on
    a real 1.34 node). Any other difference, or another capacity, is still a conflict."""
    wanted = {"metadata": {"name": "dra-gateway-x",
                           "labels": {names.LABEL_MANAGED_BY: names.MANAGED_BY}},
              "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                  "deviceClassName": names.GPU_CLASS,
                  "capacity": {"requests": {"memory": "8000Mi", "cores": "30"}}}}]}}}}
    stored = copy.deepcopy(wanted)
    exactly = stored["spec"]["spec"]["devices"]["requests"][0]["exactly"]
    del exactly["capacity"]
    assert conflict(stored, wanted, "inference") is None
    exactly["capacity"] = {"requests": {"memory": "4000Mi", "cores": "30"}}
    assert conflict(stored, wanted, "inference") is not None
    del exactly["capacity"]
    exactly["deviceClassName"] = "gpu.nvidia.com"
    refusal = conflict(stored, wanted, "inference")
    assert refusal is not None
    assert ("exactly.deviceClassName: stored \"gpu.nvidia.com\", translated "
            f"\"{names.GPU_CLASS}\"") in refusal

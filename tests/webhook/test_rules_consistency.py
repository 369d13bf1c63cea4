"""Replicas never serve rules other than the labelled ConfigMaps say.

The last good rules live in memory only: a replica restarted after a broken rules ConfigMap used
to report ready and serve the built-in rules, while older replicas served the admin's. Now every
replica stays unready while a labelled ConfigMap is refused, and the validating webhook refuses
the broken ConfigMap when it is written, with the load error and its field path.
"""

from __future__ import annotations

import uuid
from typing import Any

import orjson
from aiohttp import web
from aiohttp.test_utils import TestClient
from testkit import EXAMPLES, eventually

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.resources import CONFIG_MAPS
from dra_gateway.webhook.app import STATE, create_app
from dra_gateway.webhook.settings import WebhookSettings

from .conftest import ClientFactory, hami_pod, review

Client = TestClient[web.Request, web.Application]

NPU_RULES = (EXAMPLES / "rules" / "new-vendor.yaml").read_text()
BROKEN_RULES = NPU_RULES.replace("example.com/npu: {}", "example.com/npu: {unit: Gb}")


def rules_config_map(data: dict[str, str], *, name: str = "site-rules",
                     namespace: str = "dra-gateway", labelled: bool = True) -> dict[str, Any]:
    labels = {names.RULES_LABEL: names.RULES_LABEL_VALUE} if labelled else {}
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace, "labels": labels},
            "data": data}


def config_map_review(config_map: dict[str, Any], *, operation: str = "CREATE"
                      ) -> dict[str, Any]:
    meta = config_map["metadata"]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": str(uuid.uuid4()),
        "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
        "resource": {"group": "", "version": "v1", "resource": "configmaps"},
        "name": meta["name"], "namespace": meta["namespace"], "operation": operation,
        "userInfo": {"username": "admin"}, "object": config_map,
        "oldObject": config_map if operation == "UPDATE" else None, "dryRun": False}}


async def _check(client: Client, config_map: dict[str, Any], *,
                 operation: str = "CREATE") -> dict[str, Any]:
    resp = await client.post("/validate-rules",
                             data=orjson.dumps(config_map_review(config_map, operation=operation)))
    assert resp.status == 200, await resp.text()
    answer: dict[str, Any] = (await resp.json())["response"]
    return answer


async def _ready(client: Client) -> tuple[int, str]:
    resp = await client.get("/readyz")
    return resp.status, await resp.text()


async def test_a_replica_started_after_a_broken_rules_config_map_stays_unready(
    client: Client, cluster: MemoryCluster
) -> None:
    await cluster.create(CONFIG_MAPS, rules_config_map({"npu.yaml": BROKEN_RULES}))
    state = client.app[STATE]
    await eventually(lambda: state.config_maps_synced)
    status, text = await _ready(client)
    assert status == 503
    assert text == ("not ready: rules ConfigMap dra-gateway/site-rules not in force: refused, "
                    "see its Warning Events\n")
    fixed = await cluster.get(CONFIG_MAPS, "site-rules", namespace="dra-gateway")
    fixed["data"] = {"npu.yaml": NPU_RULES}
    await cluster.update(CONFIG_MAPS, fixed)
    await eventually(lambda: state.store.rules is not None
                     and state.store.rules.is_legacy("example.com/npu"))
    assert await _ready(client) == (200, "ok\n")


async def test_a_replica_serving_good_rules_turns_unready_when_they_are_broken(
    client: Client, cluster: MemoryCluster
) -> None:
    state = client.app[STATE]
    await eventually(lambda: state.config_maps_synced)
    await cluster.create(CONFIG_MAPS, rules_config_map({"npu.yaml": NPU_RULES}))
    await eventually(lambda: state.store.rules is not None
                     and state.store.rules.is_legacy("example.com/npu"))
    assert (await _ready(client))[0] == 200
    broken = await cluster.get(CONFIG_MAPS, "site-rules", namespace="dra-gateway")
    broken["data"] = {"npu.yaml": BROKEN_RULES}
    await cluster.update(CONFIG_MAPS, broken)
    await eventually(lambda: bool(state.store.problems))
    assert (await _ready(client))[0] == 503
    # Deleting the broken ConfigMap agrees with a fresh replica again: ready.
    await cluster.delete(CONFIG_MAPS, "site-rules", namespace="dra-gateway")
    await eventually(lambda: not state.store.problems)
    assert (await _ready(client))[0] == 200


async def test_writing_a_broken_rules_config_map_is_refused_with_the_field_path(
    client: Client
) -> None:
    await eventually(lambda: client.app[STATE].config_maps_synced)
    answer = await _check(client, rules_config_map({"npu.yaml": BROKEN_RULES}))
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 422
    assert answer["status"]["reason"] == "Invalid"
    message = answer["status"]["message"]
    assert message.startswith(
        "rules ConfigMap dra-gateway/site-rules refused by dra-gateway, it would not load: "
        "1 rule failed to load: ConfigMap dra-gateway/site-rules key npu.yaml: rules[0].")
    assert "Gb" in message
    assert message.endswith(
        "fix the rules (`dra-gateway rules check FILE` checks them before they are written), or "
        "remove the label dra-gateway.io/rules to keep the ConfigMap without using it")


async def test_a_good_rules_config_map_and_an_update_are_allowed(client: Client) -> None:
    await eventually(lambda: client.app[STATE].config_maps_synced)
    good = rules_config_map({"npu.yaml": NPU_RULES})
    assert (await _check(client, good))["allowed"] is True
    assert (await _check(client, good, operation="UPDATE"))["allowed"] is True


async def test_a_rules_config_map_that_conflicts_with_one_in_force_is_refused(
    client: Client, cluster: MemoryCluster
) -> None:
    state = client.app[STATE]
    await eventually(lambda: state.config_maps_synced)
    await cluster.create(CONFIG_MAPS, rules_config_map({"rules.yaml": NPU_RULES}))
    await eventually(lambda: state.store.rules is not None
                     and state.store.rules.is_legacy("example.com/npu"))
    rival = rules_config_map({"rules.yaml": NPU_RULES.replace(
        "name: example-npu\n    precedence: 10", "name: other-npu")}, name="team-rules")
    answer = await _check(client, rival)
    assert answer["allowed"] is False
    assert ('ConfigMap dra-gateway/team-rules key rules.yaml: rules[0].precedence: rule '
            '"other-npu" reads example.com/npu like rule "example-npu"') in answer["status"][
        "message"]


async def test_config_maps_the_gateway_does_not_read_are_allowed_whatever_they_hold(
    client: Client
) -> None:
    await eventually(lambda: client.app[STATE].config_maps_synced)
    unlabelled = rules_config_map({"npu.yaml": BROKEN_RULES}, labelled=False)
    elsewhere = rules_config_map({"npu.yaml": BROKEN_RULES}, namespace="team-a")
    assert (await _check(client, unlabelled, operation="UPDATE"))["allowed"] is True
    assert (await _check(client, elsewhere))["allowed"] is True


async def test_the_rules_check_waits_for_the_config_maps_in_force(
    aiohttp_client: ClientFactory, cluster: MemoryCluster
) -> None:
    settings = WebhookSettings(namespace="dra-gateway", watch_retry_delay=0.05)
    client = await aiohttp_client(create_app(settings, cluster))
    client.app[STATE].config_maps_synced = False
    client.app[STATE].store.on_synced = None
    answer = await _check(client, rules_config_map({"npu.yaml": NPU_RULES}))
    assert answer["allowed"] is False
    assert answer["status"]["code"] == 503


async def test_a_pod_review_sent_to_the_rules_endpoint_is_a_bad_request(client: Client) -> None:
    resp = await client.post("/validate-rules", data=orjson.dumps(review(hami_pod())))
    assert resp.status == 400
    assert "not configmaps; this webhook serves configmaps only" in await resp.text()

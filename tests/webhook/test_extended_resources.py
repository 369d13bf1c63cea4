"""/mutate and /validate with DeviceClasses that declare spec.extendedResourceName, through the
embedded cluster: the watch follows classes created, changed and deleted; a declared name is left
to kube-scheduler with a warning, a log line and a metric; a rule setting takes it back."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import orjson
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from testkit import eventually

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import Forbidden, NotFound
from dra_gateway.kube.logs import JsonFormatter
from dra_gateway.kube.resources import DEVICE_CLASSES, RESOURCE_CLAIM_TEMPLATES
from dra_gateway.webhook.app import STATE, create_app
from dra_gateway.webhook.settings import WebhookSettings

from .conftest import ClientFactory, RefusedList, decoded_patch, hami_pod, review

Client = TestClient[web.Request, web.Application]

DEFERRED = ('container "main": nvidia.com/gpu left to kube-scheduler: DeviceClass '
            "gpu.nvidia.com declares nvidia.com/gpu (spec.extendedResourceName); "
            "extendedResourceNames: translate on rule nvidia-gpu would translate it")


def device_class(name: str, resource: str | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression":
                                                   f'device.driver == "{name}"'}}]}
    if resource is not None:
        spec["extendedResourceName"] = resource
    obj = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
           "spec": spec}
    kubernetes_validate.validate(obj, "1.34", strict=True)
    return obj


def gpu_pod(limits: dict[str, str] | None = None) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "train-", "namespace": "ml"},
            "spec": {"containers": [{"name": "main", "image": "trainer:1", "resources": {
                "limits": limits or {"nvidia.com/gpu": "1"}}}]}}


async def post(client: Client, endpoint: str, pod: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post(endpoint, data=orjson.dumps(review(pod)))
    assert resp.status == 200
    answer: dict[str, Any] = (await resp.json())["response"]
    return answer


async def metrics(client: Client) -> str:
    return await (await client.get("/metrics")).text()


async def declared(client: Client, cluster: MemoryCluster, obj: dict[str, Any]) -> None:
    """Create or replace `obj` and wait until the webhook's watch has seen it."""
    watch = client.app[STATE].device_classes
    generation = watch.generation
    try:
        current = await cluster.get(DEVICE_CLASSES, obj["metadata"]["name"])
    except NotFound:
        await cluster.create(DEVICE_CLASSES, obj)
    else:
        current["spec"] = obj["spec"]
        await cluster.update(DEVICE_CLASSES, current)
    await eventually(lambda: watch.generation > generation)


async def test_a_declared_name_is_left_to_kube_scheduler_with_a_warning_and_a_metric(
    client: Client, cluster: MemoryCluster, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG, logger="dra_gateway.webhook"):
        await declared(client, cluster, device_class("gpu.nvidia.com", "nvidia.com/gpu"))
        first = await post(client, "/mutate", gpu_pod())
        second = await post(client, "/mutate", gpu_pod())  # from the decision cache
    for answer in (first, second):
        assert answer["allowed"] is True
        assert "patch" not in answer
        assert answer["warnings"] == [DEFERRED]
    # Nothing to create, and /validate lets the untranslated request through to the scheduler.
    assert (await cluster.list(RESOURCE_CLAIM_TEMPLATES)).items == []
    assert (await post(client, "/validate", gpu_pod()))["allowed"] is True
    text = await metrics(client)
    for line in (
        'dra_gateway_webhook_extended_resources_total{action="deferred",'
        'device_class="gpu.nvidia.com",resource="nvidia.com/gpu"} 2.0',
        'dra_gateway_webhook_device_class_extended_resources{device_class="gpu.nvidia.com",'
        'resource="nvidia.com/gpu"} 1.0',
        'dra_gateway_webhook_reviews_total{outcome="allowed",webhook_endpoint="mutate"} 2.0',
    ):
        assert line in text, line
    # The watch says what it saw; the first admission of the kind logs at INFO, later ones at
    # DEBUG (a line per review would cost more than the review).
    (seen,) = [r for r in caplog.records if r.getMessage().startswith(
        "a DeviceClass declares an extended resource name")]
    assert (seen.levelno, seen.deviceClass, seen.resource) == (  # type: ignore[attr-defined]
        logging.INFO, "gpu.nvidia.com", "nvidia.com/gpu")
    deferred = [r for r in caplog.records if r.getMessage().startswith(
        "legacy resource left to kube-scheduler")]
    assert [r.levelno for r in deferred] == [logging.INFO, logging.DEBUG]
    entry = orjson.loads(JsonFormatter().format(deferred[0]))
    assert {k: entry[k] for k in ("namespace", "container", "resource", "deviceClass", "rule",
                                  "resources")} == {
        "namespace": "ml", "container": "main", "resource": "nvidia.com/gpu",
        "deviceClass": "gpu.nvidia.com", "rule": "nvidia-gpu", "resources": ["nvidia.com/gpu"]}


async def test_the_watch_follows_a_class_being_created_changed_and_deleted(
    client: Client, cluster: MemoryCluster
) -> None:
    state = client.app[STATE]
    await eventually(lambda: state.device_classes.synced)
    # The same pod each time: the decision cache must not outlive what the classes declare.
    assert "patch" in await post(client, "/mutate", gpu_pod())

    await declared(client, cluster, device_class("gpu.nvidia.com", "nvidia.com/gpu"))
    assert "patch" not in await post(client, "/mutate", gpu_pod())

    await declared(client, cluster, device_class("gpu.nvidia.com", "example.com/gpu"))
    answer = await post(client, "/mutate", gpu_pod())
    assert "patch" in answer
    assert "warnings" not in answer
    text = await metrics(client)
    gauge = "dra_gateway_webhook_device_class_extended_resources"
    assert f'{gauge}{{device_class="gpu.nvidia.com",resource="example.com/gpu"}} 1.0' in text
    assert f'{gauge}{{device_class="gpu.nvidia.com",resource="nvidia.com/gpu"}}' not in text

    await declared(client, cluster, device_class("gpu.nvidia.com", "nvidia.com/gpu"))
    assert "patch" not in await post(client, "/mutate", gpu_pod())

    generation = state.device_classes.generation
    await cluster.delete(DEVICE_CLASSES, "gpu.nvidia.com")
    await eventually(lambda: state.device_classes.generation > generation)
    assert "patch" in await post(client, "/mutate", gpu_pod())
    assert "dra_gateway_webhook_device_class_extended_resources{" not in await metrics(client)

    # A change the webhook does not read (selectors only) keeps the cached decisions.
    await declared(client, cluster, device_class("gpu.nvidia.com", "nvidia.com/gpu"))
    generation = state.device_classes.generation
    current = await cluster.get(DEVICE_CLASSES, "gpu.nvidia.com")
    current["spec"]["selectors"] = []
    await cluster.update(DEVICE_CLASSES, current)
    await post(client, "/mutate", gpu_pod())
    assert state.device_classes.generation == generation


async def test_an_expired_watch_relists_and_misses_no_class(
    client: Client, cluster: MemoryCluster
) -> None:
    state = client.app[STATE]
    await eventually(lambda: state.device_classes.synced)
    cluster.expire_watches()
    await cluster.create(DEVICE_CLASSES, device_class("gpu.nvidia.com", "nvidia.com/gpu"))
    await eventually(lambda: bool(state.device_classes.extended))
    assert "patch" not in await post(client, "/mutate", gpu_pod())


async def test_a_hami_container_with_a_declared_name_is_left_whole_and_validated_through(
    client: Client, cluster: MemoryCluster
) -> None:
    await declared(client, cluster, device_class("gpu.nvidia.com", "nvidia.com/gpu"))
    pod = hami_pod()
    answer = await post(client, "/mutate", pod)
    assert "patch" not in answer
    (warning,) = answer["warnings"]
    assert "nvidia.com/gpumem" in warning
    assert "DeviceClass gpu.nvidia.com declares nvidia.com/gpu" in warning
    assert "rule hami" in warning
    # /validate (enforcing) would refuse an untranslated HAMi request; not this one.
    assert (await post(client, "/validate", pod))["allowed"] is True
    # What no class declares is still refused when it escaped translation.
    plain_hami = gpu_pod({"nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "30"})
    refused = await post(client, "/validate", plain_hami)
    assert refused["allowed"] is False
    assert refused["status"]["reason"] == "UntranslatedGpuRequest"


async def test_a_rule_that_takes_the_name_back_translates_it(
    aiohttp_client: ClientFactory, cluster: MemoryCluster, tmp_path: Path
) -> None:
    rules = tmp_path / "site.yaml"
    rules.write_text("apiVersion: dra-gateway.io/v1alpha1\nkind: TranslationRules\n"
                     "overrides:\n  - rule: nvidia-gpu\n    extendedResourceNames: translate\n")
    settings = WebhookSettings(rules_paths=(rules,), watch_retry_delay=0.05)
    client = await aiohttp_client(create_app(settings, cluster))
    await declared(client, cluster, device_class("gpu.nvidia.com", "nvidia.com/gpu"))
    pod = gpu_pod()
    answer = await post(client, "/mutate", pod)
    assert "warnings" not in answer
    patched = jsonpatch.apply_patch(pod, decoded_patch({"response": answer}))
    assert patched["spec"]["schedulingGates"] == [{"name": names.SCHEDULING_GATE}]
    (template,) = (await cluster.list(RESOURCE_CLAIM_TEMPLATES, namespace="ml")).items
    assert template["metadata"]["name"] == \
        patched["spec"]["resourceClaims"][0]["resourceClaimTemplateName"]
    kubernetes_validate.validate({k: v for k, v in template.items() if k != "metadata"} | {
        "metadata": {"name": template["metadata"]["name"], "namespace": "ml"}},
        "1.34", strict=True)
    assert 'dra_gateway_webhook_extended_resources_total{action="translated",' \
           'device_class="gpu.nvidia.com",resource="nvidia.com/gpu"} 1.0' in await metrics(client)


async def test_a_dra_gateway_class_declaring_a_name_is_left_alone_and_warned_about(
    client: Client, cluster: MemoryCluster, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="dra_gateway.webhook"):
        await declared(client, cluster, device_class(names.GPU_CLASS, "nvidia.com/gpu"))
    (seen,) = [r for r in caplog.records if "dra-gateway DeviceClass declares" in r.getMessage()]
    assert seen.levelno == logging.WARNING
    answer = await post(client, "/mutate", gpu_pod())
    assert "patch" not in answer
    assert answer["warnings"][0].startswith(
        f'container "main": nvidia.com/gpu left to kube-scheduler: DeviceClass {names.GPU_CLASS} '
        "(a dra-gateway class: no shares) declares nvidia.com/gpu")


async def test_readiness_waits_for_device_classes_and_names_the_missing_rbac(
    aiohttp_client: ClientFactory, tmp_path: Path
) -> None:
    settings = WebhookSettings(watch_config_maps=False, watch_retry_delay=0.05)
    client = await aiohttp_client(create_app(settings, RefusedList(DEVICE_CLASSES, Forbidden)))
    state = client.app[STATE]
    await eventually(lambda: state.device_classes.problem is not None)
    resp = await client.get("/readyz")
    assert (resp.status, await resp.text()) == (
        503, "not ready: DeviceClasses not read yet (Forbidden; grant the webhook's "
             "ServiceAccount list and watch on deviceclasses in API group resource.k8s.io, or "
             "start the webhook with --no-device-classes)\n")
    # Without the watch, the webhook translates as before and is ready.
    quiet = await aiohttp_client(create_app(
        WebhookSettings(watch_config_maps=False, watch_device_classes=False),
        RefusedList(DEVICE_CLASSES, Forbidden)))
    resp = await quiet.get("/readyz")
    assert (resp.status, await resp.text()) == (200, "ok\n")


async def test_an_api_server_without_device_classes_declares_nothing(
    aiohttp_client: ClientFactory
) -> None:
    settings = WebhookSettings(watch_config_maps=False, watch_retry_delay=0.05)
    client = await aiohttp_client(create_app(settings, RefusedList(DEVICE_CLASSES, NotFound)))
    state = client.app[STATE]
    await eventually(lambda: state.device_classes.synced)
    assert (await client.get("/readyz")).status == 200
    assert "patch" in await post(client, "/mutate", gpu_pod())

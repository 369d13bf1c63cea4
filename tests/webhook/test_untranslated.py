"""Nothing dropped without a word, and one translation everywhere: a pod keeping a name only a
disabled rule reads gets an AdmissionReview warning and a metric from `/mutate`, and `/mutate`
answers every example with the patch, warnings and template `dra-gateway translate` computes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
import yaml
from aiohttp import web
from aiohttp.test_utils import TestClient
from testkit import EXAMPLES

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube.resources import RESOURCE_CLAIM_TEMPLATES
from dra_gateway.translator.manifests import rewrite_manifests
from dra_gateway.translator.rules import load_rules

from .conftest import decoded_patch, review

Client = TestClient[web.Request, web.Application]

ACCELERATORS = (EXAMPLES / "pods-other-vendors" / "accelerators.yaml").read_text()
# Read once, at collection: the tests are coroutines and must not block on files.
EXAMPLE_TEXTS = {f"{p.parent.name}/{p.name}": p.read_text() for p in sorted(
    [*(EXAMPLES / "pods").glob("*.yaml"), *(EXAMPLES / "pods-other-vendors").glob("*.yaml")])}

# The pods of accelerators.yaml whose rules ship disabled, with the rule each names.
DISABLED_PODS = {
    "iluvatar-vgpu": "iluvatar", "metax-sgpu": "metax-sgpu", "hygon-dcu": "hygon-dcu",
    "cambricon-mlu": "cambricon-mlu", "enflame-gcu": "enflame-gcu",
    "mthreads-sgpu": "mthreads-gpu", "ascend-vnpu": "ascend-npu",
    "neuron-infer": "aws-neurondevice", "neuron-cores": "aws-neuroncore",
    "tpu-train": "google-tpu", "intel-gpu": "intel-gpu", "kunlunxin-vxpu": "kunlunxin-xpu",
}


async def mutate(client: Client, pod: dict[str, Any]) -> dict[str, Any]:
    resp = await client.post("/mutate", data=orjson.dumps(review(pod)),
                             headers={"Content-Type": "application/json"})
    assert resp.status == 200, await resp.text()
    answer: dict[str, Any] = orjson.loads(await resp.read())
    return answer["response"]  # type: ignore[no-any-return]


def accelerator_pods() -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in yaml.safe_load_all(ACCELERATORS)}


def test_the_table_covers_every_disabled_rule() -> None:
    # Every disabled rule whose names no enabled rule reads (the MIG rules onto NVIDIA's driver
    # share theirs with the gateway's twins: their pods are translated by those).
    assert sorted(set(DISABLED_PODS.values())) == sorted(
        r for r in set(load_rules().disabled_resources.values()) if r != "aws-neuron")
    assert set(DISABLED_PODS) <= set(accelerator_pods())


@pytest.mark.parametrize(("name", "rule"), sorted(DISABLED_PODS.items()))
async def test_a_disabled_vendor_pod_is_admitted_unchanged_with_a_warning_and_a_metric(
        client: Client, name: str, rule: str) -> None:
    pod = accelerator_pods()[name]
    resources = list(pod["spec"]["containers"][0]["resources"]["limits"])
    answer = await mutate(client, pod)
    assert answer["allowed"] is True
    assert "patch" not in answer
    assert answer["warnings"] == [
        f'container "main": {", ".join(resources)} left untranslated: rule {rule} is disabled; '
        f"enable it with an override naming the DeviceClass that serves it (overrides: [{{rule: "
        f"{rule}, enabled: true, className: <class>}}])"]
    metrics = await (await client.get("/metrics")).text()
    for resource in resources:
        assert (f'dra_gateway_webhook_untranslated_resources_total{{resource="{resource}",'
                f'rule="{rule}"}} 1.0') in metrics


async def test_the_metric_counts_each_admission(client: Client) -> None:
    pod = accelerator_pods()["tpu-train"]
    for _ in range(3):
        await mutate(client, pod)
    metrics = await (await client.get("/metrics")).text()
    assert ('dra_gateway_webhook_untranslated_resources_total{resource="google.com/tpu",'
            'rule="google-tpu"} 3.0') in metrics


@pytest.mark.parametrize("example", sorted(EXAMPLE_TEXTS))
async def test_translate_and_mutate_agree_on_every_example(
        client: Client, cluster: MemoryCluster, example: str) -> None:
    result = rewrite_manifests(list(yaml.safe_load_all(EXAMPLE_TEXTS[example])), load_rules())
    assert result.pods
    for found in result.pods:
        assert found.plan is not None, found.where
        pod = {"apiVersion": "v1", "kind": "Pod", **found.pod}
        answer = await mutate(client, pod)
        assert answer["allowed"] is True, found.where
        patch = decoded_patch({"response": answer}) if "patch" in answer else []
        assert patch == found.plan.patch, found.where
        assert answer.get("warnings", []) == found.plan.warnings, found.where
        for template in found.plan.templates:
            stored = await cluster.get(RESOURCE_CLAIM_TEMPLATES, template["metadata"]["name"],
                                       namespace=template["metadata"]["namespace"])
            assert stored["spec"] == template["spec"], found.where

"""The webhook behind the embedded API server, as kube-apiserver would call it.

The API server serves a MemoryCluster over loopback HTTP and calls the webhooks registered in
it (from `webhook-config`'s objects: matchConditions, namespaceSelector, caBundle and all); the
webhook reaches the cluster through the kubernetes-asyncio adapter with a kubeconfig.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from dra_gateway.certs.generate import make_bundle, write_bundle
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.devkit.sim.server import serve as serve_api
from dra_gateway.kube import names
from dra_gateway.kube.cluster.connect import connect
from dra_gateway.kube.cluster.port import ApiError, Cluster
from dra_gateway.kube.resources import (
    GPU_SHARING_POLICIES,
    MUTATING_WEBHOOK_CONFIGURATIONS,
    NAMESPACES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    VALIDATING_WEBHOOK_CONFIGURATIONS,
)
from dra_gateway.translator.rules import load_rules
from dra_gateway.webhook.config import configurations
from dra_gateway.webhook.server import ServeOptions, serve
from dra_gateway.webhook.settings import WebhookSettings

from .conftest import hami_pod, plain_pod

SERVICE = "dra-gateway/dra-gateway-webhook"


@dataclass
class Stack:
    cluster: MemoryCluster
    client: Cluster


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    tls = write_bundle(make_bundle(dns_names=["dra-gateway-webhook.dra-gateway.svc"],
                                   ip_addresses=["127.0.0.1"]), tmp_path / "tls")
    cluster = MemoryCluster()
    for obj in configurations(load_rules(), service_namespace="dra-gateway",
                              service_name="dra-gateway-webhook",
                              ca_bundle=tls.ca_cert.read_bytes()):
        await cluster.create(MUTATING_WEBHOOK_CONFIGURATIONS if obj["kind"].startswith("Mut")
                             else VALIDATING_WEBHOOK_CONFIGURATIONS, obj)
    stop = asyncio.Event()
    port: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    kubeconfig = tmp_path / "kubeconfig"
    # The API server needs the webhook's port before it starts: take a free one first.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        webhook_port = s.getsockname()[1]
    async with serve_api(cluster, kubeconfig=kubeconfig,
                         webhook_services={SERVICE: f"127.0.0.1:{webhook_port}"}):
        settings = WebhookSettings(tls_dir=tmp_path / "tls", ca_file=tls.ca_cert)
        task = asyncio.create_task(serve(
            settings, ServeOptions(host="127.0.0.1", port=webhook_port, cluster="kube",
                                   kubeconfig=str(kubeconfig)),
            stop=stop, started=port.set_result))
        await asyncio.wait_for(asyncio.shield(port), 20)
        client = await connect("kube", str(kubeconfig))
        try:
            yield Stack(cluster, client)
        finally:
            await client.close()
            stop.set()
            await task


async def test_a_hami_pod_created_through_the_api_is_translated(stack: Stack) -> None:
    created = await stack.client.create(PODS, hami_pod(), namespace="inference")
    spec = created["spec"]
    assert spec["schedulingGates"] == [{"name": names.SCHEDULING_GATE}]
    (claim,) = spec["resourceClaims"]
    assert "nvidia.com/gpu" not in spec["containers"][0]["resources"].get("limits", {})
    template = await stack.cluster.get(RESOURCE_CLAIM_TEMPLATES,
                                       claim["resourceClaimTemplateName"], namespace="inference")
    assert template["metadata"]["labels"][names.LABEL_MANAGED_BY] == names.MANAGED_BY


async def test_a_gpu_free_pod_goes_through_untouched(stack: Stack) -> None:
    created = await stack.client.create(PODS, plain_pod(), namespace="inference")
    assert "resourceClaims" not in created["spec"]
    assert "schedulingGates" not in created["spec"]


async def test_a_pod_the_validating_webhook_refuses_gets_its_message(stack: Stack) -> None:
    pod = plain_pod()
    pod["metadata"]["annotations"] = {names.ANNOTATION_TRANSLATED: "{}"}
    with pytest.raises(ApiError) as exc:
        await stack.client.create(PODS, pod, namespace="inference")
    assert "pod inference/web carries the annotation dra-gateway.io/translated" in \
        exc.value.message


async def _exclusive_namespace(stack: Stack, namespace: str) -> None:
    await stack.client.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                           "metadata": {"name": namespace,
                                                        "labels": {"tier": "exclusive"}}})
    await stack.client.create(GPU_SHARING_POLICIES, {
        "apiVersion": names.API_VERSION, "kind": "GPUSharingPolicy",
        "metadata": {"name": "exclusive"},
        "spec": {"namespaceSelector": {"matchLabels": {"tier": "exclusive"}},
                 "exclusive": True}})


def _native_claim(device_class: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "shared", "namespace": "inference"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": device_class,
                "capacity": {"requests": {"memory": "8Gi", "cores": "20"}}}}]}}}


async def _refused(create: Callable[[], Awaitable[object]]) -> str:
    """The message of the refusal `create` meets once the webhook has read the policies."""
    for _ in range(100):
        try:
            await create()
        except ApiError as exc:
            return exc.message
        await asyncio.sleep(0.05)
    raise AssertionError("never refused")


async def test_a_pod_sharing_in_an_exclusive_namespace_is_refused_with_the_pods_message(
        stack: Stack) -> None:
    # /mutate creates the translated template first, through the API server: the claims
    # webhook leaves the gateway's own template alone, so the refusal is /validate's about the
    # pod, not a failed template creation.
    await _exclusive_namespace(stack, "inference")

    async def create() -> None:
        await stack.client.create(PODS, hami_pod(), namespace="inference")
        await stack.client.delete(PODS, "llm-serve", namespace="inference")

    message = await _refused(create)
    assert message == (
        'admission webhook "validate.dra-gateway.io" denied the request: pod '
        "inference/llm-serve: request 'server' asks for a share of a GPU, but GPUSharingPolicy "
        "exclusive makes the namespace exclusive (whole cards only); ask for whole GPUs")


async def test_a_native_claim_of_a_gateway_class_meets_the_policies_through_the_api(
        stack: Stack) -> None:
    await _exclusive_namespace(stack, "inference")

    async def create() -> None:
        await stack.client.create(RESOURCE_CLAIMS, _native_claim(names.GPU_CLASS),
                                  namespace="inference")
        await stack.client.delete(RESOURCE_CLAIMS, "shared", namespace="inference")

    message = await _refused(create)
    assert message == (
        'admission webhook "claims.dra-gateway.io" denied the request: ResourceClaim '
        "inference/shared: request 'gpu' (spec.devices.requests[0]) asks for a share of a GPU, "
        "but GPUSharingPolicy exclusive makes the namespace exclusive (whole cards only); ask "
        "for whole GPUs")
    # Another driver's claim never reaches the webhook.
    await stack.client.create(RESOURCE_CLAIMS, _native_claim("gpu.nvidia.com"),
                              namespace="inference")

"""The embedded API server calls registered admission webhooks as kube-apiserver does."""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from dra_gateway.certs.generate import make_bundle
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.devkit.sim.server import serve
from dra_gateway.kube.cluster.connect import connect
from dra_gateway.kube.cluster.port import ApiError, Cluster
from dra_gateway.kube.resources import (
    MUTATING_WEBHOOK_CONFIGURATIONS,
    PODS,
    VALIDATING_WEBHOOK_CONFIGURATIONS,
)

NS = "team-a"
Reviewer = Callable[[dict[str, Any]], dict[str, Any]]


def pod(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": dict(labels)},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}


def patch_response(request: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    return {"uid": request["uid"], "allowed": True, "patchType": "JSONPatch",
            "patch": base64.b64encode(json.dumps(operations).encode()).decode()}


def add_gate(request: dict[str, Any]) -> dict[str, Any]:
    return patch_response(request, [
        {"op": "add", "path": "/spec/schedulingGates",
         "value": [{"name": "dra-gateway.io/allocation"}]},
        {"op": "add", "path": "/metadata/annotations",
         "value": {"seen-name": request["name"], "seen-op": request["operation"]}}])


def deny_labelled(request: dict[str, Any]) -> dict[str, Any]:
    labels = (request["object"]["metadata"].get("labels") or {})
    if labels.get("deny") == "yes":
        return {"uid": request["uid"], "allowed": False,
                "status": {"code": 403, "reason": "Forbidden", "message": "no GPUs for you"}}
    return {"uid": request["uid"], "allowed": True}


@contextlib.asynccontextmanager
async def webhook_server(routes: dict[str, Reviewer],
                         tls: ssl.SSLContext | None = None) -> AsyncIterator[tuple[str, int]]:
    """A webhook on 127.0.0.1 answering AdmissionReviews with the reviewer of each path."""
    seen: list[dict[str, Any]] = []

    async def review(request: web.Request) -> web.Response:
        body = await request.json()
        seen.append(body["request"])
        response = routes[request.path](body["request"])
        return web.json_response({"apiVersion": "admission.k8s.io/v1",
                                  "kind": "AdmissionReview", "response": response})

    app = web.Application()
    for path in routes:
        app.router.add_post(path, review)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls)
    await site.start()
    try:
        yield runner.addresses[0][0], runner.addresses[0][1]
    finally:
        await runner.cleanup()


def hook(name: str, client_config: dict[str, Any], *, operations: tuple[str, ...] = ("CREATE",),
         **extra: Any) -> dict[str, Any]:
    return {"name": name, "clientConfig": client_config,
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": list(operations),
                       "resources": ["pods"], "scope": "Namespaced"}],
            "sideEffects": "None", "admissionReviewVersions": ["v1"], **extra}


async def register(memory: MemoryCluster, mutating: list[dict[str, Any]],
                   validating: list[dict[str, Any]] | None = None) -> None:
    if mutating:
        await memory.create(MUTATING_WEBHOOK_CONFIGURATIONS,
                            {"metadata": {"name": "mutate"}, "webhooks": mutating})
    if validating:
        await memory.create(VALIDATING_WEBHOOK_CONFIGURATIONS,
                            {"metadata": {"name": "validate"}, "webhooks": validating})


@contextlib.asynccontextmanager
async def api(memory: MemoryCluster, tmp_path: Path,
              services: dict[str, str] | None = None) -> AsyncIterator[Cluster]:
    kubeconfig = tmp_path / "kubeconfig"
    async with serve(memory, kubeconfig=kubeconfig, webhook_services=services):
        cluster = await connect("kube", str(kubeconfig))
        try:
            yield cluster
        finally:
            await cluster.close()


async def test_mutating_then_validating_webhooks_shape_and_refuse_pods(tmp_path: Path) -> None:
    memory = MemoryCluster()
    async with webhook_server({"/mutate": add_gate, "/validate": deny_labelled}) as (host, port):
        base = f"http://{host}:{port}"
        await register(memory, [hook("gate.example.com", {"url": f"{base}/mutate"})],
                       [hook("deny.example.com", {"url": f"{base}/validate"})])
        async with api(memory, tmp_path) as cluster:
            made = await cluster.create(PODS, pod("web-0"), namespace=NS)
            assert made["spec"]["schedulingGates"] == [{"name": "dra-gateway.io/allocation"}]
            assert made["metadata"]["annotations"] == {"seen-name": "web-0",
                                                       "seen-op": "CREATE"}
            generated = pod("")
            generated["metadata"] = {"generateName": "web-"}
            made = await cluster.create(PODS, generated, namespace=NS)
            assert made["metadata"]["annotations"]["seen-name"] == ""
            with pytest.raises(ApiError) as caught:
                await cluster.create(PODS, pod("bad", deny="yes"), namespace=NS)
            assert caught.value.code == 403
            assert caught.value.message == (
                'admission webhook "deny.example.com" denied the request: no GPUs for you')
            # Updates are not in the rules: untouched.
            patched = await cluster.patch(PODS, "web-0", {"metadata": {"labels": {"a": "b"}}},
                                          namespace=NS)
            assert patched["metadata"]["labels"] == {"a": "b"}


async def test_selectors_and_match_conditions_choose_what_a_webhook_sees(
        tmp_path: Path) -> None:
    memory = MemoryCluster()
    async with webhook_server({"/mutate": add_gate}) as (host, port):
        await register(memory, [hook(
            "gate.example.com", {"url": f"http://{host}:{port}/mutate"},
            namespaceSelector={"matchExpressions": [{"key": "kubernetes.io/metadata.name",
                                                     "operator": "NotIn",
                                                     "values": ["kube-system"]}]},
            objectSelector={"matchExpressions": [{"key": "skip", "operator": "DoesNotExist"}]},
            matchConditions=[{"name": "gpu-pods",
                              "expression": 'object.metadata.name.startsWith("gpu-")'}])])
        async with api(memory, tmp_path) as cluster:
            gated = await cluster.create(PODS, pod("gpu-1"), namespace=NS)
            assert "schedulingGates" in gated["spec"]
            for name, namespace, labels in (("cpu-1", NS, {}),
                                            ("gpu-2", "kube-system", {}),
                                            ("gpu-3", NS, {"skip": "1"})):
                made = await cluster.create(PODS, pod(name, **labels), namespace=namespace)
                assert "schedulingGates" not in made["spec"], name


async def test_failure_policy_decides_what_an_unreachable_webhook_means(
        tmp_path: Path) -> None:
    memory = MemoryCluster()
    await register(memory, [
        hook("lenient.example.com", {"url": "http://127.0.0.1:9/x"}, failurePolicy="Ignore",
             timeoutSeconds=2),
    ])
    async with api(memory, tmp_path) as cluster:
        assert await cluster.create(PODS, pod("p1"), namespace=NS)
        await memory.patch(MUTATING_WEBHOOK_CONFIGURATIONS, "mutate", [
            {"op": "replace", "path": "/webhooks/0/failurePolicy", "value": "Fail"}],
            patch_type="json")
        with pytest.raises(ApiError) as caught:
            await cluster.create(PODS, pod("p2"), namespace=NS)
        assert caught.value.code == 500
        assert caught.value.message.startswith(
            'Internal error occurred: failed calling webhook "lenient.example.com": '
            'failed to call webhook: Post "http://127.0.0.1:9/x"')


async def test_an_update_webhook_sees_the_patched_object_and_the_old_one(
        tmp_path: Path) -> None:
    memory = MemoryCluster()
    seen: list[dict[str, Any]] = []

    def record(request: dict[str, Any]) -> dict[str, Any]:
        seen.append(request)
        return patch_response(request, [{"op": "add", "path": "/metadata/labels/stamped",
                                         "value": "yes"}])

    async with webhook_server({"/update": record}) as (host, port):
        await register(memory, [hook("stamp.example.com", {"url": f"http://{host}:{port}/update"},
                                     operations=("UPDATE",))])
        async with api(memory, tmp_path) as cluster:
            await cluster.create(PODS, pod("p1", v="1"), namespace=NS)
            patched = await cluster.patch(PODS, "p1", {"metadata": {"labels": {"v": "2"}}},
                                          namespace=NS)
    assert patched["metadata"]["labels"] == {"v": "2", "stamped": "yes"}
    assert seen[0]["oldObject"]["metadata"]["labels"] == {"v": "1"}
    assert seen[0]["object"]["metadata"]["labels"] == {"v": "2"}


async def test_a_service_webhook_is_reached_over_tls_by_its_service_name(
        tmp_path: Path) -> None:
    bundle = make_bundle(dns_names=["gateway.dra.svc"])
    (tmp_path / "tls.crt").write_bytes(bundle.cert)
    (tmp_path / "tls.key").write_bytes(bundle.key)
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(tmp_path / "tls.crt", tmp_path / "tls.key")
    memory = MemoryCluster()
    async with webhook_server({"/mutate": add_gate}, tls=tls) as (host, port):
        await register(memory, [hook("gate.example.com", {
            "service": {"namespace": "dra", "name": "gateway", "path": "/mutate", "port": 443},
            "caBundle": base64.b64encode(bundle.ca_cert).decode()})])
        async with api(memory, tmp_path, services={"dra/gateway": f"{host}:{port}"}) as cluster:
            made = await cluster.create(PODS, pod("p1"), namespace=NS)
            assert "schedulingGates" in made["spec"]
        async with api(memory, tmp_path) as cluster:
            with pytest.raises(ApiError, match="--webhook-service dra/gateway=HOST:PORT"):
                await cluster.create(PODS, pod("p2"), namespace=NS)

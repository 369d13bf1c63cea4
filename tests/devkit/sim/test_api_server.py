"""The HTTP front of the in-memory cluster: paths, verbs, streams, errors and discovery."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine
from typing import Any

import aiohttp
import orjson
import pytest
from aiohttp.test_utils import TestClient

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.devkit.sim.server import create_app, serve
from dra_gateway.kube.resources import RESOURCE_CLAIMS

ClientFactory = Callable[..., Coroutine[Any, Any, TestClient[Any, Any]]]
CLAIMS = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims"
AUTH = {"Authorization": "Bearer t0ken"}


def claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.dra-gateway.io"}}]}}}


@pytest.fixture
def memory() -> MemoryCluster:
    return MemoryCluster(history=5)


@pytest.fixture
async def client(aiohttp_client: ClientFactory, memory: MemoryCluster) -> TestClient[Any, Any]:
    return await aiohttp_client(create_app(memory, token="t0ken"), headers=AUTH)


async def test_discovery_describes_groups_resources_and_subresources(
        client: TestClient[Any, Any]) -> None:
    version = await (await client.get("/version")).json()
    assert version["major"] == "1"
    assert (await (await client.get("/api")).json())["versions"] == ["v1"]
    core = await (await client.get("/api/v1")).json()
    by_name = {r["name"]: r for r in core["resources"]}
    assert by_name["pods"]["namespaced"] is True
    assert by_name["pods"]["kind"] == "Pod"
    assert by_name["pods/status"]["verbs"] == ["get", "patch", "update"]
    assert by_name["nodes"]["namespaced"] is False
    groups = await (await client.get("/apis")).json()
    assert {g["name"] for g in groups["groups"]} == {
        "resource.k8s.io", "coordination.k8s.io", "admissionregistration.k8s.io",
        "dra-gateway.io", "policy",
        # Volcano's and the coscheduling plugin's PodGroups, as where those are installed.
        "scheduling.volcano.sh", "scheduling.x-k8s.io",
        # Upstream's Workload API, as where GenericWorkload is on; JobSet and Kubeflow.
        "scheduling.k8s.io", "jobset.x-k8s.io", "kubeflow.org"}
    group = await (await client.get("/apis/resource.k8s.io")).json()
    assert group["preferredVersion"]["groupVersion"] == "resource.k8s.io/v1"
    dra = await (await client.get("/apis/resource.k8s.io/v1")).json()
    assert dra["groupVersion"] == "resource.k8s.io/v1"
    assert {"resourceclaims", "resourceclaims/status", "resourceclaimtemplates",
            "resourceslices", "deviceclasses"} == {r["name"] for r in dra["resources"]}
    missing = await client.get("/apis/example.com/v1")
    assert missing.status == 404
    assert (await missing.json())["kind"] == "Status"


async def test_requests_without_the_token_are_unauthorized_except_health(
        aiohttp_client: ClientFactory, memory: MemoryCluster) -> None:
    anonymous = await aiohttp_client(create_app(memory, token="t0ken"))
    refused = await anonymous.get(CLAIMS)
    assert refused.status == 401
    assert (await refused.json())["reason"] == "Unauthorized"
    assert (await anonymous.get("/healthz")).status == 200
    wrong = await anonymous.get(CLAIMS, headers={"Authorization": "Bearer nope"})
    assert wrong.status == 401


async def test_create_get_list_and_errors_speak_kubernetes_http(
        client: TestClient[Any, Any]) -> None:
    created = await client.post(CLAIMS, json=claim("c1"))
    assert created.status == 201
    again = await client.post(CLAIMS, json=claim("c1"))
    assert again.status == 409
    status = await again.json()
    assert status["reason"] == "AlreadyExists"
    assert status["message"] == 'resourceclaims.resource.k8s.io "c1" already exists'
    assert (await client.get(f"{CLAIMS}/c1")).status == 200
    listed = await (await client.get("/apis/resource.k8s.io/v1/resourceclaims")).json()
    assert listed["kind"] == "ResourceClaimList"
    assert [i["metadata"]["name"] for i in listed["items"]] == ["c1"]
    assert (await client.get(f"{CLAIMS}/nope")).status == 404
    assert (await client.get("/apis/resource.k8s.io/v1/widgets")).status == 404
    bad_json = await client.post(CLAIMS, data=b"{not json",
                                 headers={"Content-Type": "application/json"})
    assert bad_json.status == 400
    assert "not valid JSON" in (await bad_json.json())["message"]
    no_namespace = await client.post("/apis/resource.k8s.io/v1/resourceclaims",
                                     json=claim("c2"))
    assert no_namespace.status == 400
    renamed = await client.put(f"{CLAIMS}/other", json=claim("c1"))
    assert renamed.status == 400
    assert "does not match the name on the URL" in (await renamed.json())["message"]
    bad_selector = await client.get(CLAIMS, params={"labelSelector": "a in b"})
    assert bad_selector.status == 400


async def test_patch_content_types_and_an_unknown_one_is_refused_with_415(
        client: TestClient[Any, Any]) -> None:
    await client.post(CLAIMS, json=claim("c1"))
    merged = await client.patch(f"{CLAIMS}/c1", data=orjson.dumps(
        {"metadata": {"labels": {"a": "1"}}}),
        headers={"Content-Type": "application/merge-patch+json"})
    assert (await merged.json())["metadata"]["labels"] == {"a": "1"}
    jsoned = await client.patch(f"{CLAIMS}/c1", data=orjson.dumps(
        [{"op": "replace", "path": "/metadata/labels/a", "value": "2"}]),
        headers={"Content-Type": "application/json-patch+json"})
    assert (await jsoned.json())["metadata"]["labels"] == {"a": "2"}
    strategic = await client.patch(f"{CLAIMS}/c1/status", data=orjson.dumps(
        {"status": {"reservedFor": []}}),
        headers={"Content-Type": "application/strategic-merge-patch+json"})
    assert strategic.status == 200
    applied = await client.patch(f"{CLAIMS}/c1", data=b"metadata: {labels: {b: '1'}}",
                                 headers={"Content-Type": "application/apply-patch+yaml"})
    assert applied.status == 200
    assert (await applied.json())["metadata"]["labels"] == {"a": "2", "b": "1"}
    odd = await client.patch(f"{CLAIMS}/c1", data=b"{}",
                             headers={"Content-Type": "text/plain"})
    assert odd.status == 415


async def test_dry_run_create_stores_nothing(client: TestClient[Any, Any]) -> None:
    made = await client.post(CLAIMS, json=claim("c1"), params={"dryRun": "All"})
    assert made.status == 201
    assert (await client.get(f"{CLAIMS}/c1")).status == 404
    odd = await client.post(CLAIMS, json=claim("c1"), params={"dryRun": "Some"})
    assert odd.status == 400


async def test_delete_honours_preconditions_and_reports_pending_finalizers(
        client: TestClient[Any, Any]) -> None:
    body = claim("c1")
    body["metadata"]["finalizers"] = ["dra-gateway.io/allocation"]
    made = await (await client.post(CLAIMS, json=body)).json()
    await client.patch(f"{CLAIMS}/c1", data=b'{"metadata":{"labels":{"a":"1"}}}',
                       headers={"Content-Type": "application/merge-patch+json"})
    stale = await client.delete(f"{CLAIMS}/c1", json={
        "kind": "DeleteOptions", "apiVersion": "v1",
        "preconditions": {"resourceVersion": made["metadata"]["resourceVersion"]}})
    assert stale.status == 409
    pending = await client.delete(f"{CLAIMS}/c1")
    assert pending.status == 202
    assert (await pending.json())["metadata"]["deletionTimestamp"]


async def test_watch_streams_events_and_ends_with_a_410_error_event(
        client: TestClient[Any, Any], memory: MemoryCluster) -> None:
    start = memory.resource_version
    response = await client.get(CLAIMS, params={"watch": "1", "resourceVersion": start})
    assert response.status == 200
    await client.post(CLAIMS, json=claim("c1"))
    async with asyncio.timeout(5):
        first = orjson.loads(await response.content.readline())
        assert first["type"] == "ADDED"
        assert first["object"]["metadata"]["name"] == "c1"
        memory.expire_watches()
        error = orjson.loads(await response.content.readline())
    assert error["type"] == "ERROR"
    assert error["object"]["code"] == 410
    assert error["object"]["reason"] == "Expired"
    response.release()


async def test_a_watch_from_a_compacted_version_gets_a_410_error_event(
        client: TestClient[Any, Any], memory: MemoryCluster) -> None:
    start = memory.resource_version
    for i in range(8):
        await memory.create(RESOURCE_CLAIMS, claim(f"c{i}"), namespace="team-a")
    response = await client.get(CLAIMS, params={"watch": "true", "resourceVersion": start,
                                                "allowWatchBookmarks": "true"})
    async with asyncio.timeout(5):
        error = orjson.loads(await response.content.readline())
    assert error["type"] == "ERROR"
    assert error["object"]["code"] == 410
    assert "too old resource version" in error["object"]["message"]
    response.release()


async def test_a_watch_with_timeout_seconds_ends_the_stream(
        client: TestClient[Any, Any], memory: MemoryCluster) -> None:
    response = await client.get(CLAIMS, params={
        "watch": "true", "resourceVersion": memory.resource_version, "timeoutSeconds": "1"})
    async with asyncio.timeout(5):
        assert await response.read() == b""


async def test_stopping_the_server_ends_open_watches_promptly() -> None:
    memory = MemoryCluster()
    async with asyncio.timeout(10), serve(memory) as server:
        session = aiohttp.ClientSession()
        response = await session.get(f"{server.url}{CLAIMS}", params={"watch": "true"})
        assert response.status == 200
    with contextlib.suppress(aiohttp.ClientError):
        await response.read()
    response.release()
    await session.close()
    assert memory.open_watches == 0


async def test_an_eviction_deletes_the_pod_and_its_uid_is_a_precondition(
        client: TestClient[Any, Any], memory: MemoryCluster) -> None:
    pod = (await memory.load([{"apiVersion": "v1", "kind": "Pod",
                               "metadata": {"name": "p", "namespace": "team-a"},
                               "spec": {"containers": [{"name": "c", "image": "x"}]}}]))[0]
    path = "/api/v1/namespaces/team-a/pods/p/eviction"
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p"},
            "deleteOptions": {"preconditions": {"uid": "another"}}}
    assert (await client.post(path, json=body)).status == 409
    body["deleteOptions"]["preconditions"]["uid"] = pod["metadata"]["uid"]
    assert (await client.post(path, json=body)).status == 201
    assert (await client.get("/api/v1/namespaces/team-a/pods/p")).status == 404

"""The official Kubernetes Python clients work against the embedded API server.

kubernetes-asyncio (typed `ResourceV1Api` and its `Watch`) and the synchronous `kubernetes`
package create, get, list, watch and conflict-update a ResourceClaim, as they would on a real
cluster. The synchronous client runs in a thread because the server runs on the test's loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import kubernetes
import pytest
from kubernetes_asyncio import client as aclient
from kubernetes_asyncio import config as aconfig
from kubernetes_asyncio import watch as awatch

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.devkit.sim.server import serve, write_kubeconfig

NS = "default"


def claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.dra-gateway.io"}}]}},
    }


@pytest.fixture
async def kubeconfig(tmp_path: Path) -> AsyncIterator[str]:
    memory = MemoryCluster()
    async with serve(memory, token="secret") as server:
        path = tmp_path / "kubeconfig"
        write_kubeconfig(path, server.url, token="secret")
        yield str(path)
        await memory.close()


async def test_kubernetes_asyncio_typed_api_creates_gets_lists_watches_and_conflicts(
        kubeconfig: str) -> None:
    api_client = await aconfig.new_client_from_config(config_file=kubeconfig)
    async with api_client:
        api = aclient.ResourceV1Api(api_client)
        start = (await api.list_namespaced_resource_claim(NS)).metadata.resource_version
        created = await api.create_namespaced_resource_claim(NS, claim("c1"))
        assert created.metadata.name == "c1"
        assert created.spec.devices.requests[0].exactly.device_class_name == "gpu.dra-gateway.io"
        fetched = await api.read_namespaced_resource_claim("c1", NS)
        assert fetched.metadata.uid == created.metadata.uid
        listed = await api.list_namespaced_resource_claim(NS)
        assert [c.metadata.name for c in listed.items] == ["c1"]

        # The generated client names the v1 item model ResourceV1ResourceClaim, which Watch
        # cannot derive from V1ResourceClaimList: name it, as a user of the client must.
        watcher = awatch.Watch(return_type="ResourceV1ResourceClaim")
        seen = []
        async with asyncio.timeout(10):
            async for event in watcher.stream(api.list_namespaced_resource_claim, NS,
                                              resource_version=start, timeout_seconds=5):
                seen.append((event["type"], event["object"].metadata.name))
                watcher.stop()
        await watcher.close()
        assert seen == [("ADDED", "c1")]

        stale = api_client.sanitize_for_serialization(created)
        stale["metadata"]["labels"] = {"a": "1"}
        await api.replace_namespaced_resource_claim("c1", NS, stale)
        stale["metadata"]["labels"] = {"a": "2"}
        with pytest.raises(aclient.ApiException) as caught:
            await api.replace_namespaced_resource_claim("c1", NS, stale)
        assert caught.value.status == 409
        assert "the object has been modified" in caught.value.body


async def test_kubernetes_asyncio_discovery_and_generic_objects_work(kubeconfig: str) -> None:
    api_client = await aconfig.new_client_from_config(config_file=kubeconfig)
    async with api_client:
        version = await aclient.VersionApi(api_client).get_code()
        assert version.major == "1"
        groups = await aclient.ApisApi(api_client).get_api_versions()
        assert "resource.k8s.io" in [g.name for g in groups.groups]
        resources = await aclient.ResourceV1Api(api_client).get_api_resources()
        assert {"resourceclaims", "resourceclaims/status", "resourceslices"} <= {
            r.name for r in resources.resources}
        custom = aclient.CustomObjectsApi(api_client)
        await custom.create_namespaced_custom_object("resource.k8s.io", "v1", NS,
                                                     "resourceclaims", claim("c2"))
        got = await custom.get_namespaced_custom_object("resource.k8s.io", "v1", NS,
                                                        "resourceclaims", "c2")
        assert got["metadata"]["name"] == "c2"


def _sync_client_round_trip(kubeconfig: str) -> dict[str, Any]:
    api_client = kubernetes.config.new_client_from_config(config_file=kubeconfig)
    try:
        api = kubernetes.client.ResourceV1Api(api_client)
        start = api.list_namespaced_resource_claim(NS).metadata.resource_version
        created = api.create_namespaced_resource_claim(NS, claim("sync-1"))
        fetched = api.read_namespaced_resource_claim("sync-1", NS)
        listed = api.list_namespaced_resource_claim(NS)
        watcher = kubernetes.watch.Watch(return_type="ResourceV1ResourceClaim")
        seen = []
        for event in watcher.stream(api.list_namespaced_resource_claim, NS,
                                    resource_version=start, timeout_seconds=5):
            seen.append((event["type"], event["object"].metadata.name))
            watcher.stop()
        stale = api_client.sanitize_for_serialization(created)
        stale["metadata"]["labels"] = {"a": "1"}
        api.replace_namespaced_resource_claim("sync-1", NS, stale)
        stale["metadata"]["labels"] = {"a": "2"}
        try:
            api.replace_namespaced_resource_claim("sync-1", NS, stale)
            conflict = None
        except kubernetes.client.ApiException as exc:
            conflict = exc.status
        return {"uid": created.metadata.uid, "fetched": fetched.metadata.uid,
                "listed": [c.metadata.name for c in listed.items], "seen": seen,
                "conflict": conflict}
    finally:
        api_client.close()


async def test_the_synchronous_kubernetes_client_round_trips(kubeconfig: str) -> None:
    outcome = await asyncio.to_thread(_sync_client_round_trip, kubeconfig)
    assert outcome["fetched"] == outcome["uid"]
    assert outcome["listed"] == ["sync-1"]
    assert outcome["seen"] == [("ADDED", "sync-1")]
    assert outcome["conflict"] == 409

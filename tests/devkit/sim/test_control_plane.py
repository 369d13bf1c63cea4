"""The embedded control plane: claims from templates, reservation cleanup and binding."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import kubernetes_validate
import pytest
from testkit import eventually

from dra_gateway.devkit.sim.controlplane import SimulatedControllers, claim_generate_name
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube.cluster.port import NotFound
from dra_gateway.kube.resources import NODES, PODS, RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS

NS = "team-a"
GATE = "dra-gateway.io/allocation"


def on_node(name: str) -> dict[str, Any]:
    return {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": [name]}]}]}


def pod(name: str, *, gates: bool = False, template: str | None = None,
        claim: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if template:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    if gates:
        spec["schedulingGates"] = [{"name": GATE}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": spec}


@pytest.fixture
async def cluster() -> AsyncIterator[MemoryCluster]:
    memory = MemoryCluster()
    for node in ("node-a", "node-b"):
        await memory.create(NODES, {"metadata": {"name": node, "labels": {"zone": node}}})
    await memory.create(RESOURCE_CLAIM_TEMPLATES, {
        "metadata": {"name": "one-gpu", "namespace": NS},
        "spec": {"metadata": {"labels": {"from": "template"}},
                 "spec": {"devices": {"requests": [
                     {"name": "gpu", "exactly": {"deviceClassName": "gpu.dra-gateway.io"}}]}}}})
    async with SimulatedControllers(memory, retry_delay=0.05).running():
        yield memory
    await memory.close()


STAMP = "2026-12-01T15:04:05Z"


async def allocate(cluster: MemoryCluster, name: str, node: str, *,
                   stamped: bool = True) -> None:
    """Allocate as the gateway's allocator does: with `allocationTimestamp` unless told not to."""
    allocation: dict[str, Any] = {
        "devices": {"results": [{"request": "gpu", "driver": "gpu.dra-gateway.io",
                                 "pool": node, "device": "gpu-0"}]},
        "nodeSelector": on_node(node)}
    if stamped:
        allocation["allocationTimestamp"] = STAMP
    await cluster.patch(RESOURCE_CLAIMS, name, {"status": {"allocation": allocation}},
                        namespace=NS, subresource="status")


def shared_claim() -> dict[str, Any]:
    return {"metadata": {"name": "shared", "namespace": NS},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.dra-gateway.io"}}]}}}


async def node_of(cluster: MemoryCluster, name: str) -> Any:
    return (await cluster.get(PODS, name, namespace=NS))["spec"].get("nodeName")


async def test_a_pod_gets_its_claim_from_the_template_as_upstream_names_it(
        cluster: MemoryCluster) -> None:
    made = await cluster.create(PODS, pod("web-0", gates=True, template="one-gpu"))

    async def recorded() -> Any:
        got = await cluster.get(PODS, "web-0", namespace=NS)
        return (got.get("status") or {}).get("resourceClaimStatuses")

    statuses = await eventually(recorded)
    assert statuses[0]["name"] == "gpu"
    claim = await cluster.get(RESOURCE_CLAIMS, statuses[0]["resourceClaimName"], namespace=NS)
    assert claim["metadata"]["name"].startswith("web-0-gpu-")
    assert claim["metadata"]["labels"] == {"from": "template"}
    assert claim["metadata"]["annotations"] == {"resource.kubernetes.io/pod-claim-name": "gpu"}
    assert claim["metadata"]["ownerReferences"] == [{
        "apiVersion": "v1", "kind": "Pod", "name": "web-0", "uid": made["metadata"]["uid"],
        "controller": True, "blockOwnerDeletion": True}]
    kubernetes_validate.validate(claim, "1.34", strict=True)
    await cluster.delete(PODS, "web-0", namespace=NS)
    assert (await cluster.list(RESOURCE_CLAIMS, namespace=NS)).items == []


async def test_a_gated_pod_waits_and_binds_where_its_claim_is_allocated(
        cluster: MemoryCluster) -> None:
    made = await cluster.create(PODS, pod("web-0", gates=True, template="one-gpu"))

    async def claim_name() -> Any:
        got = await cluster.get(PODS, "web-0", namespace=NS)
        statuses = (got.get("status") or {}).get("resourceClaimStatuses") or []
        return statuses[0]["resourceClaimName"] if statuses else None

    name = await eventually(claim_name)
    await allocate(cluster, name, "node-b")
    await asyncio.sleep(0.2)
    still = await cluster.get(PODS, "web-0", namespace=NS)
    assert "nodeName" not in still["spec"]  # the gate holds it
    # As the API server marks a gated pod on create: kubectl's STATUS reads SchedulingGated.
    assert still["status"]["conditions"] == [{
        "type": "PodScheduled", "status": "False", "reason": "SchedulingGated",
        "message": "Scheduling is blocked due to non-empty scheduling gates"}]
    await cluster.patch(PODS, "web-0", {"spec": {"schedulingGates": None}}, namespace=NS)

    async def bound() -> Any:
        got = await cluster.get(PODS, "web-0", namespace=NS)
        return got["spec"].get("nodeName")

    assert await eventually(bound) == "node-b"
    claim = await cluster.get(RESOURCE_CLAIMS, name, namespace=NS)
    assert claim["status"]["reservedFor"] == [
        {"resource": "pods", "name": "web-0", "uid": made["metadata"]["uid"]}]
    assert claim["status"]["allocation"]["allocationTimestamp"] == STAMP  # kept as written

    async def running() -> Any:
        got = await cluster.get(PODS, "web-0", namespace=NS)
        ready = {c["type"]: c["status"] for c in got["status"].get("conditions") or []}
        return got if ready.get("Ready") == "True" else None

    # Once bound, the pod runs, as the kubelet (or KWOK) makes it.
    scheduled = await eventually(running)
    assert scheduled["status"]["phase"] == "Running"
    assert {c["type"]: (c["status"], c.get("reason")) for c in
            scheduled["status"]["conditions"]} == {
        "PodScheduled": ("True", None), "PodReadyToStartContainers": ("True", None),
        "Initialized": ("True", None), "ContainersReady": ("True", None),
        "Ready": ("True", None)}
    assert [(c["name"], c["ready"], list(c["state"])) for c in
            scheduled["status"]["containerStatuses"]] == [
        (c["name"], True, ["running"]) for c in scheduled["spec"]["containers"]]


async def test_a_claim_allocated_without_a_timestamp_never_lets_its_pod_bind_as_from_1_36(
        cluster: MemoryCluster, caplog: pytest.LogCaptureFixture) -> None:
    await cluster.create(RESOURCE_CLAIMS, shared_claim())
    await allocate(cluster, "shared", "node-a", stamped=False)
    await cluster.create(PODS, pod("web-0", claim="shared"))

    async def refused() -> bool:
        return "status.allocation: Invalid value" in caplog.text

    await eventually(refused)
    await asyncio.sleep(0.2)  # retried, and refused again
    assert await node_of(cluster, "web-0") is None
    claim = await cluster.get(RESOURCE_CLAIMS, "shared", namespace=NS)
    assert "allocationTimestamp" not in claim["status"]["allocation"]
    assert "reservedFor" not in claim["status"]


async def test_without_binding_conditions_a_claim_without_a_timestamp_binds_as_in_1_34() -> None:
    memory = MemoryCluster()
    await memory.create(NODES, {"metadata": {"name": "node-a"}})
    await memory.create(RESOURCE_CLAIMS, shared_claim())
    await allocate(memory, "shared", "node-a", stamped=False)
    async with SimulatedControllers(memory, retry_delay=0.05, binding_conditions=False).running():
        await memory.create(PODS, pod("web-0", claim="shared"))
        assert await eventually(lambda: node_of(memory, "web-0")) == "node-a"
    claim = await memory.get(RESOURCE_CLAIMS, "shared", namespace=NS)
    assert "allocationTimestamp" not in claim["status"]["allocation"]
    await memory.close()


async def test_an_unallocated_claim_keeps_the_pod_pending(cluster: MemoryCluster) -> None:
    await cluster.create(RESOURCE_CLAIMS, {
        "metadata": {"name": "shared", "namespace": NS},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.dra-gateway.io"}}]}}})
    await cluster.create(PODS, pod("web-0", claim="shared"))
    await asyncio.sleep(0.2)
    assert "nodeName" not in (await cluster.get(PODS, "web-0", namespace=NS))["spec"]
    await allocate(cluster, "shared", "node-a")

    async def bound() -> Any:
        return (await cluster.get(PODS, "web-0", namespace=NS))["spec"].get("nodeName")

    assert await eventually(bound) == "node-a"


async def test_a_pod_of_another_scheduler_is_left_to_it(cluster: MemoryCluster) -> None:
    # As kube-scheduler does: a pod naming another scheduler (volcano) is not its to bind, even
    # with every claim allocated; the same pod naming default-scheduler binds.
    await cluster.create(RESOURCE_CLAIMS, shared_claim())
    await allocate(cluster, "shared", "node-a")
    other = pod("volcano-0", claim="shared")
    other["spec"]["schedulerName"] = "volcano"
    await cluster.create(PODS, other)
    default = pod("web-0", claim="shared")
    default["spec"]["schedulerName"] = "default-scheduler"
    await cluster.create(PODS, default)
    assert await eventually(lambda: node_of(cluster, "web-0")) == "node-a"
    await asyncio.sleep(0.2)
    assert await node_of(cluster, "volcano-0") is None


async def test_a_deleted_pod_is_dropped_from_reserved_for(cluster: MemoryCluster) -> None:
    await cluster.create(RESOURCE_CLAIMS, {
        "metadata": {"name": "shared", "namespace": NS},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.dra-gateway.io"}}]}}})
    await allocate(cluster, "shared", "node-a")
    await cluster.create(PODS, pod("a", claim="shared"))
    await cluster.create(PODS, pod("b", claim="shared"))

    async def reserved() -> Any:
        claim = await cluster.get(RESOURCE_CLAIMS, "shared", namespace=NS)
        return sorted(r["name"] for r in claim["status"].get("reservedFor") or [])

    assert await eventually(lambda: _equals(reserved, ["a", "b"])) is True
    await cluster.delete(PODS, "a", namespace=NS)
    assert await eventually(lambda: _equals(reserved, ["b"])) is True


async def _equals(read: Callable[[], Awaitable[Any]], want: Any) -> bool:
    return bool(await read() == want)


async def test_a_pod_waits_for_a_missing_template(cluster: MemoryCluster) -> None:
    await cluster.create(PODS, pod("web-0", template="later"))
    await asyncio.sleep(0.2)
    assert (await cluster.list(RESOURCE_CLAIMS, namespace=NS)).items == []
    await cluster.create(RESOURCE_CLAIM_TEMPLATES, {
        "metadata": {"name": "later", "namespace": NS},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.dra-gateway.io"}}]}}}})

    async def claims() -> Any:
        return (await cluster.list(RESOURCE_CLAIMS, namespace=NS)).items

    assert len(await eventually(claims)) == 1
    with pytest.raises(NotFound):
        await cluster.get(PODS, "gone", namespace=NS)


def test_claim_names_are_cut_in_proportion_like_upstream() -> None:
    assert claim_generate_name("web-0", "gpu") == "web-0-gpu-"
    long = claim_generate_name("p" * 60, "c" * 20)
    assert long == "p" * 42 + "-" + "c" * 14 + "-"

"""`dra-gateway allocator --release-all`, the chart's pre-delete hook, on the embedded API.

After `helm uninstall` nobody removes the allocator's finalizer, and a claim carrying it blocks
its own deletion and its namespace's. The command clears the allocation of every claim no live
pod uses, removes the finalizer from every claim, and leaves gated pods gated.
"""

from __future__ import annotations

from typing import Any

from dra_gateway.allocator.uninstall import release_all
from dra_gateway.cli import main
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import NotFound
from dra_gateway.kube.resources import NAMESPACES, PODS, RESOURCE_CLAIMS

NS = "team-a"


def _pod(name: str, *, claim: str | None = None, gated: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c", "image": "cuda"}]}
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    if gated:
        spec["schedulingGates"] = [{"name": names.SCHEDULING_GATE}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": spec}


def _claim(name: str) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NS, "finalizers": [names.FINALIZER],
                         "annotations": {names.ANNOTATION_SHARES: "{}"}},
            "spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": names.GPU_CLASS}}]}}}


async def _allocated(cluster: MemoryCluster, name: str) -> dict[str, Any]:
    claim = await cluster.create(RESOURCE_CLAIMS, _claim(name), namespace=NS)
    claim["status"] = {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": "gpu.dra-gateway.io",
                                 "pool": "node-a", "device": "gpu-0"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}}}
    return await cluster.update(RESOURCE_CLAIMS, claim, namespace=NS, subresource="status")


async def _setup() -> MemoryCluster:
    cluster = MemoryCluster()
    await cluster.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": NS}})
    await _allocated(cluster, "orphan")  # its pod is gone
    await _allocated(cluster, "in-use")
    await cluster.create(PODS, _pod("runner", claim="in-use"), namespace=NS)
    await cluster.create(PODS, _pod("waiting", gated=True), namespace=NS)
    plain = _claim("foreign")
    plain["metadata"]["finalizers"] = []
    await cluster.create(RESOURCE_CLAIMS, plain, namespace=NS)
    return cluster


async def test_release_all_frees_orphans_and_unblocks_every_claims_deletion() -> None:
    cluster = await _setup()
    summary = await release_all(cluster)
    assert summary.released == [f"{NS}/orphan"]
    assert summary.kept == [f"{NS}/in-use"]
    assert summary.gated_pods == [f"{NS}/waiting"]
    assert summary.failed == []
    orphan = await cluster.get(RESOURCE_CLAIMS, "orphan", namespace=NS)
    assert "allocation" not in (orphan.get("status") or {})
    in_use = await cluster.get(RESOURCE_CLAIMS, "in-use", namespace=NS)
    assert in_use["status"]["allocation"]  # the running pod keeps its devices
    for claim in (orphan, in_use):
        assert names.FINALIZER not in (claim["metadata"].get("finalizers") or [])
        assert names.ANNOTATION_SHARES not in (claim["metadata"].get("annotations") or {})
    # Before, the finalizer held the deletion forever; now it completes at once.
    for name in ("orphan", "in-use"):
        await cluster.delete(RESOURCE_CLAIMS, name, namespace=NS)
        try:
            await cluster.get(RESOURCE_CLAIMS, name, namespace=NS)
        except NotFound:
            continue
        raise AssertionError(f"claim {name} still exists after its deletion")
    gated = await cluster.get(PODS, "waiting", namespace=NS)
    assert gated["spec"]["schedulingGates"] == [{"name": names.SCHEDULING_GATE}]


async def test_release_all_twice_changes_nothing_the_second_time() -> None:
    cluster = await _setup()
    await release_all(cluster)
    again = await release_all(cluster)
    assert (again.released, again.kept, again.failed) == ([], [], [])
    assert "1 pods stay behind the scheduling gate" in again.text()


def test_release_all_is_a_flag_of_the_allocator_command(capsys: Any) -> None:
    assert main(["allocator", "--cluster", "memory", "--release-all"]) == 0
    assert capsys.readouterr().out == (
        "allocator --release-all: released 0 claims no pod uses (allocation cleared, finalizer "
        "dra-gateway.io/allocation removed); removed the finalizer from 0 claims running pods "
        "still use (allocation kept)\n")


async def _bound_pod_with_generated_claim(cluster: MemoryCluster, name: str, node: str, *,
                                          phase: str = "Running") -> None:
    """A pod on `node` whose claim the claim controller made from a template: owned by the
    pod, reserved for it, named only in the pod's status."""
    pod = await cluster.create(PODS, {**_pod(name), "spec": {
        "nodeName": node, "containers": [{"name": "c", "image": "cuda"}],
        "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]}}, namespace=NS)
    pod["status"] = {"phase": phase, "resourceClaimStatuses": [
        {"name": "gpu", "resourceClaimName": f"{name}-gpu"}]}
    pod = await cluster.update(PODS, pod, namespace=NS, subresource="status")
    claim = _claim(f"{name}-gpu")
    claim["metadata"]["ownerReferences"] = [{
        "apiVersion": "v1", "kind": "Pod", "name": name, "uid": pod["metadata"]["uid"],
        "controller": True}]
    await cluster.create(RESOURCE_CLAIMS, claim, namespace=NS)
    allocated = await _allocated_status(cluster, f"{name}-gpu")
    allocated["status"]["reservedFor"] = [{"resource": "pods", "name": name,
                                           "uid": pod["metadata"]["uid"]}]
    await cluster.update(RESOURCE_CLAIMS, allocated, namespace=NS, subresource="status")


async def _allocated_status(cluster: MemoryCluster, name: str) -> dict[str, Any]:
    claim = await cluster.get(RESOURCE_CLAIMS, name, namespace=NS)
    claim["status"] = {"allocation": {
        "devices": {"results": [{"request": "gpu", "driver": "gpu.dra-gateway.io",
                                 "pool": "node-b", "device": "gpu-1"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["node-b"]}]}]}}}
    return await cluster.update(RESOURCE_CLAIMS, claim, namespace=NS, subresource="status")


async def test_release_all_names_each_pod_still_running_on_gateway_claims() -> None:
    cluster = await _setup()
    await _bound_pod_with_generated_claim(cluster, "trainer", "node-b")
    await _bound_pod_with_generated_claim(cluster, "done", "node-b", phase="Succeeded")
    summary = await release_all(cluster)
    # The orphan and the finished pod's claim are released; the gated pod holds no allocation.
    assert sorted(summary.released) == [f"{NS}/done-gpu", f"{NS}/orphan"]
    assert [(p.pod, p.claims, p.node) for p in summary.running] == [
        (f"{NS}/runner", (f"{NS}/in-use",), ""),
        (f"{NS}/trainer", (f"{NS}/trainer-gpu",), "node-b")]
    assert summary.lines() == [
        f"released 2 claims no pod uses (allocation cleared, finalizer {names.FINALIZER} "
        f"removed); removed the finalizer from 2 claims running pods still use (allocation "
        f"kept); 2 pods still run on gateway claims, which keep their devices after the "
        f"uninstall (one line each below); 1 pods stay behind the scheduling gate "
        f"{names.SCHEDULING_GATE} (delete them, or reinstall the gateway): {NS}/waiting",
        "pods still running on gateway claims (NAMESPACE/POD on node NODE: CLAIMS); they keep "
        "their devices until they end, and a claim a pod names itself (resourceClaimName) "
        "keeps them until it is deleted:",
        f"  {NS}/runner: {NS}/in-use",
        f"  {NS}/trainer on node node-b: {NS}/trainer-gpu",
    ]


async def test_a_second_release_all_still_names_the_pods_on_gateway_claims() -> None:
    cluster = await _setup()
    await _bound_pod_with_generated_claim(cluster, "trainer", "node-b")
    first = await release_all(cluster)
    again = await release_all(cluster)  # no finalizer left: the claims' classes tell
    assert (again.released, again.kept) == ([], [])
    assert again.running == first.running
    assert [p.pod for p in again.running] == [f"{NS}/runner", f"{NS}/trainer"]


async def test_a_pod_on_another_drivers_claim_is_not_named() -> None:
    cluster = MemoryCluster()
    await cluster.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                      "metadata": {"name": NS}})
    other = _claim("nvidia")
    other["metadata"]["finalizers"] = []
    other["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] = "gpu.nvidia.com"
    await cluster.create(RESOURCE_CLAIMS, other, namespace=NS)
    await _allocated_status(cluster, "nvidia")
    await cluster.create(PODS, _pod("nvidia-user", claim="nvidia"), namespace=NS)
    summary = await release_all(cluster)
    assert summary.running == []
    assert len(summary.lines()) == 1


def test_the_release_all_command_prints_each_pod_on_a_line_of_its_own(
        capsys: Any, monkeypatch: Any) -> None:
    import asyncio
    import importlib

    # The package re-exports the function under the module's name: reach the module itself.
    connecting = importlib.import_module("dra_gateway.kube.cluster.connect")

    async def seeded() -> MemoryCluster:
        cluster = await _setup()
        await _bound_pod_with_generated_claim(cluster, "trainer", "node-b")
        return cluster

    cluster = asyncio.run(seeded())

    async def connect(*args: Any, **kwargs: Any) -> MemoryCluster:
        return cluster

    monkeypatch.setattr(connecting, "connect", connect)
    assert main(["allocator", "--cluster", "memory", "--release-all"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("allocator --release-all: released 1 claims no pod uses")
    assert out[2:] == [f"  {NS}/runner: {NS}/in-use",
                       f"  {NS}/trainer on node node-b: {NS}/trainer-gpu"]

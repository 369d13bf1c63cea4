"""Which pods use which claims: the indexes of the allocator's pod and claim mirrors.

The lookups are checked on informers over the in-memory API, then through the controller's
handlers: a claim's change wakes exactly the gated pods that name, own or reserve it, and a
pod's end queues every claim it held, also those it never named (owner, reservedFor).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from testkit import eventually

from dra_gateway.allocator.controller import Controller
from dra_gateway.allocator.index import (
    CLAIM_INDEXERS,
    POD_INDEXERS,
    claims_of,
    pod_by_uid,
    pods_naming,
    users_of,
)
from dra_gateway.allocator.work import ClaimKey, PodKey, WorkKey
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import Object
from dra_gateway.kube.resources import PODS, RESOURCE_CLAIMS
from dra_gateway.kube.runtime.informer import Informer

from .conftest import FAST, whole_claim_spec

NS = "ns"


def _pod(name: str, *claims: str) -> Object:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"containers": [{"name": "main", "image": "cuda:12"}],
                     "resourceClaims": [{"name": c, "resourceClaimName": c} for c in claims],
                     "schedulingGates": [{"name": names.SCHEDULING_GATE}]}}


def _claim(name: str, *, owner: Object | None = None) -> Object:
    meta: dict[str, Any] = {"name": name, "namespace": NS, "finalizers": [names.FINALIZER]}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Pod", "controller": True,
                                    "name": owner["metadata"]["name"],
                                    "uid": owner["metadata"]["uid"]}]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": meta,
            "spec": whole_claim_spec()}


# reservedFor needs an allocation (which then never changes).
ALLOCATION = {"devices": {"results": [{"request": "gpu", "driver": names.DRIVER,
                                       "pool": "node-0", "device": "gpu-0"}]}}


async def _reserve(cluster: MemoryCluster, claim: str, *pods: Object) -> Object:
    return await cluster.patch(RESOURCE_CLAIMS, claim, {"status": {
        "allocation": ALLOCATION,
        "reservedFor": [{"resource": "pods", "name": p["metadata"]["name"],
                         "uid": p["metadata"]["uid"]} for p in pods]}},
        namespace=NS, subresource="status")


async def _name_in_status(cluster: MemoryCluster, pod: str, *claims: str) -> Object:
    return await cluster.patch(PODS, pod, {"status": {"resourceClaimStatuses": [
        {"name": c, "resourceClaimName": c} for c in claims]}}, namespace=NS,
        subresource="status")


def _uid(obj: Object) -> str:
    return str(obj["metadata"]["uid"])


def _names(pods: list[Object]) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods)


def _rv_seen(informer: Informer, obj: Object) -> bool:
    held = informer.get(obj["metadata"].get("namespace"), obj["metadata"]["name"])
    return held is not None and (held["metadata"]["resourceVersion"]
                                 == obj["metadata"]["resourceVersion"])


@contextlib.asynccontextmanager
async def _running(*informers: Informer) -> AsyncIterator[None]:
    tasks = [asyncio.create_task(i.run()) for i in informers]
    try:
        async with asyncio.timeout(5):
            for informer in informers:
                await informer.synced.wait()
        yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


# The lookups ------------------------------------------------------------------------------------

async def test_a_pod_is_found_by_uid_and_under_the_claims_it_names_in_spec_or_status() -> None:
    cluster = MemoryCluster()
    p1 = await cluster.create(PODS, _pod("p1", "a", "b"), namespace=NS)
    await cluster.create(PODS, _pod("p2"), namespace=NS)
    p2 = await _name_in_status(cluster, "p2", "b")
    pods = Informer(cluster, PODS, indexers=POD_INDEXERS)
    async with _running(pods):
        assert _names([p for p in (pod_by_uid(pods, _uid(p1)), pod_by_uid(pods, _uid(p2)))
                       if p is not None]) == ["p1", "p2"]
        assert pod_by_uid(pods, "no-such-uid") is None
        assert _names(pods_naming(pods, ClaimKey(NS, "a"))) == ["p1"]
        assert _names(pods_naming(pods, ClaimKey(NS, "b"))) == ["p1", "p2"]
        assert pods_naming(pods, ClaimKey("other", "b")) == []


async def test_a_pod_naming_other_claims_leaves_the_old_ones_and_a_deleted_pod_leaves_all(
        ) -> None:
    cluster = MemoryCluster()
    await cluster.create(PODS, _pod("p1"), namespace=NS)
    await _name_in_status(cluster, "p1", "a")
    pods = Informer(cluster, PODS, indexers=POD_INDEXERS)
    async with _running(pods):
        assert _names(pods_naming(pods, ClaimKey(NS, "a"))) == ["p1"]
        moved = await _name_in_status(cluster, "p1", "b")
        await eventually(lambda: _rv_seen(pods, moved))
        assert (pods_naming(pods, ClaimKey(NS, "a")),
                _names(pods_naming(pods, ClaimKey(NS, "b")))) == ([], ["p1"])
        await cluster.delete(PODS, "p1", namespace=NS)
        await eventually(lambda: pods.get(NS, "p1") is None)
        assert (pods_naming(pods, ClaimKey(NS, "b")), pod_by_uid(pods, _uid(moved))) == ([], None)


async def test_the_users_of_a_claim_are_the_pods_naming_it_its_owner_and_reserved_pods() -> None:
    cluster = MemoryCluster(garbage_collection=False)
    named = await cluster.create(PODS, _pod("named", "c"), namespace=NS)
    owner = await cluster.create(PODS, _pod("owner"), namespace=NS)
    reserved = await cluster.create(PODS, _pod("reserved"), namespace=NS)
    await cluster.create(PODS, _pod("bystander", "other"), namespace=NS)
    await cluster.create(RESOURCE_CLAIMS, _claim("c", owner=owner), namespace=NS)
    claim = await _reserve(cluster, "c", reserved, named)
    pods = Informer(cluster, PODS, indexers=POD_INDEXERS)
    async with _running(pods):
        assert _names(users_of(pods, claim)) == ["named", "owner", "reserved"]  # each once
        # Owner and reservedFor are read from the object given, not from a mirror.
        claim["status"]["reservedFor"] = []
        assert _names(users_of(pods, claim)) == ["named", "owner"]
        await cluster.delete(PODS, "owner", namespace=NS)
        await eventually(lambda: pods.get(NS, "owner") is None)
        assert _names(users_of(pods, claim)) == ["named"]


async def test_a_pod_holds_the_claims_it_names_owns_or_is_reserved_in_also_once_deleted(
        ) -> None:
    cluster = MemoryCluster(garbage_collection=False)
    pod = await cluster.create(PODS, _pod("p", "named"), namespace=NS)
    other = await cluster.create(PODS, _pod("other"), namespace=NS)
    await cluster.create(RESOURCE_CLAIMS, _claim("owned", owner=pod), namespace=NS)
    await cluster.create(RESOURCE_CLAIMS, _claim("reserved"), namespace=NS)
    await _reserve(cluster, "reserved", pod)
    await cluster.create(RESOURCE_CLAIMS, _claim("unrelated", owner=other), namespace=NS)
    claims = Informer(cluster, RESOURCE_CLAIMS, indexers=CLAIM_INDEXERS)
    uid = _uid(pod)
    async with _running(claims):
        held = {ClaimKey(NS, "owned"), ClaimKey(NS, "reserved")}
        assert claims_of(claims, uid, pod) == {ClaimKey(NS, "named"), *held}
        # A deleted pod: no state (or another pod's) names nothing, its holds stay.
        await cluster.delete(PODS, "p", namespace=NS)
        assert claims_of(claims, uid, None) == claims_of(claims, uid, other) == held
        # Until the claims themselves change.
        moved = await _reserve(cluster, "reserved", other)
        await eventually(lambda: _rv_seen(claims, moved))
        assert claims_of(claims, uid, None) == {ClaimKey(NS, "owned")}
        await cluster.delete(RESOURCE_CLAIMS, "owned", namespace=NS)
        await eventually(lambda: claims.get(NS, "owned") is None or
                         bool(claims.get(NS, "owned")["metadata"].get("deletionTimestamp")))
        await cluster.patch(RESOURCE_CLAIMS, "owned", {"metadata": {"finalizers": None}},
                            namespace=NS)
        await eventually(lambda: claims.get(NS, "owned") is None)
        assert claims_of(claims, uid, None) == set()
        assert claims_of(claims, _uid(other), None) == {ClaimKey(NS, "reserved"),
                                                        ClaimKey(NS, "unrelated")}


# Through the controller's handlers ------------------------------------------------------------

class Spied:
    """A controller whose pod and claim mirrors run (nothing else), with its wakes and queued
    keys recorded."""

    def __init__(self, cluster: MemoryCluster) -> None:
        self.controller = Controller(cluster, FAST)
        self.woken: list[PodKey] = []
        self.queued: list[WorkKey] = []
        self.controller.unplaceable.wake = self.woken.append  # type: ignore[method-assign]
        self.controller.queue.add = self.queued.append  # type: ignore[method-assign]

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[Controller]:
        async with _running(self.controller.pods, self.controller.claims):
            self.woken.clear()
            self.queued.clear()
            yield self.controller


async def test_a_claims_change_wakes_exactly_the_gated_pods_that_name_own_or_reserve_it(
        ) -> None:
    cluster = MemoryCluster(garbage_collection=False)
    named = await cluster.create(PODS, _pod("named", "c"), namespace=NS)
    owner = await cluster.create(PODS, _pod("owner"), namespace=NS)
    reserved = await cluster.create(PODS, _pod("reserved"), namespace=NS)
    await cluster.create(PODS, _pod("later"), namespace=NS)
    await cluster.create(PODS, _pod("bystander", "other"), namespace=NS)
    await cluster.create(RESOURCE_CLAIMS, _claim("c", owner=owner), namespace=NS)
    await cluster.create(RESOURCE_CLAIMS, _claim("other"), namespace=NS)
    await _reserve(cluster, "c", reserved)
    spied = Spied(cluster)
    async with spied.running() as controller:

        async def change_claim(value: str) -> None:
            changed = await cluster.patch(RESOURCE_CLAIMS, "c", {"metadata": {"labels": {
                "v": value}}}, namespace=NS)
            await eventually(lambda: _rv_seen(controller.claims, changed))

        await change_claim("1")
        assert sorted(k.name for k in spied.woken) == ["named", "owner", "reserved"]
        assert {k.uid for k in spied.woken} == {_uid(named), _uid(owner), _uid(reserved)}
        # A pod that comes to name the claim (its claim statuses) is woken from then on.
        later = await _name_in_status(cluster, "later", "c")
        await eventually(lambda: _rv_seen(controller.pods, later))
        spied.woken.clear()
        await change_claim("2")
        assert sorted(k.name for k in spied.woken) == ["later", "named", "owner", "reserved"]


async def _delete(cluster: MemoryCluster, name: str) -> None:
    await cluster.delete(PODS, name, namespace=NS)


async def _finish(cluster: MemoryCluster, name: str) -> None:
    # Out of the live pods' watch: the mirror hears of it as deleted.
    await cluster.patch(PODS, name, {"status": {"phase": "Succeeded"}}, namespace=NS,
                        subresource="status")


async def _delete_unseen(cluster: MemoryCluster, name: str) -> None:
    # Deleted while the watch is broken: the relist reports it, with its last stored state.
    cluster.expire_watches()
    await cluster.delete(PODS, name, namespace=NS)


@pytest.mark.parametrize("end", [_delete, _finish, _delete_unseen])
async def test_a_pods_end_queues_its_claims_also_those_it_never_named(end: Any) -> None:
    cluster = MemoryCluster(garbage_collection=False)
    pod = await cluster.create(PODS, _pod("p", "named"), namespace=NS)
    await _name_in_status(cluster, "p", "named", "in-status")
    other = await cluster.create(PODS, _pod("other", "unrelated"), namespace=NS)
    for name in ("named", "in-status", "reserved", "unrelated"):
        await cluster.create(RESOURCE_CLAIMS, _claim(name), namespace=NS)
    await cluster.create(RESOURCE_CLAIMS, _claim("owned", owner=pod), namespace=NS)
    await _reserve(cluster, "reserved", pod, other)
    spied = Spied(cluster)
    async with spied.running() as controller:
        await end(cluster, "p")
        await eventually(lambda: controller.pods.get(NS, "p") is None, within=5)
        assert sorted(str(k) for k in spied.queued) == [
            f"{NS}/in-status", f"{NS}/named", f"{NS}/owned", f"{NS}/reserved"]

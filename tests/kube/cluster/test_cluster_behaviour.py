"""One behaviour suite for the cluster port, run against every backend (see conftest.py)."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import kubernetes_validate
import pytest

from dra_gateway.kube.cluster.port import (
    AlreadyExists,
    ApiError,
    BadRequest,
    Cluster,
    Conflict,
    Expired,
    Invalid,
    NotFound,
    WatchEvent,
)
from dra_gateway.kube.resources import (
    CONFIG_MAPS,
    NODES,
    PODS,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)

if TYPE_CHECKING:
    from .conftest import Backend

NS = "team-a"
DRIVER = "gpu.dra-gateway.io"


def claim(name: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS, "labels": dict(labels)},
        "spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": DRIVER}},
        ]}},
    }


def allocation(device: str) -> dict[str, Any]:
    return {"devices": {"results": [
        {"request": "gpu", "driver": DRIVER, "pool": "node-a", "device": device},
    ]}}


def pod(name: str, *, gates: list[str] | None = None, node: str | None = None,
        claims: list[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "busybox"}]}
    if gates:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    if node:
        spec["nodeName"] = node
    if claims:
        spec["resourceClaims"] = [{"name": c, "resourceClaimName": c} for c in claims]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": spec}


def slice_(name: str, node: str, driver: str = DRIVER) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": name},
        "spec": {"driver": driver, "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": [{"name": "gpu-0"}]},
    }


async def take(events: AsyncIterator[WatchEvent], count: int) -> list[tuple[str, str]]:
    """The next `count` events as (type, name), failing rather than hanging."""
    seen = []
    async with asyncio.timeout(5):
        for _ in range(count):
            event = await anext(events)
            seen.append((event.type, event.object["metadata"]["name"]))
    return seen


def names(items: list[dict[str, Any]]) -> list[str]:
    return [item["metadata"]["name"] for item in items]


# Create, get, list -----------------------------------------------------------------------------

async def test_create_fills_server_fields_and_get_returns_the_same_object(
        cluster: Cluster) -> None:
    created = await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS)
    meta = created["metadata"]
    assert meta["uid"]
    assert meta["generation"] == 1
    assert int(meta["resourceVersion"]) > 0
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", meta["creationTimestamp"])
    assert await cluster.get(RESOURCE_CLAIMS, "c1", namespace=NS) == created
    kubernetes_validate.validate(created, "1.34", strict=True)


async def test_creating_an_existing_name_is_already_exists(cluster: Cluster) -> None:
    await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS)
    with pytest.raises(AlreadyExists) as caught:
        await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS)
    assert caught.value.code == 409
    assert caught.value.message == 'resourceclaims.resource.k8s.io "c1" already exists'


async def test_creating_an_object_that_carries_a_resource_version_is_refused(
        cluster: Cluster) -> None:
    # The API server's storage refuses it: a client re-creating an object it read back must
    # clear the version, so that mistake fails here as it would on a real cluster.
    created = await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS)
    again = claim("c2")
    again["metadata"]["resourceVersion"] = created["metadata"]["resourceVersion"]
    with pytest.raises(ApiError) as caught:
        await cluster.create(RESOURCE_CLAIMS, again, namespace=NS)
    assert caught.value.code == 500
    assert caught.value.message == "resourceVersion should not be set on objects to be created"
    with pytest.raises(NotFound):
        await cluster.get(RESOURCE_CLAIMS, "c2", namespace=NS)


async def test_getting_a_missing_object_is_not_found_worded_as_kubernetes_does(
        cluster: Cluster) -> None:
    with pytest.raises(NotFound) as caught:
        await cluster.get(PODS, "nope", namespace=NS)
    assert caught.value.code == 404
    assert caught.value.message == 'pods "nope" not found'
    with pytest.raises(NotFound, match=re.escape('resourceslices.resource.k8s.io "s" not found')):
        await cluster.delete(RESOURCE_SLICES, "s")


async def test_generate_name_appends_a_five_character_suffix(cluster: Cluster) -> None:
    template = claim("")
    del template["metadata"]["name"]
    template["metadata"]["generateName"] = "web-0-gpu-"
    first = await cluster.create(RESOURCE_CLAIMS, template, namespace=NS)
    second = await cluster.create(RESOURCE_CLAIMS, template, namespace=NS)
    for made in (first, second):
        assert re.fullmatch(r"web-0-gpu-[a-z0-9]{5}", made["metadata"]["name"])
    assert first["metadata"]["name"] != second["metadata"]["name"]


async def test_an_object_without_name_or_generate_name_is_invalid(cluster: Cluster) -> None:
    template = claim("")
    del template["metadata"]["name"]
    with pytest.raises(Invalid, match=re.escape("metadata.name: Required value")):
        await cluster.create(RESOURCE_CLAIMS, template, namespace=NS)


async def test_namespaced_types_need_a_namespace(cluster: Cluster) -> None:
    orphan = claim("c1")
    del orphan["metadata"]["namespace"]
    with pytest.raises(BadRequest, match="namespace is required"):
        await cluster.create(RESOURCE_CLAIMS, orphan)
    # The namespace may come from the object alone.
    made = await cluster.create(RESOURCE_CLAIMS, claim("c2"))
    assert made["metadata"]["namespace"] == NS


async def test_resource_version_increases_across_types(cluster: Cluster) -> None:
    a = await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS)
    b = await cluster.create(RESOURCE_SLICES, slice_("s1", "node-a"))
    c = await cluster.create(RESOURCE_CLAIMS, claim("c2"), namespace=NS)
    versions = [int(o["metadata"]["resourceVersion"]) for o in (a, b, c)]
    assert versions == sorted(versions)
    assert len(set(versions)) == 3
    listed = await cluster.list(RESOURCE_CLAIMS, namespace=NS)
    assert int(listed.resource_version) >= versions[-1]


async def test_list_filters_by_namespace_and_label_selector(cluster: Cluster) -> None:
    await cluster.create(RESOURCE_CLAIMS, claim("a", tier="gold", app="x"), namespace=NS)
    await cluster.create(RESOURCE_CLAIMS, claim("b", tier="silver"), namespace=NS)
    await cluster.create(RESOURCE_CLAIMS, claim("c"), namespace=NS)
    other = claim("d", tier="gold")
    other["metadata"]["namespace"] = "team-b"
    await cluster.create(RESOURCE_CLAIMS, other)

    async def select(selector: str | None, namespace: str | None = NS) -> list[str]:
        listed = await cluster.list(RESOURCE_CLAIMS, namespace=namespace,
                                    label_selector=selector)
        return names(listed.items)

    assert await select(None) == ["a", "b", "c"]
    assert await select(None, None) == ["a", "b", "c", "d"]
    assert await select("tier=gold", None) == ["a", "d"]
    assert await select("tier==gold,app=x") == ["a"]
    assert await select("tier!=gold") == ["b", "c"]
    assert await select("tier in (gold, silver)") == ["a", "b"]
    assert await select("tier notin (gold)") == ["b", "c"]
    assert await select("tier") == ["a", "b"]
    assert await select("!tier") == ["c"]


async def test_list_filters_by_field_selector(cluster: Cluster) -> None:
    await cluster.create(RESOURCE_SLICES, slice_("s1", "node-a"))
    await cluster.create(RESOURCE_SLICES, slice_("s2", "node-b"))
    await cluster.create(RESOURCE_SLICES, slice_("s3", "node-b", driver="gpu.nvidia.com"))
    await cluster.create(PODS, pod("p1", node="node-a"), namespace=NS)
    await cluster.create(PODS, pod("p2"), namespace=NS)

    async def select(rt: Any, selector: str) -> list[str]:
        return names((await cluster.list(rt, field_selector=selector)).items)

    assert await select(RESOURCE_SLICES, "spec.nodeName=node-b") == ["s2", "s3"]
    assert await select(RESOURCE_SLICES, f"spec.nodeName==node-b,spec.driver={DRIVER}") == ["s2"]
    assert await select(RESOURCE_SLICES, "spec.driver!=gpu.nvidia.com") == ["s1", "s2"]
    assert await select(PODS, "spec.nodeName=node-a") == ["p1"]
    assert await select(PODS, "spec.nodeName=") == ["p2"]
    assert await select(PODS, "status.phase=Pending,metadata.name=p2") == ["p2"]
    assert await select(PODS, f"metadata.namespace={NS}") == ["p1", "p2"]


async def test_bad_selectors_are_bad_requests_naming_the_selector(cluster: Cluster) -> None:
    with pytest.raises(BadRequest, match='invalid label selector "tier in gold"'):
        await cluster.list(RESOURCE_CLAIMS, label_selector="tier in gold")
    with pytest.raises(BadRequest, match=re.escape("field label not supported: spec.driver")):
        await cluster.list(PODS, field_selector="spec.driver=x")
    with pytest.raises(BadRequest, match='invalid field selector "nodeName"'):
        await cluster.list(PODS, field_selector="nodeName")


# Update, status, patch -------------------------------------------------------------------------

async def test_stale_update_is_a_conflict(cluster: Cluster) -> None:
    made = await cluster.create(CONFIG_MAPS, {"metadata": {"name": "cm", "namespace": NS},
                                              "data": {"k": "1"}})
    fresh = {**made, "data": {"k": "2"}}
    await cluster.update(CONFIG_MAPS, fresh, namespace=NS)
    stale = {**made, "data": {"k": "3"}}
    with pytest.raises(Conflict) as caught:
        await cluster.update(CONFIG_MAPS, stale, namespace=NS)
    assert caught.value.code == 409
    assert caught.value.message == (
        'Operation cannot be fulfilled on configmaps "cm": the object has been modified; '
        "please apply your changes to the latest version and try again")
    assert (await cluster.get(CONFIG_MAPS, "cm", namespace=NS))["data"] == {"k": "2"}


async def test_update_without_resource_version_is_unconditional(cluster: Cluster) -> None:
    made = await cluster.create(CONFIG_MAPS, {"metadata": {"name": "cm", "namespace": NS},
                                              "data": {"k": "1"}})
    await cluster.update(CONFIG_MAPS, {**made, "data": {"k": "2"}}, namespace=NS)
    blind = {"metadata": {"name": "cm", "namespace": NS}, "data": {"k": "3"}}
    updated = await cluster.update(CONFIG_MAPS, blind, namespace=NS)
    assert updated["data"] == {"k": "3"}
    assert updated["metadata"]["uid"] == made["metadata"]["uid"]


async def test_updating_a_missing_object_is_not_found(cluster: Cluster) -> None:
    expected = 'resourceclaims.resource.k8s.io "ghost" not found'
    with pytest.raises(NotFound, match=re.escape(expected)):
        await cluster.update(RESOURCE_CLAIMS, claim("ghost"), namespace=NS)


async def test_concurrent_updates_from_one_version_let_exactly_one_win(
        cluster: Cluster) -> None:
    made = await cluster.create(CONFIG_MAPS, {"metadata": {"name": "cm", "namespace": NS},
                                              "data": {"k": "0"}})

    async def write(i: int) -> str:
        try:
            await cluster.update(CONFIG_MAPS, {**made, "data": {"k": str(i)}}, namespace=NS)
        except Conflict:
            return "conflict"
        return "ok"

    outcomes = await asyncio.gather(*(write(i) for i in range(1, 9)))
    assert sorted(outcomes) == ["conflict"] * 7 + ["ok"]


async def test_status_changes_only_through_the_status_subresource(cluster: Cluster) -> None:
    made = await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS)
    with_status = {**made, "status": {"allocation": allocation("gpu-0")}}
    after_main = await cluster.update(RESOURCE_CLAIMS, with_status, namespace=NS)
    assert "status" not in after_main
    with_status["metadata"]["labels"] = {"sneaky": "yes"}
    after_status = await cluster.update(RESOURCE_CLAIMS, with_status, namespace=NS,
                                        subresource="status")
    assert after_status["status"] == {"allocation": allocation("gpu-0")}
    assert after_status["metadata"]["labels"] == {}
    assert after_status["metadata"]["generation"] == 1
    kubernetes_validate.validate(after_status, "1.34", strict=True)


async def test_generation_counts_spec_changes_only(cluster: Cluster) -> None:
    made = await cluster.create(NODES, {"metadata": {"name": "node-a"}, "spec": {}})
    labelled = await cluster.patch(NODES, "node-a", {"metadata": {"labels": {"a": "b"}}})
    assert labelled["metadata"]["generation"] == 1
    cordoned = await cluster.patch(NODES, "node-a", {"spec": {"unschedulable": True}})
    assert cordoned["metadata"]["generation"] == 2
    assert int(cordoned["metadata"]["resourceVersion"]) > int(made["metadata"]["resourceVersion"])


async def test_a_no_op_update_keeps_the_resource_version(cluster: Cluster) -> None:
    made = await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS)
    again = await cluster.update(RESOURCE_CLAIMS, made, namespace=NS)
    assert again["metadata"]["resourceVersion"] == made["metadata"]["resourceVersion"]


async def test_json_and_merge_patches_apply(cluster: Cluster) -> None:
    await cluster.create(RESOURCE_CLAIMS, claim("c1", keep="1", drop="1"), namespace=NS)
    merged = await cluster.patch(RESOURCE_CLAIMS, "c1",
                                 {"metadata": {"labels": {"drop": None, "new": "2"}}},
                                 namespace=NS, patch_type="merge")
    assert merged["metadata"]["labels"] == {"keep": "1", "new": "2"}
    patched = await cluster.patch(
        RESOURCE_CLAIMS, "c1",
        [{"op": "test", "path": "/metadata/labels/keep", "value": "1"},
         {"op": "add", "path": "/metadata/annotations", "value": {"why": "test"}}],
        namespace=NS, patch_type="json")
    assert patched["metadata"]["annotations"] == {"why": "test"}
    with pytest.raises(Invalid):
        await cluster.patch(RESOURCE_CLAIMS, "c1",
                            [{"op": "test", "path": "/metadata/labels/keep", "value": "2"}],
                            namespace=NS, patch_type="json")
    with pytest.raises(BadRequest):
        await cluster.patch(RESOURCE_CLAIMS, "c1", [{"op": "remove", "path": "/nope/x"}],
                            namespace=NS, patch_type="json")


async def test_a_patch_carrying_a_stale_resource_version_is_a_conflict(
        cluster: Cluster) -> None:
    made = await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS)
    await cluster.patch(RESOURCE_CLAIMS, "c1", {"metadata": {"labels": {"a": "1"}}},
                        namespace=NS)
    with pytest.raises(Conflict):
        await cluster.patch(RESOURCE_CLAIMS, "c1", {"metadata": {
            "labels": {"a": "2"}, "resourceVersion": made["metadata"]["resourceVersion"]}},
            namespace=NS)


async def test_a_patch_naming_another_uid_reaches_only_the_object_it_was_written_for(
        cluster: Cluster) -> None:
    """As the API server answers (checked on 1.34.4): a patch's metadata.uid is immutable, so
    a patch written for an object deleted since never lands on one made under its name."""
    first = await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS)
    await cluster.delete(RESOURCE_CLAIMS, "c1", namespace=NS)
    await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS)
    stale = {"metadata": {"uid": first["metadata"]["uid"], "labels": {"a": "1"}}}
    for subresource in (None, "status"):
        with pytest.raises(Invalid, match=r"metadata\.uid"):
            await cluster.patch(RESOURCE_CLAIMS, "c1", stale, namespace=NS,
                                patch_type="strategic", subresource=subresource)
    now = await cluster.get(RESOURCE_CLAIMS, "c1", namespace=NS)
    assert "a" not in (now["metadata"].get("labels") or {})
    same = {"metadata": {"uid": now["metadata"]["uid"], "labels": {"a": "1"}}}
    patched = await cluster.patch(RESOURCE_CLAIMS, "c1", same, namespace=NS,
                                  patch_type="strategic")
    assert patched["metadata"]["labels"]["a"] == "1"


async def test_status_patch_sets_allocation_and_strategic_patch_merges_by_key(
        cluster: Cluster) -> None:
    await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS)
    consumer = {"resource": "pods", "name": "p1", "uid": "uid-1"}
    allocated = await cluster.patch(
        RESOURCE_CLAIMS, "c1",
        {"status": {"allocation": allocation("gpu-0"), "reservedFor": [consumer]}},
        namespace=NS, subresource="status")
    assert allocated["status"]["reservedFor"] == [consumer]
    second = {"resource": "pods", "name": "p2", "uid": "uid-2"}
    both = await cluster.patch(RESOURCE_CLAIMS, "c1", {"status": {"reservedFor": [second]}},
                               namespace=NS, patch_type="strategic", subresource="status")
    assert both["status"]["reservedFor"] == [consumer, second]
    finalized = await cluster.patch(RESOURCE_CLAIMS, "c1",
                                    {"metadata": {"finalizers": ["a.io/x"]}},
                                    namespace=NS, patch_type="strategic")
    finalized = await cluster.patch(RESOURCE_CLAIMS, "c1",
                                    {"metadata": {"finalizers": ["b.io/y"]}},
                                    namespace=NS, patch_type="strategic")
    assert finalized["metadata"]["finalizers"] == ["a.io/x", "b.io/y"]


# Delete and finalizers -------------------------------------------------------------------------

async def test_delete_removes_an_object_without_finalizers(cluster: Cluster) -> None:
    await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS)
    gone = await cluster.delete(RESOURCE_CLAIMS, "c1", namespace=NS)
    assert gone is not None
    assert gone["metadata"]["name"] == "c1"
    with pytest.raises(NotFound):
        await cluster.get(RESOURCE_CLAIMS, "c1", namespace=NS)


async def test_finalizers_hold_deletion_until_the_last_one_is_removed(cluster: Cluster) -> None:
    made = claim("c1")
    made["metadata"]["finalizers"] = ["dra-gateway.io/allocation", "other.io/x"]
    await cluster.create(RESOURCE_CLAIMS, made, namespace=NS)
    marked = await cluster.delete(RESOURCE_CLAIMS, "c1", namespace=NS)
    assert marked is not None
    assert marked["metadata"]["deletionTimestamp"]
    assert marked["metadata"]["deletionGracePeriodSeconds"] == 0
    again = await cluster.delete(RESOURCE_CLAIMS, "c1", namespace=NS)
    assert again is not None
    assert again["metadata"]["resourceVersion"] == marked["metadata"]["resourceVersion"]

    current = await cluster.get(RESOURCE_CLAIMS, "c1", namespace=NS)
    current["metadata"]["finalizers"] = ["dra-gateway.io/allocation", "new.io/z"]
    with pytest.raises(Invalid, match="no new finalizers can be added"):
        await cluster.update(RESOURCE_CLAIMS, current, namespace=NS)
    current["metadata"]["finalizers"] = ["other.io/x"]
    current = await cluster.update(RESOURCE_CLAIMS, current, namespace=NS)
    assert current["metadata"]["finalizers"] == ["other.io/x"]
    await cluster.patch(RESOURCE_CLAIMS, "c1", {"metadata": {"finalizers": None}},
                        namespace=NS)
    with pytest.raises(NotFound):
        await cluster.get(RESOURCE_CLAIMS, "c1", namespace=NS)


async def test_delete_with_a_stale_resource_version_precondition_is_a_conflict(
        cluster: Cluster) -> None:
    made = await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS)
    touched = await cluster.patch(RESOURCE_CLAIMS, "c1", {"metadata": {"labels": {"a": "1"}}},
                                  namespace=NS)
    with pytest.raises(Conflict, match="does not match the ResourceVersion in record"):
        await cluster.delete(RESOURCE_CLAIMS, "c1", namespace=NS,
                             resource_version=made["metadata"]["resourceVersion"])
    await cluster.delete(RESOURCE_CLAIMS, "c1", namespace=NS,
                         resource_version=touched["metadata"]["resourceVersion"])


async def test_claims_owned_by_a_deleted_pod_are_garbage_collected(cluster: Cluster) -> None:
    owner = await cluster.create(PODS, pod("p1"), namespace=NS)
    owned = claim("p1-gpu")
    owned["metadata"]["ownerReferences"] = [{
        "apiVersion": "v1", "kind": "Pod", "name": "p1", "uid": owner["metadata"]["uid"],
        "controller": True, "blockOwnerDeletion": True}]
    await cluster.create(RESOURCE_CLAIMS, owned, namespace=NS)
    await cluster.create(RESOURCE_CLAIMS, claim("unowned"), namespace=NS)
    await cluster.delete(PODS, "p1", namespace=NS)
    assert names((await cluster.list(RESOURCE_CLAIMS, namespace=NS)).items) == ["unowned"]


async def test_dry_run_returns_the_object_but_stores_nothing(cluster: Cluster) -> None:
    would_be = await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS, dry_run=True)
    assert would_be["metadata"]["name"] == "c1"
    assert would_be["metadata"]["uid"]
    with pytest.raises(NotFound):
        await cluster.get(RESOURCE_CLAIMS, "c1", namespace=NS)


async def test_callers_cannot_mutate_stored_state(cluster: Cluster) -> None:
    sent = claim("c1", a="1")
    made = await cluster.create(RESOURCE_CLAIMS, sent, namespace=NS)
    sent["metadata"]["labels"]["a"] = "mutated"
    made["metadata"]["labels"]["a"] = "mutated"
    fetched = await cluster.get(RESOURCE_CLAIMS, "c1", namespace=NS)
    assert fetched["metadata"]["labels"] == {"a": "1"}


# Validations -----------------------------------------------------------------------------------

async def test_claim_spec_is_immutable(cluster: Cluster) -> None:
    made = await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS)
    made["spec"]["devices"]["requests"][0]["name"] = "other"
    with pytest.raises(Invalid) as caught:
        await cluster.update(RESOURCE_CLAIMS, made, namespace=NS)
    assert caught.value.code == 422
    assert caught.value.message.startswith(
        'ResourceClaim.resource.k8s.io "c1" is invalid: spec: Invalid value: ')
    assert caught.value.message.endswith(": field is immutable")


async def test_claim_allocation_is_set_once_and_only_cleared(cluster: Cluster) -> None:
    await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS)
    await cluster.patch(RESOURCE_CLAIMS, "c1", {"status": {"allocation": allocation("gpu-0")}},
                        namespace=NS, subresource="status")
    with pytest.raises(Invalid, match=r"status\.allocation: Invalid value: .*field is immutable"):
        await cluster.patch(RESOURCE_CLAIMS, "c1",
                            {"status": {"allocation": allocation("gpu-1")}},
                            namespace=NS, subresource="status")
    cleared = await cluster.patch(RESOURCE_CLAIMS, "c1", {"status": {"allocation": None}},
                                  namespace=NS, subresource="status")
    assert "allocation" not in cleared.get("status", {})
    again = await cluster.patch(RESOURCE_CLAIMS, "c1",
                                {"status": {"allocation": allocation("gpu-1")}},
                                namespace=NS, subresource="status")
    assert again["status"]["allocation"] == allocation("gpu-1")


async def test_pod_scheduling_gates_may_only_be_removed(cluster: Cluster) -> None:
    await cluster.create(PODS, pod("p1", gates=["dra-gateway.io/allocation", "b"]),
                         namespace=NS)
    with pytest.raises(Invalid) as caught:
        await cluster.patch(PODS, "p1", {"spec": {"schedulingGates": [{"name": "x"}]}},
                            namespace=NS)
    assert caught.value.message == (
        'Pod "p1" is invalid: spec.schedulingGates[0].name: Forbidden: only deletion is '
        "allowed, but found new scheduling gate 'x'")
    ungated = await cluster.patch(PODS, "p1", [{"op": "remove", "path": "/spec/schedulingGates/0"}],
                                  namespace=NS, patch_type="json")
    assert ungated["spec"]["schedulingGates"] == [{"name": "b"}]


async def test_pod_resource_claims_are_immutable(cluster: Cluster) -> None:
    await cluster.create(PODS, pod("p1", claims=["gpu"]), namespace=NS)
    with pytest.raises(Invalid, match=re.escape("spec.resourceClaims: Invalid value")):
        await cluster.patch(PODS, "p1", {"spec": {"resourceClaims": []}}, namespace=NS)


async def test_a_pod_starts_pending_and_its_status_moves_through_the_subresource(
        cluster: Cluster) -> None:
    sent = pod("p1")
    sent["status"] = {"phase": "Running"}
    made = await cluster.create(PODS, sent, namespace=NS)
    assert made["status"] == {"phase": "Pending"}
    running = await cluster.patch(PODS, "p1", {"status": {"phase": "Running"}}, namespace=NS,
                                  subresource="status")
    assert running["status"]["phase"] == "Running"
    kubernetes_validate.validate(running, "1.34", strict=True)


async def test_an_unknown_subresource_is_not_found(cluster: Cluster) -> None:
    await cluster.create(CONFIG_MAPS, {"metadata": {"name": "cm", "namespace": NS}})
    with pytest.raises(NotFound):
        await cluster.patch(CONFIG_MAPS, "cm", {"data": {}}, namespace=NS,
                            subresource="status")


# Watches ---------------------------------------------------------------------------------------

async def test_watch_from_a_resource_version_replays_then_follows_in_order(
        cluster: Cluster) -> None:
    await cluster.create(RESOURCE_CLAIMS, claim("before"), namespace=NS)
    start = (await cluster.list(RESOURCE_CLAIMS, namespace=NS)).resource_version
    await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS)
    await cluster.patch(RESOURCE_CLAIMS, "c1", {"metadata": {"labels": {"a": "1"}}},
                        namespace=NS)
    async with contextlib.aclosing(cluster.watch(RESOURCE_CLAIMS, namespace=NS,
                                                 resource_version=start)) as events:
        assert await take(events, 2) == [("ADDED", "c1"), ("MODIFIED", "c1")]
        await cluster.create(RESOURCE_CLAIMS, claim("c2"), namespace=NS)
        await cluster.delete(RESOURCE_CLAIMS, "c1", namespace=NS)
        assert await take(events, 2) == [("ADDED", "c2"), ("DELETED", "c1")]


async def test_watch_without_a_resource_version_starts_with_the_current_objects(
        cluster: Cluster) -> None:
    await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS)
    await cluster.create(RESOURCE_CLAIMS, claim("c2"), namespace=NS)
    async with contextlib.aclosing(cluster.watch(RESOURCE_CLAIMS, namespace=NS)) as events:
        assert await take(events, 2) == [("ADDED", "c1"), ("ADDED", "c2")]


async def test_watch_versions_are_increasing_and_resumable(cluster: Cluster) -> None:
    start = (await cluster.list(RESOURCE_CLAIMS)).resource_version
    for i in range(5):
        await cluster.create(RESOURCE_CLAIMS, claim(f"c{i}"), namespace=NS)
    async with contextlib.aclosing(cluster.watch(RESOURCE_CLAIMS,
                                                 resource_version=start)) as events:
        async with asyncio.timeout(5):
            seen = [await anext(events) for _ in range(3)]
    resume = seen[-1].object["metadata"]["resourceVersion"]
    versions = [int(e.object["metadata"]["resourceVersion"]) for e in seen]
    assert versions == sorted(versions)
    async with contextlib.aclosing(cluster.watch(RESOURCE_CLAIMS,
                                                 resource_version=resume)) as events:
        assert await take(events, 2) == [("ADDED", "c3"), ("ADDED", "c4")]


async def test_watch_filters_by_selector_and_reports_objects_leaving_as_deleted(
        cluster: Cluster) -> None:
    start = (await cluster.list(RESOURCE_CLAIMS)).resource_version
    async with contextlib.aclosing(cluster.watch(RESOURCE_CLAIMS, namespace=NS,
                                                 resource_version=start,
                                                 label_selector="tier=gold")) as events:
        await cluster.create(RESOURCE_CLAIMS, claim("silver", tier="silver"), namespace=NS)
        await cluster.create(RESOURCE_CLAIMS, claim("gold", tier="gold"), namespace=NS)
        await cluster.patch(RESOURCE_CLAIMS, "gold", {"metadata": {"labels": {"tier": "x"}}},
                            namespace=NS)
        await cluster.patch(RESOURCE_CLAIMS, "silver",
                            {"metadata": {"labels": {"tier": "gold"}}}, namespace=NS)
        assert await take(events, 3) == [("ADDED", "gold"), ("DELETED", "gold"),
                                         ("ADDED", "silver")]


async def test_watch_filters_by_field_selector(cluster: Cluster) -> None:
    start = (await cluster.list(RESOURCE_SLICES)).resource_version
    async with contextlib.aclosing(cluster.watch(RESOURCE_SLICES, resource_version=start,
                                                 field_selector="spec.nodeName=node-b")) as ev:
        await cluster.create(RESOURCE_SLICES, slice_("s1", "node-a"))
        await cluster.create(RESOURCE_SLICES, slice_("s2", "node-b"))
        assert await take(ev, 1) == [("ADDED", "s2")]


async def test_watch_from_a_compacted_version_is_expired_and_a_relist_recovers(
        backend: Backend) -> None:
    cluster = backend.cluster
    start = (await cluster.list(RESOURCE_CLAIMS)).resource_version
    for i in range(25):  # the backends keep 20 events per type
        await cluster.create(RESOURCE_CLAIMS, claim(f"c{i:02}"), namespace=NS)
    with pytest.raises(Expired) as caught:
        async with contextlib.aclosing(cluster.watch(RESOURCE_CLAIMS,
                                                     resource_version=start)) as events:
            await take(events, 1)
    assert caught.value.code == 410
    assert "too old resource version" in caught.value.message
    relisted = await cluster.list(RESOURCE_CLAIMS)
    assert len(relisted.items) == 25
    async with contextlib.aclosing(cluster.watch(
            RESOURCE_CLAIMS, resource_version=relisted.resource_version)) as events:
        await cluster.create(RESOURCE_CLAIMS, claim("after"), namespace=NS)
        assert await take(events, 1) == [("ADDED", "after")]


async def test_expiring_watches_ends_open_watches_with_410(backend: Backend) -> None:
    cluster = backend.cluster
    start = (await cluster.list(RESOURCE_CLAIMS)).resource_version
    async with contextlib.aclosing(cluster.watch(RESOURCE_CLAIMS,
                                                 resource_version=start)) as events:
        await cluster.create(RESOURCE_CLAIMS, claim("c1"), namespace=NS)
        assert await take(events, 1) == [("ADDED", "c1")]
        backend.memory.expire_watches()
        with pytest.raises(Expired):
            await take(events, 1)
    with pytest.raises(Expired):
        async with contextlib.aclosing(cluster.watch(RESOURCE_CLAIMS,
                                                     resource_version=start)) as events:
            await take(events, 1)


async def test_a_watch_ends_after_its_timeout(cluster: Cluster) -> None:
    start = (await cluster.list(RESOURCE_CLAIMS)).resource_version
    seen = []
    async with asyncio.timeout(10):
        async for event in cluster.watch(RESOURCE_CLAIMS, resource_version=start,
                                         timeout_seconds=1):
            seen.append(event)
    assert seen == []


async def test_errors_carry_a_kubernetes_status(cluster: Cluster) -> None:
    with pytest.raises(ApiError) as caught:
        await cluster.get(RESOURCE_CLAIMS, "nope", namespace=NS)
    status = caught.value.status
    assert status["kind"] == "Status"
    assert status["code"] == 404
    assert status["reason"] == "NotFound"
    assert status["details"]["name"] == "nope"


async def test_strategic_patch_directives_delete_list_items(cluster: Cluster) -> None:
    made = pod("p1", gates=["dra-gateway.io/allocation", "other.io/gate"])
    made["metadata"]["finalizers"] = ["a.io/x", "b.io/y"]
    await cluster.create(PODS, made, namespace=NS)
    patched = await cluster.patch(PODS, "p1", {
        "metadata": {"$deleteFromPrimitiveList/finalizers": ["a.io/x"]},
        "spec": {"schedulingGates": [{"name": "dra-gateway.io/allocation",
                                      "$patch": "delete"}]},
    }, namespace=NS, patch_type="strategic")
    assert patched["metadata"]["finalizers"] == ["b.io/y"]
    assert patched["spec"]["schedulingGates"] == [{"name": "other.io/gate"}]
    assert patched["spec"]["containers"] == [{"name": "main", "image": "busybox"}]


async def test_slices_owned_by_a_deleted_node_are_garbage_collected(cluster: Cluster) -> None:
    node = await cluster.create(NODES, {"metadata": {"name": "node-a"}})
    owned = slice_("node-a-gpu", "node-a")
    owned["metadata"]["ownerReferences"] = [{
        "apiVersion": "v1", "kind": "Node", "name": "node-a", "uid": node["metadata"]["uid"],
        "controller": True}]
    await cluster.create(RESOURCE_SLICES, owned)
    await cluster.create(RESOURCE_SLICES, slice_("node-b-gpu", "node-b"))
    await cluster.delete(NODES, "node-a")
    assert names((await cluster.list(RESOURCE_SLICES)).items) == ["node-b-gpu"]


async def test_a_deleting_claim_takes_no_new_reservations(cluster: Cluster) -> None:
    made = claim("c1")
    made["metadata"]["finalizers"] = ["dra-gateway.io/allocation"]
    await cluster.create(RESOURCE_CLAIMS, made, namespace=NS)
    first = {"resource": "pods", "name": "p1", "uid": "uid-1"}
    await cluster.patch(RESOURCE_CLAIMS, "c1", {"status": {
        "allocation": allocation("gpu-0"), "reservedFor": [first]}},
        namespace=NS, subresource="status")
    await cluster.delete(RESOURCE_CLAIMS, "c1", namespace=NS)
    second = {"resource": "pods", "name": "p2", "uid": "uid-2"}
    with pytest.raises(Invalid, match="new entries may not be added"):
        await cluster.patch(RESOURCE_CLAIMS, "c1", {"status": {"reservedFor": [first, second]}},
                            namespace=NS, subresource="status")
    released = await cluster.patch(RESOURCE_CLAIMS, "c1", {"status": {"reservedFor": None}},
                                   namespace=NS, subresource="status")
    assert "reservedFor" not in released["status"]

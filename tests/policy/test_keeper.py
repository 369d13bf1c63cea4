"""The catalog a mirror keeps, one change at a time, is the one a full build makes."""

from __future__ import annotations

import copy
from typing import Any

from dra_gateway.kube.resources import GPU_QUOTAS, GPU_SHARING_POLICIES, NAMESPACES
from dra_gateway.policy.amounts import Amounts
from dra_gateway.policy.catalog import Catalog
from dra_gateway.policy.keeper import CatalogKeeper

from .conftest import quota, sharing

GI = 1024**3


def namespace(name: str, **labels: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


def with_used(document: dict[str, Any], memory: str) -> dict[str, Any]:
    return {**copy.deepcopy(document), "status": {"used": {"memory": memory}}}


def shape(catalog: Catalog) -> tuple[Any, ...]:
    return ([(s.quota.key, s.used) for s in catalog.quotas], catalog.sharing,
            dict(catalog.namespace_labels), sorted(catalog.errors),
            catalog.sharing_for("prod").exclusive, catalog.sharing_for("dev").exclusive)


def test_changes_taken_in_one_by_one_make_the_catalog_a_full_build_makes() -> None:
    keeper = CatalogKeeper(usage=True)
    prod, dev = namespace("prod", tier="prod"), namespace("dev", tier="dev")
    policy = sharing(selector={"matchLabels": {"tier": "prod"}}, exclusive=True)
    assert keeper.replace(NAMESPACES, [prod, dev])
    assert keeper.replace(GPU_SHARING_POLICIES, [policy])
    assert keeper.replace(GPU_QUOTAS, [quota(memory="80Gi"), quota("broken", memory="1 Gi")])
    assert keeper.change(GPU_QUOTAS, "added", quota("b", "dev", memory="40Gi"))
    moved = namespace("dev", tier="prod")
    assert keeper.change(NAMESPACES, "modified", moved, dev)
    assert keeper.change(GPU_QUOTAS, "deleted", quota("broken"))
    assert shape(keeper.catalog) == shape(Catalog.build(
        quotas=[quota(memory="80Gi"), quota("b", "dev", memory="40Gi")], sharing=[policy],
        namespaces=[prod, moved]))


def test_only_what_the_catalog_reads_is_a_change() -> None:
    keeper = CatalogKeeper(usage=False)
    document = quota(memory="80Gi")
    assert keeper.replace(GPU_QUOTAS, [document])
    before = keeper.catalog
    # The allocator's own status writes and a namespace's other metadata change nothing.
    assert not keeper.change(GPU_QUOTAS, "modified", with_used(document, "10Gi"), document)
    assert keeper.replace(NAMESPACES, [namespace("team-a", tier="a")])
    annotated = namespace("team-a", tier="a")
    annotated["metadata"]["annotations"] = {"note": "x"}
    assert not keeper.change(NAMESPACES, "modified", annotated)
    assert not keeper.replace(NAMESPACES, [annotated])
    assert not keeper.change(GPU_QUOTAS, "deleted", quota("never-seen"))
    assert keeper.catalog.quotas == before.quotas


def test_with_usage_a_status_write_updates_the_quota_and_keeps_its_compiled_form() -> None:
    keeper = CatalogKeeper(usage=True)
    document = quota(memory="80Gi")
    assert keeper.replace(GPU_QUOTAS, [document])
    (before,) = keeper.catalog.quotas_for("team-a")
    assert keeper.change(GPU_QUOTAS, "modified", with_used(document, "10Gi"), document)
    (after,) = keeper.catalog.quotas_for("team-a")
    assert after.used == Amounts(memory=10 * GI)
    assert after.quota is before.quota

"""Informers mirror the API in order and recover from expired watches by relisting."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from testkit import eventually

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube.cluster.port import Forbidden, NotFound
from dra_gateway.kube.resources import NODES, PODS
from dra_gateway.kube.runtime.informer import Change, Informer


def node(name: str, **labels: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[Change, str, str | None]] = []
        self.changed = asyncio.Event()

    def __call__(self, change: Change, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        labels = obj["metadata"].get("labels") or {}
        self.events.append((change, obj["metadata"]["name"], labels.get("v")))
        self.changed.set()

    async def wait_for(self, count: int) -> None:
        async with asyncio.timeout(5):
            while len(self.events) < count:
                self.changed.clear()
                await self.changed.wait()


@contextlib.asynccontextmanager
async def running(informer: Informer) -> AsyncIterator[Informer]:
    task = asyncio.create_task(informer.run())
    try:
        async with asyncio.timeout(5):
            await informer.synced.wait()
        yield informer
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_first_list_then_every_change_reaches_the_handler_in_order() -> None:
    cluster = MemoryCluster()
    await cluster.create(NODES, node("a", v="1"))
    seen = Recorder()
    async with running(Informer(cluster, NODES, seen)) as informer:
        assert seen.events == [("added", "a", "1")]
        await cluster.create(NODES, node("b", v="1"))
        await cluster.patch(NODES, "a", {"metadata": {"labels": {"v": "2"}}})
        await cluster.delete(NODES, "b")
        await seen.wait_for(4)
        assert seen.events[1:] == [("added", "b", "1"), ("modified", "a", "2"),
                                   ("deleted", "b", "1")]
        assert set(informer.store) == {("", "a")}
    assert cluster.open_watches == 0


async def test_an_expired_watch_relists_and_reports_what_it_missed() -> None:
    cluster = MemoryCluster()
    await cluster.create(NODES, node("a", v="1"))
    await cluster.create(NODES, node("b", v="1"))
    seen = Recorder()
    async with running(Informer(cluster, NODES, seen, min_backoff=0.01)) as informer:
        # Changes made while the watch is being expired must not be lost.
        cluster.expire_watches()
        await cluster.delete(NODES, "b")
        await cluster.patch(NODES, "a", {"metadata": {"labels": {"v": "2"}}})
        await cluster.create(NODES, node("c", v="1"))
        await seen.wait_for(5)
        assert informer.relists == 2
        assert sorted(seen.events[2:]) == [("added", "c", "1"), ("deleted", "b", "1"),
                                           ("modified", "a", "2")]
        assert set(informer.store) == {("", "a"), ("", "c")}


async def test_objects_leaving_the_field_selector_are_reported_deleted() -> None:
    cluster = MemoryCluster()
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": "p", "namespace": "ns"},
           "spec": {"containers": [{"name": "c", "image": "i"}]}}
    await cluster.create(PODS, pod, namespace="ns")
    seen = Recorder()
    informer = Informer(cluster, PODS, seen,
                        field_selector="status.phase!=Succeeded,status.phase!=Failed")
    async with running(informer):
        await cluster.patch(PODS, "p", {"status": {"phase": "Succeeded"}}, namespace="ns",
                            subresource="status")
        await seen.wait_for(2)
        assert [e[0] for e in seen.events] == ["added", "deleted"]
        assert informer.get("ns", "p") is None


async def test_a_write_of_our_own_is_applied_without_moving_the_watch_position() -> None:
    cluster = MemoryCluster()
    await cluster.create(NODES, node("a", v="1"))
    seen = Recorder()
    async with running(Informer(cluster, NODES, seen)) as informer:
        position = informer.resource_version
        written = await cluster.patch(NODES, "a", {"metadata": {"labels": {"v": "2"}}})
        informer.observe_write(written)
        assert informer.get(None, "a") == written
        assert informer.resource_version == position
        await seen.wait_for(3)  # the watch still delivers it: handlers must be idempotent
        assert seen.events[1:] == [("modified", "a", "2"), ("modified", "a", "2")]


@pytest.mark.parametrize("selector", ["spec.nodeName=n1"])
async def test_selectors_are_passed_to_list_and_watch(selector: str) -> None:
    cluster = MemoryCluster()
    for name, node_name in (("on-n1", "n1"), ("on-n2", "n2")):
        await cluster.create(PODS, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"},
            "spec": {"nodeName": node_name, "containers": [{"name": "c", "image": "i"}]}},
            namespace="ns")
    seen = Recorder()
    async with running(Informer(cluster, PODS, seen, field_selector=selector)) as informer:
        assert [key[1] for key in informer.store] == ["on-n1"]


async def test_the_watch_catching_up_with_two_writes_of_ours_never_rolls_the_store_back() -> None:
    cluster = MemoryCluster()
    await cluster.create(NODES, node("a", v="1"))
    seen = Recorder()
    async with running(Informer(cluster, NODES, seen)) as informer:
        first = await cluster.patch(NODES, "a", {"metadata": {"labels": {"v": "2"}}})
        second = await cluster.patch(NODES, "a", {"metadata": {"labels": {"v": "3"}}})
        informer.observe_write(first)
        informer.observe_write(second)
        labels: list[str] = []
        for _ in range(20):  # every step of the watch catching up
            labels.append(informer.get(None, "a")["metadata"]["labels"]["v"])
            await asyncio.sleep(0)
        assert set(labels) == {"3"}
        assert [e[2] for e in seen.events[1:]] == ["2", "3", "3"]
        # Once caught up, later changes flow again; so they do after a write that changed
        # nothing (no event follows it).
        informer.observe_write(await cluster.get(NODES, "a"))
        await cluster.patch(NODES, "a", {"metadata": {"labels": {"v": "4"}}})
        await seen.wait_for(5)
        assert informer.get(None, "a")["metadata"]["labels"]["v"] == "4"


async def test_handlers_of_a_relist_see_the_whole_new_list_in_the_store() -> None:
    cluster = MemoryCluster()
    for name in ("a", "b", "c"):
        await cluster.create(NODES, node(name, v="1"))
    seen: list[tuple[Change, str, set[str]]] = []
    informer: Informer

    def handler(change: Change, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        seen.append((change, obj["metadata"]["name"], {k[1] for k in informer.store}))

    informer = Informer(cluster, NODES, handler, min_backoff=0.01)
    async with running(informer):
        # While disconnected: one goes, one changes; "c" (unchanged) must be visible throughout.
        cluster.expire_watches()
        await cluster.delete(NODES, "b")
        await cluster.patch(NODES, "a", {"metadata": {"labels": {"v": "2"}}})
        await eventually(lambda: informer.relists >= 2)
        relist = [entry for entry in seen[3:] if entry[1] in ("a", "b")][:2]
        assert sorted(relist) == [("deleted", "b", {"a", "c"}), ("modified", "a", {"a", "c"})]


async def test_a_watch_that_closes_at_once_is_retried_with_backoff_not_in_a_loop() -> None:
    class ClosesWatches(MemoryCluster):
        """Accepts every watch and ends it at once, without an event (a proxy shedding load)."""

        watches = 0

        async def _closed(self) -> AsyncIterator[Any]:
            self.watches += 1
            return
            yield

        def watch(self, rt: Any, **kwargs: Any) -> AsyncIterator[Any]:
            return self._closed()

    cluster = ClosesWatches()
    await cluster.create(NODES, node("a", v="1"))
    seen = Recorder()
    async with running(Informer(cluster, NODES, seen, min_backoff=0.05, max_backoff=0.2)):
        await asyncio.sleep(0.5)
    assert 1 <= cluster.watches <= 12
    assert seen.events == [("added", "a", "1")]


async def test_a_replacing_informer_hands_over_each_full_list_and_then_the_watch() -> None:
    cluster = MemoryCluster()
    await cluster.create(NODES, node("a", v="1"))
    lists: list[list[str]] = []
    seen = Recorder()
    informer = Informer(cluster, NODES, seen, min_backoff=0.01,
                        replaced=lambda items: lists.append([i["metadata"]["name"] for i in items]))
    async with running(informer):
        assert (lists, seen.events) == ([["a"]], [])
        await cluster.create(NODES, node("b", v="1"))
        await seen.wait_for(1)
        cluster.expire_watches()
        await eventually(lambda: len(lists) == 2)
        await cluster.patch(NODES, "a", {"metadata": {"labels": {"v": "2"}}})
        await seen.wait_for(2)
        assert (lists, seen.events) == ([["a"], ["a", "b"]], [("added", "b", "1"),
                                                              ("modified", "a", "2")])


async def test_coroutine_callbacks_are_awaited_in_order_before_the_next_event() -> None:
    cluster = MemoryCluster()
    log: list[str] = []

    async def handler(change: Change, obj: dict[str, Any], old: dict[str, Any] | None) -> None:
        log.append(f"start {change} {obj['metadata']['name']}")
        await asyncio.sleep(0.01)
        log.append(f"end {change} {obj['metadata']['name']}")

    async with running(Informer(cluster, NODES, handler)):
        await cluster.create(NODES, node("a"))
        await cluster.delete(NODES, "a")
        await eventually(lambda: len(log) == 4)
    assert log == ["start added a", "end added a", "start deleted a", "end deleted a"]


async def test_a_missing_type_is_empty_and_listed_again_or_ends_the_mirror() -> None:
    class Unserved(MemoryCluster):
        lists = 0

        async def list(self, rt: Any, **kwargs: Any) -> Any:
            self.lists += 1
            raise NotFound("the server could not find the requested resource")

    cluster = Unserved()
    missing: list[str] = []
    empty = Informer(cluster, NODES, Recorder(), when_missing="empty", max_backoff=0.02,
                     missing=lambda: missing.append("empty"))
    async with running(empty):
        assert empty.absent
        assert empty.synced.is_set()
        await eventually(lambda: cluster.lists >= 3)
    assert missing == ["empty"]  # once, not at every listing
    stopped = Informer(cluster, NODES, Recorder(), when_missing="stop",
                       missing=lambda: missing.append("stop"))
    async with asyncio.timeout(5):
        await stopped.run()
    assert missing == ["empty", "stop"]


async def test_a_refused_list_is_reported_and_logged_with_the_rbac_fix(
        caplog: pytest.LogCaptureFixture) -> None:
    class Refused(MemoryCluster):
        async def list(self, rt: Any, **kwargs: Any) -> Any:
            raise Forbidden('nodes is forbidden: User "x" cannot list resource "nodes"')

    refusals: list[int] = []
    informer = Informer(Refused(), NODES, Recorder(), min_backoff=0.01,
                        failed=lambda exc: refusals.append(exc.code), rbac_fix="grant list")
    task = asyncio.create_task(informer.run())
    try:
        await eventually(lambda: len(refusals) >= 2)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    (record, *_) = [r for r in caplog.records if "list or watch failed" in r.getMessage()]
    assert (refusals[0], record.fix) == (403, "grant list")  # type: ignore[attr-defined]
    assert not informer.synced.is_set()


async def test_indexes_follow_the_store_through_changes_and_relists() -> None:
    cluster = MemoryCluster()
    await cluster.create(NODES, node("a", v="1"))
    await cluster.create(NODES, node("b", v="1"))
    informer = Informer(cluster, NODES, Recorder(), min_backoff=0.01,
                        indexers={"v": lambda obj: [obj["metadata"]["labels"]["v"]]})

    def names(value: str) -> list[str]:
        return sorted(o["metadata"]["name"] for o in informer.by_index("v", value))

    async with running(informer):
        assert names("1") == ["a", "b"]
        await cluster.patch(NODES, "a", {"metadata": {"labels": {"v": "2"}}})
        await eventually(lambda: names("2") == ["a"])
        assert names("1") == ["b"]
        cluster.expire_watches()
        await cluster.delete(NODES, "b")
        await eventually(lambda: names("1") == [])
        assert names("2") == ["a"]


async def test_an_informer_without_a_store_passes_changes_as_the_watch_names_them() -> None:
    cluster = MemoryCluster()
    await cluster.create(NODES, node("a", v="1"))
    lists: list[int] = []
    seen = Recorder()
    informer = Informer(cluster, NODES, seen, keep=False,
                        replaced=lambda items: lists.append(len(items)))
    async with running(informer):
        await cluster.patch(NODES, "a", {"metadata": {"labels": {"v": "2"}}})
        await cluster.delete(NODES, "a")
        await seen.wait_for(2)
        assert (lists, seen.events, informer.store) == (
            [1], [("modified", "a", "2"), ("deleted", "a", "2")], {})

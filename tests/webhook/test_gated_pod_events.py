"""An Event on pods left gated while no allocator leads (webhook/gatedpods.py decides,
webhook/allocatorwatch.py watches and posts).

The decision is checked on a table of Leases and pods; the watch on the embedded simulator with a
clock the test moves: the Event appears only once the Lease has lacked a holder and the pod has
been gated for the threshold, only while no allocator leads, once per pod and outage however many
replicas post it, and never on a pod without the gate.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient
from testkit import eventually

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.resources import EVENTS, LEASES, PODS
from dra_gateway.webhook.allocatorwatch import GatedPodEvents, default_interval
from dra_gateway.webhook.app import STATE, create_app
from dra_gateway.webhook.gatedpods import (
    REASON,
    GatedPod,
    LeaseRecord,
    due_events,
    event_name,
    event_object,
    gated_pod,
    lease_record,
    span,
    vacancy,
)
from dra_gateway.webhook.metrics import Metrics
from dra_gateway.webhook.settings import WebhookSettings

from .conftest import ClientFactory

NAMESPACE = "dra-gateway"
LEASE = names.ALLOCATOR_LEASE
T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
THRESHOLD = 120.0
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _micro(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _lease(holder: str | None, renewed: float, duration: int = 15) -> dict[str, Any]:
    spec: dict[str, Any] = {"leaseDurationSeconds": duration, "renewTime": _micro(_at(renewed))}
    if holder:
        spec["holderIdentity"] = holder
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": LEASE, "namespace": NAMESPACE}, "spec": spec}


def _record(lease: dict[str, Any] | None, *, seen: float = 0.0,
            previous: LeaseRecord | None = None) -> LeaseRecord:
    return lease_record(lease, namespace=NAMESPACE, name=LEASE, now=_at(seen), previous=previous)


def _pod(name: str, created: float, *, gated: bool = True, uid: str | None = None,
         deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "team-a", "uid": uid or f"uid-{name}",
                            "creationTimestamp": _at(created).strftime("%Y-%m-%dT%H:%M:%SZ")}
    if deleting:
        meta["deletionTimestamp"] = meta["creationTimestamp"]
    spec: dict[str, Any] = {"containers": [{"name": "main", "image": "cuda:12"}]}
    if gated:
        spec["schedulingGates"] = [{"name": "example.com/other"},
                                   {"name": names.SCHEDULING_GATE}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def _gated(name: str, created: float) -> GatedPod:
    found = gated_pod(_pod(name, created))
    assert found is not None
    return found


# The decision ----------------------------------------------------------------------------------

# (case, Lease (None: none exists), when the webhook first saw it so, the pod's creation, now,
#  whether the pod gets an Event)
CASES: list[tuple[str, dict[str, Any] | None, float, float, float, bool]] = [
    ("a leader renewing: never", _lease("allocator-a", 1000), 0, 0, 1005, False),
    ("expired for less than the threshold", _lease("allocator-a", 0), 0, 0, 15 + 119, False),
    ("expired for the threshold", _lease("allocator-a", 0), 0, 0, 15 + 120, True),
    ("expired long ago, pod gated for less", _lease("allocator-a", 0), 0, 500, 600, False),
    ("expired long ago, pod gated for the threshold", _lease("allocator-a", 0), 0, 480, 600,
     True),
    ("released (no holder) for less than the threshold", _lease(None, 0), 0, 0, 119, False),
    ("released (no holder) for the threshold", _lease(None, 0), 0, 0, 120, True),
    ("a longer lease expires later", _lease("allocator-a", 0, duration=60), 0, 0, 179, False),
    ("no Lease, seen missing for less", None, 100, 0, 219, False),
    ("no Lease, seen missing for the threshold", None, 100, 0, 220, True),
]


@pytest.mark.parametrize(("case", "lease", "seen", "created", "now", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_which_pods_get_an_event_now(case: str, lease: dict[str, Any] | None, seen: float,
                                     created: float, now: float, expected: bool) -> None:
    due = due_events(_record(lease, seen=seen), [_gated("train", created)], now=_at(now),
                     threshold_s=THRESHOLD)
    assert [d.pod.name for d in due] == (["train"] if expected else []), case


def test_a_pod_gets_one_event_per_outage() -> None:
    pods = [_gated("a", 0), _gated("b", 0)]
    expired = _record(_lease("allocator-a", 0))
    first = due_events(expired, pods, now=_at(200), threshold_s=THRESHOLD)
    assert [d.pod.name for d in first] == ["a", "b"]
    # The same round again, in this replica or another: the same names.
    again = due_events(expired, pods, now=_at(900), threshold_s=THRESHOLD)
    assert [d.name for d in again] == [d.name for d in first]
    assert due_events(expired, pods, now=_at(900), threshold_s=THRESHOLD,
                      posted={d.name for d in first}) == []
    # A later outage (the Lease renewed, then lost again) is another Event.
    later = _record(_lease("allocator-b", 5000))
    [next_a, _] = due_events(later, pods, now=_at(5200), threshold_s=THRESHOLD)
    assert next_a.name != first[0].name


def test_only_pods_waiting_for_the_allocator_count() -> None:
    assert gated_pod(_pod("plain", 0, gated=False)) is None
    assert gated_pod(_pod("going", 0, deleting=True)) is None
    broken = _pod("new", 0)
    del broken["metadata"]["creationTimestamp"]
    assert gated_pod(broken) is None
    assert gated_pod(_pod("train", 0)) == GatedPod("team-a", "train", "uid-train", T0)


def test_event_names_are_valid_and_differ_by_pod_and_outage() -> None:
    long = _gated("x" * 252 + "-", 0)
    name = event_name(long, "2026-01-01T12:00:00.000000Z")
    assert len(name) <= 253, name
    assert DNS_SUBDOMAIN.match(name), name
    pod = _gated("train", 0)
    assert event_name(pod, "r1") == event_name(pod, "r1")
    assert event_name(pod, "r1") != event_name(pod, "r2")
    other = gated_pod(_pod("train", 0, uid="another"))
    assert other is not None
    assert event_name(other, "r1") != event_name(pod, "r1")  # the pod recreated by its name


def test_the_message_names_the_lease_its_last_holder_how_long_and_what_to_check() -> None:
    renewed = _record(_lease("allocator-7f9c-x2", 0))
    released = _record(_lease(None, 30), seen=31, previous=renewed)
    assert released.last_holder == "allocator-7f9c-x2"  # a release clears holderIdentity
    [due] = due_events(released, [_gated("train", 0)], now=_at(30 + 192), threshold_s=THRESHOLD)
    message = due.message
    assert f"Lease {NAMESPACE}/{LEASE} has had no holder since 2026-01-01T12:00:30Z" in message
    assert "for 3m12s" in message
    assert "last holder was allocator-7f9c-x2" in message
    assert names.SCHEDULING_GATE in message
    assert "allocator Deployment in namespace dra-gateway" in message
    event = event_object(due, now=_at(222), instance="webhook-0")
    assert event["reason"] == REASON == "AllocatorUnavailable"
    assert event["type"] == "Warning"
    assert event["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "namespace": "team-a",
                                       "name": "train", "uid": "uid-train"}
    assert event["metadata"] == {"name": due.name, "namespace": "team-a"}
    expired = due_events(_record(_lease("allocator-a", 0)), [_gated("train", 0)], now=_at(200),
                         threshold_s=THRESHOLD)[0].message
    assert "expired at 2026-01-01T12:00:15Z" in expired
    assert "by allocator-a" in expired
    missing = due_events(_record(None, seen=0), [_gated("train", 0)], now=_at(200),
                         threshold_s=THRESHOLD)[0].message
    assert "does not exist" in missing
    assert "no holder of it was seen" in missing


def test_the_lease_record_keeps_when_it_was_first_seen_so() -> None:
    first = _record(None, seen=10)
    assert _record(None, seen=50, previous=first).observed_at == _at(10)
    created = _record(_lease("allocator-a", 60), seen=60, previous=first)
    assert created.observed_at == _at(60)
    assert vacancy(created, _at(70)) is None
    assert vacancy(created, _at(75)) is not None  # 60 + 15


def test_spans_read_as_durations() -> None:
    assert [span(s) for s in (0, 40, 192, 3600, 3725)] == ["0s", "40s", "3m12s", "1h", "1h2m5s"]
    assert default_interval(120) == 5.0
    assert default_interval(1) == 0.25


# The watch on the simulator --------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = datetime.now(UTC).replace(microsecond=0)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def sim(clock: Clock) -> MemoryCluster:
    return MemoryCluster(clock=clock)


async def _events(cluster: MemoryCluster) -> list[dict[str, Any]]:
    return [e for e in (await cluster.list(EVENTS)).items if e.get("reason") == REASON]


async def _create_pod(cluster: MemoryCluster, name: str, *, gated: bool = True) -> None:
    pod = _pod(name, 0, gated=gated)
    del pod["metadata"]["uid"], pod["metadata"]["creationTimestamp"]
    await cluster.create(PODS, pod, namespace="team-a")


async def _put_lease(cluster: MemoryCluster, clock: Clock, holder: str | None) -> None:
    spec: dict[str, Any] = {"leaseDurationSeconds": 15, "renewTime": _micro(clock.now)}
    if holder:
        spec["holderIdentity"] = holder
    try:
        lease = await cluster.get(LEASES, LEASE, namespace=NAMESPACE)
    except Exception:
        await cluster.create(LEASES, {"metadata": {"name": LEASE, "namespace": NAMESPACE},
                                      "spec": spec}, namespace=NAMESPACE)
        return
    lease["spec"] = spec
    await cluster.update(LEASES, lease, namespace=NAMESPACE)


@pytest.fixture
async def watch(sim: MemoryCluster, clock: Clock) -> AsyncIterator[GatedPodEvents]:
    async with _running(sim, clock) as watcher:
        yield watcher


class _running:
    """A GatedPodEvents running in a task; `instance` names the replica."""

    def __init__(self, cluster: MemoryCluster, clock: Clock, instance: str = "webhook-0") -> None:
        self.watcher = GatedPodEvents(cluster, Metrics(), namespace=NAMESPACE,
                                      threshold=THRESHOLD, retry_delay=0.01, interval=0.01,
                                      instance=instance, clock=clock)
        self.task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> GatedPodEvents:
        self.task = asyncio.create_task(self.watcher.run())
        await eventually(lambda: self.watcher.lease is not None)
        return self.watcher

    async def __aexit__(self, *exc: object) -> None:
        assert self.task is not None
        self.task.cancel()
        await asyncio.gather(self.task, return_exceptions=True)


async def _settle() -> None:
    """Let the watch run a few rounds (its interval is 0.01 s)."""
    await asyncio.sleep(0.1)


async def test_the_event_comes_after_the_threshold_once_per_pod_and_never_on_ungated_pods(
        sim: MemoryCluster, clock: Clock) -> None:
    await _put_lease(sim, clock, "allocator-a")
    async with _running(sim, clock) as watch:
        await _create_pod(sim, "train")
        await _create_pod(sim, "web", gated=False)
        await _put_lease(sim, clock, None)  # the allocator released the Lease and stopped
        await eventually(lambda: watch.lease is not None and not watch.lease.holder)
        clock.advance(THRESHOLD - 1)
        await _settle()
        assert await _events(sim) == []
        assert not watch.watching_pods  # no pod is listed before an Event may be due
        clock.advance(1)
        [event] = await eventually(lambda: _events(sim))
        assert event["involvedObject"]["name"] == "train"
        assert "last holder was allocator-a" in event["message"]
        assert "for 2m" in event["message"]
        # A pod created during the outage waits its own threshold.
        await _create_pod(sim, "late")
        clock.advance(THRESHOLD - 1)
        await _settle()
        assert [e["involvedObject"]["name"] for e in await _events(sim)] == ["train"]
        clock.advance(1)
        await eventually(lambda: _names(sim, {"train", "late"}))
        # Once per pod: more rounds, and a second replica posting the same Events, add none.
        async with _running(sim, clock, instance="webhook-1") as second:
            clock.advance(600)
            await eventually(lambda: second._pods_synced)
            await _settle()
        events = await _events(sim)
        assert sorted(e["involvedObject"]["name"] for e in events) == ["late", "train"]
        assert all(e["count"] == 1 and e["reportingInstance"] == "webhook-0" for e in events)
        assert second._metrics.gated_pod_events.labels("exists")._value.get() == 2


async def _names(sim: MemoryCluster, wanted: set[str]) -> bool:
    return {e["involvedObject"]["name"] for e in await _events(sim)} == wanted


async def test_no_event_while_an_allocator_leads_and_none_after_it_returns(
        sim: MemoryCluster, clock: Clock) -> None:
    await _put_lease(sim, clock, "allocator-a")
    async with _running(sim, clock) as watch:
        await _create_pod(sim, "train")
        for _ in range(10):  # renewed every 2 s for 20 minutes (of the test's clock)
            clock.advance(120)
            await _put_lease(sim, clock, "allocator-a")
            await _settle()
        assert await _events(sim) == []
        assert not watch.watching_pods
        # The leader dies without releasing: the Lease expires 15 s after its last renewal.
        clock.advance(15 + THRESHOLD - 1)
        await _settle()
        assert await _events(sim) == []
        clock.advance(1)
        [event] = await eventually(lambda: _events(sim))
        assert "expired at" in event["message"]
        assert "by allocator-a" in event["message"]
        # A leader again: the pods are no longer watched, and nothing more is posted.
        await _put_lease(sim, clock, "allocator-b")
        await eventually(lambda: not watch.watching_pods)
        clock.advance(1000)
        await _put_lease(sim, clock, "allocator-b")
        await _settle()
        assert len(await _events(sim)) == 1


async def test_a_cluster_that_never_had_an_allocator_gets_events_too(
        sim: MemoryCluster, clock: Clock, watch: GatedPodEvents) -> None:
    assert watch.lease is not None
    assert not watch.lease.exists
    await _create_pod(sim, "train")
    clock.advance(THRESHOLD)
    [event] = await eventually(lambda: _events(sim))
    assert "does not exist" in event["message"]


async def test_the_webhook_runs_the_watch_with_its_threshold_and_not_with_0(
        aiohttp_client: ClientFactory, sim: MemoryCluster) -> None:
    off = await aiohttp_client(create_app(WebhookSettings(gated_event_after=0,
                                                          watch_config_maps=False), sim))
    assert off.app[STATE].gated_events is None
    client: TestClient[web.Request, web.Application] = await aiohttp_client(create_app(
        WebhookSettings(gated_event_after=0.3, watch_config_maps=False,
                        watch_retry_delay=0.01), MemoryCluster()))
    cluster = client.app[STATE].cluster
    assert isinstance(cluster, MemoryCluster)
    await _create_pod(cluster, "train")
    [event] = await eventually(lambda: _events(cluster), within=10)
    assert event["involvedObject"]["name"] == "train"
    metrics = (await (await client.get("/metrics")).text())
    assert 'dra_gateway_webhook_allocator_unavailable_events_total{result="created"} 1.0' \
        in metrics

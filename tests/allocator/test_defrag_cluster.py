"""Defrag on a cluster's objects: who waits, who may move, the holds, and carrying a plan out
(on the simulator; the real control-plane tier runs it with the Eviction API and PDBs)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from dra_gateway.allocator.eviction import holds as holdfmt
from dra_gateway.allocator.eviction.inputs import Snapshot, build
from dra_gateway.allocator.eviction.moves import Applier, Pace, drop_unserved, unserved
from dra_gateway.allocator.eviction.store import read_snapshot, write_records
from dra_gateway.allocator.planner import PodPlan, plan_pod
from dra_gateway.allocator.planner.defrag import Limits, plan_defrag
from dra_gateway.allocator.planner.leaving import why_fixed
from dra_gateway.cli import main
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.resources import CONFIG_MAPS, EVENTS, PODS, RESOURCE_CLAIMS

from .planner_support import claim, cluster, device_class, gpu, node, pod, resource_slice

NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
NS = "ns"


def _owned(p: dict[str, Any], kind: str = "ReplicaSet", name: str = "rs") -> dict[str, Any]:
    p["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": kind, "name": name,
                                         "uid": f"uid-{name}", "controller": True}]
    p["metadata"]["creationTimestamp"] = "2026-12-02T08:00:00Z"
    p["metadata"]["labels"] = {"app": name}
    return p


def _objects(*, shares: int = 8) -> list[dict[str, Any]]:
    """n1: eight cards, one 4 GiB share on each (ReplicaSet pods, bound); n2: one free card;
    a gated pod asking for two whole cards."""
    state = cluster({"n1": [gpu(i) for i in range(8)]}, strategy="spread")
    objs: list[dict[str, Any]] = [device_class(names.GPU_CLASS, "gpu"),
                                  device_class(names.MIG_CLASS, "mig"),
                                  node("n1"), node("n2"),
                                  resource_slice("n1", [gpu(i) for i in range(8)]),
                                  resource_slice("n2", [gpu(0)])]
    for i in range(shares):
        c = claim(f"c{i}", capacity={"memory": "4Gi", "cores": "10"})
        p = _owned(pod(f"s{i}", node_name="n1"))
        p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"c{i}"}]
        plan: PodPlan = plan_pod(state, {**p, "spec": {**p["spec"], "nodeName": None}}, [c])
        state.assume(p, plan)
        c["status"] = {"allocation": plan.allocations[c["metadata"]["uid"]]}
        objs += [p, c]
    big = pod("big", schedulingGates=[{"name": names.SCHEDULING_GATE}],
              resourceClaims=[{"name": "gpu", "resourceClaimName": "big-c"}])
    big["metadata"]["creationTimestamp"] = "2026-12-02T08:30:00Z"
    objs += [big, claim("big-c", count=2)]
    return objs


async def _served(objs: list[dict[str, Any]]) -> MemoryCluster:
    sim = MemoryCluster()
    for obj in objs:
        status = obj.get("status") if obj["kind"] == "ResourceClaim" else None
        created = (await sim.load([{k: v for k, v in obj.items() if k != "status"}
                                   if status else obj], default_namespace=NS))[0]
        if status:
            await sim.update(RESOURCE_CLAIMS, {**created, "status": status}, namespace=NS,
                             subresource="status")
    return sim


def test_who_may_move() -> None:
    records = holdfmt.Records()
    assert why_fixed(_owned(pod("a")), records.moved, NOW, 3600) is None
    assert why_fixed(_owned(pod("b"), "StatefulSet"), records.moved, NOW, 3600) is None
    assert "bare pod" in str(why_fixed(pod("c"), records.moved, NOW, 3600))
    assert "DaemonSet" in str(why_fixed(_owned(pod("d"), "DaemonSet"), records.moved, NOW, 3600))
    never = _owned(pod("e"))
    never["metadata"]["annotations"] = {names.ANNOTATION_DEFRAG: "never"}
    assert "never" in str(why_fixed(never, records.moved, NOW, 3600))
    custom = _owned(pod("f"), "RayCluster", "ray")
    assert "dra-gateway.io/defrag: allow" in str(why_fixed(custom, records.moved, NOW, 3600))
    custom["metadata"]["annotations"] = {names.ANNOTATION_DEFRAG: "allow"}
    assert why_fixed(custom, records.moved, NOW, 3600) is None
    # Moved ten minutes ago: neither it nor what its ReplicaSet made since moves again.
    moved = holdfmt.Moved("uid-a", "ns/a", "uid-rs", NOW - timedelta(minutes=10), "ns/big")
    records = holdfmt.Records(moved=[moved])
    assert "moved at" in str(why_fixed(_owned(pod("a")), records.moved, NOW, 3600))
    after = _owned(pod("g"))
    after["metadata"]["creationTimestamp"] = "2026-12-02T08:55:00Z"
    assert "after it lost a pod" in str(why_fixed(after, records.moved, NOW, 3600))
    assert why_fixed(after, records.moved, NOW, 300) is None  # the window has passed


def test_the_view_finds_the_waiting_pod_the_movable_pods_and_their_budgets() -> None:
    objs = _objects()
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": "keep", "namespace": NS},
           "spec": {"selector": {"matchLabels": {"app": "rs"}}, "maxUnavailable": 1},
           "status": {"disruptionsAllowed": 1}}
    inputs = build(Snapshot(now=NOW, nodes=[o for o in objs if o["kind"] == "Node"],
                            slices=[o for o in objs if o["kind"] == "ResourceSlice"],
                            classes=[o for o in objs if o["kind"] == "DeviceClass"],
                            pods=[o for o in objs if o["kind"] == "Pod"],
                            claims=[o for o in objs if o["kind"] == "ResourceClaim"],
                            budgets=[pdb]))
    assert [w.pod["metadata"]["name"] for w in inputs.waiters] == ["big"]
    assert len(inputs.residents) == 8
    assert all(r.fixed is None and r.budgets == ("ns/keep",) for r in inputs.residents)
    assert inputs.budgets == {"ns/keep": 1}
    # One disruption allowed: the second move the pod needs is not allowed.
    plan = plan_defrag(inputs.state, inputs.waiters, inputs.residents,
                       Limits(budgets=inputs.budgets))
    assert plan.helped == []


def test_a_live_hold_is_taken_and_its_pod_no_longer_waits() -> None:
    objs = _objects()
    hold = holdfmt.Hold("uid-big", "ns/big", "n2", {
        "uid-big-c": {"devices": {"results": [{"request": "main", "driver": names.DRIVER,
                                               "pool": "n2", "device": "gpu-0"}]},
                      "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{
                          "key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}}},
        NOW + timedelta(minutes=5))
    config_map = {"data": {hold.key: hold.value()}}
    inputs = build(Snapshot(now=NOW, nodes=[o for o in objs if o["kind"] == "Node"],
                            slices=[o for o in objs if o["kind"] == "ResourceSlice"],
                            classes=[o for o in objs if o["kind"] == "DeviceClass"],
                            pods=[o for o in objs if o["kind"] == "Pod"],
                            claims=[o for o in objs if o["kind"] == "ResourceClaim"],
                            records=holdfmt.read(config_map)))
    assert inputs.waiters == []
    assert inputs.state.device_usage((names.DRIVER, "n2", "gpu-0")).holders == 1
    expired = build(Snapshot(now=NOW + timedelta(minutes=6),
                             nodes=[o for o in objs if o["kind"] == "Node"],
                             pods=[o for o in objs if o["kind"] == "Pod"],
                             claims=[o for o in objs if o["kind"] == "ResourceClaim"],
                             records=holdfmt.read(config_map)))
    assert [w.pod["metadata"]["name"] for w in expired.waiters] == ["big"]


def test_records_that_cannot_be_read_are_named_and_ignored() -> None:
    records = holdfmt.read({"data": {"hold.x": "{", "moved.y": json.dumps({"pod": "a"}),
                                     "other": "{}"}})
    assert records.holds == {}
    assert records.moved == []
    assert len(records.problems) == 3
    assert all("ConfigMap dra-gateway-defrag: data[" in p for p in records.problems)


async def test_apply_holds_first_then_evicts_and_records_events() -> None:
    sim = await _served(_objects())
    snapshot = await read_snapshot(sim, namespace="dra-gateway", now=NOW)
    inputs = build(snapshot)
    plan = plan_defrag(inputs.state, inputs.waiters, inputs.residents)
    assert len(plan.moves) == 2
    applier = Applier(sim, namespace="dra-gateway", clock=lambda: NOW,
                      pace=Pace(wait_seconds=0.2, poll_seconds=0.05))
    report = await applier.carry_out(plan, inputs.pods)
    assert report.stopped is None
    assert report.evicted == 2
    left = {p["metadata"]["name"] for p in (await sim.list(PODS, namespace=NS)).items}
    assert left == {"big"} | {f"s{i}" for i in range(8)} - {m.pod[3:] for m in plan.moves}
    records = holdfmt.read(await sim.get(CONFIG_MAPS, holdfmt.CONFIG_MAP,
                                         namespace="dra-gateway"))
    assert records.holds[plan.helped[0].uid].node == plan.helped[0].placement.node
    assert sorted(m.pod for m in records.moved) == sorted(m.pod for m in plan.moves)
    reasons = sorted(e["reason"] for e in (await sim.list(EVENTS, namespace=NS)).items)
    assert reasons == ["DefragMoved", "DefragMoved", "DefragRoomMade"]
    assert report.outcomes[0].placed.startswith("not placed within")  # no allocator here
    # Nor a ReplicaSet controller: the moved pods are not replaced, and the report says so
    # (`defrag apply` exits 3: the moves were made, what they were for is not done).
    assert report.outcomes[0].is_placed is False
    assert [m.replaced for m in report.outcomes[0].moves] == [False, False]
    assert all(m.replacement == "not replaced within 0.2s: its controller made no new pod "
               "(scaled down, paused or gone?)" for m in report.outcomes[0].moves)
    assert report.incomplete
    # A second plan sees the hold: the pod no longer waits, and nothing moves twice.
    again = build(await read_snapshot(sim, namespace="dra-gateway", now=NOW))
    assert again.waiters == []


class _Refusing(MemoryCluster):
    async def evict(self, name: str, *, namespace: str, uid: str | None = None) -> None:
        from dra_gateway.kube.cluster.port import TooManyRequests

        raise TooManyRequests("Cannot evict pod as it would violate the pod's disruption "
                              "budget.")


async def test_an_eviction_refused_by_a_budget_stops_the_plan_and_says_so() -> None:
    objs = _objects()
    sim = _Refusing()
    for obj in objs:
        status = obj.get("status") if obj["kind"] == "ResourceClaim" else None
        created = (await sim.load([{k: v for k, v in obj.items() if k != "status"}
                                   if status else obj], default_namespace=NS))[0]
        if status:
            await sim.update(RESOURCE_CLAIMS, {**created, "status": status}, namespace=NS,
                             subresource="status")
    inputs = build(await read_snapshot(sim, namespace="dra-gateway", now=NOW))
    plan = plan_defrag(inputs.state, inputs.waiters, inputs.residents)
    report = await Applier(sim, namespace="dra-gateway", clock=lambda: NOW,
                           pace=Pace(in_flight=1, wait_seconds=0.1,
                                     poll_seconds=0.05)).carry_out(plan, inputs.pods)
    assert report.stopped is not None
    assert "disruption budget" in report.stopped
    results = [m.result for m in report.outcomes[0].moves]
    assert results[0].startswith("refused")
    assert results[1] == "not started"


class _Killed(Exception):
    """The process carrying a plan out stops (killed) as it calls the Eviction API."""


async def test_a_hold_whose_moves_never_came_is_dropped_and_its_pod_helped_again() -> None:
    sim = await _served(_objects())
    inputs = build(await read_snapshot(sim, namespace="dra-gateway", now=NOW))
    plan = plan_defrag(inputs.state, inputs.waiters, inputs.residents)

    async def killed(name: str, *, namespace: str, uid: str | None = None) -> None:
        raise _Killed

    real_evict, sim.evict = sim.evict, killed  # type: ignore[method-assign]
    with pytest.raises(_Killed):
        await Applier(sim, namespace="dra-gateway", clock=lambda: NOW,
                      pace=Pace(wait_seconds=0.1, poll_seconds=0.05)).carry_out(
                          plan, inputs.pods)
    sim.evict = real_evict  # type: ignore[method-assign]
    # Its hold and records stay: the pod no longer waits, and the pods named as moved are
    # still there on the devices held.
    stopped = await read_snapshot(sim, namespace="dra-gateway", now=NOW + timedelta(seconds=5))
    assert build(stopped).waiters == []
    assert unserved(stopped) == {}  # too soon to tell from a plan under way
    later = await read_snapshot(sim, namespace="dra-gateway", now=NOW + timedelta(seconds=31))
    assert sorted(unserved(later)) == sorted(
        [f"hold.{plan.helped[0].uid}"] + [f"moved.{m.uid}" for m in plan.moves])
    assert "were never evicted" in unserved(later)[f"hold.{plan.helped[0].uid}"]

    kept = await drop_unserved(sim, "dra-gateway", later)
    assert kept.records.holds == {}
    assert kept.records.moved == []
    again = build(kept)
    assert [w.pod["metadata"]["name"] for w in again.waiters] == ["big"]
    records = holdfmt.read(await sim.get(CONFIG_MAPS, holdfmt.CONFIG_MAP,
                                         namespace="dra-gateway"))
    assert (records.holds, records.moved) == ({}, [])
    # Carried out again, its moves are made this time.
    replan = plan_defrag(again.state, again.waiters, again.residents)
    report = await Applier(sim, namespace="dra-gateway", clock=lambda: NOW,
                           pace=Pace(wait_seconds=0.1, poll_seconds=0.05)).carry_out(
                               replan, again.pods)
    assert report.evicted == 2
    # A hold whose moved pods are gone (or leaving) serves its pod: it stays.
    served = await read_snapshot(sim, namespace="dra-gateway", now=NOW + timedelta(seconds=60))
    assert unserved(served) == {}


def test_the_command_says_what_is_wrong_with_its_flags(capsys: pytest.CaptureFixture[str],
                                                         ) -> None:
    with pytest.raises(SystemExit):
        main(["defrag", "plan", "--window", "soon"])
    assert "'soon' is not a duration" in capsys.readouterr().err





async def test_records_past_their_use_are_dropped_before_new_ones_are_written() -> None:
    sim = await _served(_objects())
    old_hold = holdfmt.Hold("gone", "ns/gone", "n1", {}, NOW - timedelta(minutes=1))
    old_move = holdfmt.Moved("m", "ns/m", None, NOW - timedelta(hours=2), "ns/x")
    fresh_move = holdfmt.Moved("f", "ns/f", None, NOW - timedelta(minutes=2), "ns/x")
    await write_records(sim, "dra-gateway", {r.key: r.value()
                                             for r in (old_hold, old_move, fresh_move)})
    inputs = build(await read_snapshot(sim, namespace="dra-gateway", now=NOW))
    plan = plan_defrag(inputs.state, inputs.waiters, inputs.residents)
    await Applier(sim, namespace="dra-gateway", clock=lambda: NOW,
                  pace=Pace(wait_seconds=0.1, poll_seconds=0.05)).carry_out(plan, inputs.pods)
    data = (await sim.get(CONFIG_MAPS, holdfmt.CONFIG_MAP, namespace="dra-gateway"))["data"]
    assert "hold.gone" not in data
    assert "moved.m" not in data
    assert "moved.f" in data


def test_a_budget_with_no_disruption_left_is_named_and_a_stale_one_allows_none() -> None:
    from dra_gateway.allocator.planner.leaving import disruptions_allowed
    from dra_gateway.defrag import to_dict

    objs = _objects()
    pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
           "metadata": {"name": "keep", "namespace": NS, "generation": 2},
           "spec": {"selector": {"matchLabels": {"app": "rs"}}, "minAvailable": 8},
           "status": {"disruptionsAllowed": 0, "observedGeneration": 2}}
    inputs = build(Snapshot(now=NOW, nodes=[o for o in objs if o["kind"] == "Node"],
                            slices=[o for o in objs if o["kind"] == "ResourceSlice"],
                            classes=[o for o in objs if o["kind"] == "DeviceClass"],
                            pods=[o for o in objs if o["kind"] == "Pod"],
                            claims=[o for o in objs if o["kind"] == "ResourceClaim"],
                            budgets=[pdb]))
    plan = plan_defrag(inputs.state, inputs.waiters, inputs.residents,
                       Limits(budgets=inputs.budgets))
    body = to_dict(plan, inputs)
    assert body["moves"] == 0
    assert body["mayNotMove"] == {
        "its PodDisruptionBudget ns/keep allows no disruption now": 8}
    # A status the disruption controller wrote for an older spec allows nothing.
    stale = {**pdb, "metadata": {**pdb["metadata"], "generation": 3},
             "status": {"disruptionsAllowed": 5, "observedGeneration": 2}}
    assert disruptions_allowed(stale) == 0
    fresh = {**stale, "status": {"disruptionsAllowed": 5, "observedGeneration": 3}}
    assert disruptions_allowed(fresh) == 5

"""Holds in the allocator's planner state (allocator/planning.py, over planner/ledger.py): devices
freed for a pod are held for it, and a hold never costs the cluster what the API shows taken: a
hold read late over a claim already allocated leaves that allocation counted once it is let go,
and a hold whose pod is gone is not taken again at the next look at the records."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from dra_gateway.allocator.eviction.holds import Hold
from dra_gateway.allocator.planner import plan_pod
from dra_gateway.allocator.planning import Planning
from dra_gateway.allocator.settings import ControllerSettings
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import Object

from .planner_support import claim, cluster, device_class, gpu, node, pod, resource_slice

UNTIL = datetime(2030, 1, 1, tzinfo=UTC)


def _allocation(device: str) -> dict[str, Any]:
    return {"devices": {"results": [{"request": "main", "driver": names.DRIVER, "pool": "n1",
                                     "device": device}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{
                "key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}}


def _planning() -> Planning:
    planning = Planning(ControllerSettings(strategy="first-fit"), claims=lambda ns, n: None,
                        consumable_capacity=True)
    planning.set_device_class(device_class(names.GPU_CLASS, "gpu"))
    planning.set_node(node("n1"))
    planning.set_slice(resource_slice("n1", [gpu(0, shared=False)]))
    return planning


def _gated(name: str) -> Object:
    return pod(name, schedulingGates=[{"name": names.SCHEDULING_GATE}])


def _fits(planning: Planning, name: str) -> bool:
    return plan_pod(planning.state, pod(name), [claim(name)]).node_name is not None


def test_forgetting_an_assumption_over_an_allocated_claim_leaves_its_devices_taken() -> None:
    state = cluster({"n1": [gpu(0, shared=False), gpu(1, shared=False)]})
    allocated = claim("c")
    allocated["status"] = {"allocation": _allocation("gpu-0")}
    state.set_claim(allocated)
    # A stale plan (a hold written before the claim was allocated elsewhere on the node).
    stale = Hold("uid-p", "ns/p", "n1", {"uid-c": _allocation("gpu-1")}, UNTIL).plan()
    state.assume(pod("p"), stale)
    state.forget(pod("p"), stale)
    record = state.claims["uid-c"]
    assert not record.assumed
    assert set(record.uses) == {(names.DRIVER, "n1", "gpu-0")}
    assert state.device_usage((names.DRIVER, "n1", "gpu-0")).holders == 1
    assert state.device_usage((names.DRIVER, "n1", "gpu-1")).holders == 0


def test_a_hold_read_late_over_an_allocated_claim_never_frees_its_device() -> None:
    planning = _planning()
    waiting = _gated("p")
    # The allocator wrote the pod's claim; its gate is not removed yet.
    allocated = claim("p")
    allocated["status"] = {"allocation": _allocation("gpu-0")}
    planning.set_claim(allocated)
    assert not _fits(planning, "q")
    # The hold a preemption wrote for it is read only now.
    hold = Hold("uid-p", "ns/p", "n1", {"uid-p": _allocation("gpu-0")}, UNTIL)
    planning.set_holds({"uid-p": hold}, lambda uid, h: waiting)
    planning.refresh_placement(waiting)
    # The pod is placed: its hold has served and is let go.
    planning.drop_hold(waiting)
    planning.set_holds({}, lambda uid, h: None)
    assert not _fits(planning, "q"), "the claim's card looks free: it would be given twice"


def test_a_hold_whose_pod_is_gone_is_not_taken_again() -> None:
    planning = _planning()
    waiting = _gated("p")
    hold = Hold("uid-p", "ns/p", "n1", {"uid-p": _allocation("gpu-0")},
                datetime.now(UTC) + timedelta(minutes=5))
    alive: dict[str, Object] = {"uid-p": waiting}
    assert planning.set_holds({"uid-p": hold}, lambda uid, h: alive.get(uid)) == ["uid-p"]
    assert not _fits(planning, "q")
    del alive["uid-p"]  # deleted: the pods' mirror no longer has it
    planning.drop_hold(waiting)
    assert _fits(planning, "q")
    # The records still hold it until it expires; the next look must not take it again.
    assert planning.set_holds({"uid-p": hold}, lambda uid, h: alive.get(uid)) == []
    assert planning.holds == {}
    assert _fits(planning, "q")

"""The pure planner: devices, shares, constraints, node fit, policies and the records it keeps."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dra_gateway.allocator.planner import (
    ClusterState,
    PlannerSettings,
    PodPlan,
    TaskType,
    Workload,
    plan_pod,
)
from dra_gateway.kube import names

from .planner_support import (
    DRIVER,
    GI,
    MI,
    claim,
    cluster,
    device_class,
    devices_of,
    exactly,
    gpu,
    mig,
    node,
    place,
    pod,
    resource_slice,
    results,
    share_config,
    validate_allocated,
)

# --- whole cards and shares --------------------------------------------------------------------


def test_whole_card_claim_gets_a_free_card_pinned_to_its_node() -> None:
    state = cluster({"n1": [gpu(0), gpu(1)]})
    c = claim()
    plan = place(state, pod(), c)
    assert plan.node_name == "n1"
    assert results(plan, c) == [{"request": "main", "driver": DRIVER, "pool": "n1",
                                 "device": "gpu-0", "shareID": results(plan, c)[0]["shareID"],
                                 "consumedCapacity": {"memory": "16Gi", "cores": "100"}}]
    assert plan.allocations["uid-c"]["nodeSelector"] == {"nodeSelectorTerms": [{"matchFields": [
        {"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]}
    validate_allocated(c, plan)


def test_share_consumes_memory_and_cores_with_a_lowercase_share_id() -> None:
    state = cluster({"n1": [gpu(0)]})
    c = claim(capacity={"memory": "4Gi", "cores": "30"})
    plan = place(state, pod(), c)
    (result,) = results(plan, c)
    assert result["consumedCapacity"] == {"memory": "4Gi", "cores": "30"}
    assert result["shareID"] == result["shareID"].lower()
    assert len(result["shareID"]) == 36
    validate_allocated(c, plan)


def test_shares_fill_a_card_until_its_memory_runs_out() -> None:
    state = cluster({"n1": [gpu(0)]})
    placed = [place(state, pod(f"p{i}"), claim(f"c{i}", capacity={"memory": "5Gi",
                                                                     "cores": "10"}))
              for i in range(4)]
    assert [p.node_name for p in placed] == ["n1", "n1", "n1", None]
    assert placed[3].reason is not None
    assert placed[3].reason == (
        "pod ns/p3: 0/1 nodes fit; 1 node(s): claim ns/c3: request main needs 1 device(s) of "
        "class gpu.dra-gateway.io, 0 of 1 matching on the node has room for memory 5Gi and "
        "cores 10%; short of memory on 1")


def test_a_whole_card_never_shares_a_card_with_a_share() -> None:
    state = cluster({"n1": [gpu(0), gpu(1)]})
    share = claim("share", capacity={"memory": "1Gi", "cores": "1"})
    assert devices_of(place(state, pod("a"), share), share) == ["gpu-0"]
    whole = claim("whole")
    assert devices_of(place(state, pod("b"), whole), whole) == ["gpu-1"]
    later = claim("later", capacity={"memory": "1Gi", "cores": "1"})
    assert devices_of(place(state, pod("c"), later), later) == ["gpu-0"]
    assert place(state, pod("d"), claim("whole2")).node_name is None


def test_relative_memory_is_resolved_per_card_and_rounded_down_to_mib() -> None:
    state = cluster({"n1": [gpu(0, memory_gib=24)]})
    c = claim(capacity={"cores": "33"}, config=[share_config(["main"], memoryPercent=33,
                                                             cores=33)])
    plan = place(state, pod(), c)
    expected = 24 * GI * 33 // 100 // MI * MI
    (result,) = results(plan, c)
    assert result["consumedCapacity"]["memory"] == f"{expected // MI}Mi"
    claim_configs = [cfg for cfg in plan.allocations["uid-c"]["devices"]["config"]
                     if cfg["source"] == "FromClaim"]
    assert claim_configs[0]["opaque"]["parameters"]["memory"] == expected
    assert "memoryPercent" not in claim_configs[0]["opaque"]["parameters"]
    validate_allocated(c, plan)


def test_request_policy_rounds_a_request_up_to_the_next_step() -> None:
    policy = {"default": "1Gi", "validRange": {"min": "1Gi", "max": "8Gi", "step": "1Gi"}}
    state = cluster({"n1": [gpu(0, memory_gib=8, policy=policy)]})
    c = claim(capacity={"memory": "1500Mi", "cores": "10"})
    (result,) = results(place(state, pod(), c), c)
    assert result["consumedCapacity"]["memory"] == "2Gi"
    too_big = claim("big", capacity={"memory": "9Gi"})
    assert place(state, pod("q"), too_big).node_name is None


def test_request_policy_valid_values_take_the_smallest_that_fits() -> None:
    policy = {"default": "2Gi", "validValues": ["2Gi", "4Gi", "8Gi"]}
    state = cluster({"n1": [gpu(0, memory_gib=8, policy=policy)]})
    c = claim(capacity={"memory": "3Gi", "cores": "10"})
    assert results(place(state, pod(), c), c)[0]["consumedCapacity"]["memory"] == "4Gi"
    # Unrequested memory takes the policy's default.
    d = claim("d", capacity={"cores": "10"})
    assert results(place(state, pod("q"), d), d)[0]["consumedCapacity"]["memory"] == "2Gi"


# --- counts, alternatives, constraints ---------------------------------------------------------


def test_exact_count_takes_that_many_cards_on_one_node() -> None:
    state = cluster({"n1": [gpu(0)], "n2": [gpu(0), gpu(1), gpu(2)]})
    c = claim(count=3)
    plan = place(state, pod(), c)
    assert plan.node_name == "n2"
    assert devices_of(plan, c) == ["gpu-0", "gpu-1", "gpu-2"]


def test_allocation_mode_all_takes_every_matching_device_or_nothing() -> None:
    state = cluster({"n1": [gpu(0), gpu(1)]})
    first = claim("first", capacity={"memory": "1Gi", "cores": "1"})
    place(state, pod("a"), first)
    c = claim(mode="All")
    plan = place(state, pod("b"), c)
    assert plan.node_name is None
    assert plan.reason is not None
    assert "needs all device(s)" in plan.reason
    state2 = cluster({"n1": [gpu(0), gpu(1)]})
    assert devices_of(place(state2, pod("b"), c), c) == ["gpu-0", "gpu-1"]


def test_first_available_falls_back_to_the_next_subrequest() -> None:
    state = cluster({"n1": [gpu(0, product="T4")]})
    big = {"name": "big", **exactly(selectors=[
        f"device.attributes['{DRIVER}'].productName == 'A100'"])}
    small = {"name": "small", **exactly()}
    c = claim(requests=[{"name": "gpu", "firstAvailable": [big, small]}])
    plan = place(state, pod(), c)
    assert results(plan, c)[0]["request"] == "gpu/small"
    validate_allocated(c, plan)


def test_match_attribute_keeps_devices_on_one_numa_node() -> None:
    devices = [gpu(0, numa=0), gpu(1, numa=1), gpu(2, numa=1), gpu(3, numa=0), gpu(4, numa=2)]
    state = cluster({"n1": devices})
    blocker = claim("blocker")
    place(state, pod("a"), blocker)  # takes gpu-0 (NUMA 0)
    c = claim(count=2, constraints=[{"matchAttribute": f"{DRIVER}/numaNode"}])
    assert devices_of(place(state, pod("b"), c), c) == ["gpu-1", "gpu-2"]
    c2 = claim("c2", count=2, constraints=[{"matchAttribute": f"{DRIVER}/numaNode"}])
    plan = place(state, pod("c"), c2)
    assert plan.node_name is None
    assert plan.reason is not None
    assert "claim ns/c2: request main: no 2 device(s) satisfy matchAttribute" in plan.reason


def test_distinct_attribute_spreads_requests_over_different_cards() -> None:
    state = cluster({"n1": [gpu(0), gpu(1)]})
    request = {"capacity": {"memory": "1Gi", "cores": "1"}}
    c = claim(requests=[{"name": "a", "exactly": exactly(**request)},
                        {"name": "b", "exactly": exactly(**request)}],
              constraints=[{"distinctAttribute": f"{DRIVER}/index", "requests": ["a", "b"]}])
    assert devices_of(place(state, pod(), c), c) == ["gpu-0", "gpu-1"]


def test_an_all_subrequest_a_constraint_keeps_apart_refuses_the_claim_as_upstream() -> None:
    # Upstream's allocator treats an All (sub)request whose devices a constraint cannot hold
    # together as an error for the claim and tries no later subrequest (found by
    # tests/allocator/test_planner_oracle.py); the single card of `one` would fit.
    state = cluster({"n1": [gpu(0, numa=0), gpu(1, numa=1)]})
    every = {"name": "every", **exactly(mode="All")}
    one = {"name": "one", **exactly()}
    c = claim(requests=[{"name": "gpu", "firstAvailable": [every, one]}],
              constraints=[{"matchAttribute": f"{DRIVER}/numaNode"}])
    plan = place(state, pod(), c)
    assert plan.node_name is None
    assert plan.reason is not None
    assert ("claim ns/c: request gpu/every asks for all devices of class gpu.dra-gateway.io, "
            "but device gpu-1 breaks matchAttribute") in plan.reason
    # Without the constraint the All subrequest takes both cards.
    c2 = claim("c2", requests=[{"name": "gpu", "firstAvailable": [every, one]}])
    assert devices_of(place(state, pod("q"), c2), c2) == ["gpu-0", "gpu-1"]


def test_n_plus_one_devices_on_n_device_nodes_is_refused_naming_claim_and_request() -> None:
    state = cluster({f"n{i}": [gpu(0), gpu(1)] for i in range(3)})
    plan = place(state, pod(), claim("greedy", count=3))
    assert plan.node_name is None
    assert plan.reason == (
        "pod ns/p: 0/3 nodes fit; 3 node(s): claim ns/greedy: request main needs 3 device(s) "
        "of class gpu.dra-gateway.io, 2 of 2 matching on the node have room (a whole device "
        "must be free)")


def test_the_search_budget_bounds_constraints_that_cannot_be_met() -> None:
    # Eight cards on eight NUMA nodes and a claim for 4 cards of one NUMA node: the search
    # gives up after the budget instead of enumerating combinations.
    settings = PlannerSettings(default_strategy="first-fit", search_budget=50)
    state = ClusterState(settings)
    state.set_device_class(device_class(names.GPU_CLASS, "gpu"))
    state.set_node(node("n1"))
    state.set_slice(resource_slice("n1", [gpu(i, numa=i) for i in range(8)]))
    calls = 0
    original = state.verdict_for

    def counting(*args: Any) -> bool | str:
        nonlocal calls
        calls += 1
        return original(*args)

    state.verdict_for = counting  # type: ignore[method-assign]
    c = claim(requests=[{"name": f"r{i}", "exactly": exactly(count=1)} for i in range(6)],
              constraints=[{"matchAttribute": f"{DRIVER}/numaNode"}])
    plan = place(state, pod(), c)
    assert plan.node_name is None
    assert plan.reason is not None
    assert "claim ns/c:" in plan.reason
    assert calls <= 6 * 8 * 2  # static matching per request and device, not per combination


# --- selectors, classes, taints ----------------------------------------------------------------


def test_selectors_on_product_name_pick_the_model() -> None:
    state = cluster({"n1": [gpu(0, product="T4")], "n2": [gpu(0, product="V100M32")]})
    c = claim(selectors=[f"device.attributes['{DRIVER}'].productName == 'V100M32'"])
    assert place(state, pod(), c).node_name == "n2"


def test_a_selector_evaluation_error_makes_the_claim_unallocatable_with_its_message() -> None:
    state = cluster({"n1": [gpu(0)]})
    c = claim(selectors=[f"device.attributes['{DRIVER}'].noSuchAttribute == 'x'"])
    plan = place(state, pod(), c)
    assert plan.node_name is None
    assert plan.reason is not None
    assert "claim ns/c: request main: selector evaluation failed on device n1/gpu-0" in \
        plan.reason


def test_a_selector_that_does_not_compile_names_the_field() -> None:
    state = cluster({"n1": [gpu(0)]})
    plan = place(state, pod(), claim(selectors=["device.driver =="]))
    assert plan.reason is not None
    assert plan.reason.startswith(
        "claim ns/c: spec.devices.requests[0].exactly.selectors[0].cel.expression:")


def test_a_missing_device_class_is_named() -> None:
    state = cluster({"n1": [gpu(0)]})
    plan = place(state, pod(), claim(cls="nope.example.com"))
    assert plan.reason is not None
    assert "DeviceClass 'nope.example.com' not found" in plan.reason


def test_mig_instances_are_allocated_whole_through_their_class() -> None:
    state = cluster({"n1": [mig(0, "1g.10gb", 10), mig(1, "1g.10gb", 10)]})
    a, b, c = (claim(n, cls=names.MIG_CLASS) for n in "abc")
    assert devices_of(place(state, pod("a"), a), a) == ["gpu-0-mig-1g-10gb-0"]
    assert devices_of(place(state, pod("b"), b), b) == ["gpu-0-mig-1g-10gb-1"]
    assert place(state, pod("c"), c).node_name is None
    assert "consumedCapacity" not in results(plan_pod(cluster({"n1": [mig(0, "1g.10gb", 10)]}),
                                                      pod("a"), [a]), a)[0]


def test_device_taints_need_a_toleration_in_the_request() -> None:
    taint = {"key": "gpu.dra-gateway.io/unhealthy", "value": "xid", "effect": "NoSchedule"}
    state = cluster({"n1": [gpu(0, taints=[taint]), gpu(1)]})
    c = claim()
    assert devices_of(place(state, pod(), c), c) == ["gpu-1"]
    tolerant = claim("t", tolerations=[{"key": taint["key"], "operator": "Exists"}])
    plan = place(state, pod("t"), tolerant)
    assert devices_of(plan, tolerant) == ["gpu-0"]
    assert results(plan, tolerant)[0]["tolerations"] == [{"key": taint["key"],
                                                          "operator": "Exists"}]
    validate_allocated(tolerant, plan)


def test_node_taints_need_a_pod_toleration() -> None:
    taint = {"key": "dedicated", "value": "ml", "effect": "NoSchedule"}
    state = cluster({"n1": [gpu(0)]}, taints=[taint])
    plan = place(state, pod(), claim())
    assert plan.node_name is None
    assert plan.reason is not None
    assert "untolerated taint dedicated=ml:NoSchedule" in plan.reason
    tolerated = pod("t", tolerations=[{"key": "dedicated", "operator": "Equal", "value": "ml",
                                       "effect": "NoSchedule"}])
    assert place(state, tolerated, claim("t")).node_name == "n1"


def test_node_selector_and_required_affinity_are_honoured() -> None:
    state = ClusterState(PlannerSettings(default_strategy="first-fit"))
    state.set_device_class(device_class(names.GPU_CLASS, "gpu"))
    for name, zone in (("n1", "a"), ("n2", "b")):
        state.set_node(node(name, labels={"zone": zone}))
        state.set_slice(resource_slice(name, [gpu(0)]))
    assert place(state, pod("s", nodeSelector={"zone": "b"}), claim("s")).node_name == "n2"
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]}]}]}}}
    assert place(state, pod("a", affinity=affinity), claim("a")).node_name == "n1"


def test_node_affinity_is_read_as_kubernetes_reads_it() -> None:
    # kube.nodeselectors decides, as the scheduler: "1_6" is a valid label value but no
    # integer to Go's ParseInt (Python's int() would read 16), and required affinity without
    # terms admits no node.
    state = ClusterState(PlannerSettings(default_strategy="first-fit"))
    state.set_device_class(device_class(names.GPU_CLASS, "gpu"))
    for name, gpus in (("n1", "1_6"), ("n2", "16")):
        state.set_node(node(name, labels={"gpus": gpus}))
        state.set_slice(resource_slice(name, [gpu(0)]))
    many = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": "gpus", "operator": "Gt", "values": ["8"]}]}]}}}
    assert place(state, pod("m", affinity=many), claim("m")).node_name == "n2"
    nowhere = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {}}}
    assert place(state, pod("z", affinity=nowhere), claim("z")).node_name is None


def test_kubefit_keeps_no_copy_of_node_selectors_or_finished_pods() -> None:
    # One home each: kube.nodeselectors (node selectors, a pod's node affinity) and
    # kube.objects.is_finished.
    from dra_gateway.allocator.planner import kubefit
    for copy in ("node_selector_matches", "pod_accepts_node", "pod_is_finished",
                 "_match_expression", "_match_term"):
        assert not hasattr(kubefit, copy), copy


# --- CPU, memory and other writers -------------------------------------------------------------


def test_pod_cpu_and_memory_must_fit_next_to_the_pods_bound_there() -> None:
    state = cluster({"n1": [gpu(0), gpu(1)], "n2": [gpu(0)]}, cpu="8", memory="32Gi")
    state.set_pod(pod("bound", cpu="6", node_name="n1"))
    plan = place(state, pod("big", cpu="4"), claim("c", capacity={"memory": "1Gi",
                                                                   "cores": "1"}))
    assert plan.node_name == "n2"
    plan = place(state, pod("huge", cpu="7"), claim("d"))
    assert plan.node_name is None
    assert plan.reason is not None
    assert "Insufficient cpu" in plan.reason


def test_a_pod_without_claims_is_placed_by_cpu_and_memory() -> None:
    state = cluster({"n1": [gpu(0)]}, cpu="2")
    assert place(state, pod("a", cpu="1500m")).node_name == "n1"
    assert place(state, pod("b", cpu="1")).node_name is None


def test_allocations_by_other_writers_are_counted() -> None:
    state = cluster({"n1": [gpu(0), gpu(1)]})
    by_scheduler = claim("sched")
    by_scheduler["status"] = {"allocation": {"devices": {"results": [
        {"request": "main", "driver": DRIVER, "pool": "n1", "device": "gpu-0"}]}}}
    state.set_claim(by_scheduler)
    share_elsewhere = claim("other")
    share_elsewhere["status"] = {"allocation": {"devices": {"results": [
        {"request": "main", "driver": DRIVER, "pool": "n1", "device": "gpu-1",
         "shareID": "8f6a3a4e-1d2b-4c3d-9e8f-0a1b2c3d4e5f",
         "consumedCapacity": {"memory": "15Gi", "cores": "10"}}]}}}
    state.set_claim(share_elsewhere)
    assert place(state, pod(), claim("whole")).node_name is None
    assert place(state, pod("s"), claim("s", capacity={"memory": "2Gi"})).node_name is None
    fits = claim("fits", capacity={"memory": "1Gi", "cores": "10"})
    assert devices_of(place(state, pod("f"), fits), fits) == ["gpu-1"]
    state.remove_claim("uid-sched")
    assert place(state, pod("w"), claim("w")).node_name == "n1"


def test_assume_then_forget_gives_the_devices_back() -> None:
    state = cluster({"n1": [gpu(0)]}, cpu="2")
    p, c = pod(cpu="2"), claim()
    plan = place(state, p, c)
    assert place(state, pod("q"), claim("q")).node_name is None
    state.forget(p, plan)
    assert plan_pod(state, pod("q"), [claim("q")]).node_name == "n1"


def test_a_pod_with_an_allocated_claim_is_kept_on_that_node() -> None:
    state = cluster({"n1": [gpu(0)], "n2": [gpu(0)]})
    done = claim("done")
    done["status"] = {"allocation": {"devices": {"results": [
        {"request": "main", "driver": DRIVER, "pool": "n2", "device": "gpu-0"}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": ["n2"]}]}]}}}
    state.set_claim(done)
    plan = place(state, pod(), done, claim("more", capacity={"memory": "1Gi"}))
    assert plan.node_name is None  # n2's card is taken whole, and n1 is not allowed
    more = claim("more2")
    state2 = cluster({"n1": [gpu(0)], "n2": [gpu(0), gpu(1)]})
    state2.set_claim(done)
    assert place(state2, pod(), done, more).node_name == "n2"


def test_all_claims_of_a_pod_land_on_one_node_jointly() -> None:
    state = cluster({"n1": [gpu(0)], "n2": [gpu(0), gpu(1)]})
    a, b = claim("a"), claim("b")
    plan = place(state, pod(), a, b)
    assert plan.node_name == "n2"
    assert devices_of(plan, a) + devices_of(plan, b) == ["gpu-0", "gpu-1"]


def test_a_newer_pool_generation_replaces_the_devices() -> None:
    state = cluster({"n1": [gpu(0)]})
    state.set_slice(resource_slice("n1", [gpu(0, product="A10")], generation=2))
    c = claim(selectors=[f"device.attributes['{DRIVER}'].productName == 'A10'"])
    assert place(state, pod(), c).node_name == "n1"
    state.remove_slice("n1-gpu.dra-gateway.io-0")
    assert place(state, pod("q"), claim("q")).node_name is None


# --- fallback world ----------------------------------------------------------------------------


def test_without_consumable_capacity_shares_are_recorded_in_an_annotation() -> None:
    state = cluster({"n1": [gpu(0, shared=False)]}, consumable_capacity=False)
    c = claim(config=[share_config(["main"], memory=4 * GI, cores=25)])
    plan = place(state, pod(), c)
    (result,) = results(plan, c)
    assert "shareID" not in result
    assert "consumedCapacity" not in result
    recorded = json.loads(plan.annotations["uid-c"][names.ANNOTATION_SHARES])
    assert recorded == [{"request": "main", "driver": DRIVER, "pool": "n1", "device": "gpu-0",
                         "shareID": recorded[0]["shareID"],
                         "consumedCapacity": {"memory": "4Gi", "cores": "25"}}]
    validate_allocated(c, plan)
    # A restart rebuilds the share from the claim as the API serves it.
    fresh = cluster({"n1": [gpu(0, shared=False)]}, consumable_capacity=False)
    written = json.loads(json.dumps(c))
    written["metadata"]["annotations"] = plan.annotations["uid-c"]
    written["status"] = {"allocation": plan.allocations["uid-c"]}
    fresh.set_claim(written)
    big = claim("big", config=[share_config(["main"], memory=13 * GI, cores=10)])
    assert place(fresh, pod("b"), big).node_name is None
    fits = claim("fits", config=[share_config(["main"], memory=12 * GI, cores=75)])
    assert place(fresh, pod("f"), fits).node_name == "n1"
    assert place(fresh, pod("w"), claim("whole")).node_name is None


# --- capacities a share leaves out, in both worlds ---------------------------------------------


def _consumed(plan: PodPlan, c: dict[str, Any]) -> dict[str, str]:
    """The share's consumed capacity: native in the result, else from the annotation."""
    (result,) = results(plan, c)
    if "consumedCapacity" in result:
        return dict(result["consumedCapacity"])
    (recorded,) = json.loads(plan.annotations[c["metadata"]["uid"]][names.ANNOTATION_SHARES])
    return dict(recorded["consumedCapacity"])


def test_a_share_short_of_the_cores_its_request_policy_charges_says_so() -> None:
    # capacity.requests names memory only: upstream charges cores their policy's default (100),
    # so the third share finds memory free on both cards but no cores, and the reason says so.
    state = cluster({"n1": [gpu(0, memory_gib=80), gpu(1, memory_gib=80)]})
    for i in range(2):
        c = claim(f"c{i}", capacity={"memory": "10Gi"})
        assert _consumed(place(state, pod(f"p{i}"), c), c) == {"memory": "10Gi", "cores": "100"}
    plan = place(state, pod("p2"), claim("c2", capacity={"memory": "10Gi"}))
    assert plan.reason == (
        "pod ns/p2: 0/1 nodes fit; 1 node(s): claim ns/c2: request main needs 1 device(s) of "
        "class gpu.dra-gateway.io, 0 of 2 matching on the node has room for memory 10Gi and "
        "cores 100% (the request policy's default); short of cores on 2")


@pytest.mark.parametrize("native", [True, False])
def test_capacity_requests_leaving_cores_out_take_them_all_in_both_worlds(native: bool) -> None:
    # The same claim gets the same share with the gate on (cores' policy default: the whole
    # card) and off (devices carry no policy there: what the request leaves out is all taken).
    state = cluster({"n1": [gpu(0, memory_gib=80, shared=native)]},
                    consumable_capacity=native)
    first = claim("first", capacity={"memory": "10Gi"})
    assert _consumed(place(state, pod("a"), first), first) == {"memory": "10Gi", "cores": "100"}
    why = ("the request policy's default" if native
           else "all of it: capacity.requests leaves it out")
    assert place(state, pod("b"), claim("second", capacity={"memory": "10Gi"})).reason == (
        "pod ns/b: 0/1 nodes fit; 1 node(s): claim ns/second: request main needs 1 device(s) "
        "of class gpu.dra-gateway.io, 0 of 1 matching on the node has room for memory 10Gi and "
        f"cores 100% ({why}); short of cores on 1")
    # It holds every core of the card in both worlds: not even one more core fits next to it.
    small = claim("small", capacity={"memory": "10Gi", "cores": "1"})
    assert place(state, pod("c"), small).node_name is None


def _translated_claim(name: str, *, served_without_the_gate: bool) -> dict[str, Any]:
    """A gpushare pod's claim (10 GiB, no compute share) as the translator writes it; without
    the DRAConsumableCapacity gate the API server drops its `capacity.requests`."""
    from dra_gateway.translator.rules import load_rules
    from dra_gateway.translator.translate import translate

    legacy = {"apiVersion": "v1", "kind": "Pod",
              "metadata": {"name": name, "namespace": "ns", "annotations": {}},
              "spec": {"containers": [{"name": "main", "image": "x", "resources": {
                  "limits": {"aliyun.com/gpu-mem": "10"}}}]}}
    (template,) = translate(legacy, load_rules()).templates
    spec = json.loads(json.dumps(template["spec"]["spec"]))
    exactly_ = spec["devices"]["requests"][0]["exactly"]
    assert exactly_["capacity"] == {"requests": {"memory": "10Gi", "cores": "1"}}
    if served_without_the_gate:
        del exactly_["capacity"]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"}, "spec": spec}


@pytest.mark.parametrize(("native", "served_without_the_gate", "consumed"), [
    (True, False, {"memory": "10Gi", "cores": "1"}),
    (False, True, {"memory": "10Gi"}),  # as a cluster without the gate serves it
    (False, False, {"memory": "10Gi", "cores": "1"}),  # fields kept from before the gate went
])
def test_translated_memory_only_shares_share_a_card_in_both_worlds(
        native: bool, served_without_the_gate: bool, consumed: dict[str, str]) -> None:
    # The translator states every capacity of its shares, so what a capacity left out would be
    # charged never applies to them; read from the GpuShareConfig alone, a share without cores
    # limits no compute. Either way eight 10 GiB shares fill one 80 GiB card.
    state = cluster({"n1": [gpu(0, memory_gib=80, shared=native)]},
                    consumable_capacity=native)
    for i in range(8):
        c = _translated_claim(f"c{i}", served_without_the_gate=served_without_the_gate)
        plan = place(state, pod(f"p{i}"), c)
        assert devices_of(plan, c) == ["gpu-0"]
        assert _consumed(plan, c) == consumed
    extra = _translated_claim("c8", served_without_the_gate=served_without_the_gate)
    assert place(state, pod("p8"), extra).node_name is None


# --- policies ----------------------------------------------------------------------------------


def _share(name: str) -> dict[str, Any]:
    return claim(name, capacity={"memory": "4Gi", "cores": "25"})


def test_first_fit_takes_nodes_in_name_order_and_devices_in_slice_order() -> None:
    state = cluster({"b": [gpu(0), gpu(1)], "a": [gpu(0), gpu(1)]})
    c1, c2 = _share("c1"), _share("c2")
    p1, p2 = place(state, pod("1"), c1), place(state, pod("2"), c2)
    assert (p1.node_name, devices_of(p1, c1)) == ("a", ["gpu-0"])
    assert (p2.node_name, devices_of(p2, c2)) == ("a", ["gpu-0"])


def test_binpack_fills_the_busiest_node_and_spread_the_emptiest() -> None:
    for policy, expected in (("binpack", "b"), ("spread", "a")):
        state = cluster({"a": [gpu(0), gpu(1)], "b": [gpu(0), gpu(1)]}, strategy=policy)
        seed = _share("seed")
        seed["status"] = {"allocation": {"devices": {"results": [
            {"request": "main", "driver": DRIVER, "pool": "b", "device": "gpu-0",
             "shareID": "8f6a3a4e-1d2b-4c3d-9e8f-0a1b2c3d4e5f",
             "consumedCapacity": {"memory": "4Gi", "cores": "25"}}]}}}
        state.set_claim(seed)
        c = _share("c")
        plan = place(state, pod(), c)
        assert plan.node_name == expected, policy
        if policy == "binpack":
            assert devices_of(plan, c) == ["gpu-0"]


def test_spread_puts_shares_on_the_emptiest_card() -> None:
    state = cluster({"a": [gpu(0), gpu(1)]}, strategy="spread")
    c1, c2 = _share("c1"), _share("c2")
    assert devices_of(place(state, pod("1"), c1), c1) == ["gpu-0"]
    assert devices_of(place(state, pod("2"), c2), c2) == ["gpu-1"]


def test_default_strategy_keeps_whole_cards_free_for_the_workload() -> None:
    # Node a has one card a quarter used, node b two empty cards. First-fit puts a 25% share
    # on a's partly used card... and a's free card too would be fine; FGD picks what leaves the
    # fewest unusable fractions given a workload of whole-card and half-card tasks.
    workload = Workload([(TaskType(1000, GI, 1, 1000), 1.0), (TaskType(1000, GI, 1, 500), 1.0)])
    state = cluster({"a": [gpu(0), gpu(1)], "b": [gpu(0), gpu(1)]}, strategy="default")
    state.set_workload(workload)
    seed = claim("seed", capacity={"memory": "8Gi", "cores": "50"})
    place(state, pod("seed"), seed)  # a/gpu-0 half used
    c = claim("c", capacity={"memory": "8Gi", "cores": "50"})
    plan = place(state, pod(), c)
    # The second half-card share completes a/gpu-0 instead of breaking a free card.
    assert (plan.node_name, devices_of(plan, c)) == ("a", ["gpu-0"])
    quarter = claim("q", capacity={"memory": "4Gi", "cores": "25"})
    spread_state = cluster({"a": [gpu(0), gpu(1)]}, strategy="spread")
    assert devices_of(place(spread_state, pod("s"), quarter), quarter) == ["gpu-0"]


def test_policy_precedence_claim_config_then_hami_annotation_then_argument() -> None:
    def fresh() -> ClusterState:
        state = cluster({"a": [gpu(0), gpu(1)]}, strategy="first-fit")
        seed = _share("seed")
        place(state, pod("seed"), seed)  # a/gpu-0 a quarter used
        return state

    spread_claim = claim("s", capacity={"memory": "4Gi", "cores": "25"},
                         config=[share_config(["main"], policy="spread")])
    assert devices_of(place(fresh(), pod(), spread_claim, strategy="binpack"),
                      spread_claim) == ["gpu-1"]
    annotated = pod(annotations={"hami.io/gpu-scheduler-policy": "spread"})
    c = _share("c")
    assert devices_of(place(fresh(), annotated, c, strategy="binpack"), c) == ["gpu-1"]
    assert devices_of(place(fresh(), pod(), c, strategy="spread"), c) == ["gpu-1"]
    assert devices_of(place(fresh(), pod(), c), c) == ["gpu-0"]


def test_unknown_default_strategy_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="default_strategy: unknown strategy 'best'; use one of"):
        PlannerSettings(default_strategy="best")


def test_identical_nodes_are_evaluated_once_per_class() -> None:
    state = cluster({f"n{i:03d}": [gpu(0), gpu(1)] for i in range(200)}, strategy="default")
    searches = 0
    import dra_gateway.allocator.planner.search as search_module

    original = search_module.NodeSearch.run

    def counting(self: Any) -> Any:
        nonlocal searches
        searches += 1
        return original(self)

    search_module.NodeSearch.run = counting  # type: ignore[method-assign]
    try:
        plan = place(state, pod(), _share("c"))
    finally:
        search_module.NodeSearch.run = original  # type: ignore[method-assign]
    assert plan.node_name == "n000"
    assert searches == 1


def test_selectors_on_identity_attributes_are_evaluated_per_device() -> None:
    # Nodes with identical cards differ only by UUID: a selector naming one UUID must not be
    # answered from another node's verdict.
    state = cluster({f"n{i}": [gpu(0, memory_gib=16 + i)] for i in range(3)})
    for n in range(3):
        state.set_slice(resource_slice(f"n{n}", [gpu(0)], generation=2))
    wanted = "GPU-0000-16"
    assert all(d.attributes[f"{DRIVER}/uuid"] == wanted for d in state.devices.values())
    state.set_slice(resource_slice("n2", [{**gpu(0), "attributes": {
        **gpu(0)["attributes"], "uuid": {"string": "GPU-other"}}}], generation=3))
    c = claim(selectors=[f"device.attributes['{DRIVER}'].uuid == 'GPU-other'"])
    assert place(state, pod(), c).node_name == "n2"
    state.set_slice(resource_slice("n2", [gpu(0)], generation=4))
    assert place(state, pod("q"), claim("q", selectors=[
        f"device.attributes['{DRIVER}'].uuid == 'GPU-other'"])).node_name is None


def test_an_assumed_pod_keeps_its_cpu_while_it_waits_for_binding() -> None:
    state = cluster({"n1": [gpu(0), gpu(1)]}, cpu="2")
    gated = pod("g", cpu="2")
    place(state, gated, claim("g"))
    state.set_pod(gated)  # the watch sees it, still without a node
    assert place(state, pod("q", cpu="1"), claim("q")).node_name is None
    state.set_pod({**gated, "spec": {**gated["spec"], "nodeName": "n1"}})
    assert place(state, pod("r", cpu="1"), claim("r")).node_name is None
    state.set_pod({**gated, "status": {"phase": "Succeeded"}})
    assert place(state, pod("s", cpu="1"), claim("s")).node_name == "n1"


def test_a_share_of_a_whole_card_written_by_another_writer_blocks_the_card() -> None:
    state = cluster({"n1": [gpu(0)]})
    whole = claim("whole")
    whole["status"] = {"allocation": {"devices": {"results": [
        {"request": "main", "driver": DRIVER, "pool": "n1", "device": "gpu-0",
         "shareID": "8f6a3a4e-1d2b-4c3d-9e8f-0a1b2c3d4e5f",
         "consumedCapacity": {"memory": "16Gi", "cores": "100"}}]}}}
    state.set_claim(whole)
    assert state.usage[(DRIVER, "n1", "gpu-0")].exclusive == 1
    assert place(state, pod(), claim("tiny", capacity={"memory": "1Mi"})).node_name is None


def test_class_and_claim_configs_are_copied_into_the_allocation() -> None:
    state = cluster({"n1": [gpu(0)]})
    with_config = device_class(names.GPU_CLASS, "gpu")
    class_opaque = {"driver": DRIVER, "parameters": {"apiVersion": names.API_VERSION,
                                                     "kind": "GpuShareConfig",
                                                     "enforcement": "mps"}}
    with_config["spec"]["config"] = [{"opaque": class_opaque}]
    state.set_device_class(with_config)
    other = {"opaque": {"driver": "example.com", "parameters": {"a": 1}}}
    c = claim(capacity={"memory": "2Gi", "cores": "20"},
              config=[other, share_config(["main"], memory=2 * GI, cores=20)])
    plan = place(state, pod(), c)
    config = plan.allocations["uid-c"]["devices"]["config"]
    assert config == [
        {"source": "FromClass", "requests": ["main"], "opaque": class_opaque},
        {"source": "FromClaim", "opaque": other["opaque"]},
        {"source": "FromClaim", "requests": ["main"],
         "opaque": share_config(memory=2 * GI, cores=20)["opaque"]},
    ]
    validate_allocated(c, plan)


def test_fragmentation_follows_the_fgd_definition() -> None:
    workload = Workload([(TaskType(1000, GI, 1, 1000), 1.0), (TaskType(1000, GI, 1, 600), 1.0),
                         (TaskType(1000, GI, 2, 1000), 2.0), (TaskType(0, 0, 0, 0), 5.0)])
    # CPU-only types do not count; whole-card tasks lose the partly used cards, or everything
    # when too few cards are free; shares lose the cards with less free than they need.
    cards = (500, 1000)
    assert workload.fragmentation(cards, 8000, 8 * GI, "T4") == pytest.approx(
        0.25 * 500 + 0.25 * 500 + 0.5 * 1500)
    assert workload.fragmentation(cards, 500, 8 * GI, "T4") == pytest.approx(1500)
    assert workload.fragmentation((1000, 1000), 8000, 8 * GI, "T4") == pytest.approx(0)


def test_expected_loss_adds_the_share_the_cpu_left_cannot_carry() -> None:
    # Whole cards with 4 CPUs, half cards with 1 CPU, equally often: on average 2.5 CPUs and
    # 1 Gi per 750 thousandths of a card.
    workload = Workload([(TaskType(4000, GI, 1, 1000), 1.0), (TaskType(1000, GI, 1, 500), 1.0)])
    assert workload.cpu_per_milli == pytest.approx(2500 / 750)
    assert workload.memory_per_milli == pytest.approx(GI / 750)
    # Two free cards and 4 CPUs: the CPU carries 1.2 cards of the workload, 0.8 are stranded;
    # half a Gi of memory carries 0.375 of a card.
    assert workload.stranded(2000, 4000, 64 * GI) == pytest.approx(800)
    assert workload.stranded(2000, 64_000, 64 * GI) == 0
    assert workload.stranded(2000, 64_000, GI // 2) == pytest.approx(2000 - 375)
    cards = (1000, 1000)
    assert workload.expected_loss(cards, 4000, 64 * GI, "T4") == pytest.approx(
        workload.fragmentation(cards, 4000, 64 * GI, "T4") + 800)


def test_default_strategy_keeps_cpu_next_to_free_cards() -> None:
    # A CPU-heavy share goes where CPU is plentiful for the cards left, not where it would
    # leave free cards without the CPU their tasks need.
    workload = Workload([(TaskType(2000, GI, 1, 1000), 1.0), (TaskType(2000, GI, 1, 500), 1.0)])
    state = cluster({"a": [gpu(0), gpu(1)], "b": [gpu(0), gpu(1)]}, strategy="default", cpu="4")
    state.set_node(node("b", cpu="16"))
    state.set_workload(workload)
    # Either node is left with the same cards, (500, 1000); a's 2 CPUs left would carry 0.75
    # cards of the workload, b's 14 CPUs all of them. FGD alone ties and takes a by name.
    c = claim("c", capacity={"memory": "8Gi", "cores": "50"})
    assert place(state, pod(cpu="2"), c).node_name == "b"


def test_the_learned_workload_follows_the_pods_planned() -> None:
    state = cluster({"a": [gpu(0), gpu(1)]}, strategy="default")
    for n in range(20):
        place(state, pod(f"p{n}", cpu="100m"), claim(f"c{n}", capacity={
            "cores": "25"}, config=[share_config(["main"], memoryPercent=25, cores=25)]))
    assert [(t.gpus, t.milli) for t, _ in state.workload.types] == [(1, 250)]


def test_an_unsatisfiable_numa_constraint_costs_one_search_per_node_class() -> None:
    eight = [gpu(i, numa=i // 4) for i in range(8)]
    state = cluster({f"n{i:04d}": eight for i in range(300)}, strategy="default")
    import dra_gateway.allocator.planner.search as search_module

    searches: list[int] = []
    original = search_module.NodeSearch.run

    def counting(self: Any) -> Any:
        outcome = original(self)
        searches.append(self.initial_budget - self.budget)
        return outcome

    search_module.NodeSearch.run = counting  # type: ignore[method-assign]
    try:
        c = claim(count=5, constraints=[{"matchAttribute": f"{DRIVER}/numaNode"}])
        plan = place(state, pod(), c)
        again = place(state, pod("again"), claim("again", count=5, constraints=[
            {"matchAttribute": f"{DRIVER}/numaNode"}]))
    finally:
        search_module.NodeSearch.run = original  # type: ignore[method-assign]
    assert plan.node_name is None
    assert again.node_name is None
    assert plan.reason == (
        "pod ns/p: 0/300 nodes fit; 300 node(s): claim ns/c: request main: no 5 device(s) "
        f"satisfy matchAttribute {DRIVER}/numaNode")
    assert again.reason is not None
    assert again.reason.startswith("pod ns/again: 0/300 nodes fit; 300 node(s): claim ns/again:")
    assert len(searches) == 1  # one class of identical nodes, and the second pod is memoised
    assert searches[0] <= 200  # device choices tried, far below C(8, 5) x 5!


def test_the_planners_strategies_are_the_names_a_share_config_accepts() -> None:
    from dra_gateway.allocator.planner import settings
    from dra_gateway.kube import models

    assert settings.STRATEGIES is models.STRATEGIES
    assert set(models.STRATEGIES) == {settings.DEFAULT, settings.BINPACK, settings.SPREAD,
                                      settings.FIRST_FIT}

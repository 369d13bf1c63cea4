"""The planner's speed-ups change nothing: on random clusters, pods and sharing policies, it
places every pod where the plain reference (`dra_gateway.devkit.reference_planner`: every node
searched afresh, no node classes, memo or rankings) does, on the same devices.

Each example replays one history on two states: each pod is planned by both, the two plans are
compared, and the planner's plan is assumed in both (so they stay the same cluster); between
pods, claims are released and the namespaces' sharing policies change."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from dra_gateway.allocator.planner import STRATEGIES, ClusterState, PodPlan, plan_pod
from dra_gateway.devkit.reference_planner import reference_plan
from dra_gateway.policy.catalog import Catalog

from .planner_support import claim, cluster, gpu, share_config

GI = 1 << 30
NAMESPACES = ("a", "b", "c", "d")

card = st.sampled_from([("T4", 16), ("A100-SXM4", 80)])
# Mostly alike nodes (the node classes, memo and rankings serve alike nodes), some others.
layouts = st.tuples(st.integers(2, 6), st.lists(card, min_size=1, max_size=3),
                    st.lists(st.lists(card, min_size=1, max_size=3), max_size=2)).map(
    lambda t: [t[1]] * t[0] + t[2])
# Mostly small shares, so that cards hold several, of several tenants.
request = st.one_of(
    st.tuples(st.just("share"), st.integers(1, 8), st.integers(1, 30)),
    st.tuples(st.just("share"), st.integers(1, 16), st.integers(1, 60)),
    st.tuples(st.just("whole"), st.integers(1, 2)),
    st.tuples(st.just("percent"), st.integers(5, 60), st.integers(1, 60)),
)
pod_spec = st.tuples(st.sampled_from(NAMESPACES), st.lists(request, min_size=1, max_size=2),
                     st.sampled_from([None, "east", "west"]), st.sampled_from(["10m", "20"]))
sharing_spec = st.fixed_dictionaries({}, optional={
    "maxClaimsPerDevice": st.integers(1, 3),
    "allowedModels": st.sampled_from([["t4*"], ["a100*"]]),
    "isolation": st.sampled_from([{"mode": "Namespace"},
                                  {"mode": "Label", "labelKey": "team"}]),
    "exclusive": st.just(True),
    "minShare": st.sampled_from([{"cores": 10}, {"memory": "4Gi"}]),
})
# Policies namespaces share searches and rankings under: isolation by namespace and by label,
# claim limits apart, and the rules alone.
SHARED_SEARCHES = [("a", {"isolation": {"mode": "Namespace"}, "maxClaimsPerDevice": 2}),
                   ("b", {"isolation": {"mode": "Namespace"}, "maxClaimsPerDevice": 2}),
                   ("c", {"isolation": {"mode": "Label", "labelKey": "team"}}),
                   ("d", {"maxClaimsPerDevice": 3})]
step = st.one_of(
    st.tuples(st.just("pod"), pod_spec),
    st.tuples(st.just("pod"), pod_spec),
    st.tuples(st.just("pod"), pod_spec),
    st.tuples(st.just("release"), st.integers(0, 40)),
    st.tuples(st.just("policy"), st.one_of(
        st.lists(st.tuples(st.sampled_from(NAMESPACES), sharing_spec), max_size=3),
        st.just(SHARED_SEARCHES))),
)


def _claim(name: str, namespace: str, spec: tuple[Any, ...]) -> dict[str, Any]:
    uid = f"claim-{name}"
    if spec[0] == "whole":
        made = claim(name, count=spec[1], uid=uid)
    elif spec[0] == "share":
        made = claim(name, capacity={"memory": f"{spec[1]}Gi", "cores": str(spec[2])},
                     config=[share_config(["main"], memory=spec[1] * GI, cores=spec[2])],
                     uid=uid)
    else:
        made = claim(name, capacity={"cores": str(spec[2])},
                     config=[share_config(["main"], memoryPercent=spec[1], cores=spec[2])],
                     uid=uid)
    made["metadata"]["namespace"] = namespace
    return made


def _pod(name: str, namespace: str, zone: str | None, cpu: str) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}",
                     "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": {
            "requests": {"cpu": cpu, "memory": "10Mi"}}}]}}
    if zone is not None:
        pod["spec"]["nodeSelector"] = {"zone": zone}
    return pod


def _catalog(policies: list[tuple[str, dict[str, Any]]]) -> Catalog:
    sharing = [{"apiVersion": "dra-gateway.io/v1alpha1", "kind": "GPUSharingPolicy",
                "metadata": {"name": f"p{i}"},
                "spec": {"namespaceSelector": {"matchLabels": {"name": ns}}, **spec}}
               for i, (ns, spec) in enumerate(policies)]
    namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {
        "name": ns, "labels": {"name": ns, "team": "red" if ns in "ac" else "blue"}}}
        for ns in NAMESPACES]
    return Catalog.build(sharing=sharing, namespaces=namespaces)


def _where(plan: PodPlan) -> tuple[str | None, list[list[tuple[str, str]]]]:
    devices = [[(r["pool"], r["device"]) for r in a["devices"]["results"]]
               for _, a in sorted(plan.allocations.items())]
    return plan.node_name, devices


def _state(layout: list[list[tuple[str, int]]], strategy: str, **layer: bool) -> ClusterState:
    state = cluster({f"n{n}": [gpu(i, product=product, memory_gib=memory)
                               for i, (product, memory) in enumerate(cards)]
                     for n, cards in enumerate(layout)}, strategy=strategy, cpu="40", **layer)
    for n in range(len(layout)):
        state.nodes[f"n{n}"].labels["zone"] = "east" if n % 2 else "west"
    return state


# The planner as it runs, and with each part of its speed layer off (what the speed-layer
# bench measures them by): every one must plan as the reference does.
@pytest.mark.parametrize("layer", [{}, {"memo": False}, {"rankings": False}],
                         ids=["as-run", "no-memo", "no-rankings"])
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layout=layouts, strategy=st.sampled_from(STRATEGIES),
       steps=st.lists(step, min_size=4, max_size=40))
# Found by this test: on a node nobody held a card of, the memo key left out the namespace's
# maxClaimsPerDevice, and a pod's two shares were put on one card under a limit of one.
@example(layout=[[("T4", 16)], [("T4", 16)]], strategy="default",
         steps=[("pod", ("a", [("share", 1, 1)], None, "10m")),
                ("pod", ("a", [("share", 1, 1)], None, "10m")),
                ("policy", [("a", {"maxClaimsPerDevice": 1})]),
                ("pod", ("a", [("share", 1, 1), ("share", 1, 1)], None, "10m"))])
def test_the_planner_places_every_pod_as_the_reference_does(
        layer: dict[str, bool], layout: list[list[tuple[str, int]]], strategy: str,
        steps: list[tuple[str, Any]]) -> None:
    fast, plain = _state(layout, strategy, **layer), _state(layout, strategy)
    placed: list[tuple[dict[str, Any], list[dict[str, Any]]]] = []
    for n, (kind, arg) in enumerate(steps):
        if kind == "policy":
            catalog = _catalog(arg)
            if catalog.errors:
                continue
            fast.set_policies(catalog)
            plain.set_policies(_catalog(arg))
        elif kind == "release":
            if placed:
                pod, claims = placed.pop(arg % len(placed))
                for state in (fast, plain):
                    for made in claims:
                        state.remove_claim(made["metadata"]["uid"])
                    state.remove_pod(pod["metadata"]["uid"])
        else:
            namespace, requests, zone, cpu = arg
            pod = _pod(f"p{n}", namespace, zone, cpu)
            claims = [_claim(f"p{n}-c{i}", namespace, r) for i, r in enumerate(requests)]
            plan = plan_pod(fast, pod, claims)
            expected = reference_plan(plain, pod, claims)
            assert _where(plan) == _where(expected), (n, plan.reason, expected.reason)
            if plan.node_name is not None:
                fast.assume(pod, plan)
                plain.assume(pod, plan)
                placed.append((pod, claims))


@pytest.mark.parametrize(("layer", "kept"), [({}, {"memo", "rankings"}),
                                             ({"memo": False}, {"rankings"}),
                                             ({"rankings": False}, {"memo"})])
def test_each_part_of_the_speed_layer_can_be_turned_off(layer: dict[str, bool],
                                                         kept: set[str]) -> None:
    """What the bench turns off is off: nothing is memoised or ranked by a part that is."""
    state = _state([[("T4", 16)], [("T4", 16)], [("A100", 80)]], "default", **layer)
    for n in range(4):
        pod = _pod(f"p{n}", "a", None, "10m")
        plan = plan_pod(state, pod, [_claim(f"p{n}-c", "a", ("share", 1, 1))])
        assert plan.node_name is not None, plan.reason
        state.assume(pod, plan)
    assert {part for part in ("memo", "rankings") if len(getattr(state, part))} == kept

"""The planner's reference: the same search, none of its speed.

`reference_plan` places one pod as `plan_pod` promises to, read plainly: every node, in name
order; the cheap checks (CPU, memory, taints), the pod's node selector and affinity; the device
search (`NodeSearch`) run afresh on that one node under the namespace's own sharing rules; the
packing strategy's score; the lowest (score, node name) wins. No node classes, no memoised
searches, no rankings, no "planned as an equivalent namespace" rules: whatever those speed-ups
decide must come out the same (tests/allocator/test_reference_planner.py compares them plan by
plan on random clusters; `python -m dra_gateway.devkit.bench.speedlayer` on the openb trace,
and times both). Quotas are out of its scope (their walk is the planner's own), so is the
learned workload's observation, which both make through the same `_pod_visit`.

It lives in the development kit, apart from production code (an import-linter contract: no
component imports `dra_gateway.devkit`), so that the tests and the benchmarks share it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_gateway.allocator.planner import plan as planning
from dra_gateway.allocator.planner.allocation import PodPlan, build_plan
from dra_gateway.allocator.planner.search import NodeSearch, NodeSearchResult
from dra_gateway.allocator.planner.state import ClusterState
from dra_gateway.allocator.planner.visit import fits_node
from dra_gateway.kube import objects
from dra_gateway.kube.nodeselectors import pod_accepts_node


def reference_plan(state: ClusterState, pod: Mapping[str, Any],
                   claims: Sequence[Mapping[str, Any]]) -> PodPlan:
    label = "/".join(objects.namespace_name(pod))
    pod_claims = planning._read_claims(state, claims, None)
    if isinstance(pod_claims, PodPlan):
        return pod_claims
    policies = planning._apply_policies(state, pod, label, pod_claims)
    if isinstance(policies, PodPlan):
        return policies
    assert not policies.quotas, "the reference leaves quotas to the planner"
    visit, _ = planning._pod_visit(state, pod, pod_claims, policies.rules, None)
    state.refresh_groups()
    best: tuple[tuple[float, ...], str, NodeSearchResult] | None = None
    for node in sorted(state.node_group):
        if pod_claims.pinned is not None and node not in pod_claims.pinned:
            continue
        if fits_node(state, node, visit.cpu, visit.memory, visit.tolerations) is not None:
            continue
        if not pod_accepts_node(pod, name=node, labels=state.nodes[node].labels):
            continue
        result = NodeSearch(state, node, visit.claims, visit.search, workload=state.workload,
                            rules=policies.rules).run()
        if not result.ok:
            continue
        score = visit.score_of(node, result)
        if best is None or (score, node) < (best[0], best[1]):
            best = (score, node, result)
    if best is None:
        return PodPlan(None, reason="no node fits")
    return build_plan(state, best[1], pod_claims.to_plan, best[2], charges=False)

"""Shares served by MIG instances (issue 47), placed: the claim a MIG namespace's HAMi share is
translated to lands on an instance that holds it, cut on demand from an H100 (the smallest
that holds it, 3g.40gb, while it fits), in every layout of the counters."""

from __future__ import annotations

from typing import Any

import pytest

from dra_gateway.translator.rules import load_rules
from dra_gateway.translator.translate import translate

from .planner_support import claim, place, pod
from .test_planner_counters import LAYOUTS, card, mig_cluster


def _translated_claim(name: str) -> dict[str, Any]:
    legacy = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "ns"},
              "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": {
                  "nvidia.com/gpumem": 20000, "nvidia.com/gpucores": 30}}}]}}
    plan = translate(legacy, load_rules(), mig_shares=True)
    (template,) = plan.templates
    made = claim(name)
    made["spec"] = template["spec"]["spec"]
    return made


@pytest.mark.parametrize("layout", LAYOUTS)
def test_translated_shares_take_the_smallest_instance_that_holds_them(layout: str) -> None:
    """One H100: two 3g.40gb (4 memory slices each) hold the first two shares at different
    placements; the third finds no memory slice left and waits."""
    state = mig_cluster(layout, {"n1": [card(0)]})
    given: list[tuple[str, str] | None] = []
    for index in range(3):
        made = _translated_claim(f"share-{index}")
        plan = place(state, pod(f"p{index}"), made)
        if plan.node_name is None:
            given.append(None)
            continue
        (result,) = plan.allocations[made["metadata"]["uid"]]["devices"]["results"]
        given.append((result["request"], result["device"]))
    assert [g[0] if g else None for g in given] == ["main/3g-40gb", "main/3g-40gb", None]
    first, second = given[0], given[1]
    assert first is not None
    assert second is not None
    assert first[1] != second[1]

"""All or nothing: the members of a pod group planned together on one state.

`plan_group` plans each member in turn (the oldest first), each on the state as the members
before it left it (their devices, CPU, memory and quota charges assumed), so that the members
never share a device and their quotas are checked for the group as a whole. Either every
member is placed, and the plans are returned to be assumed and written together, or the group
does not fit and no plan is kept: the state ends as it started, so two groups that cannot both
fit never both hold devices. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_gateway.allocator.planner.allocation import PodPlan
from dra_gateway.allocator.planner.plan import plan_pod
from dra_gateway.allocator.planner.state import ClusterState
from dra_gateway.kube import objects

Member = tuple[Mapping[str, Any], Sequence[Mapping[str, Any]]]  # (pod, its gateway claims)


@dataclass(frozen=True, slots=True)
class GroupPlan:
    """Every member's plan (in the order given), or how many fit and why the next did not."""

    plans: tuple[PodPlan, ...]
    fitted: int  # members placed before the first that was not
    reason: str | None = None  # why member `fitted` was not placed; None: all were
    quota_reason: str | None = None

    @property
    def placed(self) -> bool:
        return self.reason is None


def plan_group(state: ClusterState, members: Sequence[Member], *,
               strategy: str | None = None) -> GroupPlan:
    """Plan `members` together (see the module); the state is left as it was."""
    assumed: list[tuple[Mapping[str, Any], PodPlan]] = []
    try:
        for pod, claims in members:
            plan = plan_pod(state, pod, list(claims), strategy=strategy)
            if plan.node_name is None:
                label = "/".join(objects.namespace_name(pod))
                return GroupPlan(tuple(p for _, p in assumed), len(assumed),
                                 plan.reason or f"pod {label}: no node fits it",
                                 plan.quota_reason)
            state.assume(pod, plan)
            assumed.append((pod, plan))
        return GroupPlan(tuple(p for _, p in assumed), len(assumed))
    finally:
        for pod, plan in reversed(assumed):
            state.forget(pod, plan)


__all__ = ["GroupPlan", "Member", "plan_group"]

"""Pod groups as the allocator sees them: which members a group has in the pods' mirror, which
hold devices, and what a waiting member says.

A group (gpu.groups: the gateway's annotations, Kueue's pod groups, LeaderWorkerSet) needs
`size` members allocated together. Members that hold devices already (ungated, or every gateway
claim allocated) count toward it; while fewer than `size` do, the gated members whose claims
all exist are planned together (planner.groups, `PodAllocator`) once enough of them have
arrived, and written only when all fit. Members beyond the size are placed as they come, one
by one. This module reads mirrors and words conditions; it writes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass

from dra_gateway.allocator.claims import ClaimLookup, claims_for
from dra_gateway.gpu.groups import GroupError, PodGroup, group_key, holder_key
from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.port import Object

GROUP_INDEX = "pod-group"
HOLDER_INDEX = "pod-group-holder"  # by the object sizing the group (a PodGroup, a Workload)
GROUP_CONDITION = f"{names.DOMAIN}/PodGroup"
GROUP_INCOMPLETE = "GroupIncomplete"  # fewer members have arrived than the group needs
GROUP_DOES_NOT_FIT = "GroupDoesNotFit"  # they have, and do not all fit together now
GROUP_PLACED = "GroupPlaced"
GROUP_INVALID = "GroupInvalid"  # the pod names a group without a usable size


def group_index(pod: Object) -> Iterable[Hashable]:
    """The pods' mirror's index: a pod under the key of its group, if any."""
    key = group_key(pod)
    return (key,) if key is not None else ()


def holder_index(pod: Object) -> Iterable[Hashable]:
    """The pods' mirror's index: a pod under the key of the object sizing its group."""
    key = holder_key(pod)
    return (key,) if key is not None else ()


@dataclass(frozen=True, slots=True)
class Ready:
    """A gated member whose claims all exist: its gateway claims, and those not allocated."""

    pod: Object
    gateway: list[Object]
    pending: list[Object]


@dataclass(frozen=True, slots=True)
class Members:
    group: PodGroup
    holding: int  # members that hold their devices (placed, or allocated and being ungated)
    ready: list[Ready]  # gated members with every claim, none allocated yet, oldest first
    arriving: int  # members not ready yet (claims not created, or behind other gates)
    placed_claims: list[Object]  # the gateway claims of the members that hold devices

    @property
    def needed(self) -> int:
        """Members still to be placed together before the group is whole."""
        return max(0, self.group.size - self.holding)


def members_of(group: PodGroup, by_index: Callable[[str, Hashable], list[Object]],
               claims: ClaimLookup) -> Members:
    holding = arriving = 0
    ready: list[Ready] = []
    placed: list[Object] = []
    for pod in by_index(GROUP_INDEX, group.key):
        if objects.is_deleting(pod) or objects.is_finished(pod):
            continue
        found, waiting = claims_for(pod, claims)
        gateway = [c for c in found if objects.is_gateway_claim(c)]
        if not objects.is_gated(pod):
            holding += 1
            placed.extend(c for c in gateway if objects.is_allocated(c))
            continue
        pending = [c for c in gateway if not objects.is_allocated(c)]
        if waiting or objects.other_gates(pod):
            arriving += 1
        elif not pending:
            holding += 1  # allocated: its gate is about to go
            placed.extend(gateway)
        else:
            ready.append(Ready(pod, gateway, pending))
    ready.sort(key=lambda r: (str(objects.meta(r.pod).get("creationTimestamp") or ""),
                              objects.name(r.pod)))
    return Members(group, holding, ready, arriving, placed)


def chosen(members: Members, uid: str) -> list[Ready]:
    """The members planned together now: the pod syncing (`uid`) and the oldest others, as
    many as the group still needs, oldest first."""
    own = [r for r in members.ready if objects.uid(r.pod) == uid]
    others = [r for r in members.ready if objects.uid(r.pod) != uid]
    picked = own + others[:max(0, members.needed - len(own))]
    return sorted(picked, key=members.ready.index)


def incomplete_message(members: Members) -> str:
    group = members.group
    missing = members.needed - len(members.ready)
    return (f"pod group {group.label} ({group.why}) needs {group.size} members allocated "
            f"together; {members.holding} hold their devices and {len(members.ready)} wait: "
            f"{missing} more to arrive (or to have their claims created and other gates "
            f"removed); no member holds a device until they all fit")


def no_fit_message(group: PodGroup, fitted: int, needed: int, reason: str | None) -> str:
    return (f"pod group {group.label} ({group.why}): {fitted} of the {needed} members still "
            f"needed fit together now; {reason or 'the next does not fit'}; no member holds a "
            f"device until they all fit")


def invalid_message(error: GroupError) -> str:
    return f"this pod's group cannot be used: {error.message}"


__all__ = [
    "GROUP_CONDITION", "GROUP_DOES_NOT_FIT", "GROUP_INCOMPLETE", "GROUP_INDEX", "GROUP_INVALID",
    "GROUP_PLACED", "HOLDER_INDEX", "Members", "Ready", "chosen", "group_index", "holder_index",
    "incomplete_message", "invalid_message", "members_of", "no_fit_message",
]

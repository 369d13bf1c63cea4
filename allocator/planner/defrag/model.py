"""What the defrag planner takes and gives besides the pods placed and waiting (`Resident`,
`Waiter`: planner/leaving.py): the limits, and the plan (the pods helped, each with where it
goes and the moves made for it). Plain values."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from dra_gateway.allocator.planner.allocation import PodPlan


@dataclass(frozen=True, slots=True)
class Limits:
    max_moves: int = 20  # in the whole plan
    max_moves_per_pod: int = 4
    nodes_tried: int = 8  # trials per waiter, cheapest nodes first (a quarter of it deeper)
    depth: int = 2  # levels of a chain: a moved pod may need room made for it in turn
    budgets: Mapping[str, int] = field(default_factory=dict)  # disruptions left per PDB


@dataclass(frozen=True, slots=True)
class Placement:
    node: str
    devices: tuple[str, ...]  # device names, in the order of the allocation's results

    def __str__(self) -> str:
        return f"{self.node} ({', '.join(self.devices)})" if self.devices else self.node


@dataclass(frozen=True, slots=True)
class Move:
    pod: str  # namespace/name
    uid: str
    source: Placement
    target: Placement
    plan: PodPlan  # where the planner put it again in the plan's world
    budgets: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Help:
    """A waiting pod, where it goes and the moves that make room for it (none: it fits now)."""

    pod: str
    uid: str
    priority: int
    placement: Placement
    plan: PodPlan
    moves: tuple[Move, ...]

    @property
    def frees(self) -> str:
        if not self.moves:
            return "nothing: it fits as the cluster is"
        return f"{', '.join(self.placement.devices)} on {self.placement.node}"


@dataclass(frozen=True, slots=True)
class NotHelped:
    pod: str
    uid: str
    reason: str


@dataclass(slots=True)
class DefragPlan:
    helped: list[Help] = field(default_factory=list)
    not_helped: list[NotHelped] = field(default_factory=list)

    @property
    def moves(self) -> list[Move]:
        return [move for help_ in self.helped for move in help_.moves]

"""The planner's inputs, named: what a device search and a ranking read, as one value each.

A memoised search is keyed by the node class it ran on (`NodeClassKey`) and by everything it
read besides that node (`SearchInputs`); a pod's ranking of node classes by `PodInputs`. The
keys are these values themselves, never tuples assembled beside them, so an input added to a
search is an input of its key: it cannot go stale in a memo. Pure data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple


class NodeClassKey(NamedTuple):
    """A node class: nodes alike in all a search and the node-level checks read."""

    static: int  # the node's devices as published (interned content, identity left out)
    usage: int  # their usage, with the holder facts the sharing rules read (interned)
    cpu: int  # CPU free, milli
    memory: int  # memory free, bytes
    taints: int  # the node's taints (interned), -1 without
    bare: int  # the devices' usage alone, what the rankings' searches read (interned)


@dataclass(frozen=True, slots=True)
class SearchInputs:
    """Everything one node's device search reads besides that node's devices and usage."""

    claims: tuple[str, ...]  # each claim's demand key: its spec as the planner reads it
    strategy: str  # the packing strategy the cards are ordered by
    workload: int  # the learned workload's version (the default strategy's score), else 0
    card_rules: object  # the sharing rules' parts that decide which card fits (memokeys)
    topology: bool  # whether multi-card requests prefer aligned cards (PlannerSettings)
    budget: int  # device combinations the search may try (PlannerSettings.search_budget)


@dataclass(frozen=True, slots=True)
class PodInputs:
    """What a pod's ranking of node classes reads: its searches' inputs and what the node-level
    checks (CPU, memory, taints) read of the pod."""

    search: SearchInputs
    cpu: int  # milli
    memory: int  # bytes
    tolerations: str  # JSON, "" without


__all__ = ["NodeClassKey", "PodInputs", "SearchInputs"]

"""Settings of the planner and the names of its packing strategies.

Data only: a frozen settings object passed in explicitly, never read from the environment here.
The strategies are enumerated once, by `kube.models.Strategy` (a claim's GpuShareConfig carries
them, so the core holds the list); `STRATEGIES` is that list, and the constants below name the
members the planner compares against, each typed as a `Strategy` so that mypy refuses a name
the list does not have. A new strategy is one more value of the Literal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# The names a claim's GpuShareConfig may carry are the names the planner knows: one list.
from dra_gateway.kube.models import STRATEGIES as STRATEGIES
from dra_gateway.kube.models import Strategy

FIRST_FIT: Final[Strategy] = "first-fit"
BINPACK: Final[Strategy] = "binpack"
SPREAD: Final[Strategy] = "spread"
DEFAULT: Final[Strategy] = "default"


@dataclass(frozen=True)
class PlannerSettings:
    """How the planner decides.

    `default_strategy`, how pods are packed onto nodes and cards, is used when neither the
    claim's GpuShareConfig (its `policy` field) nor the pod's HAMi annotation nor the caller
    names one. `consumable_capacity` says whether the API server keeps
    the DRAConsumableCapacity fields (`shareID`, `consumedCapacity`, `capacity.requests`,
    `allowMultipleAllocations`); when it does not, shares of gateway devices are recorded in the
    allocation's gateway config instead (`gpu/shares.py`; ARCHITECTURE.md, "Kubernetes versions
    and feature gates").
    """

    default_strategy: str = DEFAULT
    consumable_capacity: bool = True
    # Most device combinations one claim may try on one node before the node is given up with a
    # reason: bounds the time of requests that cannot be met (n+1 devices on an n-device node,
    # constraints across NUMA nodes) whatever the shape of the slices.
    search_budget: int = 2000
    # A request for several cards tries the cards of the fewest NVLink islands, NUMA nodes and
    # PCIe roots first (planner/topology.py); off: the strategy's order alone.
    topology: bool = True
    # Node labels naming topology domains (a rack label, `topology.kubernetes.io/zone`),
    # innermost first: a pod group's members go to the nodes its members already use, then to
    # nodes of the same value of each label in turn, then anywhere (planner/groups.py).
    group_domains: tuple[str, ...] = ()
    # The speed layer's parts, on in production; turned off only to measure what each buys
    # (`python -m dra_gateway.devkit.bench.speedlayer`). Plans are the same either way
    # (tests/allocator/test_reference_planner.py). `memo`: a node class's search for a claim
    # shape is kept and reused; `rankings`: a pod signature's feasible classes are ranked once
    # and walked best first, instead of every class being searched for every pod.
    memo: bool = True
    rankings: bool = True

    def __post_init__(self) -> None:
        if self.default_strategy not in STRATEGIES:
            raise ValueError(
                f"default_strategy: unknown strategy {self.default_strategy!r}; "
                f"use one of {', '.join(STRATEGIES)}"
            )
        if self.search_budget < 1:
            raise ValueError("search_budget: must be at least 1")

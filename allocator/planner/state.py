"""The planner's view of the cluster: `ClusterState`, the composition the planner and its
callers use.

`ClusterState` is fed object by object (from watches in the controller, from a trace in the
benchmark) and hands each object to the room that owns it:

- `inventory.Inventory`: what the cluster has (devices per node from the highest generation of
  each pool, device classes, nodes' allocatable, taints and labels);
- `ledger.UsageLedger`: who holds what (each claim's use of its devices, pods' CPU and memory
  per node, assumed plans, defrag trials' take-out and put-back) and each claim's quota charges;
- `caches.NodeClasses`: node equivalence classes and the searches and rankings memoised per
  class; `caches.Compiled`: claim specs compiled once and selector verdicts;
- `policies.PlannerPolicies`: the GPU policies (`set_policies`): quota usage per namespace from
  the same claims, the sharing rules, and the queue of pods waiting for quota.

The composition does the bookkeeping between them: a change to a node's devices or usage marks
its class dirty, a change to the classes or the policies bumps `generation` and drops every
memoised search. Its attributes are the rooms' own tables (the same objects), so reading them
costs what it did when one object held them all.

It must not do I/O, log, or look at the clock: callers decide when objects change.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dra_gateway.allocator.planner.caches import Compiled, NodeClasses
from dra_gateway.allocator.planner.inventory import (
    DeviceClassInfo,
    Interner,
    Inventory,
    NodeInfo,
)
from dra_gateway.allocator.planner.ledger import (
    ClaimRecord,
    DeviceUsage,
    PodRecord,
    TakenOut,
    UsageLedger,
    Use,
)
from dra_gateway.allocator.planner.policies import PlannerPolicies
from dra_gateway.allocator.planner.scoring import Workload
from dra_gateway.allocator.planner.settings import PlannerSettings
from dra_gateway.policy.catalog import Catalog


class ClusterState:
    """Devices, classes, nodes and everything allocated, updated incrementally."""

    def __init__(self, settings: PlannerSettings | None = None) -> None:
        self.settings = settings or PlannerSettings()
        self.workload = Workload()
        self.workload_given = False
        self.generation = 0  # bumped on changes that can alter a memoised plan
        self.policies = PlannerPolicies()
        self.inventory = Inventory(self.settings, Interner())
        dirty: set[str] = set()
        self.ledger = UsageLedger(self.inventory, self.policies, dirty.add)
        self.node_classes = NodeClasses(self.inventory, self.ledger, self.policies, dirty)
        self.compiled = Compiled()
        # The rooms' tables and lookups, under the names the planner reads.
        self.devices = self.inventory.devices
        self.node_devices = self.inventory.node_devices
        self.classes = self.inventory.classes
        self.nodes = self.inventory.nodes
        self.smallest_card_memory = self.inventory.smallest_card_memory
        self.typical_card_memory = self.inventory.typical_card_memory
        self.pods = self.ledger.pods
        self.claims = self.ledger.claims
        self.usage = self.ledger.usage
        self.node_used = self.ledger.node_used
        self.device_usage = self.ledger.device_usage
        self.node_free = self.ledger.node_free
        self.set_pod = self.ledger.set_pod
        self.remove_pod = self.ledger.remove_pod
        self.set_claim = self.ledger.set_claim
        self.remove_claim = self.ledger.remove_claim
        self.assume = self.ledger.assume
        self.forget = self.ledger.forget
        self.take_out = self.ledger.take_out
        self.put_back = self.ledger.put_back
        self.node_group = self.node_classes.node_group
        self.groups = self.node_classes.groups
        self.group_log = self.node_classes.group_log
        self.rankings = self.node_classes.rankings
        self.refresh_groups = self.node_classes.refresh
        self.group_key = self.node_classes.group_key
        self.holder_summary = self.node_classes.holder_summary
        self.verdicts = self.compiled.verdicts
        self.demand = self.compiled.demand
        self.shapes = self.compiled.shapes
        self.verdict_for = self.compiled.verdict_for

    # Searches memoised per node class (the young and the old generation, `NodeClasses.age_memo`).

    @property
    def memo(self) -> dict[tuple[object, ...], Any]:
        return self.node_classes.memo

    @property
    def memo_old(self) -> dict[tuple[object, ...], Any]:
        return self.node_classes.memo_old

    # --- workload and policies ----------------------------------------------------------------

    def set_workload(self, workload: Workload) -> None:
        """Score the `default` strategy against this distribution instead of learning one."""
        self.workload = workload
        self.workload_given = True

    def set_policies(self, catalog: Catalog) -> None:
        """Apply the cluster's GPUQuotas and GPUSharingPolicies (and namespace labels): usage
        is counted again from every claim held, and every memoised search is dropped."""
        self.policies.set_catalog(catalog)
        self.ledger.recount_quotas()
        self.node_classes.dirty.update(self.nodes)
        self._changed()

    def _changed(self) -> None:
        self.generation += 1
        self.node_classes.forget_searches()

    # --- slices, classes and nodes ------------------------------------------------------------

    def set_slice(self, obj: Mapping[str, Any]) -> None:
        self._devices_listed(self.inventory.set_slice(obj))

    def remove_slice(self, name: str) -> None:
        nodes = self.inventory.remove_slice(name)
        if nodes is not None:
            self._devices_listed(nodes)

    def _devices_listed(self, nodes: set[str]) -> None:
        for node in nodes:
            self.node_classes.devices_listed(node)
        self.ledger.recount_unresolved()

    def set_device_class(self, obj: Mapping[str, Any]) -> None:
        self.inventory.set_device_class(obj)
        self._changed()

    def remove_device_class(self, name: str) -> None:
        self.inventory.remove_device_class(name)
        self._changed()

    def set_node(self, obj: Mapping[str, Any]) -> None:
        self.node_classes.dirty.add(self.inventory.set_node(obj))

    def remove_node(self, name: str) -> None:
        if self.inventory.remove_node(name):
            self.node_classes.dirty.add(name)


__all__ = ["ClaimRecord", "ClusterState", "DeviceClassInfo", "DeviceUsage", "NodeInfo",
           "PodRecord", "TakenOut", "Use"]

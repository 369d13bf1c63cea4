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
costs what it did when one object held them all; the two lookups of every search
(`device_usage`, `node_free`) read them directly.

It must not do I/O, log, or look at the clock: callers decide when objects change.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dra_gateway.allocator.planner.caches import Compiled, NodeClasses
from dra_gateway.allocator.planner.demand import ClaimDemand
from dra_gateway.allocator.planner.devices import Device
from dra_gateway.allocator.planner.fragmentation import Workload
from dra_gateway.allocator.planner.inputs import NodeClassKey
from dra_gateway.allocator.planner.inventory import (
    DeviceClassInfo,
    Interner,
    Inventory,
    NodeInfo,
)
from dra_gateway.allocator.planner.ledger import (
    FREE_USAGE,
    ClaimRecord,
    DeviceUsage,
    PodRecord,
    TakenOut,
    UsageLedger,
    Use,
)
from dra_gateway.allocator.planner.memokeys import HolderSummary
from dra_gateway.allocator.planner.policies import PlannerPolicies
from dra_gateway.allocator.planner.settings import PlannerSettings
from dra_gateway.policy.amounts import DeviceCharge, RequestShape
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
        self.pods = self.ledger.pods
        self.claims = self.ledger.claims
        self.usage = self.ledger.usage
        self.node_used = self.ledger.node_used
        self.node_group = self.node_classes.node_group
        self.groups = self.node_classes.groups
        self.rankings = self.node_classes.rankings
        self.verdicts = self.compiled.verdicts

    # The rooms' methods, as methods of the class: the interpreter specialises calls of
    # methods, not of bound methods kept on the instance.

    def device_usage(self, key: tuple[str, str, str]) -> DeviceUsage:
        return self.usage.get(key, FREE_USAGE)

    def node_free(self, node: str) -> tuple[int, int]:
        info = self.nodes.get(node)
        used = self.node_used.get(node, (0, 0))
        if info is None or not info.known:
            return (0, 0)
        return (info.cpu - used[0], info.memory - used[1])

    def smallest_card_memory(self) -> int:
        return self.inventory.smallest_card_memory()

    def typical_card_memory(self) -> int:
        return self.inventory.typical_card_memory()

    def set_pod(self, obj: Mapping[str, Any]) -> None:
        self.ledger.set_pod(obj)

    def remove_pod(self, uid: str) -> None:
        self.ledger.remove_pod(uid)
        self.ledger.remove_legacy_pod(uid)

    def set_legacy_pod(self, uid: str, namespace: str,
                       charges: Sequence[DeviceCharge]) -> None:
        self.ledger.set_legacy_pod(uid, namespace, charges)

    def set_claim(self, obj: Mapping[str, Any]) -> None:
        self.ledger.set_claim(obj)

    def remove_claim(self, uid: str) -> None:
        self.ledger.remove_claim(uid)

    def assume(self, pod: Mapping[str, Any], plan: Any) -> None:
        self.ledger.assume(pod, plan)

    def forget(self, pod: Mapping[str, Any], plan: Any) -> None:
        self.ledger.forget(pod, plan)

    def take_out(self, pod_uid: str, claim_uids: Sequence[str]) -> TakenOut:
        return self.ledger.take_out(pod_uid, claim_uids)

    def put_back(self, taken: TakenOut) -> None:
        self.ledger.put_back(taken)

    def refresh_groups(self) -> None:
        self.node_classes.refresh()

    def group_key(self, node: str) -> NodeClassKey:
        return self.node_classes.group_key(node)

    def holder_summary(self, group_key: NodeClassKey) -> HolderSummary:
        return self.node_classes.holder_summary(group_key)

    def demand(self, spec: Mapping[str, Any]) -> tuple[str, ClaimDemand]:
        return self.compiled.demand(spec)

    def shapes(self, key: str, spec: Mapping[str, Any]) -> list[RequestShape]:
        return self.compiled.shapes(key, spec)

    def verdict_for(self, device: Device, expression: str, selector: Any,
                    identity_sensitive: bool) -> bool | str:
        return self.compiled.verdict_for(device, expression, selector, identity_sensitive)

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

    # --- filled at once -------------------------------------------------------------------------

    def load(self, *, catalog: Catalog | None = None,
             classes: Iterable[Mapping[str, Any]] = (), nodes: Iterable[Mapping[str, Any]] = (),
             slices: Iterable[Mapping[str, Any]] = (), claims: Iterable[Mapping[str, Any]] = (),
             pods: Iterable[Mapping[str, Any]] = ()) -> None:
        """Fill the state from a cluster's objects, in the one order every reader of a cluster
        uses (the allocator's rebuild, defrag's and preemption's view, the benches): the GPU
        policies, then what the cluster has (device classes, nodes, slices), then who holds
        it (claims, pods)."""
        if catalog is not None:
            self.set_policies(catalog)
        for obj in classes:
            self.set_device_class(obj)
        for obj in nodes:
            self.set_node(obj)
        for obj in slices:
            self.set_slice(obj)
        for obj in claims:
            self.set_claim(obj)
        for obj in pods:
            self.set_pod(obj)


__all__ = ["ClaimRecord", "ClusterState", "DeviceClassInfo", "DeviceUsage", "NodeInfo",
           "PodRecord", "TakenOut", "Use"]

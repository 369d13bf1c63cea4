"""What the planner remembers: node equivalence classes, memoised searches, compiled requests.

`NodeClasses` groups nodes into equivalence classes: nodes with interchangeable devices, the
same usage of each, the same free CPU and memory and the same taints plan identically, so the
planner evaluates one node per class and memoises the result (`memo`, `memo_old`) and keeps a
ranking of classes per pod signature (`rankings`, caught up from `joined`). With sharing
policies in force, the usage of a card includes what its holders bring to the sharing rules
(`memokeys.card_fact`: their tenant when isolated, their count near a maxClaimsPerDevice;
nothing for a card held whole, which nobody joins), or isolation would be memoised away, and no
more, or every namespace's holders would split the classes. Classes are rebuilt lazily for the
nodes marked dirty (by the inventory's and the ledger's changes).

`Compiled` remembers what is read from a claim spec or a selector once: the compiled demand,
the requests as quotas read them, and selector verdicts per device content.

Both only read the inventory, the ledger and the policies. Pure: no I/O, no clock.
"""

from __future__ import annotations

import json
from bisect import insort
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from dra_gateway.allocator.planner.demand import ClaimDemand, compile_claim
from dra_gateway.allocator.planner.devices import Device
from dra_gateway.allocator.planner.inputs import NodeClassKey, PodInputs
from dra_gateway.allocator.planner.inventory import Inventory
from dra_gateway.allocator.planner.ledger import DeviceUsage, UsageLedger
from dra_gateway.allocator.planner.memokeys import (
    NO_HOLDERS,
    CardFact,
    HolderSummary,
    card_fact,
    fact_without_tenant,
    summarise_holders,
)
from dra_gateway.allocator.planner.policies import PlannerPolicies
from dra_gateway.policy.amounts import RequestShape, requests_of


class NodeClasses:
    """Equivalence classes of nodes, and the searches and rankings memoised per class."""

    def __init__(self, inventory: Inventory, ledger: UsageLedger, policies: PlannerPolicies,
                 dirty: set[str]) -> None:
        self._nodes = inventory.nodes  # the inventory's tables, read on hot paths
        self._node_devices = inventory.node_devices
        self._inventory = inventory
        self._ledger = ledger
        self._policies = policies
        self._intern = inventory.intern
        self.dirty = dirty  # nodes whose class may have changed
        self.node_group: dict[str, NodeClassKey] = {}
        self.groups: dict[NodeClassKey, list[str]] = {}
        self._static_sig: dict[str, int] = {}
        self.memo: dict[tuple[object, ...], Any] = {}
        self.memo_old: dict[tuple[object, ...], Any] = {}
        # Every class that has members, by the sequence number of its last creation or join,
        # oldest first: rankings of pod signatures catch up from here (`joined_since`), never
        # reading classes that emptied meanwhile.
        self.joined: dict[NodeClassKey, int] = {}
        self.joins = 0
        # Classes a node left (or that emptied), in order: the rankings' counts of the nodes
        # each reason bars follow them (`visit.caught_up`).
        self.left_log: list[NodeClassKey] = []
        self.rankings: dict[PodInputs, Any] = {}
        # What `memo_rules` reads of each node class's held cards, by usage id (which, with
        # sharing policies in force, names the node's devices too).
        self._holder_summaries: dict[object, HolderSummary] = {}

    def devices_listed(self, node: str) -> None:
        """The node's devices were listed again (its slices changed)."""
        devices = self._node_devices.get(node, ())
        self._static_sig[node] = self._intern((tuple(d.group_id for d in devices),
                                               self._inventory.counter_sig(node)))
        self.dirty.add(node)

    def forget_searches(self) -> None:
        """Drop every memoised search and ranking (classes, policies changed)."""
        self.memo.clear()
        self.memo_old.clear()
        self.rankings.clear()

    def age_memo(self) -> None:
        """Bounded memory without a cliff: the young generation becomes the old one, entries
        still in use are promoted back on their next hit, dead ones go with the old."""
        self.memo_old = self.memo
        self.memo = {}

    def refresh(self) -> None:
        """Move dirty nodes to the equivalence class of their current state."""
        if len(self.left_log) > 200_000:
            self.left_log.clear()
            self.rankings.clear()
        nodes = self._nodes
        for node in self.dirty:
            old = self.node_group.pop(node, None)
            if old is not None:
                members = self.groups.get(old)
                if members is not None:
                    members.remove(node)
                    if not members:
                        del self.groups[old]
                        del self.joined[old]
                    self.left_log.append(old)
            info = nodes.get(node)
            if info is None or not info.known:
                continue
            key = self.group_key(node)
            self.node_group[node] = key
            members = self.groups.get(key)
            if members is None:
                members = self.groups[key] = []
            insort(members, node)
            self.joined.pop(key, None)
            self.joined[key] = self.joins
            self.joins += 1
        self.dirty.clear()

    def joined_since(self, position: int) -> list[NodeClassKey]:
        """The classes with members created or joined at or after `position` (a `joins`)."""
        since: list[NodeClassKey] = []
        joined = self.joined
        for key in reversed(joined):
            if joined[key] < position:
                break
            since.append(key)
        return since

    def group_key(self, node: str) -> NodeClassKey:
        info = self._nodes[node]
        devices = self._node_devices.get(node, ())
        static = self._static_sig.get(node, -1)
        device_usage = self._ledger.device_usage
        usages = [device_usage(d.key) for d in devices]
        sigs = tuple([self._intern(u.sig()) for u in usages])
        # What the rankings' searches read (`EVERY_TENANT`): the cards' usage alone.
        bare = self._intern((static, sigs))
        usage_id = bare
        if self._policies.sharing_active:
            # A card held whole takes nobody else, whoever holds it: its holders' tenant and
            # count would only split classes that plan alike (a node where an isolated tenant
            # holds whole cards is no class of that tenant's).
            facts = self._facts(usages)
            if facts.count(None) != len(facts):
                # With the node's devices, so that the id alone names its `holder_summary`.
                usage_id = self._intern((static, tuple([
                    sig if fact is None else self._intern((sig, fact))
                    for sig, fact in zip(sigs, facts, strict=True)])))
        cpu, memory = self._ledger.node_free(node)
        taints = self._intern(json.dumps(info.taints, sort_keys=True)) if info.taints else -1
        return NodeClassKey(static, usage_id, cpu, memory, taints, bare)

    def _facts(self, usages: Sequence[DeviceUsage]) -> list[CardFact | None]:
        """Each card's holder facts (None for a card nobody holds or one held whole), read
        once per change of its holders."""
        policies = self._policies
        facts: list[CardFact | None] = []
        for usage in usages:
            if usage.exclusive or not usage.holders:
                facts.append(None)
                continue
            read = usage.fact_of
            if read is None or read[0] != policies.generation:
                read = usage.fact_of = (policies.generation, card_fact(
                    policies.holder, policies.count_from, usage.namespaces))
            facts.append(read[1])
        return facts

    def holder_summary(self, group_key: NodeClassKey) -> HolderSummary:
        """The held cards of a node class, as `memo_rules` reads them (read from a member
        the first time a class of its usage is asked: the rankings' searches never ask)."""
        summary = self._holder_summaries.get(group_key.usage)
        if summary is None:
            members = self.groups.get(group_key)
            if not members or not self._policies.sharing_active:
                return NO_HOLDERS
            summary = self._holder_summaries[group_key.usage] = self._summary(members[0])
        return summary

    def _summary(self, node: str) -> HolderSummary:
        devices = self._node_devices.get(node, ())
        usages = [self._ledger.device_usage(d.key) for d in devices]
        facts = self._facts(usages)
        summary = summarise_holders(
            (fact for u, fact in zip(usages, facts, strict=True)
             if u.holders and not u.exclusive),
            free=sum(1 for d, u in zip(devices, usages, strict=True)
                     if d.is_gateway_gpu and not u.holders))
        if any(summary.tenants - {""}):
            sigs = [self._intern(u.sig()) for u in usages]
            neutral = self._intern((self._static_sig.get(node, -1), tuple([
                sig if (untenanted := fact_without_tenant(fact)) is None
                else self._intern((sig, untenanted))
                for sig, fact in zip(sigs, facts, strict=True)])))
            summary = replace(summary, neutral=neutral)
        return summary


class Compiled:
    """Claim specs compiled once, and selector verdicts per device (content)."""

    def __init__(self) -> None:
        self._demands: dict[str, ClaimDemand] = {}
        self._shapes: dict[str, list[RequestShape]] = {}
        self.verdicts: dict[tuple[int, str], bool | str] = {}

    def demand(self, spec: Mapping[str, Any]) -> tuple[str, ClaimDemand]:
        key = json.dumps(spec, sort_keys=True, separators=(",", ":"))
        demand = self._demands.get(key)
        if demand is None:
            if len(self._demands) > 10_000:
                self._demands.clear()
            demand = compile_claim(spec)
            self._demands[key] = demand
        return key, demand

    def shapes(self, key: str, spec: Mapping[str, Any]) -> list[RequestShape]:
        """The gateway-class requests of a claim spec as quotas read them (cached by spec)."""
        shapes = self._shapes.get(key)
        if shapes is None:
            if len(self._shapes) > 10_000:
                self._shapes.clear()
            shapes = requests_of(spec)
            self._shapes[key] = shapes
        return shapes

    def verdict_for(self, device: Device, expression: str, selector: Any,
                    identity_sensitive: bool) -> bool | str:
        """A selector's verdict on a device: True, False, or the evaluation error's message.

        Cached per device until its slice changes; a selector that cannot see identity
        attributes is cached per device content, so identical devices of identical nodes are
        evaluated once.
        """
        if identity_sensitive:
            cached = device.verdicts.get(expression)
            if cached is None:
                cached = _evaluate(device, selector)
                device.verdicts[expression] = cached
            return cached
        key = (device.group_id, expression)
        cached = self.verdicts.get(key)
        if cached is None:
            cached = _evaluate(device, selector)
            self.verdicts[key] = cached
        return cached


def _evaluate(device: Device, selector: Any) -> bool | str:
    from dra_gateway.kube import cel

    try:
        return bool(selector.matches(device.view()))
    except cel.CelError as exc:
        return str(exc) or "evaluation error"


__all__ = ["Compiled", "NodeClasses"]

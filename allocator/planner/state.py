"""The planner's view of the cluster: devices, classes, nodes, pods and every allocation.

`ClusterState` is fed object by object (from watches in the controller, from a trace in the
benchmark) and keeps incremental indexes:

- devices per node in slice order, only from the highest generation of each pool;
- what is consumed on each device, from every allocated claim whatever its writer (results with
  `consumedCapacity`, results without it as exclusive use, and in the fallback world the shares
  the allocator recorded in the allocation, kube.shares; never the annotation), plus plans
  assumed but not yet written;
- CPU and memory requested on each node by the pods bound or planned there;
- equivalence classes of nodes: nodes with interchangeable devices, the same usage of each, the
  same free CPU and memory and the same taints plan identically, so the planner evaluates one
  node per class and memoises the result; with sharing policies in force, the usage of a card
  includes what its holders bring to the sharing rules (`PlannerPolicies.card_fact`: their
  tenant when isolated, their count near a maxClaimsPerDevice; nothing for a card held whole,
  which nobody joins), or isolation would be memoised away, and no more, or every namespace's
  holders would split the classes;
- the GPU policies (`set_policies`): quota usage per namespace from the same claims, and the
  queue of pods waiting for quota (`policies.PlannerPolicies`).

It must not do I/O, log, or look at the clock: callers decide when objects change.

The indexes (node classes, usage per device, learned workload) live with the cluster they
index because they must change together with it.
"""

from __future__ import annotations

import json
from bisect import insort
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dra_gateway.allocator.planner import kubefit
from dra_gateway.allocator.planner.demand import ClaimDemand, compile_claim
from dra_gateway.allocator.planner.devices import Device
from dra_gateway.allocator.planner.policies import (
    NO_HOLDERS,
    CardFact,
    HolderSummary,
    PlannerPolicies,
)
from dra_gateway.allocator.planner.scoring import Workload
from dra_gateway.allocator.planner.settings import PlannerSettings
from dra_gateway.kube import objects
from dra_gateway.kube.quantity import QuantityError, parse_quantity
from dra_gateway.kube.shares import allocated_shares, result_key, shares_by_result
from dra_gateway.policy.amounts import DeviceCharge, RequestShape, charges_of, requests_of
from dra_gateway.policy.catalog import Catalog


@dataclass(slots=True)
class DeviceClassInfo:
    name: str
    selectors: tuple[Any, ...]
    expressions: tuple[str, ...]
    configs: tuple[Mapping[str, Any], ...]
    error: str | None = None


@dataclass(slots=True)
class NodeInfo:
    name: str
    cpu: int = 0  # allocatable, milli
    memory: int = 0  # allocatable, bytes
    taints: tuple[Mapping[str, Any], ...] = ()
    labels: Mapping[str, str] = field(default_factory=dict)
    known: bool = False  # a Node object was seen (slices may come first)


@dataclass(slots=True)
class Use:
    """One claim's use of one device."""

    consumed: dict[str, int]
    exclusive: bool
    share_id: str | None = None


@dataclass(slots=True)
class DeviceUsage:
    consumed: dict[str, int] = field(default_factory=dict)
    holders: int = 0
    exclusive: int = 0
    namespaces: dict[str, int] = field(default_factory=dict)  # holders per namespace
    # The holders' `card_fact` and the policies' generation it was read under; None until
    # read, and again after each change.
    fact_of: tuple[int, CardFact | None] | None = None

    def add(self, use: Use, sign: int, namespace: str = "") -> None:
        self.fact_of = None
        held = self.namespaces.get(namespace, 0) + sign
        if held > 0:
            self.namespaces[namespace] = held
        else:
            self.namespaces.pop(namespace, None)
        for cap_name, amount in use.consumed.items():
            left = self.consumed.get(cap_name, 0) + sign * amount
            if left:
                self.consumed[cap_name] = left
            else:
                self.consumed.pop(cap_name, None)
        self.holders += sign
        if use.exclusive:
            self.exclusive += sign

    def sig(self) -> tuple[object, ...]:
        return (self.exclusive > 0, self.holders > 0, tuple(sorted(self.consumed.items())))


_FREE_USAGE = DeviceUsage()


@dataclass(slots=True)
class ClaimRecord:
    uses: dict[tuple[str, str, str], Use]
    assumed: bool
    namespace: str = ""
    # The claim as allocated (for quota charges), or the charges an assumed plan computed.
    source: Mapping[str, Any] | None = None
    charges: tuple[DeviceCharge, ...] | None = None


@dataclass(slots=True)
class PodRecord:
    node: str
    cpu: int
    memory: int
    assumed: bool


@dataclass(slots=True)
class TakenOut:
    """What `ClusterState.take_out` removed, for `put_back`."""

    pod_uid: str
    pod: PodRecord | None
    claims: dict[str, ClaimRecord]


def _result_key(result: Mapping[str, Any]) -> tuple[str, str, str]:
    return (result.get("driver", ""), result.get("pool", ""), result.get("device", ""))


class ClusterState:
    """Indexes of devices, classes, nodes and everything allocated, updated incrementally."""

    def __init__(self, settings: PlannerSettings | None = None) -> None:
        self.settings = settings or PlannerSettings()
        self.workload = Workload()
        self.workload_given = False
        self._slices: dict[str, Mapping[str, Any]] = {}
        self._pool_generation: dict[tuple[str, str], int] = {}
        self._pool_slices: dict[tuple[str, str], set[str]] = {}
        self._pool_devices: dict[tuple[str, str], list[Device]] = {}
        self._node_pools: dict[str, set[tuple[str, str]]] = {}
        self.devices: dict[tuple[str, str, str], Device] = {}
        self.node_devices: dict[str, list[Device]] = {}
        self.classes: dict[str, DeviceClassInfo] = {}
        self.nodes: dict[str, NodeInfo] = {}
        self.node_used: dict[str, list[int]] = {}
        self.pods: dict[str, PodRecord] = {}
        self.claims: dict[str, ClaimRecord] = {}
        self.usage: dict[tuple[str, str, str], DeviceUsage] = {}
        # Equivalence classes of nodes (see module docstring), rebuilt lazily for dirty nodes.
        self._dirty: set[str] = set()
        self.node_group: dict[str, tuple[object, ...]] = {}
        self.groups: dict[tuple[object, ...], list[str]] = {}
        self._static_sig: dict[str, int] = {}
        self._sig_ids: dict[object, int] = {}
        self._serial = 0
        self.generation = 0  # bumped on changes that can alter a memoised plan
        self.memo: dict[tuple[object, ...], Any] = {}
        self.memo_old: dict[tuple[object, ...], Any] = {}
        # Classes created or joined, in order: rankings of pod signatures catch up from here.
        self.group_log: list[tuple[object, ...]] = []
        self.rankings: dict[tuple[object, ...], Any] = {}
        self._demands: dict[str, ClaimDemand] = {}
        self._shapes: dict[str, list[RequestShape]] = {}
        self.verdicts: dict[tuple[int, str], bool | str] = {}
        self.policies = PlannerPolicies()
        # Claims whose quota charges were counted before their device was published.
        self._unresolved: set[str] = set()
        self._smallest: int | None = None
        # What `memo_rules` reads of each node class's held cards, by usage id (which, with
        # sharing policies in force, names the node's devices too).
        self._holder_summaries: dict[object, HolderSummary] = {}

    # --- workload -----------------------------------------------------------------------------

    def set_workload(self, workload: Workload) -> None:
        """Score the `default` strategy against this distribution instead of learning one."""
        self.workload = workload
        self.workload_given = True

    # --- policies -----------------------------------------------------------------------------

    def set_policies(self, catalog: Catalog) -> None:
        """Apply the cluster's GPUQuotas and GPUSharingPolicies (and namespace labels): usage
        is counted again from every claim held, and every memoised search is dropped."""
        self.policies.set_catalog(catalog)
        self._unresolved.clear()
        for uid, record in self.claims.items():
            self._count_quota(uid, record)
        self._dirty.update(self.nodes)
        self._changed()

    def _count_quota(self, uid: str, record: ClaimRecord) -> None:
        if not self.policies.has_quotas(record.namespace):
            return
        charges = record.charges
        if charges is None:
            charges = tuple(charges_of(record.source or {}, self._device_raw))
            if any(c.device is None for c in charges):
                self._unresolved.add(uid)
        self.policies.ledger.set_claim(uid, record.namespace, charges)

    def _device_raw(self, key: tuple[str, str, str]) -> Mapping[str, Any] | None:
        device = self.devices.get(key)
        return device.raw if device is not None else None

    def shapes(self, key: str, spec: Mapping[str, Any]) -> list[RequestShape]:
        """The gateway-class requests of a claim spec as quotas read them (cached by spec)."""
        shapes = self._shapes.get(key)
        if shapes is None:
            if len(self._shapes) > 10_000:
                self._shapes.clear()
            shapes = requests_of(spec)
            self._shapes[key] = shapes
        return shapes

    # --- slices and classes -------------------------------------------------------------------

    def set_slice(self, obj: Mapping[str, Any]) -> None:
        name = objects.name(obj)
        old = self._slices.get(name)
        if old is not None:
            self._unindex_pool(old)
        self._slices[name] = obj
        self._reindex_pool(obj)

    def remove_slice(self, name: str) -> None:
        old = self._slices.pop(name, None)
        if old is not None:
            self._unindex_pool(old)
            self._rebuild_pool(self._pool_of(old))

    @staticmethod
    def _pool_of(obj: Mapping[str, Any]) -> tuple[str, str]:
        spec = obj.get("spec") or {}
        return (spec.get("driver", ""), (spec.get("pool") or {}).get("name", ""))

    def _unindex_pool(self, obj: Mapping[str, Any]) -> None:
        pool = self._pool_of(obj)
        slices = self._pool_slices.get(pool)
        if slices is not None:
            slices.discard(objects.name(obj))

    def _reindex_pool(self, obj: Mapping[str, Any]) -> None:
        pool = self._pool_of(obj)
        self._pool_slices.setdefault(pool, set()).add(objects.name(obj))
        self._rebuild_pool(pool)

    def _rebuild_pool(self, pool: tuple[str, str]) -> None:
        """Replace the pool's devices by those of its highest generation (upstream rule)."""
        names_ = self._pool_slices.get(pool, set())
        slices = [self._slices[n] for n in sorted(names_) if n in self._slices]
        touched: set[str] = set()
        self._smallest = None
        for device in self._pool_devices.pop(pool, ()):
            self.devices.pop(device.key, None)
            if device.node is not None:
                touched.add(device.node)
        if not slices:
            self._pool_slices.pop(pool, None)
            self._pool_generation.pop(pool, None)
        else:
            top = max(int(((s.get("spec") or {}).get("pool") or {}).get("generation", 0))
                      for s in slices)
            self._pool_generation[pool] = top
            devices: list[Device] = []
            for s in slices:
                spec = s.get("spec") or {}
                if int((spec.get("pool") or {}).get("generation", 0)) != top:
                    continue
                node = spec.get("nodeName")
                for raw in spec.get("devices") or ():
                    device = Device(driver=pool[0], pool=pool[1], node=node, raw=raw,
                                    consumable_capacity=self.settings.consumable_capacity)
                    device.group_id = self._intern(device.group)
                    self._serial += 1
                    device.serial = self._serial
                    self.devices[device.key] = device
                    devices.append(device)
                    if node:
                        touched.add(node)
                        self._node_pools.setdefault(node, set()).add(pool)
            self._pool_devices[pool] = devices
        for node in touched:
            self._reindex_node_devices(node)
        if self._unresolved:
            # Quota charges counted before their devices were published: count them again.
            pending, self._unresolved = self._unresolved, set()
            for uid in pending:
                record = self.claims.get(uid)
                if record is not None:
                    self._count_quota(uid, record)

    def _reindex_node_devices(self, node: str) -> None:
        # Slice order: pools by (driver, pool) name, devices as published (stable across
        # restarts because the node plugin builds slices in sorted order).
        pools = sorted(p for p in self._node_pools.get(node, ()) if p in self._pool_devices)
        devices = [d for p in pools for d in self._pool_devices[p] if d.node == node]
        if devices:
            self.node_devices[node] = devices
        else:
            self.node_devices.pop(node, None)
            self._node_pools.pop(node, None)
        self.nodes.setdefault(node, NodeInfo(node))
        sig = tuple(d.group_id for d in devices)
        self._static_sig[node] = self._intern(sig)
        self._touch(node)

    def _intern(self, value: object) -> int:
        ident = self._sig_ids.get(value)
        if ident is None:
            ident = len(self._sig_ids)
            self._sig_ids[value] = ident
        return ident

    def set_device_class(self, obj: Mapping[str, Any]) -> None:
        from dra_gateway.kube import cel

        name = objects.name(obj)
        spec = obj.get("spec") or {}
        selectors: list[Any] = []
        expressions: list[str] = []
        error = None
        for i, selector in enumerate(spec.get("selectors") or ()):
            expression = ((selector or {}).get("cel") or {}).get("expression", "")
            try:
                selectors.append(cel.compile_selector(expression))
                expressions.append(expression)
            except cel.CelError as exc:
                error = f"DeviceClass {name}: spec.selectors[{i}].cel.expression: {exc}"
        configs = tuple(c for c in spec.get("config") or () if c.get("opaque"))
        self.classes[name] = DeviceClassInfo(name, tuple(selectors), tuple(expressions), configs,
                                             error)
        self._changed()

    def remove_device_class(self, name: str) -> None:
        self.classes.pop(name, None)
        self._changed()

    # --- nodes and pods -----------------------------------------------------------------------

    def set_node(self, obj: Mapping[str, Any]) -> None:
        name = objects.name(obj)
        cpu, memory = kubefit.node_allocatable(obj)
        info = self.nodes.setdefault(name, NodeInfo(name))
        info.cpu, info.memory = cpu, memory
        info.taints = tuple(kubefit.node_taints(obj))
        info.labels = dict(objects.labels(obj))
        info.known = True
        self._touch(name)

    def remove_node(self, name: str) -> None:
        info = self.nodes.get(name)
        if info is None:
            return
        info.known = False
        info.cpu = info.memory = 0
        self._touch(name)

    def set_pod(self, obj: Mapping[str, Any]) -> None:
        """Count a pod's CPU and memory on its node once it is bound (spec.nodeName)."""
        uid = objects.uid(obj)
        node = (obj.get("spec") or {}).get("nodeName")
        if kubefit.pod_is_finished(obj):
            self.remove_pod(uid)
            return
        if not node:
            # Not bound yet: a plan assumed for it keeps its CPU and memory reserved.
            old = self.pods.get(uid)
            if old is not None and not old.assumed:
                self.remove_pod(uid)
            return
        cpu, memory = kubefit.pod_requests(obj)
        self._put_pod(uid, PodRecord(node, cpu, memory, assumed=False))

    def remove_pod(self, uid: str) -> None:
        # Gone, finished or placed: it no longer waits for quota either.
        self.policies.queue.leave(uid)
        old = self.pods.pop(uid, None)
        if old is not None:
            self._add_node_use(old, -1)

    def _put_pod(self, uid: str, record: PodRecord) -> None:
        self.remove_pod(uid)
        self.pods[uid] = record
        self._add_node_use(record, 1)

    def _add_node_use(self, record: PodRecord, sign: int) -> None:
        used = self.node_used.setdefault(record.node, [0, 0])
        used[0] += sign * record.cpu
        used[1] += sign * record.memory
        self._touch(record.node)

    # --- claims -------------------------------------------------------------------------------

    def set_claim(self, obj: Mapping[str, Any]) -> None:
        """Record the claim's allocation, whoever wrote it; an unallocated claim holds nothing."""
        uid = objects.uid(obj)
        allocation = (obj.get("status") or {}).get("allocation")
        if not allocation:
            old = self.claims.get(uid)
            # An assumed plan stays until the write lands or is forgotten.
            if old is not None and not old.assumed:
                self.remove_claim(uid)
            return
        uses = self._uses_of(allocation, objects.annotations(obj))
        self._put_claim(uid, ClaimRecord(uses, assumed=False, namespace=objects.namespace(obj),
                                         source=obj))

    def remove_claim(self, uid: str) -> None:
        old = self.claims.pop(uid, None)
        if old is not None:
            for key, use in old.uses.items():
                self._add_device_use(key, use, -1, old.namespace)
            self.policies.ledger.remove_claim(uid)
            self._unresolved.discard(uid)

    def _put_claim(self, uid: str, record: ClaimRecord) -> None:
        self.remove_claim(uid)
        self.claims[uid] = record
        for key, use in record.uses.items():
            self._add_device_use(key, use, 1, record.namespace)
        self._count_quota(uid, record)

    def _add_device_use(self, key: tuple[str, str, str], use: Use, sign: int,
                        namespace: str) -> None:
        usage = self.usage.setdefault(key, DeviceUsage())
        usage.add(use, sign, namespace)
        if usage.holders <= 0:
            self.usage.pop(key, None)
        device = self.devices.get(key)
        if device is not None and device.node:
            self._touch(device.node)

    def _uses_of(self, allocation: Mapping[str, Any],
                 annotations: Mapping[str, str]) -> dict[tuple[str, str, str], Use]:
        # The allocation's own record, never the annotation a tenant may edit (kube.shares).
        recorded = shares_by_result(allocated_shares(allocation))
        uses: dict[tuple[str, str, str], Use] = {}
        results = ((allocation.get("devices") or {}).get("results")) or ()
        for result in results:
            key = _result_key(result)
            consumed_raw = result.get("consumedCapacity")
            share_id = result.get("shareID")
            entries = recorded.get(result_key(result)) if consumed_raw is None else None
            if entries:
                entry = entries.pop(0)
                consumed_raw, share_id = entry.consumed_capacity, entry.share_id
            consumed: dict[str, int] = {}
            for cap_name, value in (consumed_raw or {}).items():
                try:
                    consumed[cap_name] = parse_quantity(value).nanos
                except QuantityError:
                    continue
            # A result without a share (no consumedCapacity, nowhere recorded) holds the device
            # alone: that is how the scheduler and non-sharing drivers allocate.
            device = self.devices.get(key)
            exclusive = consumed_raw is None or (
                # A share of everything is a whole card, whoever wrote it.
                device is not None and bool(device.capacity) and consumed == device.capacity)
            if consumed_raw is None:
                consumed = dict(device.capacity) if device is not None else {}
            previous = uses.get(key)
            if previous is not None:
                for cap_name, amount in consumed.items():
                    previous.consumed[cap_name] = previous.consumed.get(cap_name, 0) + amount
                previous.exclusive = previous.exclusive or exclusive
            else:
                uses[key] = Use(consumed, exclusive, share_id)
        return uses

    # --- plans --------------------------------------------------------------------------------

    def assume(self, pod: Mapping[str, Any], plan: Any) -> None:
        """Reserve a plan's devices, CPU and memory before it is written."""
        if plan.node_name is None:
            return
        namespace = objects.namespace(pod)
        charges: Mapping[str, tuple[DeviceCharge, ...]] = getattr(plan, "charges", None) or {}
        for uid, allocation in plan.allocations.items():
            uses = self._uses_of(allocation, plan.annotations.get(uid) or {})
            self._put_claim(uid, ClaimRecord(uses, assumed=True, namespace=namespace,
                                             charges=charges.get(uid, ())))
        uid = objects.uid(pod)
        self.policies.queue.leave(uid)
        if uid and uid not in self.pods:
            cpu, memory = kubefit.pod_requests(pod)
            self._put_pod(uid, PodRecord(plan.node_name, cpu, memory, assumed=True))

    def forget(self, pod: Mapping[str, Any], plan: Any) -> None:
        """Undo `assume` when the write failed; records that came from the API stay."""
        for uid in plan.allocations:
            record = self.claims.get(uid)
            if record is not None and record.assumed:
                self.remove_claim(uid)
        uid = objects.uid(pod)
        record_pod = self.pods.get(uid)
        if record_pod is not None and record_pod.assumed:
            self.remove_pod(uid)

    def take_out(self, pod_uid: str, claim_uids: Sequence[str]) -> TakenOut:
        """Remove a pod's CPU, memory and claims as if it had left (a defrag trial);
        `put_back` undoes it exactly."""
        claims = {uid: self.claims[uid] for uid in claim_uids if uid in self.claims}
        for uid in claims:
            self.remove_claim(uid)
        pod = self.pods.get(pod_uid)
        if pod is not None:
            self.remove_pod(pod_uid)
        return TakenOut(pod_uid, pod, claims)

    def put_back(self, taken: TakenOut) -> None:
        for uid, record in taken.claims.items():
            self._put_claim(uid, record)
        if taken.pod is not None:
            self._put_pod(taken.pod_uid, taken.pod)

    # --- indexes used by the planner ----------------------------------------------------------

    def demand(self, spec: Mapping[str, Any]) -> tuple[str, ClaimDemand]:
        key = json.dumps(spec, sort_keys=True, separators=(",", ":"))
        demand = self._demands.get(key)
        if demand is None:
            if len(self._demands) > 10_000:
                self._demands.clear()
            demand = compile_claim(spec)
            self._demands[key] = demand
        return key, demand

    def device_usage(self, key: tuple[str, str, str]) -> DeviceUsage:
        return self.usage.get(key, _FREE_USAGE)

    def node_free(self, node: str) -> tuple[int, int]:
        info = self.nodes.get(node)
        used = self.node_used.get(node, (0, 0))
        if info is None or not info.known:
            return (0, 0)
        return (info.cpu - used[0], info.memory - used[1])

    def _touch(self, node: str) -> None:
        self._dirty.add(node)

    def _changed(self) -> None:
        self.generation += 1
        self.memo.clear()
        self.memo_old.clear()
        self.rankings.clear()

    def refresh_groups(self) -> None:
        """Move dirty nodes to the equivalence class of their current state."""
        if len(self.group_log) > 200_000:
            self.group_log.clear()
            self.rankings.clear()
        for node in self._dirty:
            old = self.node_group.pop(node, None)
            if old is not None:
                members = self.groups.get(old)
                if members is not None:
                    members.remove(node)
                    if not members:
                        del self.groups[old]
            info = self.nodes.get(node)
            if info is None or not info.known:
                continue
            key = self.group_key(node)
            self.node_group[node] = key
            members = self.groups.get(key)
            if members is None:
                members = self.groups[key] = []
            insort(members, node)
            self.group_log.append(key)
        self._dirty.clear()

    def group_key(self, node: str) -> tuple[object, ...]:
        info = self.nodes[node]
        devices = self.node_devices.get(node, ())
        static = self._static_sig.get(node, -1)
        usages = [self.device_usage(d.key) for d in devices]
        sigs = tuple([self._intern(u.sig()) for u in usages])
        # What the rankings' searches read (`EVERY_TENANT`): the cards' usage alone.
        bare = self._intern((static, sigs))
        usage_id = bare
        if self.policies.sharing_active:
            # A card held whole takes nobody else, whoever holds it: its holders' tenant and
            # count would only split classes that plan alike (a node where an isolated tenant
            # holds whole cards is no class of that tenant's).
            facts = self._facts(usages)
            if facts.count(None) != len(facts):
                # With the node's devices, so that the id alone names its `holder_summary`.
                usage_id = self._intern((static, tuple([
                    sig if fact is None else self._intern((sig, fact))
                    for sig, fact in zip(sigs, facts, strict=True)])))
        cpu, memory = self.node_free(node)
        taints = self._intern(json.dumps(info.taints, sort_keys=True)) if info.taints else -1
        return (static, usage_id, cpu, memory, taints, bare)

    def _facts(self, usages: Sequence[DeviceUsage]) -> list[CardFact | None]:
        """Each card's holder facts (None for a card nobody holds or one held whole), read
        once per change of its holders."""
        policies = self.policies
        facts: list[CardFact | None] = []
        for usage in usages:
            if usage.exclusive or not usage.holders:
                facts.append(None)
                continue
            read = usage.fact_of
            if read is None or read[0] != policies.generation:
                read = usage.fact_of = (policies.generation,
                                        policies.card_fact(usage.namespaces))
            facts.append(read[1])
        return facts

    def holder_summary(self, group_key: tuple[object, ...]) -> HolderSummary:
        """The held cards of a node class, as `memo_rules` reads them (read from a member
        the first time a class of its usage is asked: the rankings' searches never ask)."""
        summary = self._holder_summaries.get(group_key[1])
        if summary is None:
            members = self.groups.get(group_key)
            if not members or not self.policies.sharing_active:
                return NO_HOLDERS
            summary = self._holder_summaries[group_key[1]] = self._summary(members[0])
        return summary

    def _summary(self, node: str) -> HolderSummary:
        devices = self.node_devices.get(node, ())
        usages = [self.device_usage(d.key) for d in devices]
        facts = self._facts(usages)
        summary = self.policies.summary(
            (fact for u, fact in zip(usages, facts, strict=True)
             if u.holders and not u.exclusive),
            free=sum(1 for d, u in zip(devices, usages, strict=True)
                     if d.is_gateway_gpu and not u.holders))
        if any(summary.tenants - {""}):
            sigs = [self._intern(u.sig()) for u in usages]
            neutral = self._intern((self._static_sig.get(node, -1), tuple([
                sig if (untenanted := self.policies.fact_without_tenant(fact)) is None
                else self._intern((sig, untenanted))
                for sig, fact in zip(sigs, facts, strict=True)])))
            summary = replace(summary, neutral=neutral)
        return summary

    def smallest_card_memory(self) -> int:
        """Bytes of the smallest gateway GPU published (0 when none): a lower bound of what a
        whole card or a share relative to the card costs wherever it lands."""
        if self._smallest is None:
            self._smallest = min((d.gpu_memory for d in self.devices.values()
                                  if d.is_gateway_gpu), default=0)
        return self._smallest

    def typical_card_memory(self) -> int:
        sizes = sorted(d.gpu_memory for d in self.devices.values() if d.is_gateway_gpu)
        return sizes[len(sizes) // 2] if sizes else 16 << 30

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
                cached = self._evaluate(device, selector)
                device.verdicts[expression] = cached
            return cached
        key = (device.group_id, expression)
        cached = self.verdicts.get(key)
        if cached is None:
            cached = self._evaluate(device, selector)
            self.verdicts[key] = cached
        return cached

    @staticmethod
    def _evaluate(device: Device, selector: Any) -> bool | str:
        from dra_gateway.kube import cel

        try:
            return bool(selector.matches(device.view()))
        except cel.CelError as exc:
            return str(exc) or "evaluation error"


"""Who holds what: every allocated claim's use of its devices, and pods' CPU and memory.

`UsageLedger` records what is consumed on each device, from every allocated claim whatever its
writer (results with `consumedCapacity`, results without it as exclusive use, and in the
fallback world the shares the allocator recorded in the allocation, gpu.shares; never the
annotation), plus plans assumed but not yet written; the CPU and memory requested on each node
by the pods bound or planned there; and, through the quota counting hook, each claim's quota
charges in the policies' `QuotaLedger`, beside the charges of the pods a legacy device plugin
serves (`set_legacy_pod`: what their translation would cost, policy.legacyusage), so that a
namespace's GPUQuota counts both worlds while it moves.

It reads the inventory (a device's capacity and node) and tells `touch` which node's usage
changed; it keeps no memo. Pure: no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_gateway.allocator.planner import kubefit
from dra_gateway.allocator.planner.inventory import Inventory
from dra_gateway.allocator.planner.memokeys import CardFact
from dra_gateway.allocator.planner.policies import PlannerPolicies
from dra_gateway.gpu.shares import allocated_shares, result_key, shares_by_result
from dra_gateway.kube import objects
from dra_gateway.kube.quantity import QuantityError, parse_quantity
from dra_gateway.policy.amounts import DeviceCharge, charges_of
from dra_gateway.policy.legacyusage import LEGACY_CLAIM_PREFIX


def _amounts(consumed_raw: Mapping[str, Any] | None) -> dict[str, int] | None:
    """A result's `consumedCapacity` in nanos; None when an amount is not a quantity or is
    negative."""
    consumed: dict[str, int] = {}
    for cap_name, value in (consumed_raw or {}).items():
        try:
            amount = parse_quantity(value).nanos
        except QuantityError:
            return None
        if amount < 0:
            return None
        consumed[cap_name] = amount
    return consumed


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
    # read, and again after each change (kept here so that it goes stale with the usage).
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


FREE_USAGE = DeviceUsage()


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
    """What `take_out` removed, for `put_back`."""

    pod_uid: str
    pod: PodRecord | None
    claims: dict[str, ClaimRecord]


def _result_key(result: Mapping[str, Any]) -> tuple[str, str, str]:
    return (result.get("driver", ""), result.get("pool", ""), result.get("device", ""))


class UsageLedger:
    """Claims and pods held, by device and by node, with their quota charges."""

    def __init__(self, inventory: Inventory, policies: PlannerPolicies,
                 touch: Callable[[str], None]) -> None:
        self._inventory = inventory
        self._nodes = inventory.nodes  # the inventory's tables, read on hot paths
        self._devices = inventory.devices
        self._policies = policies
        self._touch = touch
        self.pods: dict[str, PodRecord] = {}
        self.claims: dict[str, ClaimRecord] = {}
        self.usage: dict[tuple[str, str, str], DeviceUsage] = {}
        self.node_used: dict[str, list[int]] = {}
        # Claims whose quota charges were counted before their device was published.
        self._unresolved: set[str] = set()
        # Pods a legacy device plugin serves: pod uid -> (namespace, their quota charges).
        self.legacy: dict[str, tuple[str, tuple[DeviceCharge, ...]]] = {}

    def device_usage(self, key: tuple[str, str, str]) -> DeviceUsage:
        return self.usage.get(key, FREE_USAGE)

    def node_free(self, node: str) -> tuple[int, int]:
        info = self._nodes.get(node)
        used = self.node_used.get(node, (0, 0))
        if info is None or not info.known:
            return (0, 0)
        return (info.cpu - used[0], info.memory - used[1])

    # --- quota counting -----------------------------------------------------------------------

    def recount_quotas(self) -> None:
        """Count every claim held again (the policies' catalog changed)."""
        self._unresolved.clear()
        for uid, record in self.claims.items():
            self._count_quota(uid, record)
        for uid in self.legacy:
            self._count_legacy(uid)

    def recount_unresolved(self) -> None:
        """Quota charges counted before their devices were published: count them again."""
        if self._unresolved:
            pending, self._unresolved = self._unresolved, set()
            for uid in pending:
                record = self.claims.get(uid)
                if record is not None:
                    self._count_quota(uid, record)

    def _count_quota(self, uid: str, record: ClaimRecord) -> None:
        if not self._policies.has_quotas(record.namespace):
            return
        charges = record.charges
        if charges is None:
            charges = tuple(charges_of(record.source or {}, self._inventory.device_raw))
            if any(c.device is None for c in charges):
                self._unresolved.add(uid)
        self._policies.ledger.set_claim(uid, record.namespace, charges)

    def set_legacy_pod(self, uid: str, namespace: str,
                       charges: Sequence[DeviceCharge]) -> None:
        """What a pod a legacy device plugin serves costs its namespace's quotas; no charges:
        it holds nothing (any more)."""
        if not charges:
            self.remove_legacy_pod(uid)
            return
        kept = tuple(charges)
        if self.legacy.get(uid) == (namespace, kept):
            return
        self.legacy[uid] = (namespace, kept)
        self._count_legacy(uid)

    def remove_legacy_pod(self, uid: str) -> None:
        if self.legacy.pop(uid, None) is not None:
            self._policies.ledger.remove_claim(LEGACY_CLAIM_PREFIX + uid)

    def _count_legacy(self, uid: str) -> None:
        namespace, charges = self.legacy[uid]
        if self._policies.has_quotas(namespace):
            self._policies.ledger.set_claim(LEGACY_CLAIM_PREFIX + uid, namespace, charges)

    # --- pods ---------------------------------------------------------------------------------

    def set_pod(self, obj: Mapping[str, Any]) -> None:
        """Count a pod's CPU and memory on its node once it is bound (spec.nodeName)."""
        uid = objects.uid(obj)
        node = (obj.get("spec") or {}).get("nodeName")
        if objects.is_finished(obj):
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
        self._policies.queue.leave(uid)
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
        uses = self._uses_of(allocation)
        self._put_claim(uid, ClaimRecord(uses, assumed=False, namespace=objects.namespace(obj),
                                         source=obj))

    def remove_claim(self, uid: str) -> None:
        old = self.claims.pop(uid, None)
        if old is not None:
            for key, use in old.uses.items():
                self._add_device_use(key, use, -1, old.namespace)
            self._policies.ledger.remove_claim(uid)
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
        device = self._devices.get(key)
        if device is not None and device.node:
            self._touch(device.node)

    def _uses_of(self, allocation: Mapping[str, Any]) -> dict[tuple[str, str, str], Use]:
        # The allocation's own record, never the annotation a tenant may edit (gpu.shares).
        recorded = shares_by_result(allocated_shares(allocation))
        devices = self._devices
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
            consumed = _amounts(consumed_raw)
            if consumed is None:
                # An amount the API refuses (negative, not a quantity: kube.api_rules), written
                # by someone else: counting it would free what the claim holds. It holds the
                # device alone until it is fixed; the controller names it.
                consumed_raw = None
                consumed = {}
            # A result without a share (no consumedCapacity, nowhere recorded) holds the device
            # alone: that is how the scheduler and non-sharing drivers allocate.
            device = devices.get(key)
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
        """Reserve a plan's devices, CPU and memory before it is written.

        A claim the API shows allocated keeps that record: an assumption (a plan being
        written, a hold read late, a placement refreshed) never stands in for it, and so
        `forget` never erases it. Replacing it was rejected: until the assumption was
        forgotten the claim's real devices looked free, and after, all of them did (the claim
        counted nowhere), which let a second pod be given them."""
        if plan.node_name is None:
            return
        namespace = objects.namespace(pod)
        charges: Mapping[str, tuple[DeviceCharge, ...]] = getattr(plan, "charges", None) or {}
        for uid, allocation in plan.allocations.items():
            held = self.claims.get(uid)
            if held is not None and not held.assumed:
                continue  # what the API shows wins
            uses = self._uses_of(allocation)
            self._put_claim(uid, ClaimRecord(uses, assumed=True, namespace=namespace,
                                             charges=charges.get(uid, ())))
        uid = objects.uid(pod)
        self._policies.queue.leave(uid)
        if uid and uid not in self.pods:
            cpu, memory = kubefit.pod_requests(pod)
            self._put_pod(uid, PodRecord(plan.node_name, cpu, memory, assumed=True))

    def forget(self, pod: Mapping[str, Any], plan: Any) -> None:
        """Undo `assume` (the write failed, landed, or the hold is over); records that came
        from the API stay, whatever was assumed over them since."""
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


__all__ = [
    "FREE_USAGE",
    "ClaimRecord",
    "DeviceUsage",
    "PodRecord",
    "TakenOut",
    "UsageLedger",
    "Use",
]

"""A pod's plan, and the allocations it writes: from the devices a search picked to the
`status.allocation` of each claim (results, shares, configs as DRA copies them, the node
selector).

Pure: no I/O, no clock, no logging. It must not choose devices or nodes (`plan` and `search`
do); it only writes down what was chosen.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dra_gateway.allocator.planner.demand import ClaimDemand, memory_for
from dra_gateway.allocator.planner.devices import NANO
from dra_gateway.allocator.planner.search import NodeSearchResult, Pick
from dra_gateway.allocator.planner.state import ClusterState
from dra_gateway.gpu.shares import RecordedShare, encode_shares, share_record
from dra_gateway.kube import names, objects
from dra_gateway.kube.api_rules import allocation_problems
from dra_gateway.kube.models import config_applies
from dra_gateway.policy.amounts import DeviceCharge
from dra_gateway.policy.quotas import Exceeded

_SHARE_NAMESPACE = uuid.UUID("5b0f6b8e-2a4e-4f43-9d1c-6b1f3c2a9e77")


@dataclass(frozen=True)
class PodPlan:
    """The plan for one pod.

    `allocations` maps claim uid to the `status.allocation` to write; `annotations` maps claim
    uid to annotations to merge (the fallback world records shares there); `reason` says why
    the pod cannot be placed, naming claim, request and the binding limit. A pod held back by
    a quota has `quota_reason` (`QuotaExceeded`, or `QueuedForQuota` behind an earlier pod)
    and `quota` (the quotas exceeded, when known); `reason` is then ResourceQuota's message.
    `charges` maps claim uid to what each allocation costs against quotas.
    """

    node_name: str | None
    allocations: dict[str, dict[str, Any]] = field(default_factory=dict)
    annotations: dict[str, dict[str, str]] = field(default_factory=dict)
    reason: str | None = None
    quota_reason: str | None = None
    quota: tuple[Exceeded, ...] = ()
    charges: dict[str, tuple[DeviceCharge, ...]] = field(default_factory=dict)



def build_plan(state: ClusterState, node: str,
               to_plan: Sequence[tuple[Mapping[str, Any], str, ClaimDemand]],
               outcome: NodeSearchResult, *, charges: bool = False) -> PodPlan:
    """The allocations of the devices `outcome` picked on `node`; with `charges`, what each
    claim's allocation costs against quotas too (`plan_charges`)."""
    devices = state.node_devices.get(node, [])
    allocations: dict[str, dict[str, Any]] = {}
    annotations: dict[str, dict[str, str]] = {}
    native = state.settings.consumable_capacity
    by_claim: dict[int, list[Pick]] = {}
    for pick in outcome.picks:
        by_claim.setdefault(pick.claim, []).append(pick)
    for index, (claim, _, demand) in enumerate(to_plan):
        uid = objects.uid(claim)
        results: list[dict[str, Any]] = []
        recorded: list[RecordedShare] = []
        class_requests: dict[str, list[str]] = {}
        resolved_memory: dict[str, int] = {}
        for n, pick in enumerate(by_claim.get(index, ())):
            device = devices[pick.device]
            alt = pick.alternative
            result: dict[str, Any] = {"request": pick.result_name, "driver": device.driver,
                                      "pool": device.pool, "device": device.name}
            if alt.admin_access:
                result["adminAccess"] = True
            if alt.tolerations:
                result["tolerations"] = [dict(t) for t in alt.tolerations]
            multi = bool(device.raw.get("allowMultipleAllocations"))
            if device.shareable and (multi or not pick.exclusive):
                share_id = str(uuid.uuid5(_SHARE_NAMESPACE,
                                          f"{uid}/{pick.result_name}/{n}/{device.key}"))
                consumed = {k: str(device.quantity(k, v)) for k, v in pick.consumed.items()}
                if native and multi:
                    result["shareID"] = share_id
                    result["consumedCapacity"] = consumed
                elif not pick.exclusive:
                    recorded.append(RecordedShare(
                        request=pick.result_name, driver=device.driver, pool=device.pool,
                        device=device.name, share_id=share_id, consumed_capacity=consumed))
            results.append(result)
            names_ = class_requests.setdefault(alt.class_name, [])
            if pick.result_name not in names_:
                names_.append(pick.result_name)
            if alt.share.memory_percent is not None and alt.share.memory is None:
                resolved = memory_for(alt.share, device.gpu_memory)
                if resolved is not None:
                    resolved_memory[pick.result_name] = resolved
        config: list[dict[str, Any]] = []
        for class_name, requests in class_requests.items():
            info = state.classes.get(class_name)
            for class_config in info.configs if info is not None else ():
                config.append({"source": "FromClass", "requests": list(requests),
                               "opaque": dict(class_config["opaque"])})
        config.extend(claim_configs(demand, resolved_memory))
        # The shares' record goes where only status writers reach (gpu.shares); the
        # annotation below repeats it for people and is never read back.
        record = share_record(recorded)
        if record is not None:
            config.append(record)
        allocation: dict[str, Any] = {
            "devices": {"results": results, **({"config": config} if config else {})},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]},
        }
        problems = allocation_problems(allocation)
        if problems:
            # The API would refuse the write (1.38 validates what earlier releases stored), and
            # one negative amount in a stored claim stops kube-scheduler for every DRA pod:
            # the pod waits with the reason instead.
            ns, name = objects.namespace_name(claim)
            return PodPlan(None, reason=(
                f"ResourceClaim {ns}/{name}: the allocation planned on node {node} is not one "
                f"the API accepts ({'; '.join(problems)}); check the claim's "
                "spec.devices.requests[].capacity.requests and the capacities the devices "
                "publish"))
        allocations[uid] = allocation
        if recorded:
            annotations[uid] = {names.ANNOTATION_SHARES: encode_shares(recorded)}
    return PodPlan(node, allocations, annotations, None,
                   charges=plan_charges(state, node, to_plan, outcome) if charges else {})


def plan_charges(state: ClusterState, node: str,
                 to_plan: Sequence[tuple[Mapping[str, Any], str, ClaimDemand]],
                 outcome: NodeSearchResult) -> dict[str, tuple[DeviceCharge, ...]]:
    """Per claim uid, the quota charges of the allocation `build_plan` writes, taken from the
    search's picks: what `policy.amounts.charges_of` reads back from that allocation (a share's
    consumedCapacity, wherever it is recorded, in whole units; a device held alone, all of
    it), without writing the allocation out and parsing it again."""
    devices = state.node_devices.get(node, [])
    native = state.settings.consumable_capacity
    by_claim: dict[int, list[Pick]] = {}
    for pick in outcome.picks:
        by_claim.setdefault(pick.claim, []).append(pick)
    charges: dict[str, tuple[DeviceCharge, ...]] = {}
    for index, (claim, _, _) in enumerate(to_plan):
        found: list[DeviceCharge] = []
        for pick in by_claim.get(index, ()):
            class_name = pick.alternative.class_name
            if class_name not in names.GATEWAY_CLASSES:
                continue
            device = devices[pick.device]
            card_memory, card_cores = device.card_amounts
            multi = bool(device.raw.get("allowMultipleAllocations"))
            # As build_plan writes it: consumedCapacity, or a recorded share.
            shared = device.shareable and (multi or not pick.exclusive) and \
                ((native and multi) or not pick.exclusive)
            if shared:
                memory = _units(pick.consumed.get(names.CAPACITY_MEMORY, 0))
                cores = _units(pick.consumed.get(names.CAPACITY_CORES, 0))
                whole = memory >= card_memory > 0 and cores >= card_cores
            else:
                memory, cores, whole = card_memory, card_cores, True
            found.append(DeviceCharge(device.key, class_name, memory, cores, whole,
                                      device.raw))
        charges[objects.uid(claim)] = tuple(found)
    return charges


def _units(nanos: int) -> int:
    """Nanos as whole units, rounded away from zero (a quantity's `value()`)."""
    magnitude = -(-abs(nanos) // NANO)
    return magnitude if nanos >= 0 else -magnitude


def claim_configs(demand: ClaimDemand, resolved: Mapping[str, int]) -> list[dict[str, Any]]:
    """The claim's configs as DRA copies them, with relative memory made absolute per request."""
    out: list[dict[str, Any]] = []
    for raw in demand.configs:
        opaque = raw.get("opaque")
        if not opaque:
            continue
        targets = list(raw.get("requests") or ())
        params = opaque.get("parameters") or {}
        percent = (opaque.get("driver") == names.DRIVER
                   and params.get("kind") == names.KIND_GPU_SHARE_CONFIG
                   and params.get("memoryPercent") is not None)
        applies = [r for r in resolved if config_applies(targets, r)]
        if not percent or not applies:
            entry: dict[str, Any] = {"source": "FromClaim", "opaque": dict(opaque)}
            if targets:
                entry["requests"] = targets
            out.append(entry)
            continue
        for result_name in applies:
            parameters = {k: v for k, v in params.items() if k != "memoryPercent"}
            parameters["memory"] = resolved[result_name]
            out.append({"source": "FromClaim", "requests": [result_name],
                        "opaque": {"driver": opaque["driver"], "parameters": parameters}})
    return out

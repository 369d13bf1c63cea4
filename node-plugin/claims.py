"""What an allocated ResourceClaim gives this node: devices, shares, enforcement, CDI edits.

Pure: it takes the claim as the API returns it, the node's name and labels and its published
devices, and returns a plan or a `ClaimError` whose message names the claim and the field. The
share of a card comes, in order, from what the allocation consumed (the result's
`consumedCapacity` where the cluster keeps consumable capacity, else the allocator's record of
it in the allocation's GpuShareAllocation config), then the claim's `GpuShareConfig` (memory in
bytes or `memoryPercent` of the card); a card with none of these is whole. Only the capacities
the share names are limits (see `_limited`): the others are consumed for accounting only.

The share record is the allocator's, in `status.allocation` (which tenants cannot write), read
with dra_gateway.gpu.shares: entries are matched to results by request, driver, pool and
device, in order, and a missing or malformed record counts as absent. The annotation
`dra-gateway.io/shares` is never read: anyone who may update the claim may edit it. Which
GpuShareConfig applies to a request, and whether it is valid, is
dra_gateway.kube.models.read_share_config, the same function the planner sizes shares with.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_gateway.gpu.memory_percent import share_bytes
from dra_gateway.gpu.shares import (
    RecordedShare,
    ResultKey,
    recorded_shares,
    result_key,
    shares_by_result,
)
from dra_gateway.kube import names, objects
from dra_gateway.kube.models import Enforcement, GpuShareConfig, read_share_config
from dra_gateway.kube.nodeselectors import node_selector_matches
from dra_gateway.kube.quantity import QuantityError, bytes_of, parse_quantity
from dra_gateway.node_plugin.cdi import (
    DEFAULT_ENFORCEMENT,
    CardShare,
    CdiDevice,
    EnforcementSettings,
    build_spec,
    container_env,
    hami_mounts,
    qualified_name,
)
from dra_gateway.node_plugin.devices import DeviceInfo


class ClaimError(Exception):
    """The claim cannot be prepared on this node; the message is for the pod's events."""


@dataclass(frozen=True, slots=True)
class PlannedDevice:
    request: str
    pool: str
    device: str
    cdi_name: str
    share_id: str | None
    card: CardShare


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    devices: tuple[PlannedDevice, ...]
    cdi_spec: dict[str, Any] | None  # None when no device of this driver was allocated

    def response_devices(self, kind: str) -> list[dict[str, Any]]:
        """The kubelet's `Device` entries, as plain data for the checkpoint and the gRPC reply.

        `request_names` carry the request, never a firstAvailable subrequest (`gpu/large` is
        `gpu`): the kubelet matches them against a container's `resources.claims[].request`,
        which names a request, so a subrequest name would hide the device from the container
        (the DRA library strips it the same way, `stripSubrequestNames`).
        """
        out = []
        for d in self.devices:
            entry: dict[str, Any] = {"request_names": [d.request.split("/", 1)[0]],
                                     "pool_name": d.pool,
                                     "device_name": d.device,
                                     "cdi_device_ids": [qualified_name(kind, d.cdi_name)]}
            if d.share_id:
                entry["share_id"] = d.share_id
            out.append(entry)
        return out


def _share_config(claim: Mapping[str, Any], request: str, driver: str,
                  where: str) -> GpuShareConfig:
    allocation = claim["status"]["allocation"]
    configs = list((allocation.get("devices") or {}).get("config") or [])
    ours = [c for c in configs if (c.get("opaque") or {}).get("driver") == driver]
    if not ours:
        # An allocator that did not copy the configs (or an older one): the claim has them.
        ours = [c for c in (claim.get("spec", {}).get("devices", {}).get("config") or [])
                if (c.get("opaque") or {}).get("driver") == driver]
    try:
        # Class configs first, then the claim's: later entries win, key by key.
        return read_share_config(ours, request, driver=driver)
    except ValueError as exc:
        raise ClaimError(f"{where}: {exc}") from None


def _requested_capacity(claim: Mapping[str, Any], request: str) -> Collection[str]:
    """Capacity names the claim's spec requests for `request` (`req` or `req/sub`)."""
    name, _, sub = request.partition("/")
    for entry in (claim.get("spec", {}).get("devices", {}).get("requests") or []):
        if entry.get("name") != name:
            continue
        bodies = [entry.get("exactly") or {}] if not sub else [
            s for s in entry.get("firstAvailable") or [] if s.get("name") == sub]
        return {k for b in bodies for k in ((b.get("capacity") or {}).get("requests") or {})}
    return ()


def _limited(config: GpuShareConfig, claim: Mapping[str, Any], request: str,
             consumed: Mapping[str, Any]) -> Collection[str]:
    """The capacities whose share the container is limited to.

    Those the GpuShareConfig names, when it names any: a share states its other capacities at
    the smallest amount only so that the request policy's default (the whole card) is not
    consumed, and that amount must not become a limit. Otherwise (a claim written without
    amounts in its config) those the request asked for, then those the allocation consumed.
    """
    named = {c for c, on in ((names.CAPACITY_MEMORY, config.memory is not None
                              or config.memory_percent is not None),
                             (names.CAPACITY_CORES, config.cores is not None)) if on}
    return named or _requested_capacity(claim, request) or set(consumed)


def _bytes(value: Any, where: str) -> int:
    try:
        return bytes_of(value)
    except QuantityError as exc:
        raise ClaimError(f"{where}: {exc}") from None


def _percent(value: Any, where: str) -> int:
    try:
        quantity = parse_quantity(value)
    except QuantityError as exc:
        raise ClaimError(f"{where}: {exc}") from None
    cores = quantity.value()
    if not 1 <= cores <= names.CORES_PER_CARD:
        raise ClaimError(f"{where}: cores {value} is outside 1..{names.CORES_PER_CARD}")
    return cores


@dataclass(frozen=True, slots=True)
class _ClaimOnNode:
    """What planning each device of one claim reads: the claim, where errors point, this node's
    devices, and the allocator's share record (its entries taken in turn, result by result)."""

    claim: Mapping[str, Any]
    where: str  # "ResourceClaim ns/name", the start of every error's message
    node_name: str
    driver: str
    devices: Mapping[str, DeviceInfo]
    recorded: dict[ResultKey, list[RecordedShare]]


def plan_claim(claim: Mapping[str, Any], *, uid: str, node_name: str,
               node_labels: Mapping[str, str], driver: str, kind: str,
               devices: Mapping[str, DeviceInfo],
               enforcement: EnforcementSettings = DEFAULT_ENFORCEMENT) -> ClaimPlan:
    """What to hand the containers of an allocated claim; ClaimError when it is not ours."""
    meta = objects.meta(claim)
    where = f"ResourceClaim {meta.get('namespace')}/{meta.get('name')}"
    allocation = _allocation_on_node(claim, uid=uid, node_name=node_name,
                                     node_labels=node_labels, where=where)
    results = [r for r in (allocation.get("devices") or {}).get("results") or []
               if r.get("driver") == driver]
    context = _ClaimOnNode(claim=claim, where=where, node_name=node_name, driver=driver,
                           devices=devices, recorded=shares_by_result(recorded_shares(claim)))
    cdi_names = _cdi_names(results, uid)
    planned: list[PlannedDevice] = []
    modes: dict[str, Enforcement] = {}  # each request's enforcement
    for i, result in enumerate(results):
        device, mode = _plan_device(context, index=i, result=result, cdi_name=cdi_names[i])
        planned.append(device)
        modes[_request_name(device.request)] = mode
    if not planned:
        return ClaimPlan(devices=(), cdi_spec=None)
    cdi_devices = _cdi_devices(planned, modes, enforcement, where=where, node_name=node_name)
    spec = build_spec(kind=kind, claim_uid=uid, claim_namespace=str(meta.get("namespace")),
                      claim_name=str(meta.get("name")), devices=cdi_devices)
    return ClaimPlan(devices=tuple(planned), cdi_spec=spec)


def _allocation_on_node(claim: Mapping[str, Any], *, uid: str, node_name: str,
                        node_labels: Mapping[str, str], where: str) -> Mapping[str, Any]:
    """The claim's allocation, once it is the claim the kubelet asked for and is allocated to
    this node."""
    meta = objects.meta(claim)
    if meta.get("uid") != uid:
        raise ClaimError(f"{where} has UID {meta.get('uid')}, the kubelet asked for {uid}: the "
                         "claim was deleted and recreated; the kubelet retries with the new one")
    allocation: Mapping[str, Any] | None = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"{where} is not allocated (status.allocation is empty)")
    if not node_selector_matches(allocation.get("nodeSelector"), name=node_name,
                                 labels=node_labels):
        raise ClaimError(f"{where}: status.allocation.nodeSelector does not select node "
                         f"{node_name}")
    return allocation


def _request_name(request: Any) -> str:
    """The request of an allocation result's `req` or `req/sub` (containers name requests)."""
    return str(request).split("/", 1)[0]


def _cdi_names(results: Sequence[Mapping[str, Any]], uid: str) -> list[str]:
    """Each result's CDI device name: the claim and the device, and the result's index where
    the device appears more than once (several shares of one card)."""
    counts = Counter(r.get("device", "") for r in results)
    return [f"{uid}-{r.get('device')}" if counts[r.get("device", "")] == 1
            else f"{uid}-{r.get('device')}-{i}" for i, r in enumerate(results)]


def _plan_device(context: _ClaimOnNode, *, index: int, result: Mapping[str, Any],
                 cdi_name: str) -> tuple[PlannedDevice, Enforcement]:
    """One allocated device of this node: its share of the card, and its request's
    enforcement."""
    rwhere = f"{context.where}: status.allocation.devices.results[{index}]"
    pool, device, request = result.get("pool"), result.get("device"), result.get("request")
    if pool != context.node_name:
        raise ClaimError(f"{rwhere}: pool {pool} is not this node's pool {context.node_name}")
    info = context.devices.get(str(device))
    if info is None:
        raise ClaimError(f"{rwhere}: device {device} is not published by node "
                         f"{context.node_name}")
    config = _share_config(context.claim, str(request), context.driver, context.where)
    consumed, cwhere = _consumed(context, result=result, rwhere=rwhere)
    limited = _limited(config, context.claim, str(request), consumed)
    card = _card_share(config, info, limited=limited, consumed=consumed, where=cwhere)
    return PlannedDevice(request=str(request), pool=str(pool), device=str(device),
                         cdi_name=cdi_name, share_id=result.get("shareID"),
                         card=card), config.enforcement


def _consumed(context: _ClaimOnNode, *, result: Mapping[str, Any],
              rwhere: str) -> tuple[Mapping[str, Any], str]:
    """What the allocation consumed of the card, and where an error in it points: the result's
    `consumedCapacity`, else the allocator's record (kept there without consumable capacity),
    else nothing."""
    consumed = result.get("consumedCapacity")
    if consumed is not None:
        return consumed, f"{rwhere}.consumedCapacity"
    entries = context.recorded.get(result_key(result))
    return (entries.pop(0).consumed_capacity if entries else {},
            f"{context.where}: status.allocation.devices.config "
            f"{names.KIND_GPU_SHARE_ALLOCATION}, device {result.get('device')}")


def _card_share(config: GpuShareConfig, info: DeviceInfo, *, limited: Collection[str],
                consumed: Mapping[str, Any], where: str) -> CardShare:
    """The limits of one card's share, from what was consumed, then the GpuShareConfig; None
    where there is none: a capacity not limited, a MIG instance (isolated by hardware), a
    share of the full card."""
    memory: int | None = None
    cores: int | None = None
    if names.CAPACITY_MEMORY not in limited:
        pass
    elif names.CAPACITY_MEMORY in consumed:
        memory = _bytes(consumed[names.CAPACITY_MEMORY], f"{where}.memory")
    elif config.memory is not None:
        memory = config.memory
    elif config.memory_percent is not None:
        memory = share_bytes(info.memory, config.memory_percent)
    if names.CAPACITY_CORES not in limited:
        pass
    elif names.CAPACITY_CORES in consumed:
        cores = _percent(consumed[names.CAPACITY_CORES], f"{where}.cores")
    elif config.cores is not None:
        cores = config.cores
    if info.kind == "mig" or (memory is not None and memory >= info.memory):
        memory = None
    if info.kind == "mig" or cores == names.CORES_PER_CARD:
        cores = None
    return CardShare(uuid=info.uuid, memory=memory, cores=cores)


def _cdi_devices(planned: Sequence[PlannedDevice], modes: Mapping[str, Enforcement],
                 enforcement: EnforcementSettings, *, where: str, node_name: str
                 ) -> list[CdiDevice]:
    """The CDI spec's devices. Containers name requests, so each device's edits describe its
    whole request: every device of one request carries the same environment and the runtime's
    merge is moot. ClaimError for a share HAMi-core should enforce on a node without its
    library: the runtime would fail every start of the container on the missing mount."""
    cdi_devices = []
    for d in planned:
        request = _request_name(d.request)
        group = [p.card for p in planned if _request_name(p.request) == request]
        mode = modes[request]
        mounts = hami_mounts(mode, enforcement, group)
        if mounts and not enforcement.hami_library_present:
            raise ClaimError(
                f"{where}: request {request!r} asks HAMi-core to enforce its share, but node "
                f"{node_name} has no HAMi-core library at {enforcement.hami_library}: install "
                "HAMi-core on this node (the chart's nodePlugin.hamiCore.hostPath names where), "
                "or ask for the share with enforcement none; the claim stays unprepared and the "
                "kubelet retries")
        cdi_devices.append(CdiDevice(
            name=d.cdi_name, env=tuple(container_env(group, mode, enforcement)),
            mounts=mounts))
    return cdi_devices

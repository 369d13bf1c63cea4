"""What an allocated ResourceClaim gives this node: devices, shares, enforcement, CDI edits.

Pure: it takes the claim as the API returns it, the node's name and labels and its published
devices, and returns a plan or a `ClaimError` whose message names the claim and the field. The
share of a card comes, in order, from what the allocation consumed (the result's
`consumedCapacity` where the cluster keeps consumable capacity, else the allocator's record of
it in the allocation's GpuShareAllocation config), then the claim's `GpuShareConfig` (memory in
bytes or `memoryPercent` of the card); a card with none of these is whole. Only the capacities
the share names are limits (see `_limited`): the others are consumed for accounting only.

The share record is the allocator's, in `status.allocation` (which tenants cannot write), read
with dra_gateway.kube.shares: entries are matched to results by request, driver, pool and
device, in order, and a missing or malformed record counts as absent. The annotation
`dra-gateway.io/shares` is never read: anyone who may update the claim may edit it. Which
GpuShareConfig applies to a request is dra_gateway.kube.models.share_parameters, the same
function the planner sizes shares with.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from dra_gateway.kube import names, objects
from dra_gateway.kube.memory_percent import share_bytes
from dra_gateway.kube.models import Enforcement, GpuShareConfig, share_parameters
from dra_gateway.kube.nodeselectors import node_selector_matches
from dra_gateway.kube.quantity import QuantityError, bytes_of, parse_quantity
from dra_gateway.kube.shares import recorded_shares, result_key, shares_by_result
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
        merged = share_parameters(ours, request, driver=driver)
    except ValueError as exc:
        raise ClaimError(f"{where}: {exc}") from None
    try:
        return GpuShareConfig.model_validate(merged)
    except ValidationError as exc:
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or '(document)'}: {e['msg']}"
                           for e in exc.errors())
        raise ClaimError(f"{where}: GpuShareConfig for request {request} is invalid: "
                         f"{detail}") from None


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


def plan_claim(claim: Mapping[str, Any], *, uid: str, node_name: str,
               node_labels: Mapping[str, str], driver: str, kind: str,
               devices: Mapping[str, DeviceInfo],
               enforcement: EnforcementSettings = DEFAULT_ENFORCEMENT) -> ClaimPlan:
    """What to hand the containers of an allocated claim; ClaimError when it is not ours."""
    meta = objects.meta(claim)
    where = f"ResourceClaim {meta.get('namespace')}/{meta.get('name')}"
    if meta.get("uid") != uid:
        raise ClaimError(f"{where} has UID {meta.get('uid')}, the kubelet asked for {uid}: the "
                         "claim was deleted and recreated; the kubelet retries with the new one")
    allocation = (claim.get("status") or {}).get("allocation")
    if not allocation:
        raise ClaimError(f"{where} is not allocated (status.allocation is empty)")
    if not node_selector_matches(allocation.get("nodeSelector"), name=node_name,
                                 labels=node_labels):
        raise ClaimError(f"{where}: status.allocation.nodeSelector does not select node "
                         f"{node_name}")
    results = [r for r in (allocation.get("devices") or {}).get("results") or []
               if r.get("driver") == driver]
    recorded = shares_by_result(recorded_shares(claim))
    counts: dict[str, int] = {}
    for r in results:
        counts[r.get("device", "")] = counts.get(r.get("device", ""), 0) + 1
    planned: list[PlannedDevice] = []
    enforcement_by_request: dict[str, Enforcement] = {}
    for i, result in enumerate(results):
        rwhere = f"{where}: status.allocation.devices.results[{i}]"
        pool, device, request = result.get("pool"), result.get("device"), result.get("request")
        if pool != node_name:
            raise ClaimError(f"{rwhere}: pool {pool} is not this node's pool {node_name}")
        info = devices.get(str(device))
        if info is None:
            raise ClaimError(f"{rwhere}: device {device} is not published by node {node_name}")
        config = _share_config(claim, str(request), driver, where)
        enforcement_by_request[str(request).split("/", 1)[0]] = config.enforcement
        memory: int | None = None
        cores: int | None = None
        consumed = result.get("consumedCapacity")
        cwhere = f"{rwhere}.consumedCapacity"
        if consumed is None:
            # Without consumable capacity the allocator records the share in the allocation.
            entries = recorded.get(result_key(result))
            consumed = entries.pop(0).consumed_capacity if entries else {}
            cwhere = (f"{where}: status.allocation.devices.config "
                      f"{names.KIND_GPU_SHARE_ALLOCATION}, device {device}")
        limited = _limited(config, claim, str(request), consumed)
        if names.CAPACITY_MEMORY not in limited:
            pass
        elif names.CAPACITY_MEMORY in consumed:
            memory = _bytes(consumed[names.CAPACITY_MEMORY], f"{cwhere}.memory")
        elif config.memory is not None:
            memory = config.memory
        elif config.memory_percent is not None:
            memory = share_bytes(info.memory, config.memory_percent)
        if names.CAPACITY_CORES not in limited:
            pass
        elif names.CAPACITY_CORES in consumed:
            cores = _percent(consumed[names.CAPACITY_CORES], f"{cwhere}.cores")
        elif config.cores is not None:
            cores = config.cores
        if info.kind == "mig" or (memory is not None and memory >= info.memory):
            memory = None  # a MIG instance is isolated by hardware; a full share is the card
        if info.kind == "mig" or cores == names.CORES_PER_CARD:
            cores = None
        cdi_name = f"{uid}-{device}" if counts[str(device)] == 1 else f"{uid}-{device}-{i}"
        planned.append(PlannedDevice(
            request=str(request), pool=str(pool), device=str(device), cdi_name=cdi_name,
            share_id=result.get("shareID"),
            card=CardShare(uuid=info.uuid, memory=memory, cores=cores)))
    if not planned:
        return ClaimPlan(devices=(), cdi_spec=None)
    cdi_devices = []
    for d in planned:
        # Containers name requests, so each device's edits describe its whole request: every
        # device of one request carries the same environment and the runtime's merge is moot.
        group = [p.card for p in planned if p.request.split("/", 1)[0] ==
                 d.request.split("/", 1)[0]]
        mode = enforcement_by_request[d.request.split("/", 1)[0]]
        cdi_devices.append(CdiDevice(
            name=d.cdi_name, env=tuple(container_env(group, mode, enforcement)),
            mounts=hami_mounts(mode, enforcement, group)))
    spec = build_spec(kind=kind, claim_uid=uid, claim_namespace=str(meta.get("namespace")),
                      claim_name=str(meta.get("name")), devices=cdi_devices)
    return ClaimPlan(devices=tuple(planned), cdi_spec=spec)

"""Draining pods off failed devices where the cluster cannot: the gateway's own eviction for a
fatal device fault, on API servers that keep no device taints (Kubernetes 1.34 and 1.35 by
default).

Where device taints are kept, a node plugin taints a device with a fatal fault `NoExecute` and
kube-controller-manager evicts its pods. Where they are not, the plugin withholds the device from
its slices and lists it in its Node's condition `GpuDevicesUnhealthy` (kube/device_health.py):
nothing new lands there, but the pods already on it keep running on a card that fell off the
bus. On the leader, every `drain_interval`, this mode reads those conditions and evicts each pod
whose claim is allocated a device that is listed as fatal and withheld, and that no slice of its
node publishes now (a plugin that restarted and publishes it again is believed):

- the pod gets `DisruptionTarget` (reason `DeviceFailureByDraGateway`) and a Warning Event
  `UnhealthyDevice` naming the device, its node, the fault and since when, then is evicted
  through the Eviction API (`evict.py`), so its PodDisruptionBudgets are honoured;
- a budget that refuses (or any failure) leaves the pod running, its `DisruptionTarget` set
  False again (`evict.py`): a Warning Event `EvictionRefused` says why (once per reason), and
  the next round tries again, marking it again first;
- its controller's replacement is placed as any pod is, never on a withheld device.

Pods that tolerate the taint cannot be told apart here (such an API server drops tolerations
too), so every pod on the device leaves, as kube-controller-manager's eviction would for pods
without a toleration. Counted in `dra_gateway_allocator_health_evictions_total{result}`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from dra_gateway.allocator.eviction.evict import EVICTED, GONE
from dra_gateway.allocator.eviction.inputs import Snapshot
from dra_gateway.allocator.eviction.mode import EvictionMode
from dra_gateway.allocator.metrics import Metrics
from dra_gateway.allocator.settings import ControllerSettings
from dra_gateway.allocator.work import Fence
from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.port import Cluster, Object
from dra_gateway.kube.device_health import DeviceMark, node_marks

log = logging.getLogger(__name__)

REASON = "DeviceFailureByDraGateway"
EVENT_UNHEALTHY = "UnhealthyDevice"
EVENT_REFUSED = "EvictionRefused"
FATAL = "fatal"


@dataclass(frozen=True, slots=True)
class Victim:
    """A pod to evict: it uses `device` of `node`, which failed as `mark` says."""

    uid: str
    pod: str  # namespace/name
    node: str
    mark: DeviceMark

    def why(self) -> str:
        m = self.mark
        return (f"device {m.device} on node {self.node} failed ({m.reason}, {m.severity} fault "
                f"since {m.since}) and is withheld from the node's ResourceSlices; the pod "
                f"using it is evicted so that its controller's replacement runs on a healthy "
                f"device")


def failed_devices(nodes: Iterable[Object]) -> dict[str, dict[str, DeviceMark]]:
    """Node name -> its devices with a fatal fault that its plugin withholds."""
    found: dict[str, dict[str, DeviceMark]] = {}
    for node in nodes:
        marks = {m.device: m for m in node_marks(node) if m.severity == FATAL and m.withheld}
        if marks:
            found[objects.namespace_name(node)[1]] = marks
    return found


def victims(snapshot: Snapshot, driver: str,
            failed: Mapping[str, Mapping[str, DeviceMark]]) -> list[Victim]:
    """The live pods using a failed device of `driver`, in a stable order. Pure."""
    if not failed:
        return []
    pool_node: dict[str, str] = {}
    published: set[tuple[str, str]] = set()
    for piece in snapshot.slices:
        spec = piece.get("spec") or {}
        if spec.get("driver") != driver:
            continue
        pool = str((spec.get("pool") or {}).get("name") or "")
        if spec.get("nodeName"):
            pool_node[pool] = str(spec["nodeName"])
        published.update((pool, str(d.get("name"))) for d in spec.get("devices") or ())
    pods = {objects.uid(p): p for p in snapshot.pods}
    found: dict[str, Victim] = {}
    for claim in snapshot.claims:
        status = claim.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or ()
        for result in results:
            if result.get("driver") != driver:
                continue
            pool, device = str(result.get("pool", "")), str(result.get("device", ""))
            node = pool_node.get(pool, pool)
            mark = failed.get(node, {}).get(device)
            if mark is None or (pool, device) in published:
                continue
            for ref in status.get("reservedFor") or ():
                pod = pods.get(str(ref.get("uid", ""))) if ref.get("resource") == "pods" else None
                if pod is None or objects.is_deleting(pod) or objects.is_finished(pod):
                    continue
                uid = objects.uid(pod)
                found.setdefault(uid, Victim(uid, "/".join(objects.namespace_name(pod)), node,
                                             mark))
    return sorted(found.values(), key=lambda v: (v.node, v.mark.device, v.pod))


class DrainMode(EvictionMode):
    """Evicts the pods of failed, withheld devices; on the leader only."""

    name = "drain"

    def __init__(self, cluster: Cluster, settings: ControllerSettings, *,
                 snapshot: Callable[[], Snapshot], metrics: Metrics, fence: Fence,
                 nodes: Callable[[], Iterable[Object]], driver: str = names.DRIVER,
                 clock: Callable[[], datetime] | None = None) -> None:
        super().__init__(cluster, settings, snapshot=snapshot, metrics=metrics, fence=fence,
                         clock=clock)
        self.nodes = nodes
        self.driver = driver
        # Pod uid -> the last refusal told in an Event (told again only when it changes).
        self._refused: dict[str, str] = {}

    @property
    def interval(self) -> float:
        return self.settings.drain_interval

    async def one_round(self) -> bool:
        await self.round()
        return False  # a failed device is looked at again at the same pace

    async def round(self) -> list[tuple[Victim, str]]:
        """One look: the pods tried and how each went. The common case (no failed device)
        reads only the Nodes."""
        failed = failed_devices(self.nodes())
        if not failed:
            self._refused.clear()
            return []
        snapshot = self.snapshot()
        found = victims(snapshot, self.driver, failed)
        self._refused = {v.uid: self._refused[v.uid] for v in found if v.uid in self._refused}
        pods = {objects.uid(p): p for p in snapshot.pods}
        return [(victim, await self._evict(victim, pods.get(victim.uid))) for victim in found]

    async def _evict(self, victim: Victim, pod: Object | None) -> str:
        why = victim.why()
        # The Event that says why is written once; a pod whose eviction was refused before is
        # marked again (the refusal took the mark back) and tried again.
        again = victim.uid in self._refused
        told = None if pod is None or again else (pod, EVENT_UNHEALTHY, why)
        if not again:
            log.warning("evicting a pod from a failed device", extra={
                "pod": victim.pod, "node": victim.node, "device": victim.mark.device,
                "fault": victim.mark.reason})
        result, message = await self.evictions.leave(
            victim.pod, victim.uid, reason=REASON,
            message=f"dra-gateway: {why}", told=told, told_type="Warning")
        if result != GONE:
            self.metrics.health_evictions.labels(result).inc()
        if result not in (EVICTED, GONE) and self._refused.get(victim.uid) != message:
            self._refused[victim.uid] = message
            log.warning("could not evict a pod from a failed device", extra={
                "pod": victim.pod, "device": victim.mark.device, "error": message})
            await self.evictions.event(
                pod, EVENT_REFUSED,
                f"could not evict this pod from failed device {victim.mark.device} on node "
                f"{victim.node}: {message}; it is tried again", "Warning")
        return result


__all__ = ["EVENT_REFUSED", "EVENT_UNHEALTHY", "REASON", "DrainMode", "Victim",
           "failed_devices", "victims"]

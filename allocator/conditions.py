"""The pod conditions the allocator writes on a gated pod it holds back, all through one
writer (`set_pod_condition`).

`dra-gateway.io/QuotaExceeded`: True (reason `QuotaExceeded` or `QueuedForQuota`, message in
ResourceQuota's words) while the allocator holds the pod back for quota; False once the pod is
placed or waits for something else. `dra-gateway.io/WaitingForGates`: True (reason `OtherGates`)
while the pod carries scheduling gates of another admission system besides the gateway's
(Kueue's, KAI's): the allocator allocates its devices only once its own gate is the last one
left; False (`GatesRemoved`) once they are gone. Written through pods/status with a strategic
merge patch keyed by the condition type, so the scheduler's own conditions (PodScheduled) are
left alone, and only when status, reason or message change. `dra-gateway.io/Preemption` (a pod
others are preempted for) and `dra-gateway.io/PodGroup` (a member of a pod group) are written
the same way.
Like Events, a condition is advice: a failed write is logged and dropped, and this module must
never raise into the allocation path nor decide anything about the pod.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from dra_gateway.allocator.events import now
from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.port import ApiError, Cluster, Object
from dra_gateway.kube.resources import PODS

log = logging.getLogger(__name__)

QUOTA_CONDITION = f"{names.DOMAIN}/QuotaExceeded"
PLACED = "QuotaAvailable"
GATES_CONDITION = f"{names.DOMAIN}/WaitingForGates"
# A pod pods of lower priority are preempted for: True while they leave (reason `Preempting`,
# or `PreemptionRefused` when a budget refused an eviction), False once it is placed.
PREEMPTION_CONDITION = f"{names.DOMAIN}/Preemption"
OTHER_GATES = "OtherGates"
GATES_REMOVED = "GatesRemoved"
_MAX_MESSAGE = 1024


def pod_condition(pod: Object, kind: str = QUOTA_CONDITION) -> Mapping[str, Any] | None:
    """The pod's condition of type `kind`, if it has one."""
    for condition in objects.status(pod).get("conditions") or ():
        if condition.get("type") == kind:
            return condition  # type: ignore[no-any-return]
    return None


async def set_pod_condition(cluster: Cluster, pod: Object, *, held: bool, reason: str,
                              message: str, kind: str = QUOTA_CONDITION) -> bool:
    """Write the condition (`kind`) if it differs from the pod's; True when a write was made."""
    status = "True" if held else "False"
    message = message[:_MAX_MESSAGE]
    current = pod_condition(pod, kind)
    if current is None and not held:
        return False  # never held back this way: nothing to clear
    if current is not None and (current.get("status"), current.get("reason"),
                                current.get("message")) == (status, reason, message):
        return False
    stamp = now()
    transition = stamp if current is None or current.get("status") != status \
        else current.get("lastTransitionTime", stamp)
    condition = {"type": kind, "status": status, "reason": reason,
                 "message": message, "lastTransitionTime": transition,
                 "lastProbeTime": None}
    ns, name = objects.namespace_name(pod)
    try:
        await cluster.patch(PODS, name, {"status": {"conditions": [condition]}}, namespace=ns,
                            patch_type="strategic", subresource="status")
    except (ApiError, OSError, TimeoutError) as err:
        log.warning("could not write a pod condition", extra={
            "pod": f"{ns}/{name}", "condition": kind, "error": str(err)})
        return False
    return True


__all__ = ["GATES_CONDITION", "GATES_REMOVED", "OTHER_GATES", "PLACED", "PREEMPTION_CONDITION",
           "QUOTA_CONDITION", "pod_condition", "set_pod_condition"]

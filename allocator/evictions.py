"""How the allocator makes a pod leave, whatever the cause: the one carry-out path of preemption,
cohort reclaim, defrag and the drain of failed devices.

Each eviction is, in order: the pod's condition `DisruptionTarget` (True, with the cause's reason
and a message for `kubectl describe`), as kube-scheduler's preemption and the taint managers set
it; an Event on the pod; then the Eviction API with the pod's uid as a precondition, so its
PodDisruptionBudgets are honoured and a pod of the same name made since is never touched. Every
write is fenced: a replica that no longer leads evicts nothing. Who leaves and why is decided
elsewhere; this module only carries it out, and says how it went.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime

from dra_gateway.allocator.events import COMPONENT, pod_event
from dra_gateway.allocator.work import Fence
from dra_gateway.kube import objects
from dra_gateway.kube.cluster.port import (
    ApiError,
    Cluster,
    Conflict,
    NotFound,
    Object,
    TooManyRequests,
)
from dra_gateway.kube.resources import EVENTS, PODS

log = logging.getLogger(__name__)

DISRUPTION_TARGET = "DisruptionTarget"
# An Event to write on the pod as it is evicted: the pod object, the Event's reason, its message.
Told = tuple[Object | None, str, str]
# The results of `evict`, as the metrics count them.
EVICTED = "evicted"
GONE = "already gone"
REFUSED = "refused"  # a PodDisruptionBudget (429)
FAILED = "failed"


class Evictions:
    """Evictions and their Events on one cluster; `clock` stamps conditions and Events."""

    def __init__(self, cluster: Cluster, *, clock: Callable[[], datetime], instance: str = "",
                 fence: Fence | None = None, component: str = COMPONENT) -> None:
        self.cluster = cluster
        self.clock = clock
        self.component = component  # the Events' source
        self.instance = instance or component
        self.fence = fence or (lambda: None)

    def _stamp(self) -> str:
        return self.clock().strftime("%Y-%m-%dT%H:%M:%SZ")

    async def event(self, pod: Object | None, reason: str, message: str,
                    type_: str = "Normal") -> None:
        """An Event on the pod (none when it is unknown); a failed write is logged only."""
        if pod is None:
            return
        event = pod_event(pod, reason=reason, message=message, type_=type_,
                          component=self.component, instance=self.instance,
                          stamp=self._stamp())
        try:
            await self.cluster.create(EVENTS, event, namespace=objects.namespace(pod))
        except (ApiError, OSError) as exc:
            log.warning("could not record an event", extra={
                "pod": "/".join(objects.namespace_name(pod)), "error": str(exc)})

    async def mark(self, pod: str, reason: str, message: str) -> None:
        """Set `DisruptionTarget` on the pod ("namespace/name"); raises the API's errors."""
        namespace, name = pod.split("/", 1)
        condition = {"type": DISRUPTION_TARGET, "status": "True", "reason": reason,
                     "message": message, "lastTransitionTime": self._stamp()}
        self.fence()
        await self.cluster.patch(PODS, name, {"status": {"conditions": [condition]}},
                                 namespace=namespace, subresource="status",
                                 patch_type="strategic")

    async def evict(self, pod: str, uid: str) -> None:
        """Evict the pod ("namespace/name") if it still has `uid`; raises the API's errors
        (`TooManyRequests` when a PodDisruptionBudget refuses)."""
        namespace, name = pod.split("/", 1)
        self.fence()
        await self.cluster.evict(name, namespace=namespace, uid=uid)

    async def leave(self, pod: str, uid: str, *, reason: str, message: str,
                    told: Told | None = None, told_type: str = "Normal") -> tuple[str, str]:
        """Mark, write the Event `told` (the pod object, its reason and message), then evict,
        saying how it went: (EVICTED, ""), (GONE, ""), or (REFUSED or FAILED, the API's
        message)."""
        try:
            await self.mark(pod, reason, message)
            if told is not None:
                await self.event(*told, type_=told_type)
            await self.evict(pod, uid)
        except (NotFound, Conflict):
            return GONE, ""  # gone, or another pod has the name now
        except TooManyRequests as exc:
            return REFUSED, exc.message
        except ApiError as exc:
            return FAILED, exc.message
        except OSError as exc:
            return FAILED, str(exc)
        return EVICTED, ""


__all__ = ["DISRUPTION_TARGET", "EVICTED", "FAILED", "GONE", "REFUSED", "Evictions", "Told"]

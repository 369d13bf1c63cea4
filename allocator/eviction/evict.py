"""How the allocator makes a pod leave, whatever the cause: the one carry-out path and the one
loop of preemption, cohort reclaim, defrag and the drain of failed devices. Who may leave is
decided in planner/leaving.py.

Each mode runs in rounds (`run_rounds`), on the leader only: a round that found nothing to do
(or failed) makes the next wait longer, up to the mode's limit; a lost leadership ends the loop;
any other error is logged and the next round tries again.

Each eviction is, in order: the pod's condition `DisruptionTarget` (True, with the cause's reason
and a message for `kubectl describe`), as kube-scheduler's preemption and the taint managers set
it before they delete, so that a Job's podFailurePolicy sees it on the pod that is deleted; an
Event on the pod; then the Eviction API with the pod's uid as a precondition, so its
PodDisruptionBudgets are honoured and a pod of the same name made since is never touched. An
eviction the API does not carry out (a budget, an admission policy, any failure) takes the
condition back: it is set False (reason `EvictionRefused`), so that a pod that stays never
carries a disruption it did not have, and a later crash of it is not read as one. Writing the
condition only once the eviction is accepted was rejected: the pod is being deleted by then,
and the condition may land after the podFailurePolicy has judged it. Every write is fenced: a
replica that no longer leads evicts nothing. Who leaves and why is decided elsewhere; this
module only carries it out, and says how it went.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime

from dra_gateway.allocator.events import COMPONENT, pod_event
from dra_gateway.allocator.work import Fence
from dra_gateway.kube import objects
from dra_gateway.kube.cluster.port import (
    ApiError,
    Cluster,
    Conflict,
    Invalid,
    NotFound,
    Object,
    TooManyRequests,
)
from dra_gateway.kube.resources import EVENTS, PODS
from dra_gateway.kube.runtime.leader import LeadershipLost

log = logging.getLogger(__name__)

DISRUPTION_TARGET = "DisruptionTarget"
# The reason of a DisruptionTarget set False again: the eviction it announced did not happen.
NOT_EVICTED = "EvictionRefused"
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
        """An Event on the pod (none when it is unknown); a failed write is logged only. Fenced
        like the evictions: a replica that no longer leads says nothing more."""
        if pod is None:
            return
        event = pod_event(pod, reason=reason, message=message, type_=type_,
                          component=self.component, instance=self.instance,
                          stamp=self._stamp())
        self.fence()
        try:
            await self.cluster.create(EVENTS, event, namespace=objects.namespace(pod))
        except (ApiError, OSError) as exc:
            log.warning("could not record an event", extra={
                "pod": "/".join(objects.namespace_name(pod)), "error": str(exc)})

    async def mark(self, pod: str, uid: str, reason: str, message: str, *,
                   status: str = "True") -> None:
        """Set `DisruptionTarget` on the pod ("namespace/name") if it still has `uid`, True
        unless `status` says otherwise; raises the API's errors (`Invalid` when another pod
        has the name now: the patch names the uid, which the API server keeps immutable)."""
        namespace, name = pod.split("/", 1)
        condition = {"type": DISRUPTION_TARGET, "status": status, "reason": reason,
                     "message": message, "lastTransitionTime": self._stamp()}
        self.fence()
        await self.cluster.patch(PODS, name, {"metadata": {"uid": uid},
                                              "status": {"conditions": [condition]}},
                                 namespace=namespace, subresource="status",
                                 patch_type="strategic")

    async def evict(self, pod: str, uid: str) -> None:
        """Evict the pod ("namespace/name") if it still has `uid`; raises the API's errors
        (`TooManyRequests` when a PodDisruptionBudget refuses)."""
        namespace, name = pod.split("/", 1)
        self.fence()
        await self.cluster.evict(name, namespace=namespace, uid=uid)

    async def leave(self, pod: str, uid: str, *, reason: str | None, message: str,
                    told: Told | None = None, told_type: str = "Normal") -> tuple[str, str]:
        """Mark (unless `reason` is None), write the Event `told` (the pod object, its reason
        and message), then evict, saying how it went: (EVICTED, ""), (GONE, ""), or (REFUSED
        or FAILED, the API's message). A mark whose eviction did not happen is taken back."""
        marked = False
        try:
            if reason is not None:
                await self.mark(pod, uid, reason, message)
                marked = True
            if told is not None:
                await self.event(*told, type_=told_type)
            await self.evict(pod, uid)
        except (NotFound, Invalid):
            return GONE, ""  # gone, or another pod has the name now (refused the mark)
        except Conflict:
            # Another pod has the name now (the eviction's uid precondition).
            result, said, why = GONE, "", "the pod it was written for is gone"
        except TooManyRequests as exc:
            result, said, why = REFUSED, exc.message, exc.message
        except ApiError as exc:
            result, said, why = FAILED, exc.message, exc.message
        except OSError as exc:
            result, said, why = FAILED, str(exc), str(exc)
        else:
            return EVICTED, ""
        if marked:
            await self._unmark(pod, uid, why)
        return result, said

    async def _unmark(self, pod: str, uid: str, why: str) -> None:
        """Set the pod's `DisruptionTarget` False: the eviction it announced did not happen.
        A failure is logged only (the caller reports the eviction's own failure)."""
        try:
            await self.mark(pod, uid, NOT_EVICTED,
                            f"{self.component}: the eviction was not carried out ({why}); "
                            "the pod stays", status="False")
        except (NotFound, Conflict, Invalid):
            pass  # gone meanwhile: nothing carries the condition
        except (ApiError, OSError) as exc:
            log.warning("could not take back a DisruptionTarget condition after an eviction "
                        "that did not happen", extra={"pod": pod, "error": str(exc)})


async def run_rounds(what: str, one_round: Callable[[], Awaitable[bool]], *, interval: float,
                     max_backoff: int = 1) -> None:
    """Run `one_round` every `interval` until cancelled; it returns whether the next round may
    wait longer (nothing was done, or what was done did not go cleanly), up to `max_backoff`
    times the interval."""
    backoff = 1
    while True:
        await asyncio.sleep(interval * backoff)
        try:
            slower = await one_round()
        except ApiError as exc:
            log.warning(f"{what} round failed", extra={"error": exc.message})
            slower = True
        except LeadershipLost:
            raise  # the term is over: the controller ends it
        except Exception:  # a bug: say it, and keep going in later rounds
            log.exception(f"{what} round failed unexpectedly")
            slower = True
        backoff = min(backoff * 2, max_backoff) if slower else 1


__all__ = ["DISRUPTION_TARGET", "EVICTED", "FAILED", "GONE", "NOT_EVICTED", "REFUSED",
           "Evictions", "Told", "run_rounds"]

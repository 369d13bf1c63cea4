"""Claims whose stored allocation holds what the API refuses from Kubernetes 1.38, named.

Kubernetes 1.38 refuses a negative, unnamed or over-32-entry `consumedCapacity` (and keeps
what an earlier release stored: validation ratchets), and kube-scheduler 1.38 fails every DRA
pod of the cluster while one claim holds a negative amount. The allocator never writes one
(`planner/allocation.py` checks before it writes); when another writer's claim holds one, the
planner counts the devices it names as held whole (`planner/ledger.py`) and this module names
the claim: a log line, a Warning Event `InvalidAllocation` on the claim, and the
`dra_gateway_allocator_invalid_claims` gauge. `dra-gateway report` lists the same claims
(`policy/report.py`). The fix is the claim owner's: delete the claim (its pod), or have its
writer deallocate it.

The checks are `kube.api_rules`'; this module only reports, it decides nothing.
"""

from __future__ import annotations

import asyncio
import logging

from prometheus_client import Gauge

from dra_gateway.allocator.events import EVENT_INVALID_ALLOCATION, EventRecorder
from dra_gateway.kube import objects
from dra_gateway.kube.api_rules import allocation_problems
from dra_gateway.kube.cluster.port import Object
from dra_gateway.kube.resources import RESOURCE_CLAIMS

log = logging.getLogger(__name__)

def invalid_allocation_message(problems: list[str]) -> str:
    """The Event's and the log's words for a claim whose allocation has `problems`."""
    return ("the allocation holds what the API refuses from Kubernetes 1.38 ("
            + "; ".join(problems) + "); kube-scheduler 1.38 stops scheduling every pod with "
            "a ResourceClaim while a claim holds a negative amount. The gateway counts the "
            "devices it names as held whole; delete the claim or have its writer deallocate it")


class InvalidClaims:
    """The claims with an allocation the API refuses, by uid, and their Events."""

    def __init__(self, events: EventRecorder, gauge: Gauge) -> None:
        self._events = events
        self._gauge = gauge
        self.problems: dict[str, tuple[str, ...]] = {}  # claim uid -> what is wrong
        self._pending: asyncio.Queue[tuple[Object, str]] = asyncio.Queue()

    def seen(self, claim: Object) -> None:
        """A claim changed: check its allocation; a new problem is logged and queued as an
        Event (`run`)."""
        uid = objects.uid(claim)
        allocation = (claim.get("status") or {}).get("allocation")
        problems = tuple(allocation_problems(allocation)) if allocation else ()
        if not problems:
            self.gone(uid)
            return
        if self.problems.get(uid) == problems:
            return
        self.problems[uid] = problems
        self._gauge.set(len(self.problems))
        message = invalid_allocation_message(list(problems))
        ns, name = objects.namespace_name(claim)
        log.warning("a claim's allocation is invalid", extra={
            "claim": f"{ns}/{name}", "problems": list(problems)})
        self._pending.put_nowait((claim, message))

    def gone(self, uid: str) -> None:
        """The claim was deleted, deallocated or fixed."""
        if self.problems.pop(uid, None) is not None:
            self._gauge.set(len(self.problems))
            self._events.forget(uid)

    async def run(self) -> None:
        """Write the queued Events, one at a time, until cancelled."""
        while True:
            claim, message = await self._pending.get()
            if objects.uid(claim) in self.problems:
                await self._events.record_failure(
                    claim, message, reason=EVENT_INVALID_ALLOCATION, kind=RESOURCE_CLAIMS.kind,
                    api_version=RESOURCE_CLAIMS.api_version)


__all__ = ["InvalidClaims", "invalid_allocation_message"]

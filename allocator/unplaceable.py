"""Pods that did not fit, and when the allocator controller plans them again.

A pod the planner could not place is retried on its work-queue backoff. Events that may make
room (capacity freed, the pod or its claims changed) bring its next plan forward, but never
closer than the retry interval after the last plan: on a busy cluster events never stop, and
planning a pod per event would burn the CPU on pods that cannot fit while delaying those that
can. Freed capacity wakes every waiting pod after a short debounce. Plans run in a worker
thread while the loop goes on: an event for a pod being planned waits for the plan's outcome
(`planning`, then `failed` or `discard`), so that it is scheduled by the new backoff, as if it
had arrived just after the plan.

This module only schedules keys on the queue: it must not plan, read objects or write to the
API.
"""

from __future__ import annotations

import asyncio

from dra_gateway.allocator.work import PodKey, WorkKey
from dra_gateway.kube.runtime.workqueue import WorkQueue


class Unplaceable:
    def __init__(self, queue: WorkQueue[WorkKey], *, debounce: float,
                 retry_interval: float) -> None:
        self.queue = queue
        self.debounce = debounce  # pause between freed capacity and the retries
        self.retry_interval = retry_interval  # the most an event brings a next plan forward
        # Each waiting pod with the loop time before which no event replans it.
        self._not_before: dict[PodKey, float] = {}
        # Pods being planned, with whether an event woke them meanwhile.
        self._planning: dict[PodKey, bool] = {}
        self._retry_handle: asyncio.TimerHandle | None = None

    def __contains__(self, key: object) -> bool:
        return key in self._not_before

    def failed(self, key: PodKey) -> None:
        """The pod did not fit: the worker requeues it after its backoff, events no sooner
        than the retry interval."""
        wait = min(self.queue.next_delay(key), self.retry_interval)
        self._not_before[key] = asyncio.get_running_loop().time() + wait
        self.settle(key)

    def discard(self, key: PodKey) -> None:
        """The pod fit, or it is gone or no longer gated."""
        self._not_before.pop(key, None)
        self.settle(key)

    def planning(self, key: PodKey) -> None:
        """The pod is being planned: events for it wait for `failed`, `discard` or `settle`."""
        self._planning[key] = False

    def settle(self, key: PodKey) -> None:
        """The pod's plan is over: an event that came meanwhile wakes it now."""
        if self._planning.pop(key, False):
            self.wake(key)

    def wake(self, key: PodKey) -> None:
        """Queue a gated pod because something changed that may let it go on.

        A pod that did not fit waits until its earliest next plan however many events arrive
        meanwhile; any other pod is queued at once.
        """
        if key in self._planning:
            self._planning[key] = True
            return
        not_before = self._not_before.get(key)
        if not_before is None:
            self.queue.add(key)
        else:
            # An earlier pending retry (its backoff timer) is kept.
            self.queue.add_after(key, not_before - asyncio.get_running_loop().time())

    def capacity_changed(self) -> None:
        """Something freed or added capacity: give unplaceable pods another go, soon."""
        if not self._not_before or self._retry_handle is not None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - handlers always run on the loop
            return
        self._retry_handle = loop.call_later(self.debounce, self._retry)

    def close(self) -> None:
        if self._retry_handle is not None:
            self._retry_handle.cancel()

    def _retry(self) -> None:
        self._retry_handle = None
        for key in list(self._not_before):
            self.wake(key)


__all__ = ["Unplaceable"]

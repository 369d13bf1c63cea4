"""Warning Events on pods the allocator cannot place (and on claims it cannot count), with the
API's own spam filter.

One Event per object and message: a repeat bumps its `count` and `lastTimestamp`, written at most
once per interval; a new message starts a new Event. Events are advice to humans, so a failed
write is logged and dropped: this module must never raise into the allocation path, nor decide
anything about the pod.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime

from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.port import ApiError, Cluster, NotFound, Object
from dra_gateway.kube.resources import EVENTS

log = logging.getLogger(__name__)

COMPONENT = names.ALLOCATOR_COMPONENT
EVENT_ALLOCATION_FAILED = "AllocationFailed"
# On a claim whose allocation, written by someone else, holds what the API refuses from 1.38.
EVENT_INVALID_ALLOCATION = "InvalidAllocation"
_MAX_MESSAGE = 1024


def now() -> str:
    """The API's timestamp format, in UTC to the second."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def object_event(obj: Object, *, kind: str, api_version: str, reason: str, message: str,
                 type_: str, component: str, instance: str, stamp: str) -> Object:
    """A core/v1 Event about a namespaced object, new (count 1), its message cut to the API's
    length."""
    ns, name = objects.namespace_name(obj)
    return {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": ns},
        "involvedObject": {"apiVersion": api_version, "kind": kind, "name": name,
                           "namespace": ns, "uid": objects.uid(obj)},
        "reason": reason, "message": message[:_MAX_MESSAGE], "type": type_,
        "source": {"component": component}, "reportingComponent": component,
        "reportingInstance": instance, "firstTimestamp": stamp, "lastTimestamp": stamp,
        "count": 1,
    }


def pod_event(pod: Object, *, reason: str, message: str, type_: str, component: str,
              instance: str, stamp: str) -> Object:
    """A core/v1 Event about a pod (`object_event`)."""
    return object_event(pod, kind="Pod", api_version="v1", reason=reason, message=message,
                        type_=type_, component=component, instance=instance, stamp=stamp)


@dataclass
class _EventRecord:
    name: str
    message: str
    count: int  # failures seen
    written_at: float  # monotonic time of the last write


class EventRecorder:
    """The allocation failures of pods (and the claims the allocator cannot count), as Warning
    Events; one recorder per controller."""

    def __init__(self, cluster: Cluster, *, instance: str, interval: float) -> None:
        self.cluster = cluster
        self.instance = instance  # reportingInstance
        self.interval = interval  # a repeat is written at most this often
        self._events: dict[str, _EventRecord] = {}  # object uid -> its current Event

    def forget(self, pod_uid: str) -> None:
        """The pod is gone: its Event expires on its own."""
        self._events.pop(pod_uid, None)

    async def record_failure(self, pod: Object, message: str, *,
                             reason: str = EVENT_ALLOCATION_FAILED, kind: str = "Pod",
                             api_version: str = "v1") -> None:
        """A Warning Event on the pod (or the object of `kind`), once per message (later
        repeats bump its count); `reason` is the Event's (QuotaExceeded for a pod a GPUQuota
        holds back)."""
        uid, (ns, name) = objects.uid(pod), objects.namespace_name(pod)
        message = message[:_MAX_MESSAGE]
        stamp = now()
        record = self._events.get(uid)
        try:
            if record is not None and record.message == message:
                record.count += 1
                if time.monotonic() - record.written_at < self.interval:
                    return  # counted; written with a later repeat
                await self.cluster.patch(EVENTS, record.name, {
                    "count": record.count, "lastTimestamp": stamp}, namespace=ns)
                record.written_at = time.monotonic()
                return
            event = object_event(pod, kind=kind, api_version=api_version, reason=reason,
                                 message=message, type_="Warning", component=COMPONENT,
                                 instance=self.instance, stamp=stamp)
            await self.cluster.create(EVENTS, event, namespace=ns)
            self._events[uid] = _EventRecord(event["metadata"]["name"], message, 1,
                                             time.monotonic())
        except NotFound:
            self._events.pop(uid, None)  # the event expired: the next failure creates one
        except (ApiError, OSError, TimeoutError) as err:
            log.warning("could not record an event", extra={
                "object": f"{kind} {ns}/{name}", "error": str(err)})


__all__ = ["COMPONENT", "EVENT_ALLOCATION_FAILED", "EVENT_INVALID_ALLOCATION", "EventRecorder",
           "now", "object_event", "pod_event"]

"""Which gated pods get a Warning Event because no allocator leads: a pure decision.

Pods that use a claim of a gateway class carry the scheduling gate dra-gateway.io/allocation
until the allocator's leader places them; one allocator replica leads, through the Lease
`dra-gateway-allocator` in the gateway's namespace (kube/runtime/leader.py). With no allocator
running, those pods would wait gated without a word. `due_events` says which pods get an Event
now: the Lease has had no valid holder (none named, or its renewTime plus leaseDurationSeconds is
past, or no Lease at all) for at least the threshold, and the pod has been gated for at least the
threshold too (since its creation: the webhook gates a pod as it is created, and a gate is never
added later). Each pod gets one Event per outage. Its name comes from the pod's UID and the
Lease's last renewTime (which stays put while nobody holds the Lease), so every webhook replica
posting it writes the same object and all but the first get AlreadyExists: no duplicates, and no
coordination between replicas.

Times are wall-clock: the Lease's renewTime is the holder's clock, compared here with the
webhook's. Against a threshold of minutes, the seconds nodes' clocks differ by do not matter.
This module must not perform I/O nor read the clock (`now` is handed in); `allocatorwatch` reads
the Lease and the pods and posts the Events.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from dra_gateway.kube import names, objects

REASON = "AllocatorUnavailable"
COMPONENT = "dra-gateway-webhook"
# What leader election assumes when a Lease names a holder but no duration (kube/runtime/leader.py).
DEFAULT_LEASE_DURATION_S = 15.0
_MAX_NAME = 253  # Event names are DNS subdomains
_DIGEST = 16
ABSENT = "absent"  # the outage key while no Lease exists


def span(seconds: float) -> str:
    """`3m12s`, `1h5m`, `40s`: how long, to the second."""
    total = max(0, int(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [f"{hours}h" if hours else "", f"{minutes}m" if minutes else "",
             f"{secs}s" if secs or not (hours or minutes) else ""]
    return "".join(parts)


@dataclass(frozen=True, slots=True)
class LeaseRecord:
    """What the webhook knows of the allocator's Lease.

    observed_at: when the webhook first saw the Lease in its present state (the Lease missing,
        say); the vacancy of a Lease that carries no time of its own counts from then.
    holder, renew_time (verbatim), duration_s: the Lease's spec; "" and None when unset.
    last_holder: the holder named now, else the last one the webhook saw (a graceful release
        clears holderIdentity).
    """

    namespace: str
    name: str
    observed_at: datetime
    exists: bool = True
    holder: str = ""
    renew_time: str = ""
    duration_s: float | None = None
    last_holder: str = ""

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"


def lease_record(lease: Mapping[str, Any] | None, *, namespace: str, name: str,
                 now: datetime, previous: LeaseRecord | None = None) -> LeaseRecord:
    """The record of `lease` (None: there is no Lease) seen at `now`, after `previous`."""
    if lease is None:
        record = LeaseRecord(namespace, name, now, exists=False)
    else:
        spec = lease.get("spec") or {}
        try:
            duration = float(spec["leaseDurationSeconds"])
        except (KeyError, TypeError, ValueError):
            duration = None
        record = LeaseRecord(namespace, name, now, holder=str(spec.get("holderIdentity") or ""),
                             renew_time=str(spec.get("renewTime") or ""), duration_s=duration)
    last_holder = record.holder or (previous.last_holder if previous is not None else "")
    observed_at = now
    if previous is not None and (previous.exists, previous.holder, previous.renew_time) == (
            record.exists, record.holder, record.renew_time):
        observed_at = previous.observed_at
    return LeaseRecord(record.namespace, record.name, observed_at, record.exists,
                       record.holder, record.renew_time, record.duration_s, last_holder)


@dataclass(frozen=True, slots=True)
class Vacancy:
    """Since when no allocator holds the Lease. `outage` names this outage (the Lease's last
    renewTime, unchanged while nobody holds it); `said` tells it in words."""

    since: datetime
    outage: str
    said: str


def vacancy(lease: LeaseRecord, now: datetime) -> Vacancy | None:
    """None while the Lease has a valid holder."""
    if not lease.exists:
        return Vacancy(lease.observed_at, ABSENT,
                       f"does not exist (missing since {objects.stamp(lease.observed_at)})")
    renewed = objects.parse_time(lease.renew_time)
    outage = lease.renew_time or "unset"
    if not lease.holder:
        since = renewed or lease.observed_at
        return Vacancy(since, outage, f"has had no holder since {objects.stamp(since)}")
    duration = lease.duration_s if lease.duration_s and lease.duration_s > 0 \
        else DEFAULT_LEASE_DURATION_S
    expires = (renewed or lease.observed_at) + timedelta(seconds=duration)
    if expires > now:
        return None
    renewal = f"last renewed {objects.stamp(renewed)}, " if renewed else ""
    return Vacancy(expires, outage, f"expired at {objects.stamp(expires)} ({renewal}held for "
                   f"{duration:g}s by {lease.holder})")


@dataclass(frozen=True, slots=True)
class GatedPod:
    """A pod waiting for the allocator: gated, not being deleted."""

    namespace: str
    name: str
    uid: str
    created: datetime


def gated_pod(pod: Mapping[str, Any]) -> GatedPod | None:
    """The pod as `due_events` needs it, or None when it is not waiting for the allocator."""
    if not objects.is_gated(pod) or objects.is_deleting(pod):
        return None
    meta = objects.meta(pod)
    created = objects.parse_time(str(meta.get("creationTimestamp") or ""))
    namespace, name = objects.namespace_name(pod)
    uid = objects.uid(pod)
    if created is None or not (namespace and name and uid):
        return None
    return GatedPod(namespace, name, uid, created)


@dataclass(frozen=True, slots=True)
class DueEvent:
    """An Event to post now: its name (the same in every replica), the pod, the message."""

    name: str
    pod: GatedPod
    message: str


def event_name(pod: GatedPod, outage: str) -> str:
    """`<pod>.<digest of the pod's UID and the outage>`: one name per pod and outage."""
    digest = hashlib.sha256(f"{pod.uid}/{outage}".encode()).hexdigest()[:_DIGEST]
    prefix = pod.name[:_MAX_NAME - _DIGEST - 1].rstrip(".-")
    return f"{prefix}.{digest}"


def due_events(lease: LeaseRecord, pods: Iterable[GatedPod], *, now: datetime,
               threshold_s: float, posted: Collection[str] = ()) -> list[DueEvent]:
    """The Events to post now (by namespace and name), leaving out those in `posted`.

    None while the Lease has a valid holder or has lacked one for less than `threshold_s`;
    then one for every pod gated for at least `threshold_s`.
    """
    vacant = vacancy(lease, now)
    if vacant is None:
        return []
    vacant_s = (now - vacant.since).total_seconds()
    if vacant_s < threshold_s:
        return []
    due = []
    for pod in sorted(pods, key=lambda p: (p.namespace, p.name, p.uid)):
        if (now - pod.created).total_seconds() < threshold_s:
            continue
        name = event_name(pod, vacant.outage)
        if name in posted:
            continue
        due.append(DueEvent(name, pod, _message(lease, vacant, vacant_s)))
    return due


def _message(lease: LeaseRecord, vacant: Vacancy, vacant_s: float) -> str:
    last = f"its last holder was {lease.last_holder}" if lease.last_holder \
        else "no holder of it was seen"
    return (f"no dra-gateway allocator has led for {span(vacant_s)}: the Lease {lease.ref} "
            f"{vacant.said}; {last}. This pod keeps the scheduling gate "
            f"{names.SCHEDULING_GATE} until the allocator's leader places it. Check the "
            f"allocator Deployment in namespace {lease.namespace} (kubectl -n {lease.namespace} "
            "get deployment,pods -l app.kubernetes.io/component=allocator; its events and "
            "logs) and that its pods may update that Lease.")


def event_object(due: DueEvent, *, now: datetime, instance: str) -> dict[str, Any]:
    """The core/v1 Warning Event of `due` (kubectl describe pod shows it)."""
    pod = due.pod
    moment = objects.stamp(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": due.name, "namespace": pod.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace,
                           "name": pod.name, "uid": pod.uid},
        "reason": REASON,
        "message": due.message,
        "type": "Warning",
        "source": {"component": COMPONENT},
        "reportingComponent": COMPONENT,
        "reportingInstance": instance,
        "firstTimestamp": moment,
        "lastTimestamp": moment,
        "count": 1,
    }

"""Leader election through a coordination.k8s.io/v1 Lease: one active allocator replica.

The protocol is client-go's: a candidate takes the Lease when it is free (no holder) or when
its record has not changed for `lease_duration` seconds of the candidate's own monotonic
clock (never by comparing another machine's timestamps); the leader renews every
`retry_period` and gives up as soon as it has not managed to renew for `renew_deadline`
seconds, which is shorter than the lease so that it stops before anyone else can start. Every
write is an optimistic update carrying the resourceVersion read, so two candidates cannot both
win. Losing the lease cancels the leader's work at once; a graceful stop releases the Lease
so that a standby takes over without waiting for it to expire.

Timeouts use `asyncio.timeout`, not `asyncio.wait_for`, which in Python 3.11 can swallow a
cancellation that arrives as the awaited call completes (and then a stopped replica would keep
renewing).

Fencing: the work is cancelled when the Lease is lost, but a replica whose loop or process
stalled learns of it only when it runs again, possibly in the middle of a write. So the work
checks `check_leading` right before each write: it raises `LeadershipLost` unless this replica
holds the Lease and last renewed it less than `renew_deadline` ago by its own monotonic clock.
A standby takes over only `lease_duration` after it saw the record last change, so a write
checked in time lands before anyone else may write (client-go leaves this to its callers;
carrying the Lease's resourceVersion in each write is impossible, the API has no transaction
across objects). This module knows nothing of allocation: it runs whatever coroutine it is given.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import AlreadyExists, ApiError, Cluster, Conflict, NotFound
from dra_gateway.kube.resources import LEASES

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseSettings:
    identity: str
    name: str = names.ALLOCATOR_LEASE
    namespace: str = names.GATEWAY_NAMESPACE
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 2.0

    def __post_init__(self) -> None:
        if not self.identity:
            raise ValueError("the Lease holder identity must not be empty")
        if not 0 < self.retry_period < self.renew_deadline < self.lease_duration:
            raise ValueError(
                "lease timings need 0 < retry_period < renew_deadline < lease_duration, got "
                f"{self.retry_period}, {self.renew_deadline} and {self.lease_duration}")


class LeadershipLost(Exception):
    """A write was about to be made by a replica that may no longer hold the Lease."""


def micro_time(moment: datetime | None = None) -> str:
    """A metav1.MicroTime: RFC 3339 in UTC with microseconds."""
    moment = moment or datetime.now(UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaderElector:
    """Campaigns for one Lease and runs work only while holding it."""

    def __init__(self, cluster: Cluster, settings: LeaseSettings, *,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.cluster = cluster
        self.settings = settings
        self._monotonic = monotonic
        self._observed: dict[str, Any] | None = None  # the last Lease spec seen
        self._observed_at = 0.0
        self._leading = False
        self._renewed_at: float | None = None  # monotonic time of our last successful write
        self.transitions_seen = 0  # times this replica became the leader

    @property
    def is_leader(self) -> bool:
        return self._leading

    def check_leading(self) -> None:
        """Raise LeadershipLost unless this replica leads and renewed within renew_deadline.

        Called right before each write of the work: a stalled former leader must not write
        after a standby may have taken over.
        """
        s = self.settings
        if not self._leading or self._renewed_at is None:
            raise LeadershipLost(f"{s.identity} does not hold the Lease {self._lease_ref()}")
        age = self._monotonic() - self._renewed_at
        if age >= s.renew_deadline:
            raise LeadershipLost(
                f"{s.identity} last renewed the Lease {self._lease_ref()} {age:.1f}s ago, "
                f"beyond the renew deadline of {s.renew_deadline:g}s; another replica may lead")

    async def run(self, lead: Callable[[], Awaitable[None]]) -> None:
        """Campaign; while leading run `lead()`, cancelled at once if the Lease is lost.

        Returns when `lead()` returns (releasing the Lease) and re-raises what it raises.
        Cancelling `run` stops the work and releases the Lease.
        """
        while True:
            await self._acquire()
            work = asyncio.ensure_future(lead())
            renew = asyncio.ensure_future(self._keep_renewing())
            try:
                await asyncio.wait({work, renew}, return_when=asyncio.FIRST_COMPLETED)
            except asyncio.CancelledError:
                await _cancel(work, renew)
                await self.release()
                raise
            if work.done():
                await _cancel(renew)
                await self.release()
                work.result()  # re-raise what the work raised
                return
            # The Lease is lost: stop working before anyone else can start.
            self._leading = False
            self._renewed_at = None
            await _cancel(work)
            log.warning("lost the lease, stopped work",
                        extra={"lease": self._lease_ref(), "identity": self.settings.identity})

    async def release(self) -> None:
        """Hand the Lease back if this replica holds it (best effort, never raises)."""
        if not self._leading:
            return
        self._leading = False
        self._renewed_at = None
        s = self.settings
        try:
            async with asyncio.timeout(s.retry_period):
                lease = await self.cluster.get(LEASES, s.name, namespace=s.namespace)
            spec = lease.get("spec") or {}
            if spec.get("holderIdentity") != s.identity:
                return
            now = micro_time()
            lease["spec"] = {**spec, "leaseDurationSeconds": 1, "renewTime": now,
                             "acquireTime": now}
            lease["spec"].pop("holderIdentity", None)
            async with asyncio.timeout(s.retry_period):
                await self.cluster.update(LEASES, lease, namespace=s.namespace)
            log.info("released the lease", extra={"lease": self._lease_ref(),
                                                   "identity": s.identity})
        except (ApiError, OSError, TimeoutError) as err:
            log.warning("could not release the lease; it expires on its own",
                        extra={"lease": self._lease_ref(), "error": str(err)})

    async def _acquire(self) -> None:
        logged_waiting = False
        while True:
            try:
                async with asyncio.timeout(self.settings.renew_deadline):
                    acquired = await self.try_acquire_or_renew()
                if acquired:
                    self._leading = True
                    self.transitions_seen += 1
                    log.info("became the leader", extra={"lease": self._lease_ref(),
                                                         "identity": self.settings.identity})
                    return
                if not logged_waiting:
                    holder = (self._observed or {}).get("holderIdentity")
                    log.info("another replica leads; standing by",
                             extra={"lease": self._lease_ref(), "holder": holder})
                    logged_waiting = True
            except (ApiError, OSError, TimeoutError) as err:
                log.warning("could not read or write the lease",
                            extra={"lease": self._lease_ref(), "error": str(err)})
            await asyncio.sleep(self.settings.retry_period)

    async def _keep_renewing(self) -> None:
        """Returns when the Lease is lost: renew failed for renew_deadline, or taken."""
        s = self.settings
        last_renewed = self._monotonic()
        while True:
            await asyncio.sleep(s.retry_period)
            remaining = s.renew_deadline - (self._monotonic() - last_renewed)
            renewed = False
            if remaining > 0:
                try:
                    async with asyncio.timeout(remaining):
                        renewed = await self.try_acquire_or_renew()
                except (ApiError, OSError, TimeoutError) as err:
                    log.warning("failed to renew the lease",
                                extra={"lease": self._lease_ref(), "error": str(err)})
            if renewed:
                last_renewed = self._monotonic()
                continue
            holder = (self._observed or {}).get("holderIdentity")
            if holder and holder != s.identity:
                return  # someone else holds it now
            if self._monotonic() - last_renewed >= s.renew_deadline:
                return

    async def try_acquire_or_renew(self) -> bool:
        """One attempt: True when this replica holds the Lease afterwards."""
        s = self.settings
        now = micro_time()
        try:
            lease = await self.cluster.get(LEASES, s.name, namespace=s.namespace)
        except NotFound:
            spec = {"holderIdentity": s.identity, "leaseDurationSeconds": _seconds(s),
                    "acquireTime": now, "renewTime": now, "leaseTransitions": 0}
            started = self._monotonic()
            try:
                created = await self.cluster.create(
                    LEASES, {"apiVersion": LEASES.api_version, "kind": LEASES.kind,
                             "metadata": {"name": s.name, "namespace": s.namespace},
                             "spec": spec}, namespace=s.namespace)
            except AlreadyExists:
                return False
            self._observe(created.get("spec") or {})
            self._renewed_at = started
            return True
        spec = dict(lease.get("spec") or {})
        self._observe(spec)
        holder = spec.get("holderIdentity")
        mine = holder == s.identity
        if holder and not mine:
            duration = float(str(spec.get("leaseDurationSeconds") or s.lease_duration))
            if self._monotonic() < self._observed_at + duration:
                return False
        new_spec = {**spec, "holderIdentity": s.identity, "leaseDurationSeconds": _seconds(s),
                    "renewTime": now}
        if not (mine and self._leading):
            new_spec["acquireTime"] = now
            new_spec["leaseTransitions"] = int(str(spec.get("leaseTransitions") or 0)) + (
                1 if holder != s.identity else 0)
        lease["spec"] = new_spec
        # Counted from before the write: a standby times the record from when it saw it change.
        started = self._monotonic()
        try:
            updated = await self.cluster.update(LEASES, lease, namespace=s.namespace)
        except Conflict:
            return False  # another candidate wrote first; look again next round
        self._observe(updated.get("spec") or {})
        self._renewed_at = started
        return True

    def _observe(self, spec: dict[str, Any]) -> None:
        # Expiry is judged by when *we* saw the record change, not by the holder's clock.
        if spec != self._observed:
            self._observed = dict(spec)
            self._observed_at = self._monotonic()

    def _lease_ref(self) -> str:
        return f"{self.settings.namespace}/{self.settings.name}"


def _seconds(settings: LeaseSettings) -> int:
    # Rounded up: a Lease that says less than lease_duration lets a standby take over while
    # this replica may still be working (up to renew_deadline + retry_period after a renewal).
    return max(1, math.ceil(settings.lease_duration))


async def _cancel(*tasks: asyncio.Future[Any]) -> None:
    for task in tasks:
        task.cancel()
    for result in await asyncio.gather(*tasks, return_exceptions=True):
        if isinstance(result, Exception):
            log.error("leader work failed while stopping", extra={"error": repr(result)})

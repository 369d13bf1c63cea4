"""Device health: XID errors, lost GPUs, NVML outages and a fault file, turned into what the
cluster can keep, and lifted again once the device has recovered.

Each fault has a class (`faults.py`): a fatal one taints the device `NoExecute` (its pods are
evicted), a degraded one `NoSchedule` (no new work), an informational one is only counted.
Where the cluster keeps device taints (DRADeviceTaints), an unhealthy device stays published
with that taint, so schedulers and the allocator skip it and operators see why. Where it does
not, the device is withheld from the slice instead (and the allocator evicts the pods of a
fatal one). Either way the Node condition `GpuDevicesUnhealthy` (its format in
kube/device_health.py) and a metric say which devices, why, and when each is healthy again.

Recovery (`recovery_seconds`; 0 keeps every mark until an administrator clears it): a
degraded device is healthy again once no fault hit it for that long; a fatal one once
the card showed it came back (NVML sees a lost GPU again, the fault file says `recovered`) and
then stayed without a fault for that long. An NVML outage marks every device unhealthy ("no
healthy devices") and is cleared when NVML answers again. An administrator may clear a
device's faults or keep its mark through its Node's annotations (`apply_orders`). An XID that
NVML attributes to one MIG instance (its GPU-instance and compute-instance ids) marks that
instance only; one that is not MIG-specific marks every device of the card, as NVIDIA's device
plugin does. Marks outlive the plugin: `saved()` is what `healthstate.py` keeps, `restore()`
takes it back at start, so a card out of service stays out across a restart until it recovers
by these rules or is cleared (NVIDIA's plugins forget, and publish a failed card again). This
module decides; the publisher and the cluster port do the writing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError, Cluster
from dra_gateway.kube.device_health import (
    WITHHELD,
    AdminOrders,
    DeviceMark,
    marks_message,
)
from dra_gateway.kube.resources import NODES
from dra_gateway.node_plugin.devices import DeviceInfo
from dra_gateway.node_plugin.faults import (
    EFFECTS,
    FATAL,
    GPU_LOST,
    INFORMATIONAL,
    NVML_UNAVAILABLE,
    Severity,
    severity_of,
    worse,
)
from dra_gateway.node_plugin.healthstate import SavedHealth, SavedMark
from dra_gateway.node_plugin.metrics import Metrics
from dra_gateway.node_plugin.nvml import Nvml, NvmlError, XidEvent

log = logging.getLogger(__name__)

CONDITION_TYPE = names.NODE_HEALTH_CONDITION
_LONG_AGO = datetime.min.replace(tzinfo=UTC)


def taint_key(driver: str) -> str:
    return f"{driver}{names.UNHEALTHY_TAINT_SUFFIX}"


@dataclass(frozen=True, slots=True)
class Problem:
    reason: str  # a label value: "xid-79", "gpu-lost", "nvml-unavailable"
    since: str  # RFC 3339: when the device was first marked
    severity: Severity = "degraded"
    last_fault: float = 0.0  # monotonic seconds of the latest fault on the device
    recovered: float | None = None  # monotonic seconds of the latest sign that it came back
    last_fault_at: datetime = _LONG_AGO  # the latest fault's wall time


def devices_by_card(table: Mapping[str, DeviceInfo]) -> dict[str, list[str]]:
    """Card UUID to the names of the devices on it (the card, or its MIG instances)."""
    out: dict[str, list[str]] = {}
    for name, info in sorted(table.items()):
        out.setdefault(info.card_uuid, []).append(name)
    return out


def mig_instances(table: Mapping[str, DeviceInfo]) -> dict[str, tuple[int | None, int | None]]:
    """MIG device name to its (GPU-instance id, compute-instance id); None where unknown."""
    return {name: (info.gpu_instance_id, info.compute_instance_id)
            for name, info in sorted(table.items()) if info.kind == "mig"}


def xid_devices(event: XidEvent, devices: list[str],
                instances: Mapping[str, tuple[int | None, int | None]]) -> list[str]:
    """The devices of the event's card that the XID hit.

    An event NVML does not attribute to a MIG instance (its ids are 0xFFFFFFFF, here None)
    hits the whole card, so every device on it. One that names a GPU and compute instance hits
    the MIG device with those ids; a full card (not in `instances`) is always hit, and so is an
    instance whose ids discovery could not learn, since it cannot be ruled out.
    """
    gi, ci = event.gpu_instance_id, event.compute_instance_id
    if gi is None or ci is None:
        return list(devices)
    hit = []
    for device in devices:
        ids = instances.get(device)
        if ids is None or None in ids or ids == (gi, ci):
            hit.append(device)
    return hit


class Health:
    """Which devices are unhealthy, why and how badly; changes call `on_change`."""

    def __init__(self, *, driver: str, on_change: Callable[[], None],
                 metrics: Metrics | None = None, recovery_seconds: float = 0.0,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC),
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        self.driver = driver
        self.recovery_seconds = recovery_seconds
        self._on_change = on_change
        self._metrics = metrics or Metrics()
        self._clock = clock
        self._monotonic = monotonic
        self._problems: dict[str, Problem] = {}
        # Why each device's mark was lifted last, for the Event that says so.
        self.lifted_because: dict[str, str] = {}
        # The devices an administrator keeps out of service: their marks never lift by
        # themselves (`apply_orders`).
        self.kept: frozenset[str] = frozenset()

    @property
    def problems(self) -> dict[str, Problem]:
        return dict(self._problems)

    def mark(self, devices: list[str], reason: str) -> None:
        """A fault hit `devices`: mark them (an informational one is only logged); a device
        already marked keeps its first reason unless this one is more severe, and its
        recovery starts over."""
        severity = severity_of(reason)
        if severity == INFORMATIONAL:
            log.info("%s on %s is the application's: the device stays healthy", reason,
                     ", ".join(devices))
            return
        wall = self._clock()
        since = wall.strftime("%Y-%m-%dT%H:%M:%SZ")
        now = self._monotonic()
        changed = False
        for device in devices:
            old = self._problems.get(device)
            if old is None:
                self._problems[device] = Problem(reason, since, severity, now,
                                                 last_fault_at=wall)
                changed = True
                log.warning("device %s is unhealthy (%s): %s", device, severity, reason)
            elif worse(severity, old.severity) != old.severity:
                self._problems[device] = Problem(reason, old.since, severity, now,
                                                 last_fault_at=wall)
                changed = True
                log.warning("device %s is now %s: %s", device, severity, reason)
            else:
                # Its recovery starts over. A device that had come back no longer has a time
                # to be healthy at; a degraded one's moves later (the condition says "unless a
                # fault hits it first", and is not rewritten for every fault of a storm).
                changed = changed or old.recovered is not None
                self._problems[device] = replace(old, last_fault=now, recovered=None,
                                                 last_fault_at=wall)
        if changed:
            self._changed()

    def recovered(self, devices: list[str], how: str, *, reason: str | None = None) -> None:
        """A sign that `devices` came back (a lost GPU answers again, the fault file says so):
        their marks (of `reason` only, when given) lift after the recovery period without a
        fault (`lift_recovered`)."""
        now = self._monotonic()
        changed = False
        for device in devices:
            old = self._problems.get(device)
            if old is not None and old.recovered is None and reason in (None, old.reason):
                self._problems[device] = replace(old, recovered=now)
                changed = True
                log.info("device %s came back (%s): healthy again after %.0fs without a fault",
                         device, how, self.recovery_seconds)
        if changed:
            self._changed()  # the condition says when it is healthy again

    def _lifts_at(self, device: str, problem: Problem) -> float | None:
        """Monotonic seconds at which the mark lifts unless a fault comes first; None when
        nothing lifts it by itself (no recovery period, an NVML outage, a fatal fault with no
        sign of recovery yet, an administrator keeping it)."""
        if self.recovery_seconds <= 0 or problem.reason == NVML_UNAVAILABLE \
                or device in self.kept:
            return None
        if problem.severity == FATAL:
            if problem.recovered is None:
                return None
            return max(problem.recovered, problem.last_fault) + self.recovery_seconds
        return problem.last_fault + self.recovery_seconds

    def lift_recovered(self) -> list[str]:
        """Lift the marks of the devices that recovered; the devices lifted."""
        now = self._monotonic()
        lifted = [device for device, problem in sorted(self._problems.items())
                  if (at := self._lifts_at(device, problem)) is not None and now >= at]
        for device in lifted:
            problem = self._problems.pop(device)
            log.info("device %s is healthy again: no fault for %.0fs since %s", device,
                     self.recovery_seconds, problem.reason)
            self.lifted_because[device] = (
                f"it came back and had no fault for {self.recovery_seconds:g}s"
                if problem.severity == FATAL
                else f"no fault for {self.recovery_seconds:g}s")
            self._metrics.recoveries.inc()
        if lifted:
            self._changed()
        return lifted

    def clear(self, reason: str) -> None:
        """Drop every mark of one reason (NVML answering again clears its outage marks)."""
        cleared = [d for d, p in self._problems.items() if p.reason == reason]
        for device in cleared:
            del self._problems[device]
            self.lifted_because[device] = f"{reason} ended"
        if cleared:
            self._changed()

    def apply_orders(self, orders: AdminOrders) -> None:
        """What an administrator said on the Node: a device whose faults are cleared up to a
        time at or after its latest fault is healthy again now; a kept device's mark does not
        lift by itself until it is no longer kept."""
        cleared = []
        for device, problem in sorted(self._problems.items()):
            until = orders.cleared_until(device)
            if until is not None and until >= problem.last_fault_at:
                cleared.append((device, until))
        for device, until in cleared:
            problem = self._problems.pop(device)
            log.info("device %s is healthy again: an administrator cleared its faults up to "
                     "%s (it had %s)", device, until.isoformat(), problem.reason)
            self.lifted_because[device] = (f"an administrator cleared its faults up to "
                                           f"{until.strftime('%Y-%m-%dT%H:%M:%SZ')}")
        kept_changed = (orders.keep & set(self._problems)) != (self.kept & set(self._problems))
        self.kept = orders.keep
        if cleared or kept_changed:
            self._changed()

    def marks(self, *, tainted: bool) -> list[DeviceMark]:
        """The marks as the Node condition lists them: what was done to each device (tainted
        with its class's effect, or withheld), and when it is healthy again."""
        wall, now = self._clock(), self._monotonic()
        out = []
        for device, problem in sorted(self._problems.items()):
            at = self._lifts_at(device, problem)
            healthy_at = "" if at is None else (
                wall + timedelta(seconds=max(0.0, at - now))).strftime("%Y-%m-%dT%H:%M:%SZ")
            out.append(DeviceMark(
                device, problem.reason, problem.severity,
                f"tainted {EFFECTS[problem.severity]}" if tainted else WITHHELD,
                problem.since, healthy_at=healthy_at, kept=device in self.kept))
        return out

    def saved(self) -> SavedHealth:
        """The marks and the kept devices in wall-clock times, for `healthstate.save`."""
        wall, now = self._clock(), self._monotonic()

        def at(monotonic: float) -> datetime:
            return wall - timedelta(seconds=max(0.0, now - monotonic))

        return SavedHealth(tuple(
            SavedMark(device, p.reason, p.severity, p.since, p.last_fault_at,
                      None if p.recovered is None else at(p.recovered))
            for device, p in sorted(self._problems.items())), self.kept)

    def restore(self, saved: SavedHealth) -> None:
        """Take back what an earlier run saved (or the Node's condition said): each mark with
        its recovery where it stood, the kept devices. Replaces the marks; `on_change` is not
        called (the caller knows what it restored and says so once)."""
        wall, now = self._clock(), self._monotonic()

        def at(when: datetime) -> float:
            return now - max(0.0, (wall - when).total_seconds())

        self._problems = {m.device: Problem(
            m.reason, m.since, m.severity, at(m.last_fault_at),
            None if m.recovered_at is None else at(m.recovered_at),
            last_fault_at=m.last_fault_at) for m in saved.marks}
        self.kept = saved.kept
        self._metrics.unhealthy_devices.set(len(self._problems))

    def _changed(self) -> None:
        self._metrics.unhealthy_devices.set(len(self._problems))
        self._on_change()

    def taints(self) -> dict[str, list[dict[str, Any]]]:
        return {device: [{"key": taint_key(self.driver), "value": p.reason,
                          "effect": EFFECTS[p.severity], "timeAdded": p.since}]
                for device, p in sorted(self._problems.items())}

    def withheld(self) -> frozenset[str]:
        return frozenset(self._problems)

    def condition(self, *, tainted: bool) -> dict[str, Any]:
        now = self._clock().strftime("%Y-%m-%dT%H:%M:%SZ")
        if not self._problems:
            return {"type": CONDITION_TYPE, "status": "False", "reason": "AllDevicesHealthy",
                    "message": f"every {self.driver} device is healthy",
                    "lastHeartbeatTime": now, "lastTransitionTime": now}
        return {"type": CONDITION_TYPE, "status": "True", "reason": "DevicesUnhealthy",
                "message": marks_message(self.driver, self.marks(tainted=tainted)),
                "lastHeartbeatTime": now, "lastTransitionTime": now}

    async def run_recovery(self, interval: float = 1.0) -> None:
        """Lift recovered marks every `interval` seconds until cancelled."""
        while True:
            await asyncio.sleep(interval)
            self.lift_recovered()


@dataclass(frozen=True, slots=True)
class Transition:
    """A device turned unhealthy, worse, or healthy again: what its Node's Event says."""

    device: str
    type: str  # "Warning" or "Normal"
    reason: str  # the Event's reason
    message: str


def transitions(before: Mapping[str, Problem], after: Mapping[str, Problem], *, tainted: bool,
                lifted_because: Mapping[str, str]) -> list[Transition]:
    """What changed between two sets of marks, device by device, in words for operators:
    what hit the device and what that does to it (its taint's effect, or withheld where the
    cluster keeps no device taints), or why it is healthy again."""
    found = []
    for device, problem in sorted(after.items()):
        old = before.get(device)
        if old is not None and old.severity == problem.severity:
            continue
        if tainted:
            effect = EFFECTS[problem.severity]
            does = (f"tainted {effect}: its pods are evicted and it takes no new ones"
                    if effect == "NoExecute" else f"tainted {effect}: it takes no new pods")
        else:
            does = "withheld from the node's ResourceSlices: it takes no new pods"
        found.append(Transition(device, "Warning", "DeviceUnhealthy",
                                f"device {device}: {problem.reason} ({problem.severity} fault) "
                                f"since {problem.since}; {does}"))
    for device, problem in sorted(before.items()):
        if device not in after:
            why = lifted_because.get(device, "its mark was lifted")
            found.append(Transition(device, "Normal", "DeviceHealthy",
                                    f"device {device} is healthy again ({why}); it had "
                                    f"{problem.reason} ({problem.severity} fault) since "
                                    f"{problem.since}"))
    return found


async def report_condition(cluster: Cluster, node_name: str, health: Health, *,
                           tainted: bool) -> bool:
    """Patch the Node's condition; False when it was not written (logged, never raised: the
    caller tries again, since where the cluster keeps no device taints the allocator's drain
    reads only this condition)."""
    return await patch_node_condition(cluster, node_name, health.condition(tainted=tainted))


async def patch_node_condition(cluster: Cluster, node_name: str,
                               condition: Mapping[str, Any]) -> bool:
    """Set one condition of the plugin's Node (its status, merged by type); False when it was
    not written (logged, never raised)."""
    try:
        await cluster.patch(NODES, node_name, {"status": {"conditions": [dict(condition)]}},
                            patch_type="strategic", subresource="status")
    except ApiError as exc:
        log.warning("could not set condition %s on Node %s: %s (%s)", condition.get("type"),
                    node_name, exc.message, exc.reason)
        return False
    except (OSError, TimeoutError) as exc:
        log.warning("could not set condition %s on Node %s: %r", condition.get("type"),
                    node_name, exc)
        return False
    return True


async def watch_nvml(*, health: Health, nvml_factory: Callable[[], Nvml],
                     cards: Mapping[str, list[str]], metrics: Metrics,
                     instances: Mapping[str, tuple[int | None, int | None]] | None = None,
                     poll_ms: int = 5000, retry_seconds: float = 30.0) -> None:
    """Mark devices from XID events and lost GPUs; survive NVML outages. Never returns.

    `cards` maps a card UUID to its devices' names; `instances` (from `mig_instances`) gives
    the MIG devices' instance ids, so an XID on one MIG instance marks only that one.

    NVML's event wait blocks, so it runs in a worker thread with a bounded timeout; between
    waits every card is probed so a GPU that fell off the bus is seen without an event.
    """
    every_device = sorted(d for devices in cards.values() for d in devices)
    while True:
        # A worker thread cannot be cancelled: it checks `stop` between bounded waits.
        stop = threading.Event()
        try:
            await asyncio.to_thread(_watch_session, health, nvml_factory, cards,
                                    instances or {}, metrics, poll_ms,
                                    asyncio.get_running_loop(), stop)
        except NvmlError as exc:
            metrics.nvml_up.set(0)
            log.error("NVML failed: %s; no device is reported healthy until it answers again "
                      "(retrying every %.0fs)", exc, retry_seconds)
            health.mark(every_device, NVML_UNAVAILABLE)
        except Exception:  # a bug or a ctypes surprise must not end health watching
            metrics.nvml_up.set(0)
            log.exception("the NVML health check failed unexpectedly; no device is reported "
                          "healthy until it works again (retrying every %.0fs)", retry_seconds)
            health.mark(every_device, NVML_UNAVAILABLE)
        finally:
            stop.set()
        await asyncio.sleep(retry_seconds)


def _watch_session(health: Health, nvml_factory: Callable[[], Nvml],
                   cards: Mapping[str, list[str]],
                   instances: Mapping[str, tuple[int | None, int | None]], metrics: Metrics,
                   poll_ms: int, loop: asyncio.AbstractEventLoop, stop: threading.Event) -> None:
    def call(fn: Callable[..., None], *args: Any) -> None:
        # Health state lives on the event loop; the thread hands it the updates.
        if not stop.is_set():
            loop.call_soon_threadsafe(fn, *args)

    with nvml_factory() as nvml:
        events = nvml.xid_events(sorted(cards))
        try:
            for uuid in events.unsupported:
                log.info("GPU %s does not report XID events: only lost-GPU checks apply", uuid)
            metrics.nvml_up.set(1)
            call(health.clear, NVML_UNAVAILABLE)
            for uuid in events.lost:
                call(health.mark, cards[uuid], GPU_LOST)
            while not stop.is_set():
                for uuid, lost in nvml.probe(sorted(cards)).items():
                    if lost:
                        call(health.mark, cards[uuid], GPU_LOST)
                    else:
                        call(_answers_again, health, cards[uuid])
                event = events.wait(poll_ms)
                if event is not None:
                    _on_xid(event, health, cards, instances, metrics, call)
        finally:
            with contextlib.suppress(NvmlError):
                events.close()


def _answers_again(health: Health, devices: list[str]) -> None:
    health.recovered(devices, "NVML sees the card again", reason=GPU_LOST)


def _on_xid(event: XidEvent, health: Health, cards: Mapping[str, list[str]],
            instances: Mapping[str, tuple[int | None, int | None]], metrics: Metrics,
            call: Callable[..., None]) -> None:
    metrics.xid_events.labels(str(event.xid)).inc()
    if event.is_application_error:
        log.info("XID %d on %s is an application error: the device stays healthy",
                 event.xid, event.uuid)
        return
    devices = cards.get(event.uuid)
    if devices is None:
        log.warning("XID %d on unknown device %s", event.xid, event.uuid)
        return
    hit = xid_devices(event, devices, instances)
    if not hit:
        log.warning("XID %d on %s names GPU instance %d, compute instance %d, which no "
                    "published device is: nothing is marked", event.xid, event.uuid,
                    event.gpu_instance_id, event.compute_instance_id)
        return
    call(health.mark, hit, f"xid-{event.xid}")

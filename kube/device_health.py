"""What a node plugin says on its Node about devices out of service, and what an administrator
says back: one home for both formats, written by the node plugin, read by the allocator (which
drains where the cluster keeps no device taints) and by `dra-gateway report`.

The node plugin's condition `GpuDevicesUnhealthy` (True while any device is marked) lists each
device in its message, for people and for the gateway alike:

    2 gpu.dra-gateway.io device(s) out of service: gpu-3 (xid-79, fatal, withheld, since
    2026-12-06T10:00:00Z, healthy at 2026-12-06T10:05:00Z); gpu-4 (xid-94, degraded, tainted
    NoSchedule, since 2026-12-06T10:01:00Z, kept)

Each entry: the device, then its fault's reason, its class, what was done to the device
(`withheld` from the slices where the cluster keeps no device taints, else `tainted <effect>`),
since when; then `healthy at T` when it is healthy again at T unless a fault hits it first (a
degraded device, or a fatal one that came back), or `kept` when an administrator keeps it out of
service.

An administrator acts through two annotations on the Node (the node plugin reads them while any
of its devices is marked):

- `dra-gateway.io/clear-device-faults: "gpu-3=2026-12-06T10:30:00Z"` (or `*=...` for every
  device): forget the device's faults up to that time; it is healthy again now. A fault after
  that time marks it again, and a later time clears again, so the annotation is written anew
  for each clear (`dra-gateway devices clear` does it).
- `dra-gateway.io/keep-devices-unhealthy: "gpu-3,gpu-4"`: these devices' marks do not lift on
  their own; removing a device from the list lets its recovery run again.

Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Final

from dra_gateway.kube import names

CONDITION_TYPE: Final = names.NODE_HEALTH_CONDITION
CLEAR_ANNOTATION: Final = f"{names.DOMAIN}/clear-device-faults"
KEEP_ANNOTATION: Final = f"{names.DOMAIN}/keep-devices-unhealthy"
EVERY_DEVICE: Final = "*"
WITHHELD: Final = "withheld"

_HEAD = "device(s) out of service: "
_ENTRY = re.compile(r"(?P<device>[^\s();,]+) \((?P<fields>[^()]*)\)")
_UNSAFE = re.compile(r"[\s();,]+")


@dataclass(frozen=True, slots=True)
class DeviceMark:
    """One device out of service, as its node plugin reports it."""

    device: str
    reason: str  # "xid-79", "gpu-lost", "nvml-unavailable", a fault file's event
    severity: str  # "fatal" or "degraded"
    action: str  # "withheld", or "tainted NoExecute" / "tainted NoSchedule"
    since: str  # RFC 3339
    healthy_at: str = ""  # RFC 3339: healthy again then, unless a fault hits it first
    kept: bool = False  # an administrator keeps it out of service

    @property
    def withheld(self) -> bool:
        return self.action == WITHHELD

    def entry(self) -> str:
        fields = [_UNSAFE.sub("-", self.reason), self.severity, self.action,
                  f"since {self.since}"]
        if self.kept:
            fields.append("kept")
        elif self.healthy_at:
            fields.append(f"healthy at {self.healthy_at}")
        return f"{self.device} ({', '.join(fields)})"


def marks_message(driver: str, marks: Iterable[DeviceMark]) -> str:
    """The condition's message for these marks (sorted by device)."""
    entries = sorted(marks, key=lambda m: m.device)
    return f"{len(entries)} {driver} {_HEAD}" + "; ".join(m.entry() for m in entries)


def parse_marks(message: str) -> list[DeviceMark]:
    """The marks a condition's message lists; entries it cannot read are left out (an older
    plugin's message reads as none)."""
    if _HEAD not in message:
        return []
    found = []
    for match in _ENTRY.finditer(message.split(_HEAD, 1)[1]):
        fields = [f.strip() for f in match["fields"].split(",")]
        if len(fields) < 4 or not fields[3].startswith("since "):
            continue
        rest = fields[4:]
        found.append(DeviceMark(
            device=match["device"], reason=fields[0], severity=fields[1], action=fields[2],
            since=fields[3].removeprefix("since "), kept="kept" in rest,
            healthy_at=next((f.removeprefix("healthy at ") for f in rest
                             if f.startswith("healthy at ")), "")))
    return found


def node_marks(node: Mapping[str, object]) -> list[DeviceMark]:
    """The marks on a Node object (none when its condition is False or absent)."""
    status = node.get("status")
    conditions = status.get("conditions") if isinstance(status, Mapping) else None
    for condition in conditions or ():
        if isinstance(condition, Mapping) and condition.get("type") == CONDITION_TYPE:
            if condition.get("status") != "True":
                return []
            return parse_marks(str(condition.get("message") or ""))
    return []


@dataclass(frozen=True, slots=True)
class AdminOrders:
    """What an administrator said on the Node: faults to forget, marks to keep."""

    clear: Mapping[str, datetime]  # device (or "*") -> forget its faults up to then
    keep: frozenset[str]
    problems: tuple[str, ...] = ()  # what could not be read, for the log

    def cleared_until(self, device: str) -> datetime | None:
        """Until when the device's faults are forgotten (the later of its own and `*`)."""
        times = [t for key in (device, EVERY_DEVICE) if (t := self.clear.get(key)) is not None]
        return max(times) if times else None


def _time(text: str) -> datetime | None:
    try:
        stamp = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)


def admin_orders(annotations: Mapping[str, str] | None) -> AdminOrders:
    """Read the two annotations; a malformed item is skipped and named in `problems`."""
    annotations = annotations or {}
    clear: dict[str, datetime] = {}
    problems = []
    for item in filter(None, (p.strip() for p in annotations.get(CLEAR_ANNOTATION, "")
                              .split(","))):
        device, _, when = item.partition("=")
        stamp = _time(when) if device.strip() else None
        if stamp is None:
            problems.append(f"{CLEAR_ANNOTATION}: {item!r} is not DEVICE=TIME (RFC 3339), "
                            f"for example gpu-3=2026-12-06T10:30:00Z")
            continue
        clear[device.strip()] = max(stamp, clear.get(device.strip(), stamp))
    keep = frozenset(filter(None, (d.strip() for d in annotations.get(KEEP_ANNOTATION, "")
                                   .split(","))))
    return AdminOrders(clear, keep, tuple(problems))


def clear_value(current: str | None, devices: Iterable[str], at: datetime) -> str:
    """The clear annotation with `devices` (or `*`) cleared up to `at`, other items kept."""
    items = {}
    for item in filter(None, (p.strip() for p in (current or "").split(","))):
        device, _, when = item.partition("=")
        items[device.strip()] = when.strip()
    # To the microsecond: a fault in the same second before the clear is cleared too.
    at = at.astimezone(UTC)
    stamp = at.strftime("%Y-%m-%dT%H:%M:%S") + (f".{at.microsecond:06d}" if at.microsecond
                                                   else "") + "Z"
    for device in devices:
        items[device] = stamp
    return ",".join(f"{d}={t}" for d, t in sorted(items.items()))


def keep_value(current: str | None, add: Iterable[str] = (), remove: Iterable[str] = ()) -> str:
    """The keep annotation with devices added and removed."""
    kept = {d.strip() for d in (current or "").split(",") if d.strip()}
    kept = (kept | set(add)) - set(remove)
    return ",".join(sorted(kept))


__all__ = ["CLEAR_ANNOTATION", "CONDITION_TYPE", "EVERY_DEVICE", "KEEP_ANNOTATION",
           "AdminOrders", "DeviceMark", "admin_orders", "clear_value", "keep_value",
           "marks_message", "node_marks", "parse_marks"]

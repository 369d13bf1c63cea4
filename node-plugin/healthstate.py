"""Health marks that outlive the plugin: what `Health` knows, saved in the state directory and
read back at start, and the Node's own condition read as the copy the cluster keeps.

A card that failed must stay out of service when the plugin restarts (a rolling update, a
changed inventory, a deleted pod, a node reboot): an XID 48 gives no sign of recovery, so a
plugin that started with no marks would publish it again, untainted, and tell the Node all is
well. Two copies, each for what the other cannot do:

- `health.json` in the state directory (a hostPath beside the checkpoint), rewritten atomically
  at every change of the marks by the instance holding the fence (`fence.py`). It carries all a
  mark is (the fault, its class, since, the latest fault's time, when the card came back) and
  the devices an administrator keeps, and it is there before the API server can be asked. It is
  the newer of the two: the condition is written after it, and may lag while the API server
  refuses writes.
- The Node's condition `GpuDevicesUnhealthy` (kube/device_health.py), the cluster's copy: it
  survives a state directory that did not (a tmpfs, a reinstalled disk). It keeps less (no
  latest-fault time), so a mark read from it counts its recovery from what the message says.

Times are saved as wall-clock times; `Health` turns them back into its monotonic clock. This
module only converts and does the file I/O; it decides nothing.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, cast

from dra_gateway.kube.device_health import node_marks
from dra_gateway.kube.files import atomic_write
from dra_gateway.node_plugin.faults import FATAL, Severity

log = logging.getLogger(__name__)

HEALTH_FILE = "health.json"
FORMAT_VERSION = 1
_SEVERITIES = ("fatal", "degraded")


@dataclass(frozen=True, slots=True)
class SavedMark:
    """One device's mark, in wall-clock times."""

    device: str
    reason: str
    severity: Severity
    since: str  # RFC 3339, as the condition shows it
    last_fault_at: datetime
    recovered_at: datetime | None = None  # the latest sign that the card came back


@dataclass(frozen=True, slots=True)
class SavedHealth:
    marks: tuple[SavedMark, ...] = ()
    kept: frozenset[str] = frozenset()
    source: str = ""  # where it was read, for the log


def _stamp(when: datetime) -> str:
    return when.isoformat()


def _time(text: str) -> datetime:
    stamp = datetime.fromisoformat(text.replace("Z", "+00:00"))
    if stamp.tzinfo is None:
        raise ValueError(f"{text!r} has no time zone")
    return stamp


def save(path: Path, health: SavedHealth) -> None:
    """Write `health` to `path` atomically (a crash leaves the old file or the new one)."""
    data = {"version": FORMAT_VERSION,
            "marks": {m.device: {"reason": m.reason, "severity": m.severity, "since": m.since,
                                 "lastFaultAt": _stamp(m.last_fault_at),
                                 "recoveredAt": None if m.recovered_at is None
                                 else _stamp(m.recovered_at)}
                      for m in sorted(health.marks, key=lambda m: m.device)},
            "kept": sorted(health.kept)}
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, indent=1, sort_keys=True).encode() + b"\n")


def load(path: Path) -> SavedHealth | None:
    """What `save` wrote; None when there is no file. An unreadable one is moved aside (kept
    for a post-mortem) and read as none, so the Node's condition is asked instead."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        data = json.loads(raw)
        if data.get("version") != FORMAT_VERSION:
            raise ValueError(f"unsupported version {data.get('version')!r}")
        marks = []
        for device, entry in dict(data["marks"]).items():
            if entry["severity"] not in _SEVERITIES:
                raise ValueError(f"marks.{device}.severity: {entry['severity']!r} is not one "
                                 f"of {', '.join(_SEVERITIES)}")
            recovered = entry.get("recoveredAt")
            marks.append(SavedMark(
                device=str(device), reason=str(entry["reason"]),
                severity=cast(Severity, entry["severity"]), since=str(entry["since"]),
                last_fault_at=_time(str(entry["lastFaultAt"])),
                recovered_at=None if recovered is None else _time(str(recovered))))
        kept = frozenset(str(d) for d in data.get("kept") or ())
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        aside = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
        path.rename(aside)
        log.error("health state %s is unreadable (%s): moved to %s; reading the Node's "
                  "condition instead", path, exc, aside.name)
        return None
    return SavedHealth(tuple(marks), kept, source=str(path))


def from_node(node: Mapping[str, Any], *, recovery_seconds: float) -> SavedHealth:
    """The marks the Node's condition lists, as this plugin's run before it wrote them.

    The message has no latest-fault time: a mark that was to be healthy at T had its latest
    fault (a degraded one) or its sign of recovery (a fatal one) `recovery_seconds` before T;
    any other's latest fault is taken to be its `since`. Entries it cannot read are left out.
    """
    marks = []
    listed = node_marks(node)
    for mark in listed:
        if mark.severity not in _SEVERITIES:
            continue
        try:
            since = _time(mark.since)
            healthy_at = _time(mark.healthy_at) if mark.healthy_at else None
        except ValueError:
            continue
        last_fault, recovered = since, None
        if healthy_at is not None and recovery_seconds > 0:
            back = healthy_at - timedelta(seconds=recovery_seconds)
            if mark.severity == FATAL:
                recovered = max(back, since)
            else:
                last_fault = max(back, since)
        marks.append(SavedMark(mark.device, mark.reason, cast(Severity, mark.severity),
                               mark.since, last_fault, recovered))
    return SavedHealth(tuple(marks), frozenset(m.device for m in listed if m.kept),
                       source="the Node's condition")

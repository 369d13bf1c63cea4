"""Faults from a file: GPU health events without a GPU, for inventory nodes and tests.

In inventory mode the node plugin can follow `--fault-file FILE`, one JSON object a line,
appended while it runs and read as NVML's events are:

    {"device": "gpu-3", "event": "xid", "code": 79}      an XID on gpu-3 (its class: faults.py)
    {"device": "gpu-3", "event": "gpu-lost"}             the card fell off the bus
    {"device": "gpu-3", "event": "recovered"}            the card is back (its mark lifts after
                                                         the recovery period without a fault)

`device` is a published device name (`gpu-3`, a MIG instance's name) or a card's UUID; a
whole card's name or UUID hits every device of the card, as a card-wide XID does. A line that
cannot be used is logged with its line number and skipped. As with NVML's events, only what is
appended after the plugin starts counts (a restarted plugin does not replay the faults of its
previous run, whose marks went with it): a file that exists at start is followed from its end;
one that appears later, or is truncated or replaced, is read from its start.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from pathlib import Path

from dra_gateway.node_plugin.devices import DeviceInfo
from dra_gateway.node_plugin.faults import GPU_LOST
from dra_gateway.node_plugin.health import Health

log = logging.getLogger(__name__)

EVENTS = ("xid", "gpu-lost", "recovered")


class FaultLineError(ValueError):
    """A line of the fault file that cannot be used; the message says why."""


def devices_named(name: str, table: Mapping[str, DeviceInfo]) -> list[str]:
    """The devices a fault file's `device` names: one device, or every device of a card named
    by its full-card device name or its UUID."""
    info = table.get(name)
    if info is not None and info.kind == "mig":
        return [name]
    card = info.card_uuid if info is not None else name
    found = sorted(n for n, i in table.items() if i.card_uuid == card)
    if not found:
        known = ", ".join(sorted(table)) or "none"
        raise FaultLineError(f"device {name!r} is not a device of this node (devices: {known})")
    return found


def apply_line(text: str, health: Health, table: Mapping[str, DeviceInfo]) -> None:
    """Apply one line of the fault file; raises FaultLineError saying what is wrong."""
    try:
        event = json.loads(text)
    except ValueError as exc:
        raise FaultLineError(f"not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise FaultLineError('expected an object such as {"device": "gpu-3", "event": '
                             '"xid", "code": 79}')
    unknown = sorted(set(event) - {"device", "event", "code"})
    if unknown:
        raise FaultLineError(f"unknown field(s) {', '.join(unknown)}: the fields are device, "
                             "event and code")
    name, kind = event.get("device"), event.get("event")
    if not isinstance(name, str) or not name:
        raise FaultLineError("device: a device name (gpu-3) or a card UUID is required")
    if kind not in EVENTS:
        raise FaultLineError(f"event: {kind!r} is not one of {', '.join(EVENTS)}")
    code = event.get("code")
    if kind == "xid":
        if not isinstance(code, int) or isinstance(code, bool) or code <= 0:
            raise FaultLineError(f"code: an xid event needs its XID, a positive integer, not "
                                 f"{code!r}")
    elif code is not None:
        raise FaultLineError(f"code: only an xid event has one ({kind} has none)")
    devices = devices_named(name, table)
    if kind == "xid":
        health.mark(devices, f"xid-{code}")
    elif kind == "gpu-lost":
        health.mark(devices, GPU_LOST)
    else:
        health.recovered(devices, f"the fault file says {name} recovered")


class _Follower:
    """The complete lines appended to a file since the last read (blocking: run in a thread)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.line_number = 0
        self.pending = b""
        self.waiting_logged = False
        self.started = False

    def read(self) -> list[tuple[int, str]]:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            self.started = True
            if not self.waiting_logged:
                log.info("fault file %s does not exist yet: waiting for it", self.path)
                self.waiting_logged = True
            self.offset, self.line_number, self.pending = 0, 0, b""
            return []
        if not self.started:
            # What the file held before this run is history: follow it from its end.
            self.started = True
            with self.path.open("rb") as stream:
                held = stream.read(size)
            # After its last complete line: a line being written is read once complete.
            self.offset = held.rfind(b"\n") + 1
            self.line_number = held[:self.offset].count(b"\n")
            log.info("following fault file %s from its end (line %d)", self.path,
                     self.line_number + 1)
            return []
        if size < self.offset:
            log.info("fault file %s was truncated or replaced: reading it from the start",
                     self.path)
            self.offset, self.line_number, self.pending = 0, 0, b""
        if size == self.offset:
            return []
        with self.path.open("rb") as stream:
            stream.seek(self.offset)
            chunk = stream.read(size - self.offset)
        self.offset += len(chunk)
        *lines, self.pending = (self.pending + chunk).split(b"\n")
        found = []
        for raw in lines:
            self.line_number += 1
            text = raw.decode("utf-8", "replace").strip()
            if text:
                found.append((self.line_number, text))
        return found


def begin_following(path: Path) -> _Follower:
    """Where this run of the plugin starts reading `path`: its end, or its start once it
    appears. Taken when called, before the plugin says it started, so that a fault written
    after the start is never taken for history (blocking, but only a stat and a read)."""
    follower = _Follower(path)
    follower.read()  # the first read only notes where the file ends, or that it is missing
    return follower


async def watch_fault_file(follower: _Follower, *, health: Health,
                           table: Callable[[], Mapping[str, DeviceInfo]],
                           poll_seconds: float = 0.5) -> None:
    """Follow the file from where `begin_following` left it until cancelled, applying each
    complete line."""
    path = follower.path
    while True:
        for line_number, text in await asyncio.to_thread(follower.read):
            try:
                apply_line(text, health, table())
            except FaultLineError as exc:
                log.warning("%s:%d: %s; line skipped", path, line_number, exc)
        await asyncio.sleep(poll_seconds)


__all__ = ["EVENTS", "FaultLineError", "apply_line", "begin_following", "devices_named",
           "watch_fault_file"]

"""`dra-gateway devices`: the devices the node plugins took out of service, and an
administrator's word on them.

- `devices list [NODE...]`: every device out of service, its fault, what was done to it
  (tainted, or withheld where the cluster keeps no device taints), since when, and when it is
  healthy again by itself (or that it is kept), read from the Nodes' `GpuDevicesUnhealthy`
  conditions;
- `devices clear NODE DEVICE... | --all`: forget the devices' faults up to now (annotation
  `dra-gateway.io/clear-device-faults`); the node plugin brings them back within its
  `--admin-check-seconds`, and a fault after now marks them again;
- `devices keep NODE DEVICE...` / `devices unkeep NODE DEVICE...`: keep the devices out of
  service whatever their recovery says (annotation `dra-gateway.io/keep-devices-unhealthy`),
  or let their recovery run again.

The annotations' formats live in kube/device_health.py; the node plugin acts on them. Writes
are merge patches of one annotation, as `kubectl annotate --overwrite` makes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

from dra_gateway.kube import arguments
from dra_gateway.kube.device_health import (
    CLEAR_ANNOTATION,
    EVERY_DEVICE,
    KEEP_ANNOTATION,
    DeviceMark,
    clear_value,
    keep_value,
    node_marks,
)

if TYPE_CHECKING:
    from dra_gateway.kube.cluster.port import Cluster

T = TypeVar("T")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    devices = sub.add_parser(
        "devices", help="devices out of service (failed GPUs): list, clear, keep",
        description="The devices the gateway's node plugins took out of service after a fault, "
                    "and an administrator's word on them.")
    commands = devices.add_subparsers(dest="devices", metavar="COMMAND", required=True)
    listing = commands.add_parser(
        "list", help="every device out of service, why, and when it is healthy again",
        description="Read the Nodes and list each device out of service: its fault and class, "
                    "what was done to it, since when, and when its recovery brings it back "
                    "(or that it is kept).")
    listing.add_argument("node", nargs="*", metavar="NODE", help="only these nodes")
    arguments.output_option(listing, "table", "json")
    arguments.kubeconfig_option(listing)
    listing.set_defaults(func=_run_list)

    clear = commands.add_parser(
        "clear", help="bring devices back now: forget their faults up to now",
        description="Annotate NODE so that its node plugin forgets the devices' faults up to "
                    "now: they are published (untainted) again within its "
                    "--admin-check-seconds. A fault after now marks them again.")
    clear.add_argument("node", metavar="NODE", help="the node of the devices")
    clear.add_argument("device", nargs="*", metavar="DEVICE", help="a device of the node, as "
                       "devices list names it")
    clear.add_argument("--all", action="store_true", help="every device of the node")
    arguments.kubeconfig_option(clear)
    clear.set_defaults(func=_run_clear)

    for name, undo in (("keep", False), ("unkeep", True)):
        keep = commands.add_parser(
            name, help=("let devices recover by themselves again" if undo else
                        "keep devices out of service until unkept"),
            description=(f"Remove the devices from NODE's {KEEP_ANNOTATION}: their recovery "
                         "runs again." if undo else
                         f"Add the devices to NODE's {KEEP_ANNOTATION}: a device marked "
                         "unhealthy stays so, whatever its recovery says, until unkept."))
        keep.add_argument("node", metavar="NODE", help="the node of the devices")
        keep.add_argument("device", nargs="+", metavar="DEVICE", help="a device of the node, as "
                          "devices list names it")
        arguments.kubeconfig_option(keep)
        keep.set_defaults(func=_run_keep, undo=undo)


def rows(nodes: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """One row per device out of service, by node and device."""
    out = []
    for node in nodes:
        name = str((node.get("metadata") or {}).get("name", ""))
        out += [_row(name, mark) for mark in node_marks(node)]
    return sorted(out, key=lambda r: (r["node"], r["device"]))


def _row(node: str, mark: DeviceMark) -> dict[str, str]:
    back = "kept" if mark.kept else (mark.healthy_at or (
        "when the card comes back" if mark.severity == "fatal" else "-"))
    return {"node": node, "device": mark.device, "fault": mark.reason,
            "class": mark.severity, "action": mark.action, "since": mark.since,
            "healthyAt": back}


def table(found: Sequence[dict[str, str]]) -> str:
    header = (f"{'NODE':<20} {'DEVICE':<16} {'FAULT':<18} {'CLASS':<9} {'ACTION':<18} "
              f"{'SINCE':<21} HEALTHY AGAIN")
    lines = [header] + [
        f"{r['node']:<20} {r['device']:<16} {r['fault']:<18} {r['class']:<9} "
        f"{r['action']:<18} {r['since']:<21} {r['healthyAt']}" for r in found]
    if not found:
        lines.append("none: every device is in service")
    return "\n".join(lines) + "\n"


async def _with_cluster(kubeconfig: str | None, work: Callable[[Cluster], Awaitable[T]]) -> T:
    from dra_gateway.kube.cluster.connect import connect

    cluster = await connect("kube", kubeconfig)
    try:
        return await work(cluster)
    finally:
        await cluster.close()


def _guarded(run: Callable[[], int]) -> int:
    from dra_gateway.kube.cluster.connect import ClusterConfigError
    from dra_gateway.kube.cluster.port import ApiError, NotFound

    try:
        return run()
    except ClusterConfigError as exc:
        return arguments.error(f"{exc}", 2)
    except NotFound as exc:
        return arguments.error(f"{exc.message}", 1)
    except ApiError as exc:
        return arguments.error(f"{exc.reason}: {exc.message}", 1)


def _run_list(args: argparse.Namespace) -> int:
    from dra_gateway.kube.resources import NODES

    async def read(cluster: Cluster) -> list[Mapping[str, Any]]:
        items = (await cluster.list(NODES)).items
        return [n for n in items if not args.node or n["metadata"]["name"] in args.node]

    def run() -> int:
        found = rows(asyncio.run(_with_cluster(args.kubeconfig, read)))
        if args.output == "json":
            print(json.dumps(found, indent=2))
        else:
            sys.stdout.write(table(found))
        return 0

    return _guarded(run)


async def _annotate(cluster: Cluster, node: str, key: str,
                    value: Callable[[str | None], str]) -> str:
    """Set one annotation of the Node from its current value (removed when empty)."""
    from dra_gateway.kube import objects
    from dra_gateway.kube.resources import NODES

    current = await cluster.get(NODES, node)
    new = value(objects.annotations(current).get(key))
    await cluster.patch(NODES, node, {"metadata": {"annotations": {key: new or None}}},
                        patch_type="merge")
    return new


def _run_clear(args: argparse.Namespace) -> int:
    if bool(args.device) == bool(args.all):
        return arguments.error(
            "name the devices to clear, or --all for every device of the node", 2)
    devices = [EVERY_DEVICE] if args.all else list(args.device)

    async def clear(cluster: Cluster) -> datetime:
        from dra_gateway.kube.cluster.clock import read_clock

        # The cluster's time, not this machine's: the node plugin compares it with its own
        # clock's fault times. The latest it can be, so that no fault before the clear stays.
        now = (await read_clock(cluster)).latest()
        await _annotate(cluster, args.node, CLEAR_ANNOTATION,
                        lambda old: clear_value(old, devices, now))
        return now

    def run() -> int:
        now = asyncio.run(_with_cluster(args.kubeconfig, clear))
        what = "every device" if args.all else ", ".join(devices)
        print(f"node/{args.node} annotated: the faults of {what} up to "
              f"{now.strftime('%Y-%m-%dT%H:%M:%S.%fZ')} (the cluster's time) are cleared; its "
              f"node plugin brings them back within its --admin-check-seconds")
        return 0

    return _guarded(run)


def _run_keep(args: argparse.Namespace) -> int:
    def run() -> int:
        kept = asyncio.run(_with_cluster(args.kubeconfig, lambda c: _annotate(
            c, args.node, KEEP_ANNOTATION, lambda old: keep_value(
                old, remove=args.device) if args.undo else keep_value(old, add=args.device))))
        print(f"node/{args.node} annotated: kept out of service: {kept or 'none'}")
        return 0

    return _guarded(run)


__all__ = ["register", "rows", "table"]

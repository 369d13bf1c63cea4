"""The handlers behind `dra-gateway node-plugin ...`: parse settings, call one function, map
errors to a message and an exit code (never a trace)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from typing import Any, TextIO

from dra_gateway.kube import yamltext
from dra_gateway.node_plugin import cdi
from dra_gateway.node_plugin.deviceclasses import device_classes as build_device_classes
from dra_gateway.node_plugin.devices import (
    CONSUMABLE_CAPACITY_FALLBACK,
    DeviceOptions,
    counter_sets_of,
    devices_of,
)
from dra_gateway.node_plugin.discovery import DiscoveryError
from dra_gateway.node_plugin.discovery import discover as discover_facts
from dra_gateway.node_plugin.publish import (
    MAX_DEVICES_PER_SLICE,
    MAX_DEVICES_PER_SLICE_WITH_TAINTS,
    build_slices,
)


def _options(args: argparse.Namespace) -> DeviceOptions:
    """Device options; without a forced mode, `serve` replaces consumable_capacity with what
    it detects, and `discover` shows what is sent before that (the fallback). `serve` detects
    whether counter sets are kept too; `discover` shows them."""
    forced = args.consumable_capacity
    return DeviceOptions(default_sharing=args.sharing, consumable_capacity=(
        CONSUMABLE_CAPACITY_FALLBACK if forced is None else forced),
        partitionable_devices=args.mig_on_demand)


def _mig_flags_error(args: argparse.Namespace) -> str:
    if args.mig_on_demand and not args.nvml:
        return ("--mig-on-demand needs --nvml: instances are made through NVML, which an "
                "inventory's cards do not have")
    if getattr(args, "mig_on_demand_label", "") and not args.mig_on_demand:
        return "--mig-on-demand-label needs --mig-on-demand"
    return ""


def _discover_facts(args: argparse.Namespace) -> Any:
    return discover_facts(inventory=args.inventory, nvml=args.nvml,
                          mig_geometry=args.mig_on_demand)


def _dump(objects: list[dict[str, Any]], output: str, out: TextIO) -> None:
    if output == "json":
        json.dump({"apiVersion": "v1", "kind": "List", "items": objects}, out, indent=2)
        out.write("\n")
    else:
        out.write(yamltext.dump_all(objects, sort_keys=False))


def discover(args: argparse.Namespace, out: TextIO | None = None) -> int:
    if error := _mig_flags_error(args):
        print(f"error: {error}", file=sys.stderr)
        return 2
    try:
        facts = _discover_facts(args)
        devices = devices_of(facts, _options(args))
    except (DiscoveryError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    # Cards cut on demand are shown as a release from 1.35 publishes them (counter sets in
    # slices of their own); `serve` lays them out as its API server's release wants.
    counter_sets = counter_sets_of(facts) if args.mig_on_demand else []
    slices = build_slices(node_name=args.node_name, driver=args.driver, devices=devices,
                          generation=0, node_uid=None,
                          max_devices=MAX_DEVICES_PER_SLICE if args.device_taints is False
                          and not counter_sets else MAX_DEVICES_PER_SLICE_WITH_TAINTS,
                          counter_sets=counter_sets, counters_apart=True)
    _dump(slices, args.output, out or sys.stdout)
    return 0


def device_classes(args: argparse.Namespace, out: TextIO) -> int:
    _dump(build_device_classes(args.driver), args.output, out)
    return 0


def serve(args: argparse.Namespace) -> int:
    from dra_gateway.kube import logs

    logs.configure(getattr(logging, args.log_level))
    try:
        return asyncio.run(_serve(args))
    except KeyboardInterrupt:
        return 130


async def _serve(args: argparse.Namespace) -> int:
    from dra_gateway.kube.cluster.connect import ClusterConfigError, connect
    from dra_gateway.node_plugin.coexistence import CoexistenceSettings
    from dra_gateway.node_plugin.miginstances import MIG_JOURNAL_FILE, MigInstances
    from dra_gateway.node_plugin.nvml import Nvml, NvmlError, load_pynvml
    from dra_gateway.node_plugin.plugin import NodePlugin, PluginSettings

    if args.fault_file is not None and args.inventory is None:
        print("error: --fault-file needs --inventory (with --nvml the driver reports faults)",
              file=sys.stderr)
        return 2
    if error := _mig_flags_error(args):
        print(f"error: {error}", file=sys.stderr)
        return 2
    settings = PluginSettings(
        node_name=args.node_name, driver=args.driver, plugins_dir=args.plugins_dir,
        registry_dir=args.registry_dir, instance=args.instance, cdi_dir=args.cdi_dir,
        state_dir=args.state_dir or args.plugins_dir / args.driver, devices=_options(args),
        consumable_capacity=args.consumable_capacity,
        device_taints=args.device_taints,
        recovery_seconds=args.recovery_seconds, fault_file=args.fault_file,
        admin_check_seconds=args.admin_check_seconds,
        enforcement=cdi.EnforcementSettings(hami_library=args.hami_library),
        coexistence=CoexistenceSettings(enabled=args.legacy_coexistence,
                                        socket=args.pod_resources_socket,
                                        poll_seconds=args.legacy_poll_interval,
                                        node_seconds=args.legacy_node_interval),
        mig_on_demand_label=args.mig_on_demand_label)
    try:
        cluster = await connect(args.cluster, args.kubeconfig)
    except ClusterConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    mig = None
    try:
        if args.mig_on_demand:
            mig = MigInstances(load_pynvml(), settings.state_dir / MIG_JOURNAL_FILE,
                               session=True)
        plugin = NodePlugin(
            settings, cluster, discover=lambda: _discover_facts(args),
            nvml_factory=Nvml if args.nvml else None, mig=mig)
    except NvmlError as exc:
        await cluster.close()
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        await cluster.close()
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        # The state directory (checkpoint) cannot be read: name the path and the flag.
        await cluster.close()
        print(f"error: cannot use {exc.filename or args.state_dir}: {exc.strerror or exc}; "
              "check --state-dir and --plugins-dir", file=sys.stderr)
        return 1
    task = asyncio.current_task()
    loop = asyncio.get_running_loop()
    if task is not None:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, task.cancel)
    try:
        async with contextlib.AsyncExitStack() as stack:
            if args.metrics_address:
                from dra_gateway.kube.runtime.serving import serving

                try:
                    port = await stack.enter_async_context(
                        serving(plugin.metrics.render, args.metrics_address,
                                plugin.readiness))
                except (ValueError, OSError) as exc:
                    print(f"error: cannot serve metrics: {exc}; pass --metrics-address as "
                          "HOST:PORT with a free port", file=sys.stderr)
                    return 2
                logging.getLogger(__name__).info(
                    "serving metrics", extra={"address": args.metrics_address, "port": port})
            await plugin.run()
    except asyncio.CancelledError:
        logging.getLogger(__name__).info("stopping")
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    finally:
        await cluster.close()
        if mig is not None:
            mig.close()
    return 0

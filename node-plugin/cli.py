"""Subcommands of the node plugin: `node-plugin discover|serve|device-classes` (light imports)."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from pathlib import Path

from dra_gateway.kube import arguments

_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def _dns_subdomain(what: str, longest: int) -> Callable[[str], str]:
    # Node and driver names become slice, pool and socket names: the API server would refuse
    # every slice of a malformed one, far from the flag that caused it.
    def check(value: str) -> str:
        if len(value) > longest or not _DNS_SUBDOMAIN.match(value):
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a valid {what}: lowercase letters, digits, '-' and '.', at "
                f"most {longest} characters, starting and ending with a letter or digit")
        return value
    return check


# Every interval parses with the one duration type (`10s`, `5m`, or a bare number of seconds,
# what the chart passes); only what a refusal adds differs.
_legacy_interval = arguments.Duration(
    positive=True, hint="to stop asking the kubelet, use --no-legacy-coexistence")
_recovery = arguments.Duration(
    hint="0 keeps an unhealthy device out of service until an administrator clears it")


def _source(parser: argparse.ArgumentParser) -> None:
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--inventory", type=Path, metavar="FILE",
                       help="YAML inventory of the node's GPUs (simulated nodes, tests)")
    group.add_argument("--nvml", action="store_true", help="discover the GPUs through NVML")
    parser.add_argument("--node-name", required=True, type=_dns_subdomain("node name", 253),
                        metavar="NODE",
                        help="this node's name (the pool name)")
    parser.add_argument("--driver", default="gpu.dra-gateway.io",
                        type=_dns_subdomain("DRA driver name", 63), metavar="NAME",
                        help="DRA driver name (default: %(default)s)")
    parser.add_argument("--sharing", choices=("exclusive", "shared"), default="exclusive",
                        help="sharing of cards whose inventory does not say (default: "
                             "%(default)s)")
    parser.add_argument("--consumable-capacity", action=argparse.BooleanOptionalAction,
                        default=None, help="force publishing allowMultipleAllocations and "
                        "request policies for shared cards (the cluster has "
                        "DRAConsumableCapacity), or not; default: ask the API server, as the "
                        "allocator does (a dry-run probe slice); discover, which has no API "
                        "server to ask, then prints the fields, which a server without the "
                        "gate drops")
    parser.add_argument("--device-taints", action=argparse.BooleanOptionalAction,
                        default=None, help="mark unhealthy devices with taints (the cluster has "
                        "DRADeviceTaints), or withhold them and set a Node condition; default: "
                        "ask the API server (a dry-run probe slice), withholding until it "
                        "answers")
    parser.add_argument("--mig-on-demand", action="store_true",
                        help="with --nvml: publish each card in MIG mode as its whole card and "
                        "every MIG profile at every placement NVML allows, drawing on the "
                        "card's counters, and make the instances allocated to a claim when it is "
                        "prepared (destroyed at unprepare); instances an administrator made stay "
                        "as they are. Default: MIG cards publish only the instances they have")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add this component's subcommands; handlers import their heavy modules themselves."""
    parser = sub.add_parser("node-plugin", help="GPU discovery, ResourceSlices and the kubelet's "
                            "DRA API for one node",
                            description="The node plugin of one node: discover its GPUs, "
                            "publish them as ResourceSlices and serve the kubelet's DRA API.")
    commands = parser.add_subparsers(dest="node_plugin_command", metavar="COMMAND",
                                     required=True)

    discover = commands.add_parser("discover", help="print the ResourceSlices this node would "
                                   "publish",
                                   description="Discover the node's GPUs and print the "
                                   "ResourceSlices the plugin would publish; nothing is written.")
    _source(discover)
    arguments.output_option(discover, "yaml", "json")
    discover.set_defaults(func=_discover)

    serve = commands.add_parser("serve", help="serve the kubelet and publish ResourceSlices",
                                description="Run the node plugin: publish the node's "
                                "ResourceSlices, serve the kubelet's DRA and health APIs, write "
                                "CDI specs and watch the devices' health.")
    _source(serve)
    serve.add_argument("--cluster", choices=("kube", "memory"), default="kube",
                       help="kube: the kubeconfig's cluster (default); memory: in-process")
    arguments.kubeconfig_option(serve)
    serve.add_argument("--plugins-dir", type=Path, default=Path("/var/lib/kubelet/plugins"),
                       metavar="DIR",
                       help="the kubelet's plugins directory (default: %(default)s)")
    serve.add_argument("--registry-dir", type=Path,
                       default=Path("/var/lib/kubelet/plugins_registry"), metavar="DIR",
                       help="the kubelet's plugin registry directory (default: %(default)s)")
    serve.add_argument("--instance", default="", metavar="ID",
                       help="this plugin pod's UID: its sockets carry it, so that a rolling "
                            "update's new pod registers beside the old one and the kubelet "
                            "(1.33 and later) switches to it without a gap (default: one fixed "
                            "pair of sockets)")
    serve.add_argument("--cdi-dir", type=Path, default=Path("/var/run/cdi"), metavar="DIR",
                       help="where CDI specs are written (default: %(default)s)")
    serve.add_argument("--state-dir", type=Path, metavar="DIR",
                       help="checkpoint directory (default: <plugins-dir>/<driver>)")
    serve.add_argument("--hami-library", default="/usr/local/vgpu/libvgpu.so", metavar="FILE",
                       help="HAMi-core library preloaded for hami-core shares "
                            "(default: %(default)s)")
    serve.add_argument("--legacy-coexistence", action=argparse.BooleanOptionalAction,
                       default=True, help="withhold the cards a legacy GPU device plugin offers "
                       "or its running pods hold, as the kubelet's pod-resources API says "
                       "(default: on; turn it off only on nodes that never ran one)")
    serve.add_argument("--pod-resources-socket", type=Path,
                       default=Path("/var/lib/kubelet/pod-resources/kubelet.sock"),
                       metavar="PATH",
                       help="the kubelet's pod-resources socket (default: %(default)s)")
    serve.add_argument("--legacy-poll-interval", type=_legacy_interval, default=2.0,
                       metavar="DURATION", help=arguments.duration_help(
                           "how often the pod-resources API is asked; withheld cards come back "
                           "this long after their last legacy holder ends", 2.0))
    serve.add_argument("--legacy-node-interval", type=_legacy_interval, default=30.0,
                       metavar="DURATION", help=arguments.duration_help(
                           "how often the Node's status.allocatable is read for legacy GPU "
                           "names no device plugin lists (Koordinator's, HAMi's memory), and to "
                           "see a legacy plugin's amount drop to zero", 30.0))
    serve.add_argument("--metrics-address", metavar="HOST:PORT",
                       help="serve /metrics, /healthz and /readyz over plain HTTP there (:PORT: "
                       "every interface); default: not served")
    serve.add_argument("--recovery-seconds", type=_recovery, default=600.0,
                       metavar="DURATION", help=arguments.duration_help(
                           "how long a device that recovered from a fault (a degraded one: "
                           "since its last fault; a fatal one: since it came back) must stay "
                           "without one before its taint lifts; 0: never, until an "
                           "administrator clears it", 600.0))
    serve.add_argument("--admin-check-seconds", type=arguments.positive_duration, default=10.0,
                       metavar="DURATION", help=arguments.duration_help(
                           "while a device is out of service, how often the Node's annotations "
                           "are read for an administrator's clear or keep (dra-gateway devices "
                           "clear|keep)", 10.0))
    serve.add_argument("--fault-file", type=Path, metavar="FILE",
                       help="with --inventory: follow FILE for health events, one JSON object "
                       'a line, e.g. {"device": "gpu-3", "event": "xid", "code": 79} or '
                       '{"device": "gpu-3", "event": "recovered"}')
    serve.add_argument("--mig-on-demand-label", default="", metavar="LABEL",
                       help="with --mig-on-demand: only on a node whose Node carries the label "
                       "LABEL=true, read when the plugin starts (restart its pod after labelling); "
                       "default: every node the plugin runs on")
    serve.add_argument("--log-level", default="INFO", type=str.upper,
                       choices=("DEBUG", "INFO", "WARNING", "ERROR"),
                       help="least severe level logged, in any case "
                            "(default: %(default)s)")
    serve.set_defaults(func=_serve)

    classes = commands.add_parser("device-classes", help="print the gateway's DeviceClasses",
                                  description="Print the DeviceClasses of the gateway's driver "
                                  "(whole and shared GPUs, MIG instances), for kubectl apply.")
    classes.add_argument("--driver", default="gpu.dra-gateway.io",
                         type=_dns_subdomain("DRA driver name", 63), metavar="NAME",
                         help="DRA driver name (default: %(default)s)")
    arguments.output_option(classes, "yaml", "json")
    classes.set_defaults(func=_device_classes)


def _discover(args: argparse.Namespace) -> int:
    from dra_gateway.node_plugin import commands

    return commands.discover(args)


def _serve(args: argparse.Namespace) -> int:
    from dra_gateway.node_plugin import commands

    return commands.serve(args)


def _device_classes(args: argparse.Namespace) -> int:
    from dra_gateway.node_plugin import commands

    return commands.device_classes(args, sys.stdout)

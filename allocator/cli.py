"""Subcommands of the allocator: `allocator` (the controller). `bench allocator`, the trace
benchmark, is the development kit's (`dra_gateway.devkit.cli`) and shares `StrategyOption`.

Light imports only; each handler imports its module when it runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from dra_gateway.allocator.settings import ControllerSettings
from dra_gateway.kube import arguments, names

# The flags' defaults are the settings' own: one home for each.
_DEFAULTS = ControllerSettings()


class StrategyOption(argparse.Action):
    """`--strategy` and its deprecated alias `--policy` (the packing choice was called a policy
    before "policy" was kept for GPUQuota and GPUSharingPolicy): one destination, the flag used
    kept in `strategy_option` so that an error names what was typed; the alias says on stderr
    to use `--strategy`. `append`: the flag is repeatable (`bench allocator`)."""

    def __init__(self, option_strings: Sequence[str], dest: str, *, append: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(option_strings, dest, **kwargs)
        self.append = append

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: str | Sequence[Any] | None,
                 option_string: str | None = None) -> None:
        if option_string == "--policy":
            arguments.warn("--policy is deprecated, use --strategy (same values)")
        namespace.strategy_option = option_string
        if self.append:
            values = [*(getattr(namespace, self.dest) or ()), values]
        setattr(namespace, self.dest, values)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    controller = sub.add_parser(
        "allocator", help="run the allocator controller (one active replica through a Lease)",
        description="Run the allocator: allocate the claims of gated pods, then remove the "
                    "gate; release what owning pods left; preempt and defragment where allowed.")
    controller.add_argument("--cluster", choices=("kube", "memory"), default="kube",
                            help="kube: the kubeconfig's cluster (default); memory: an empty "
                            "in-process cluster nothing else can reach (a smoke test only)")
    arguments.kubeconfig_option(controller)
    arguments.namespace_option(controller, default=names.GATEWAY_NAMESPACE,
                               help="the gateway's namespace, where the allocator's Lease is "
                               "(default: %(default)s)")
    controller.add_argument("--strategy", "--policy", action=StrategyOption,
                            default=_DEFAULTS.strategy, metavar="STRATEGY",
                            help="cluster-wide packing strategy: default (fragmentation-aware), "
                            "binpack, spread or first-fit (default: %(default)s; --policy is "
                            "its deprecated name)")
    controller.add_argument("--workers", type=_positive_int, default=_DEFAULTS.workers,
                            metavar="COUNT",
                            help="pods handled at once; planning itself is one at a time, the "
                            "rest waits on the API (default: %(default)s)")
    controller.add_argument("--identity", metavar="NAME", help="holder identity in the Lease "
                            "(default: host name and process id)")
    controller.add_argument("--metrics-address", metavar="HOST:PORT",
                            help="serve /metrics, /healthz and /readyz there, e.g. :8080 "
                            "(default: off)")
    controller.add_argument("--release-all", action="store_true",
                            help="instead of running: clear the allocation of every claim no "
                            "live pod uses and remove the allocator's finalizer from every "
                            "claim, then exit (the chart's pre-delete hook; run it with the "
                            "allocator stopped)")
    controller.add_argument("--group-domain-label", action="append", default=[],
                            type=arguments.label_key, metavar="LABEL",
                            help="a node label naming a topology domain (a rack label, "
                            "topology.kubernetes.io/zone; repeatable, innermost first): a pod "
                            "group's members are kept within one where they fit")
    controller.add_argument("--no-preemption", action="store_true",
                            help="never evict pods of lower priority for a pod that fits "
                            "nowhere (kube-scheduler's preemption, for GPU claims)")
    controller.add_argument("--no-health-eviction", action="store_true",
                            help="never evict the pods of a device that failed (a fatal fault "
                            "a node plugin withholds the device for, where the API server keeps "
                            "no device taints and kube-controller-manager cannot evict)")
    defrag = controller.add_argument_group(
        "defrag", "move the fewest pods to place pods that wait (off by default; "
        "`dra-gateway defrag plan` shows what it would do)")
    defrag.add_argument("--defrag", action="store_true",
                        help="plan and carry out moves for pods gated longer than "
                        "--defrag-after")
    defrag.add_argument("--defrag-after", type=arguments.duration, default=_DEFAULTS.defrag_after,
                        metavar="DURATION", help=arguments.duration_help(
                            "how long a pod waits before moves are made for it",
                            _DEFAULTS.defrag_after))
    defrag.add_argument("--defrag-interval", type=arguments.duration,
                        default=_DEFAULTS.defrag_interval,
                        metavar="DURATION", help=arguments.duration_help(
                            "how often waiting pods are looked at", _DEFAULTS.defrag_interval))
    defrag.add_argument("--defrag-moves-per-hour", type=_positive_int,
                        default=_DEFAULTS.defrag_moves_per_hour, metavar="COUNT",
                        help="moves in any hour, all pods together (default: %(default)s)")
    defrag.add_argument("--defrag-moves-per-pod", type=_positive_int,
                        default=_DEFAULTS.defrag_moves_per_pod, metavar="COUNT",
                        help="moves to place one waiting pod (default: %(default)s)")
    defrag.add_argument("--defrag-hold", type=arguments.duration, default=_DEFAULTS.defrag_hold,
                        metavar="DURATION", help=arguments.duration_help(
                            "how long freed devices wait for their pod", _DEFAULTS.defrag_hold))
    defrag.add_argument("--defrag-window", type=arguments.duration,
                        default=_DEFAULTS.defrag_window,
                        metavar="DURATION", help=arguments.duration_help(
                            "a pod moved is not moved again within it", _DEFAULTS.defrag_window))
    controller.set_defaults(func=_run_controller)


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a whole number of at least 1")
    return number


def _run_controller(args: argparse.Namespace) -> int:
    if args.release_all:
        return _release_all(args)
    from dra_gateway.allocator import process

    return process.main(args)


def _release_all(args: argparse.Namespace) -> int:
    import asyncio

    from dra_gateway.allocator.uninstall import release_all
    from dra_gateway.kube.cluster.connect import ClusterConfigError, connect
    from dra_gateway.kube.cluster.port import ApiError

    async def run() -> int:
        cluster = await connect(args.cluster, args.kubeconfig)
        try:
            summary = await release_all(cluster)
        finally:
            await cluster.close()
        first, *rest = summary.lines()
        print(f"allocator --release-all: {first}")
        for line in rest:
            print(line)
        return 1 if summary.failed else 0

    try:
        return asyncio.run(run())
    except (ClusterConfigError, ApiError) as exc:
        return arguments.error(f"{exc}", 1)

"""Subcommands of the allocator: `allocator` (the controller) and `bench allocator`.

Light imports only; each handler imports its module when it runs.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import Any

from dra_gateway.kube import arguments


class _StrategyOption(argparse.Action):
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
            print(f"{parser.prog}: --policy is deprecated, use --strategy (same values)",
                  file=sys.stderr)
        namespace.strategy_option = option_string
        if self.append:
            values = [*(getattr(namespace, self.dest) or ()), values]
        setattr(namespace, self.dest, values)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    controller = sub.add_parser(
        "allocator", help="run the allocator controller (one active replica through a Lease)"
    )
    controller.add_argument("--cluster", choices=("kube", "memory"), default="kube",
                            help="kube: the kubeconfig's cluster (default); memory: an empty "
                            "in-process cluster nothing else can reach (a smoke test only)")
    controller.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, "
                            "the pod's service account, then ~/.kube/config)")
    controller.add_argument("--namespace", default="dra-gateway",
                            type=arguments.namespace,
                            help="namespace of the allocator's Lease (default: %(default)s)")
    controller.add_argument("--strategy", "--policy", action=_StrategyOption, default="default",
                            metavar="STRATEGY",
                            help="cluster-wide packing strategy: default (fragmentation-aware), "
                            "binpack, spread or first-fit (default: %(default)s; --policy is "
                            "its deprecated name)")
    controller.add_argument("--workers", type=_positive_int, default=16, metavar="N",
                            help="pods handled at once; planning itself is one at a time, the "
                            "rest waits on the API (default: %(default)s)")
    controller.add_argument("--identity", help="holder identity in the Lease (default: host name "
                            "and process id)")
    controller.add_argument("--metrics-address", metavar="HOST:PORT",
                            help="serve /metrics, /healthz and /readyz there, e.g. :8080 "
                            "(default: off)")
    controller.add_argument("--release-all", action="store_true",
                            help="instead of running: clear the allocation of every claim no "
                            "live pod uses and remove the allocator's finalizer from every "
                            "claim, then exit (the chart's pre-delete hook; run it with the "
                            "allocator stopped)")
    controller.set_defaults(func=_run_controller)

    replay = bench.add_parser(
        "allocator", help="replay an openb-format trace through the planner, per packing strategy"
    )
    replay.add_argument("--nodes", required=True, help="node list CSV (openb format)")
    replay.add_argument("--pods", required=True, help="pod list CSV (openb format)")
    replay.add_argument("--strategy", "--policy", action=_StrategyOption, append=True,
                        dest="strategies", metavar="NAME",
                        help="packing strategy to compare (repeatable; default: every "
                        "strategy; --policy is its deprecated name)")
    replay.add_argument("--load", type=float, default=1.3,
                        help="GPU requests as a share of the cluster's GPUs (default: 1.3)")
    replay.add_argument("--seeds", default="42-51",
                        help="seeds, e.g. 42-51 or 42,43 (default: %(default)s)")
    replay.add_argument("--gpu-policies", action="store_true",
                        help="also replay each seed with 200 GPUQuotas and 50 "
                        "GPUSharingPolicies over 200 namespaces, side by side pod by pod, and "
                        "report the ratio of claims/s")
    replay.add_argument("-o", "--output", choices=("table", "json"), default="table")
    replay.set_defaults(func=_run_bench)


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
    import sys

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
        print(f"allocator --release-all: {exc}", file=sys.stderr)
        return 1


def _run_bench(args: argparse.Namespace) -> int:
    from dra_gateway.allocator import bench

    return bench.main(args)

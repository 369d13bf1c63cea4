"""The allocator process: flags to settings, the connection, signals, and leadership terms.

`main` is what `dra-gateway allocator` runs: it connects to the cluster, serves metrics, and
campaigns for the Lease, running a fresh `Controller` in each term of leadership until SIGTERM
or SIGINT. Every term starts from the API alone. This module wires things together; it must not
allocate, and nothing below it may exit the process.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import socket

from dra_gateway.allocator.controller import Controller
from dra_gateway.allocator.metrics import Metrics
from dra_gateway.allocator.settings import ControllerSettings
from dra_gateway.kube.cluster.port import ApiError, Cluster
from dra_gateway.kube.runtime.collector import keep_settled
from dra_gateway.kube.runtime.leader import LeaderElector, LeaseSettings

log = logging.getLogger(__name__)


def default_identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


async def run_allocator(cluster: Cluster, *, namespace: str, identity: str,
                        settings: ControllerSettings | None = None,
                        lease: LeaseSettings | None = None,
                        metrics: Metrics | None = None,
                        stop: asyncio.Event | None = None) -> None:
    """Campaign for the Lease and run a fresh Controller in each term until `stop` is set."""
    metrics = metrics or Metrics()
    lease = lease or LeaseSettings(identity=identity, namespace=namespace)
    base = settings or ControllerSettings()
    settings = ControllerSettings(**{**base.__dict__, "identity": identity})
    elector = LeaderElector(cluster, lease)

    async def lead() -> None:
        metrics.leader.set(1)
        try:
            # Every term starts from the API alone: nothing carries over from a lost term.
            await Controller(cluster, settings, metrics=metrics,
                             fence=elector.check_leading).run()
        finally:
            metrics.end_term()

    campaign = asyncio.ensure_future(elector.run(lead))
    if stop is None:
        await campaign
        return
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({campaign, stopping}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (campaign, stopping):
            task.cancel()
        await asyncio.gather(campaign, stopping, return_exceptions=True)
    if campaign.done() and not campaign.cancelled() and campaign.exception() is not None:
        raise campaign.exception()  # type: ignore[misc]


def main(args: argparse.Namespace) -> int:
    """`dra-gateway allocator`: run until SIGTERM or SIGINT; 0 on a clean stop."""
    from dra_gateway.kube import logs

    logs.configure()
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 130


async def _main(args: argparse.Namespace) -> int:
    from dra_gateway.allocator.planner import STRATEGIES

    identity = args.identity or default_identity()
    if args.strategy not in STRATEGIES:
        log.error("unknown packing strategy", extra={
            "strategy": args.strategy,
            "fix": f"pass --strategy with one of {', '.join(STRATEGIES)}"})
        return 2
    from dra_gateway.kube.cluster import ClusterConfigError

    try:
        cluster = await _connect(args)
    except (ClusterConfigError, ApiError, OSError, ValueError) as err:
        log.error("cannot reach the cluster", extra={
            "cluster": args.cluster, "kubeconfig": args.kubeconfig, "error": str(err),
            "fix": "check --kubeconfig (or KUBECONFIG) and that the API server is reachable"})
        return 1
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    log.info("allocator starting", extra={"identity": identity, "leaseNamespace":
                                          args.namespace, "strategy": args.strategy,
                                          "cluster": args.cluster})
    metrics = Metrics()
    # The mirrors hold the cluster's pods and claims: keep full collections from walking them
    # all while allocations wait (kube/runtime/collector.py).
    settling = asyncio.create_task(keep_settled(), name="gc-settle")
    try:
        async with contextlib.AsyncExitStack() as stack:
            address = getattr(args, "metrics_address", None)
            if address:
                from dra_gateway.kube.runtime.serving import serving

                try:
                    port = await stack.enter_async_context(serving(metrics.render, address))
                except (ValueError, OSError) as err:
                    log.error("cannot serve metrics", extra={
                        "address": address, "error": str(err),
                        "fix": "pass --metrics-address as HOST:PORT with a free port"})
                    return 2
                log.info("serving metrics", extra={"address": address, "port": port})
            await run_allocator(cluster, namespace=args.namespace, identity=identity,
                                settings=ControllerSettings(
                                    strategy=args.strategy, workers=args.workers,
                                    group_domains=tuple(args.group_domain_label),
                                    namespace=args.namespace, defrag=args.defrag,
                                    defrag_after=args.defrag_after,
                                    defrag_interval=args.defrag_interval,
                                    defrag_moves_per_hour=args.defrag_moves_per_hour,
                                    defrag_moves_per_pod=args.defrag_moves_per_pod,
                                    defrag_hold=args.defrag_hold,
                                    defrag_window=args.defrag_window,
                                    preemption=not args.no_preemption,
                                    health_eviction=not args.no_health_eviction),
                                metrics=metrics, stop=stop)
    finally:
        settling.cancel()
        await asyncio.gather(settling, return_exceptions=True)
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        await cluster.close()
    log.info("allocator stopped", extra={"identity": identity})
    return 0


async def _connect(args: argparse.Namespace) -> Cluster:
    from dra_gateway.kube.cluster import connect

    if args.cluster == "memory":
        log.warning("running against an in-process memory cluster: nothing else can reach it, "
                    "so this only shows the allocator starting (smoke test)")
    return await connect(args.cluster, args.kubeconfig)


__all__ = ["default_identity", "main", "run_allocator"]

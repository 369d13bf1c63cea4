"""Subcommands of the development kit for the `dra-gateway` command (light imports only).

`dra-gateway cluster serve` runs the embedded default: an in-memory cluster served as the
Kubernetes API on loopback, with a kubeconfig written for the other components.
`dra-gateway bench cluster` measures the simulator's HTTP hop, `dra-gateway bench allocator`
replays a trace through the planner (`bench.allocator`). `offer_memory_cluster` lets every
component's `--cluster memory` reach the simulator without production code importing it.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from dra_gateway.allocator.cli import StrategyOption
from dra_gateway.kube import arguments

if TYPE_CHECKING:
    from dra_gateway.kube.cluster.port import Cluster


def _listen_address(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise argparse.ArgumentTypeError(f'"{text}" is not HOST:PORT (e.g. 127.0.0.1:0)')
    host = host.strip("[]")
    try:
        number = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f'"{text}": port "{port}" is not a number') from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f'"{text}": port {number} is out of range 0-65535')
    return host, number


def _service(text: str) -> tuple[str, str]:
    service, sep, address = text.partition("=")
    namespace, slash, name = service.partition("/")
    if not sep or not slash or not namespace or not name or ":" not in address:
        raise argparse.ArgumentTypeError(
            f'"{text}" is not NAMESPACE/NAME=HOST:PORT (e.g. dra-gateway/webhook=127.0.0.1:8443)')
    return service, address


def _token(text: str) -> str:
    # An empty token was replaced by a random one without a word; a token with spaces or
    # control characters cannot travel in an Authorization header.
    if not text or not text.isprintable() or any(c.isspace() for c in text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a bearer token: give printable characters without spaces, or "
            "leave --token out for a random one")
    return text


_POLICY_KINDS = ("GPUQuota", "GPUSharingPolicy")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the kit's subcommands (`bench`, `demo`, `cluster`); handlers import their heavy
    modules themselves."""
    from dra_gateway.devkit import demo

    bench_parser = sub.add_parser("bench", help="benchmarks on the embedded default",
                                  description="Benchmarks of the planner and the embedded API, "
                                  "each measured side by side with what it is compared to.")
    bench = bench_parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    demo.register(sub)
    cluster = sub.add_parser("cluster", help="the embedded Kubernetes API (in-memory cluster)",
                             description="The development kit's embedded Kubernetes API: an "
                             "in-memory cluster served over HTTP for kubectl and the components.")
    commands = cluster.add_subparsers(dest="cluster_command", metavar="COMMAND", required=True)
    serve = commands.add_parser(
        "serve", help="serve an in-memory cluster as the Kubernetes API until stopped",
        description="Serve an in-memory cluster over HTTP as the subset of the Kubernetes API "
                    "the project uses, write a kubeconfig for clients, and run until SIGINT or "
                    "SIGTERM.")
    serve.add_argument("--listen", type=_listen_address, default=("127.0.0.1", 0),
                       metavar="HOST:PORT",
                       help="address to listen on (default 127.0.0.1:0, a free port)")
    serve.add_argument("--kubeconfig", required=True, metavar="FILE",
                       help="where to write the kubeconfig clients use")
    serve.add_argument("--seed", action="append", default=[], metavar="FILE",
                       help="YAML or JSON manifests to create at start (repeatable)")
    serve.add_argument("--policies", action="append", default=[], metavar="FILE",
                       help="GPUQuota and GPUSharingPolicy manifests to create at start, as the "
                            "chart's CRDs serve them on a real cluster (repeatable)")
    auth = serve.add_mutually_exclusive_group()
    auth.add_argument("--token", default=None, type=_token,
                      help="bearer token clients must send (default: a random one, written "
                           "into the kubeconfig)")
    auth.add_argument("--no-token", action="store_true",
                      help="accept requests without a token (loopback addresses only)")
    serve.add_argument("--history", type=int, default=1000, metavar="COUNT",
                       help="watch events kept per type; older resourceVersions get 410 Expired "
                            "(default: %(default)s)")
    serve.add_argument("--webhook-service", action="append", default=[], type=_service,
                       metavar="NAMESPACE/NAME=HOST:PORT",
                       help="where a webhook configuration's clientConfig.service listens "
                            "(repeatable); its TLS name stays NAME.NAMESPACE.svc")
    serve.add_argument("--tls-dir", metavar="DIR",
                       help="serve HTTPS with DIR/tls.crt and DIR/tls.key (kubectl sends its "
                            "token only over HTTPS)")
    serve.add_argument("--ca-file", metavar="FILE",
                       help="the CA the kubeconfig trusts for --tls-dir's certificate")
    serve.add_argument("--no-admission", action="store_true",
                       help="do not call the admission webhooks registered in the cluster")
    serve.add_argument("--no-control-plane", action="store_true",
                       help="do not run the embedded stand-ins for the ResourceClaim controller "
                            "(claims from templates) and the scheduler (binding)")
    serve.set_defaults(func=_serve)

    measure = bench.add_parser(
        "cluster", help="the embedded API's HTTP hop against in-memory calls, side by side",
        description="Run one claim workload (create, get, allocate, watch) on the in-memory "
                    "cluster and through kubernetes-asyncio against it on loopback; print both "
                    "throughputs and their ratio.")
    measure.add_argument("--claims", type=int, default=2000, metavar="COUNT",
                         help="claims per backend (default: %(default)s)")
    measure.add_argument("--concurrency", type=int, default=16, metavar="COUNT",
                         help="concurrent workers (default: %(default)s)")
    measure.set_defaults(func=_bench)

    replay = bench.add_parser(
        "allocator", help="replay an openb-format trace through the planner, per packing strategy",
        description="Replay an openb trace's pods through the planner, once per packing "
                    "strategy and seed, and compare the GPU allocation each reaches.")
    replay.add_argument("--nodes", required=True, metavar="FILE",
                        help="node list CSV (openb format)")
    replay.add_argument("--pods", required=True, metavar="FILE",
                        help="pod list CSV (openb format)")
    replay.add_argument("--strategy", "--policy", action=StrategyOption, append=True,
                        dest="strategies", metavar="STRATEGY",
                        help="packing strategy to compare (repeatable; default: every "
                        "strategy; --policy is its deprecated name)")
    replay.add_argument("--load", type=float, default=1.3, metavar="NUMBER",
                        help="GPU requests as a share of the cluster's GPUs (default: 1.3)")
    replay.add_argument("--seeds", default="42-51", metavar="SEEDS",
                        help="seeds, e.g. 42-51 or 42,43 (default: %(default)s)")
    replay.add_argument("--gpu-policies", action="store_true",
                        help="also replay each seed with 200 GPUQuotas and 50 "
                        "GPUSharingPolicies over 200 namespaces, side by side pod by pod, and "
                        "report the ratio of claims/s")
    replay.add_argument("--scale", default=None, metavar="FACTORS",
                        help="replay the cluster and the pods multiplied N times (several, "
                        "e.g. 1,8, side by side in one run); reports the state's resident "
                        "memory and claims/s against the first factor")
    replay.add_argument("--defrag-moves", type=float, default=None, metavar="PERCENT",
                        help="after each replay, retry the pods that did not fit, then let "
                        "defrag move at most P%% of the pods placed to place them; report GPU "
                        "allocation before, after retrying and after defrag")
    replay.add_argument("--preemption", type=float, default=None, metavar="PERCENT",
                        help="after each replay, P%% more pods of a higher priority arrive; "
                        "report how many are placed with preemption and without, victims per "
                        "preemption, the victim search's time and the planning time per claim "
                        "with preemption on against off (side by side)")
    replay.add_argument("--groups", action="store_true",
                        help="deal the multi-card pods to jobs of 2 to 16 members and replay "
                        "each seed with and without group awareness (all or nothing, one GPU "
                        "model per job), side by side: jobs placed whole and partly, GPUs "
                        "partly placed jobs hold, GPU allocation, claims/s and p99")
    replay.add_argument("--losses", action="store_true",
                        help="also report where the unallocated GPU share lies at the end of "
                        "the replays: per content of a card (the shares it holds), the cards "
                        "and their free share")
    arguments.output_option(replay, "table", "json")
    replay.set_defaults(func=_run_bench)

    topology = bench.add_parser(
        "topology", help="multi-card pods on one PCIe root / NUMA node: with the topology "
        "preference, without it, and first-fit, side by side",
        description="Place multi-card pods with the topology preference, without it and "
                    "first-fit, side by side, and compare how many share one PCIe root or NUMA "
                    "node.")
    topology.add_argument("--inventory", default=None, metavar="FILE",
                          help="the node's inventory file, copied for every node (default: "
                          "the bundled examples/inventory/pcie8.yaml)")
    topology.add_argument("--nodes", type=int, default=16, metavar="COUNT",
                          help="nodes (default: %(default)s)")
    topology.add_argument("--pods", type=int, default=4000, metavar="COUNT",
                          help="pods arriving per seed (default: %(default)s)")
    topology.add_argument("--load", type=float, default=0.9, metavar="NUMBER",
                          help="cards asked as a share of the cluster's (default: %(default)s)")
    topology.add_argument("--seeds", default="1-3", metavar="SEEDS",
                          help="seeds, e.g. 1-3 or 1,2 (default: %(default)s)")
    arguments.output_option(topology, "table", "json")
    topology.set_defaults(func=_run_topology_bench)


def _memory_cluster() -> Cluster:
    from dra_gateway.devkit.sim.memory import MemoryCluster

    return MemoryCluster()


def offer_memory_cluster() -> None:
    """Make `connect("memory")`, every component's `--cluster memory`, a fresh simulator."""
    from dra_gateway.kube.cluster.connect import offer_memory

    offer_memory(_memory_cluster)


def _run_bench(args: argparse.Namespace) -> int:
    from dra_gateway.devkit.bench import allocator

    return allocator.main(args)


def _run_topology_bench(args: argparse.Namespace) -> int:
    from dra_gateway.devkit.bench import topology

    return topology.main(args)


def _bench(args: argparse.Namespace) -> int:
    if args.claims < 1 or args.concurrency < 1:
        print("error: --claims and --concurrency must be at least 1", file=sys.stderr)
        return 2
    from dra_gateway.devkit.sim import bench

    return bench.main(args.claims, args.concurrency)


def _serve(args: argparse.Namespace) -> int:
    import asyncio

    try:
        return asyncio.run(_serve_async(args))
    except KeyboardInterrupt:
        return 130


def _server_tls(tls_dir: str | None, ca_file: str | None) -> tuple[Any, bytes | None]:
    """The serving context of `cluster serve --tls-dir` and the CA its kubeconfig trusts."""
    if tls_dir is None:
        if ca_file is not None:
            raise ValueError("--ca-file goes with --tls-dir")
        return None, None
    import ssl
    from pathlib import Path

    try:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(Path(tls_dir) / "tls.crt", Path(tls_dir) / "tls.key")
        return context, Path(ca_file).read_bytes() if ca_file else None
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot serve TLS from {tls_dir} (tls.crt, tls.key)"
                         f"{f' with the CA {ca_file}' if ca_file else ''}: {exc}") from None


async def _serve_async(args: argparse.Namespace) -> int:
    import asyncio
    import contextlib
    import ipaddress
    import secrets
    import signal

    from dra_gateway.devkit.sim.manifests import ManifestError, read_manifests
    from dra_gateway.devkit.sim.memory import MemoryCluster
    from dra_gateway.devkit.sim.server import serve, write_kubeconfig
    from dra_gateway.kube.cluster.port import ApiError

    host, port = args.listen
    if args.no_token:
        try:
            loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if not loopback:
            print(f"error: --no-token is refused on {host}: the API has no authorization, so "
                  "listen on 127.0.0.1 or keep a token", file=sys.stderr)
            return 2
        token = None
    else:
        token = args.token or secrets.token_urlsafe(24)
    if args.history < 1:
        print(f"error: --history must be at least 1, got {args.history}", file=sys.stderr)
        return 2

    try:
        tls, ca_data = _server_tls(args.tls_dir, args.ca_file)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    cluster = MemoryCluster(history=args.history)
    try:
        policies = read_manifests(args.policies)
        for obj in policies:
            if obj.get("kind") not in _POLICY_KINDS:
                raise ManifestError(f"--policies takes {' and '.join(_POLICY_KINDS)} objects, "
                                    f"got {obj.get('kind')} "
                                    f"{(obj.get('metadata') or {}).get('name')}; give other "
                                    f"objects with --seed")
        seeded = await cluster.load(read_manifests(args.seed) + policies)
    except ManifestError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ApiError as exc:
        print(f"error: seeding the cluster from {', '.join(args.seed)}: {exc.message}",
              file=sys.stderr)
        return 2

    from dra_gateway.devkit.sim.controlplane import SimulatedControllers

    control_plane = None if args.no_control_plane else SimulatedControllers(cluster)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with contextlib.AsyncExitStack() as stack:
            server = await stack.enter_async_context(
                serve(cluster, host=host, port=port, token=token,
                      admission=not args.no_admission,
                      webhook_services=dict(args.webhook_service), tls=tls, ca_data=ca_data))
            if control_plane is not None:
                await stack.enter_async_context(control_plane.running())
            try:
                write_kubeconfig(args.kubeconfig, server.url, token, ca_data=ca_data)
            except OSError as exc:
                print(f"error: cannot write the kubeconfig {args.kubeconfig}: "
                      f"{exc.strerror or exc}", file=sys.stderr)
                return 2
            print(f"serving the Kubernetes API on {server.url} ({len(seeded)} objects seeded"
                  f"{'' if control_plane else ', no control plane'}); "
                  f"kubeconfig: {args.kubeconfig}", flush=True)
            await stop.wait()
            print("stopping", flush=True)
    except OSError as exc:
        print(f"error: cannot listen on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError, RuntimeError):
                loop.remove_signal_handler(signum)
        await cluster.close()
    return 0

"""The `dra-gateway` command: one entry point, a subcommand per component.

Each component registers its own subcommands from its `cli` module, whose top level stays
light: heavy imports happen inside the handlers so `dra-gateway --help` is instant.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from dra_gateway import __version__
from dra_gateway.allocator import cli as allocator_cli
from dra_gateway.certs import cli as certs_cli
from dra_gateway.devkit import cli as devkit_cli
from dra_gateway.node_plugin import cli as node_plugin_cli
from dra_gateway.translator import cli as translator_cli
from dra_gateway.webhook import cli as webhook_cli


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dra-gateway",
        description="Legacy GPU requests to Kubernetes DRA: translation, allocation, node plugin.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    bench_parser = sub.add_parser("bench", help="benchmarks on the embedded default")
    bench = bench_parser.add_subparsers(dest="bench", metavar="BENCH", required=True)
    from dra_gateway import defrag, devices, migrate, report
    from dra_gateway.devkit import demo

    demo.register(sub)
    report.register(sub)
    migrate.register(sub)
    defrag.register(sub)
    devices.register(sub)
    for module in (devkit_cli, translator_cli, webhook_cli, certs_cli, allocator_cli,
                   node_plugin_cli):
        module.register(sub, bench)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "cluster", None) == "memory":
        devkit_cli.offer_memory_cluster()
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into `head` and friends: not an error worth a trace.
        sys.stderr.close()
        return 0
    return code

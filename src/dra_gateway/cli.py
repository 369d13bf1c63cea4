"""The `dra-gateway` command: one entry point, a subcommand per component.

Each component registers its own subcommands from its `cli` module, whose top level stays
light: heavy imports happen inside the handlers so `dra-gateway --help` is instant. The
development kit's commands (`demo`, `cluster`, `bench`, the embedded `--cluster memory`) are
there where the kit is installed; the production image leaves it out (setup.py).

A command that groups others, `dra-gateway` itself included, prints its help and exits 0 when
given none of them, as kubectl and helm do; every command speaks the dialect of
`kube/arguments.py` (tests/test_cli_dialect.py walks the tree).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from types import ModuleType

from dra_gateway import __version__
from dra_gateway.allocator import cli as allocator_cli
from dra_gateway.certs import cli as certs_cli
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
    devkit = _devkit()
    if devkit is not None:
        devkit.register(sub)
    from dra_gateway import defrag, devices, migrate, preflight, report, smoke

    report.register(sub)
    migrate.register(sub)
    defrag.register(sub)
    devices.register(sub)
    preflight.register(sub)
    smoke.register(sub)
    for module in (translator_cli, webhook_cli, certs_cli, allocator_cli, node_plugin_cli):
        module.register(sub)
    _help_without_command(parser)
    return parser


def _help_without_command(parser: argparse.ArgumentParser) -> None:
    """Make every command that groups others print its help and exit 0 when none is given,
    rather than argparse's usage error: the help is what the user asked for by not choosing.
    Done here over the whole tree, so that each component's commands behave alike."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            action.required = False
            parser.set_defaults(func=functools.partial(_print_help, parser))
            for child in dict.fromkeys(action.choices.values()):
                _help_without_command(child)


def _print_help(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    parser.print_help()
    return 0


def _devkit() -> ModuleType | None:
    """The development kit's commands, where it is installed."""
    try:
        from dra_gateway.devkit import cli as devkit_cli
    except ModuleNotFoundError as exc:
        if exc.name not in ("dra_gateway.devkit", "dra_gateway.devkit.cli"):
            raise  # the kit is there and broken: say so
        return None
    return devkit_cli


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "cluster", None) == "memory":
        devkit = _devkit()
        if devkit is None:
            print("error: --cluster memory is the development kit's embedded cluster, which "
                  "this installation leaves out; use --cluster kube", file=sys.stderr)
            return 2
        devkit.offer_memory_cluster()
    try:
        code: int = args.func(args)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # Output piped into `head` and friends: not an error worth a trace.
        sys.stderr.close()
        return 0
    return code

"""Run `dra-gateway` with the NVML stand-in (`nvmlmig.MigNvml`) in place of `pynvml`, so that a
simulated node's plugin runs with `--nvml`: discovery, MIG geometry, instances made and
destroyed on demand, as on a node with MIG cards. For the cluster tiers and demos; the product
never imports it.

    python -m dra_gateway.devkit.standin_nvml --card "NVIDIA H100 80GB HBM3" --card ... \\
        --state FILE [--uuid-prefix NODE] -- node-plugin serve --nvml --mig-on-demand ...

`--state` keeps the cards' instances in FILE (JSON), as the hardware keeps them when the plugin
restarts; a test reads it to see what is made. Every card is in MIG mode.
"""

from __future__ import annotations

import argparse
import runpy
import sys
import types
from collections.abc import Sequence
from pathlib import Path

from dra_gateway.devkit.migcards import MODELS
from dra_gateway.devkit.nvmlmig import MigNvml


def install(cards: Sequence[str], state: Path | None, uuid_prefix: str = "standin") -> MigNvml:
    """Put a stand-in of `cards` (models of `migcards.MODELS`) where `import pynvml` finds it."""
    nvml = MigNvml([MODELS[name] for name in cards], state=state, uuid_prefix=uuid_prefix)
    module = types.ModuleType("pynvml", "NVML stand-in (dra_gateway.devkit.standin_nvml)")
    module.__dict__.update(vars(nvml.module()))
    sys.modules["pynvml"] = module
    return nvml


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dra_gateway.devkit.standin_nvml",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--card", action="append", required=True, choices=sorted(MODELS),
                        help="a card's model, once per card, in index order")
    parser.add_argument("--state", type=Path, help="keep the cards' instances in this file")
    parser.add_argument("--uuid-prefix", default="standin",
                        help="up to 7 characters in the cards' UUIDs (distinct per node)")
    parser.add_argument("command", nargs=argparse.REMAINDER,
                        help="-- then dra-gateway's arguments")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    install(args.card, args.state, args.uuid_prefix)
    # As `python -m dra_gateway` (the command line sits above the devkit: not imported here).
    sys.argv = ["dra-gateway", *command]
    try:
        runpy.run_module("dra_gateway", run_name="__main__", alter_sys=True)
    except SystemExit as done:
        return done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`dra-gateway demo`: the main job on the embedded default, no cluster needed."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser("demo", help="run the gateway end to end on an embedded cluster")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print("demo: not wired yet")
    return 0

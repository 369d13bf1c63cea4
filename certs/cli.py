"""Subcommands of this component for the `dra-gateway` command (light imports only)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser],
             bench: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add this component's subcommands; handlers import their heavy modules themselves."""

"""`dra-gateway report`: quotas, cards and pending pods of a cluster, as a table, JSON or HTML.

It reads the cluster through the port (a kubeconfig's API, the embedded one included) and hands
the objects to the pure builder in dra_gateway.policy.report.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = sub.add_parser(
        "report", help="quota usage, who holds which share of each card, pending pods",
        description="Read the cluster and show, per namespace, each GPUQuota's used and hard "
                    "amounts; per card who holds which share; free slivers too small for any "
                    "pending request; pending pods by reason. -o html draws the cards.")
    report.add_argument("-o", "--output", choices=("table", "json", "html"), default="table")
    report.add_argument("--kubeconfig", metavar="FILE",
                        help="kubeconfig file (default: $KUBECONFIG, then ~/.kube/config); "
                             "`cluster serve` writes one for the embedded API")
    report.set_defaults(func=_run)


async def _read(kubeconfig: str | None) -> dict[str, Any]:
    from dra_gateway.kube.cluster.connect import connect
    from dra_gateway.kube.cluster.port import NotFound
    from dra_gateway.kube.resources import (
        GPU_QUOTAS,
        GPU_SHARING_POLICIES,
        NAMESPACES,
        PODS,
        RESOURCE_CLAIM_TEMPLATES,
        RESOURCE_CLAIMS,
        RESOURCE_SLICES,
    )
    from dra_gateway.policy.catalog import Catalog
    from dra_gateway.policy.report import build_report

    cluster = await connect("kube", kubeconfig)
    try:
        async def items(rt: Any) -> list[dict[str, Any]]:
            try:
                return list((await cluster.list(rt)).items)
            except NotFound:  # the CRDs are not installed
                return []

        catalog = Catalog.build(quotas=await items(GPU_QUOTAS),
                                sharing=await items(GPU_SHARING_POLICIES),
                                namespaces=await items(NAMESPACES))
        return build_report(claims=await items(RESOURCE_CLAIMS),
                            slices=await items(RESOURCE_SLICES), pods=await items(PODS),
                            templates=await items(RESOURCE_CLAIM_TEMPLATES), catalog=catalog)
    finally:
        await cluster.close()


def _run(args: argparse.Namespace) -> int:
    from dra_gateway.kube.cluster.connect import ClusterConfigError
    from dra_gateway.kube.cluster.port import ApiError
    from dra_gateway.policy.report import render_html, render_table

    try:
        report = asyncio.run(_read(args.kubeconfig))
    except ClusterConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ApiError as exc:
        print(f"error: reading the cluster: {exc.reason}: {exc.message}", file=sys.stderr)
        return 1
    if args.output == "json":
        print(json.dumps(report, indent=2))
    elif args.output == "html":
        sys.stdout.write(render_html(report))
    else:
        sys.stdout.write(render_table(report))
    return 0

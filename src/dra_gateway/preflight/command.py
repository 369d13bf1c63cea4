"""The `dra-gateway preflight` command line: read, judge, print, exit by the worst severity.

Heavy imports happen inside the handler, so `dra-gateway --help` stays instant.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
from typing import TYPE_CHECKING

from dra_gateway.kube import arguments, names

if TYPE_CHECKING:
    from dra_gateway.preflight.checks import Check
    from dra_gateway.preflight.reading import Facts


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "preflight", help="check a cluster for what the gateway needs, read-only",
        description="Read the cluster (nothing is written: feature gates are probed with "
                    "dry-run slices) and say, check by check, what the gateway needs and what "
                    "is missing. Exit code: 0 ok or info, 1 the API failed, 2 bad input, "
                    "3 a warning, 4 an error.")
    arguments.output_option(parser, "table", "json")
    arguments.namespace_option(parser, default=names.GATEWAY_NAMESPACE,
                               help="the namespace the gateway is (or will be) installed in "
                                    "(default: %(default)s)")
    arguments.kubeconfig_option(parser)
    parser.set_defaults(func=_run)


async def _read(kubeconfig: str | None, namespace: str) -> tuple[Facts, list[Check]]:
    from dra_gateway.kube.cluster.connect import connect
    from dra_gateway.preflight.checks import judge
    from dra_gateway.preflight.reading import read_facts

    # No group is required up front: a cluster without DRA v1 is a finding, not a failure.
    cluster = await connect("kube", kubeconfig, verify=())
    try:
        facts = await read_facts(cluster, namespace=namespace)
    finally:
        await cluster.close()
    return facts, judge(facts)


def _run(args: argparse.Namespace) -> int:
    from dra_gateway.kube.cluster.connect import ClusterConfigError
    from dra_gateway.kube.cluster.port import ApiError
    from dra_gateway.preflight.checks import EXIT_CODES, worst
    from dra_gateway.preflight.render import document, table

    try:
        facts, checks = asyncio.run(_read(args.kubeconfig, args.namespace))
    except ClusterConfigError as exc:
        return arguments.error(str(exc), 2)
    except ApiError as exc:
        return arguments.error(f"reading the cluster: {exc.reason}: {exc.message}", 1)
    if args.output == "json":
        print(json.dumps(document(facts, checks), indent=2))
    else:
        sys.stdout.write(table(facts, checks, shutil.get_terminal_size().columns))
    return EXIT_CODES[worst(c.severity for c in checks)]

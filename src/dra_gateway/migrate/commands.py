"""The `dra-gateway migrate` command line: `plan`, `quotas` and `node`, and their exit codes.

Handlers read (files with `-f`, else the cluster of `--kubeconfig`), call one function and
print; every failure is one line on stderr naming what was wrong and the fix, never a traceback.
Exit codes: 0 done; 1 the API failed; 2 bad input (a dump, the kubeconfig, the rules, a node
that does not exist); 3 (`node` only) the node still waits for something, so scripts can poll.
Heavy imports happen inside the handlers, so `dra-gateway --help` stays instant.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from dra_gateway.kube import arguments, names

if TYPE_CHECKING:
    from dra_gateway.migrate.inventory import ClusterObjects
    from dra_gateway.translator.rules import RuleSet

_SOURCE_HELP = ("manifests to read instead of a live cluster (kubectl get ... -o yaml: a List "
                "or YAML documents of Pods, workloads, Namespaces, Nodes, ResourceQuotas, "
                "GPUQuotas, GPUSharingPolicies, rule ConfigMaps); repeatable; - reads "
                "standard input")


class _Failure(Exception):
    """A user-facing failure: the message and the exit code."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def _sources(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-f", "--filename", metavar="FILE", action="append", default=[],
                        help=_SOURCE_HELP)
    arguments.kubeconfig_option(parser)
    parser.add_argument("--rules", metavar="PATH", action="append", default=[],
                        help="rules files or folders the webhook reads (its --rules), besides "
                             "the built-in rules and the rule ConfigMaps found; repeatable")
    _gateway_namespace(parser)


def _gateway_namespace(parser: argparse.ArgumentParser) -> None:
    # --gateway-namespace was its name before every command said --namespace: still read.
    arguments.namespace_option(parser, default=names.GATEWAY_NAMESPACE,
                               deprecated=("--gateway-namespace",),
                               help="the gateway's namespace: its webhooks read rule ConfigMaps "
                               "there only, and leave it out as they leave out kube-system "
                               "(default: %(default)s)")


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    migrate = sub.add_parser(
        "migrate", help="move a live cluster to the gateway: plan, quotas, node cut-over",
        description="Move a cluster from legacy GPU device plugins to the gateway, namespace by "
                    "namespace and node by node.")
    commands = migrate.add_subparsers(dest="migrate", metavar="COMMAND", required=True)

    plan = commands.add_parser(
        "plan", help="what every namespace, workload, node and quota becomes, and the steps",
        description="Read the cluster and say, before anything changes, each namespace's "
                    "translation mode, what each workload's containers would become under the "
                    "rules in force (or why they stay legacy), each node's legacy device "
                    "plugins and pods, the GPUQuota each legacy ResourceQuota becomes, and the "
                    "steps in order with what each waits for.")
    _sources(plan)
    arguments.output_option(plan, "table", "json", "html")
    plan.add_argument("--default-mode", choices=("enabled", "audit"), default="enabled",
                      help="the chart's webhook.translation.default: the mode of namespaces "
                           "without the dra-gateway.io/translation label (default: enabled)")
    plan.add_argument("--exclude-namespace", action="append", default=[], metavar="NAMESPACE",
                      help="a namespace of the chart's webhook.excludeNamespaces (repeatable)")
    plan.set_defaults(func=_run_plan)

    quotas = commands.add_parser(
        "quotas", help="GPUQuotas equivalent to the ResourceQuotas on legacy GPU names",
        description="Write a GPUQuota per ResourceQuota on legacy GPU names (cards to devices, "
                    "memory in bytes, cores in percent), for kubectl apply -f -. What has no "
                    "equivalent is said in comments, in the JSON and on stderr.")
    _sources(quotas)
    arguments.output_option(quotas, "yaml", "json")
    quotas.set_defaults(func=_run_quotas)

    node = commands.add_parser(
        "node", help="cut one node over; exit 3 while it still waits",
        description="Check node NODE of the live cluster, label it dra-gateway.io/cut-over=true "
                    "and say what it still waits for: the legacy device plugin leaving (with "
                    "the DaemonSet patch that makes it leave), legacy pods holding cards, the "
                    "gateway's node plugin reaching DRA. Exit 0 when the node is cut over, 3 "
                    "while it waits (poll it), 2 when it does not exist, 1 when the API fails.")
    node.add_argument("node", metavar="NODE", help="the node to cut over")
    arguments.kubeconfig_option(node)
    node.add_argument("--rules", metavar="PATH", action="append", default=[],
                      help="rules files or folders the webhook reads, as for plan")
    _gateway_namespace(node)
    node.add_argument("--dry-run", action="store_true",
                      help="only say what it would do: the node is not labelled")
    # `text` was the name of `table` here alone: still taken.
    arguments.output_option(node, "table", "json", aliases={"text": "table"})
    node.set_defaults(func=_run_node)


# Handlers ------------------------------------------------------------------------------------


def _handle(run: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def handler(args: argparse.Namespace) -> int:
        from dra_gateway.kube.cluster.connect import ClusterConfigError
        from dra_gateway.kube.cluster.port import ApiError
        from dra_gateway.migrate.dumps import DumpError
        from dra_gateway.translator.rules import RulesError

        try:
            return run(args)
        except _Failure as exc:
            return arguments.error(str(exc), exc.code)
        except (DumpError, ClusterConfigError) as exc:
            return arguments.error(str(exc), 2)
        except RulesError as exc:
            return arguments.error(f"the rules in force do not load: {exc}; fix the rule "
                                   "ConfigMap or file named", 2)
        except ApiError as exc:
            return arguments.error(f"the Kubernetes API failed: {exc.reason}: {exc.message}", 1)

    return handler


def _inventory(args: argparse.Namespace) -> ClusterObjects:
    from dra_gateway.migrate.dumps import read_dumps

    if args.filename:
        if args.kubeconfig:
            raise _Failure("give either -f FILE (offline) or --kubeconfig (live), not both")
        return read_dumps(args.filename)
    return asyncio.run(_read_live(args.kubeconfig, args.namespace))


async def _read_live(kubeconfig: str | None, gateway_namespace: str) -> ClusterObjects:
    from dra_gateway.kube.cluster.connect import connect
    from dra_gateway.migrate.live import read_cluster

    cluster = await connect("kube", kubeconfig, verify=())
    try:
        return await read_cluster(cluster, gateway_namespace=gateway_namespace)
    finally:
        await cluster.close()


def _rules(inventory: ClusterObjects, args: argparse.Namespace) -> RuleSet:
    """The rules in force, as the webhook of `--namespace` loads them; a labelled
    ConfigMap elsewhere (in a dump) is said to be left out."""
    from dra_gateway.migrate.rules import foreign_config_maps, rules_in_force

    for name in foreign_config_maps(inventory.rule_config_maps, args.namespace):
        arguments.warn(f"ConfigMap {name} carries {names.RULES_LABEL}={names.RULES_LABEL_VALUE} "
                       f"but is not in the gateway's namespace {args.namespace}: the webhook "
                       "does not read it, so neither does this command (a different "
                       "namespace: --namespace)")
    return rules_in_force(inventory.rule_config_maps, namespace=args.namespace,
                          files=args.rules)


def _rule_sources(inventory: ClusterObjects, args: argparse.Namespace) -> list[str]:
    from dra_gateway.kube import objects
    from dra_gateway.migrate.rules import gateway_config_maps

    return ["built-in", *args.rules, *(
        f"ConfigMap {'/'.join(objects.namespace_name(cm))}"
        for cm in gateway_config_maps(inventory.rule_config_maps, args.namespace))]


def _source(args: argparse.Namespace) -> str:
    """The arguments naming the cluster and rules, as another migrate command takes them."""
    import shlex

    parts = [*(f"-f {shlex.quote(f)}" for f in args.filename)]
    if args.kubeconfig:
        parts.append(f"--kubeconfig {shlex.quote(args.kubeconfig)}")
    parts.extend(f"--rules {shlex.quote(r)}" for r in args.rules)
    if args.namespace != names.GATEWAY_NAMESPACE:
        parts.append(f"--namespace {shlex.quote(args.namespace)}")
    return " ".join(parts)


@_handle
def _run_plan(args: argparse.Namespace) -> int:
    from dra_gateway.migrate.plan import build_plan
    from dra_gateway.migrate.render import render_html, render_table

    inventory = _inventory(args)
    plan = build_plan(inventory, _rules(inventory, args), default_mode=args.default_mode,
                      rule_sources=_rule_sources(inventory, args), source=_source(args),
                      excluded=("kube-system", args.namespace,
                                *args.exclude_namespace))
    if args.output == "json":
        print(json.dumps(plan.to_dict(), indent=2))
    elif args.output == "html":
        sys.stdout.write(render_html(plan))
    else:
        sys.stdout.write(render_table(plan))
    return 0


@_handle
def _run_quotas(args: argparse.Namespace) -> int:
    from dra_gateway.migrate.quotas import migrate_quotas, render_yaml

    inventory = _inventory(args)
    migration = migrate_quotas(inventory, _rules(inventory, args))
    for warning in migration.warnings:
        arguments.warn(warning)
    if args.output == "json":
        print(json.dumps(migration.to_dict(), indent=2))
    else:
        sys.stdout.write(render_yaml(migration))
    return 0


@_handle
def _run_node(args: argparse.Namespace) -> int:
    return asyncio.run(_node(args))


async def _node(args: argparse.Namespace) -> int:
    from dra_gateway.kube import names
    from dra_gateway.kube.cluster.connect import connect
    from dra_gateway.kube.cluster.port import NotFound
    from dra_gateway.kube.resources import CONFIG_MAPS
    from dra_gateway.migrate.inventory import ClusterObjects
    from dra_gateway.migrate.node import cut_over

    cluster = await connect("kube", args.kubeconfig, verify=())
    try:
        listed = await cluster.list(
            CONFIG_MAPS, namespace=args.namespace,
            label_selector=f"{names.RULES_LABEL}={names.RULES_LABEL_VALUE}")
        rules = _rules(ClusterObjects(rule_config_maps=list(listed.items)), args)
        try:
            result = await cut_over(cluster, args.node, rules, dry_run=args.dry_run)
        except NotFound:
            raise _Failure(f"node {args.node} does not exist; list the nodes with kubectl get "
                           "nodes") from None
    finally:
        await cluster.close()
    if args.output == "json":
        print(json.dumps({**result.to_dict(), "exitCode": result.exit_code}, indent=2))
    else:
        sys.stdout.write(result.render())
    return result.exit_code

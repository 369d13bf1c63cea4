"""`dra-gateway defrag plan|apply`: the fewest moves that let waiting pods be placed, shown or
carried out on a live cluster.

`plan` reads the cluster (`allocator.eviction.store.read_snapshot`), builds the planner's inputs
(`allocator.eviction.inputs`) and prints what the planner (`allocator.planner.defrag`) would do:
per waiting pod, where it goes and which pods move from where to where, what the moves free,
the pods that could not be helped and why, and how many pods may not move and why. `apply`
makes the same plan and carries it out (`allocator.eviction.moves.Applier`): holds first, then
evictions through the Eviction API, then a wait for each re-placement. Its exit code: 0 when
every pod helped and every moved pod's replacement is placed, 3 when the moves were made but one
of them was not placed within --wait (it may still be), 1 when the plan stopped (a refused
eviction, an API failure), 2 for bad input.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import json
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from dra_gateway.kube import arguments, names, objects

# `defrag apply`: the moves were made, but a pod helped or a replacement is not placed yet.
EXIT_INCOMPLETE = 3

if TYPE_CHECKING:
    from dra_gateway.allocator.eviction.inputs import Inputs
    from dra_gateway.allocator.eviction.moves import ApplyReport
    from dra_gateway.allocator.planner.defrag import DefragPlan


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 0 or more")
    return value


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    defrag = sub.add_parser(
        "defrag", help="free whole cards for waiting pods by moving the fewest pods",
        description="Plan, or carry out, the fewest moves of placed pods that let pods waiting "
                    "for GPUs be placed.")
    commands = defrag.add_subparsers(dest="defrag", metavar="COMMAND", required=True)
    plan = commands.add_parser(
        "plan", help="show the moves, change nothing",
        description="Read the cluster and show the fewest moves that place waiting pods: per "
                    "pod where it goes and which pods move; nothing changes.")
    apply = commands.add_parser(
        "apply", help="carry the plan out: hold the freed devices, evict, wait for each "
                      "re-placement (exit 3 when one is not placed within --wait)",
        description="Make the plan of defrag plan and carry it out: hold the freed devices, "
                    "evict through the Eviction API, wait for each re-placement.")
    for parser in (plan, apply):
        arguments.kubeconfig_option(parser)
        arguments.namespace_option(parser, default=names.GATEWAY_NAMESPACE,
                                   help="the gateway's namespace, where the holds are kept "
                                   "(default: %(default)s)")
        parser.add_argument("--max-moves", type=_count, default=10, metavar="COUNT",
                            help="moves in the whole plan (default: %(default)s)")
        parser.add_argument("--max-moves-per-pod", type=_count, default=4, metavar="COUNT",
                            help="moves to place one waiting pod (default: %(default)s)")
        parser.add_argument("--window", type=arguments.duration, default=3600.0,
                            metavar="DURATION", help=arguments.duration_help(
                                "a pod moved is not moved again within it", 3600.0))
        parser.add_argument("--for", dest="only", action="append", default=[],
                            metavar="NAMESPACE/POD", help="help only these waiting pods")
        arguments.output_option(parser, "table", "json", "html")
    apply.add_argument("--in-flight", type=_count, default=2, metavar="COUNT",
                       help="evictions at once (default: %(default)s)")
    apply.add_argument("--hold", type=arguments.duration, default=600.0, metavar="DURATION",
                       help=arguments.duration_help(
                           "how long freed devices wait for their pod", 600.0))
    apply.add_argument("--wait", type=arguments.duration, default=120.0, metavar="DURATION",
                       help=arguments.duration_help(
                           "how long to wait for each re-placement", 120.0))
    plan.set_defaults(func=_run)
    apply.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    from dra_gateway.kube.cluster.connect import ClusterConfigError
    from dra_gateway.kube.cluster.port import ApiError

    where = f"dra-gateway defrag {args.defrag}"
    try:
        return asyncio.run(_main(args, where))
    except ClusterConfigError as exc:
        return arguments.error(f"{exc}", 2)
    except ApiError as exc:
        return arguments.error(f"the Kubernetes API failed: {exc.reason}: {exc.message}", 1)


async def _main(args: argparse.Namespace, where: str) -> int:
    from dra_gateway.allocator.eviction.inputs import build
    from dra_gateway.allocator.eviction.moves import Applier, Pace, drop_unserved
    from dra_gateway.allocator.eviction.store import read_snapshot
    from dra_gateway.allocator.planner.defrag import Limits, plan_defrag
    from dra_gateway.kube.cluster.clock import read_clock
    from dra_gateway.kube.cluster.connect import DRA_GROUPS, connect

    cluster = await connect("kube", args.kubeconfig, verify=DRA_GROUPS)
    try:
        # The cluster's time, not this machine's: the allocator reads the holds' expiry and the
        # moves' times with its own clock.
        clock = await read_clock(cluster)
        snapshot = await read_snapshot(cluster, namespace=args.namespace, now=clock.now())
        if args.defrag == "apply":
            # A hold left by a defrag that stopped before its moves would hide its pod.
            snapshot = await drop_unserved(cluster, args.namespace, snapshot)
        inputs = build(snapshot, window_seconds=args.window)
        if args.only:
            wanted = set(args.only)
            named = {"/".join(objects.namespace_name(w.pod)): w for w in inputs.waiters}
            unknown = sorted(wanted - set(named))
            if unknown:
                return arguments.error(
                    f"--for {unknown[0]}: no pod of that name waits for the gateway "
                    f"(a waiting pod carries the scheduling gate dra-gateway.io/allocation "
                    f"and its claims exist)", 2)
            inputs.waiters = [w for name, w in named.items() if name in wanted]
        plan = plan_defrag(inputs.state, inputs.waiters, inputs.residents, Limits(
            max_moves=args.max_moves, max_moves_per_pod=args.max_moves_per_pod,
            budgets=inputs.budgets))
        report = None
        if args.defrag == "apply":
            applier = Applier(cluster, namespace=args.namespace, pace=Pace(
                in_flight=max(1, args.in_flight), hold_seconds=args.hold,
                wait_seconds=args.wait, window_seconds=args.window), clock=clock.now)
            report = await applier.carry_out(plan, inputs.pods)
    finally:
        await cluster.close()
    body = to_dict(plan, inputs, report)
    if args.output == "json":
        print(json.dumps(body, indent=2))
    elif args.output == "html":
        print(render_html(body))
    else:
        print(render_table(body))
    if report is not None and report.stopped:
        return 1
    # The moves were made, but what they were for is not placed yet: say so in the exit code.
    return EXIT_INCOMPLETE if report is not None and report.incomplete else 0


def to_dict(plan: DefragPlan, inputs: Inputs, report: ApplyReport | None = None,
            ) -> dict[str, Any]:
    outcomes = {o.help.uid: o for o in report.outcomes} if report is not None else {}
    helped = []
    for help_ in plan.helped:
        outcome = outcomes.get(help_.uid)
        results = {m.move.uid: m for m in outcome.moves} if outcome is not None else {}
        moves = []
        for move in help_.moves:
            entry: dict[str, Any] = {
                "pod": move.pod,
                "from": {"node": move.source.node, "devices": list(move.source.devices)},
                "to": {"node": move.target.node, "devices": list(move.target.devices)}}
            if move.uid in results:
                entry["result"] = results[move.uid].result
                entry["replacement"] = results[move.uid].replacement
                entry["replaced"] = results[move.uid].replaced
            moves.append(entry)
        item: dict[str, Any] = {"pod": help_.pod, "priority": help_.priority,
                                "node": help_.placement.node,
                                "devices": list(help_.placement.devices),
                                "frees": help_.frees, "moves": moves}
        if outcome is not None:
            item["placed"] = outcome.placed
            item["isPlaced"] = outcome.is_placed
        helped.append(item)
    from dra_gateway.allocator.planner.leaving import blocked_by_budget

    fixed = Counter(r.fixed or blocked_by_budget(r, inputs.budgets) for r in inputs.residents)
    fixed.pop(None, None)
    body: dict[str, Any] = {
        "helped": helped,
        "notHelped": [{"pod": n.pod, "reason": n.reason} for n in plan.not_helped],
        "moves": len(plan.moves),
        "waiting": len(inputs.waiters),
        "placed": len(inputs.residents),
        "mayNotMove": dict(sorted(fixed.items())),
    }
    if report is not None:
        body["applied"] = {"evicted": report.evicted, "stopped": report.stopped}
    return body


def render_table(body: Mapping[str, Any]) -> str:
    lines: list[str] = []
    if body["helped"]:
        width = max(len(h["pod"]) for h in body["helped"]) + 2
        lines.append(f"{'WAITING POD':<{width}}{'PRIORITY':>8}  GOES TO")
        for h in body["helped"]:
            where = f"{h['node']} ({', '.join(h['devices'])})"
            placed = f"  [{h['placed']}]" if "placed" in h else ""
            lines.append(f"{h['pod']:<{width}}{h['priority']:>8}  {where}{placed}")
            if not h["moves"]:
                lines.append("    fits now: no move needed, the allocator places it")
            for m in h["moves"]:
                replacement = m.get("replacement")
                said = (f"; replaced by {replacement}" if m.get("replaced") else
                        f"; {replacement}") if replacement else ""
                result = f"  [{m['result']}{said}]" if "result" in m else ""
                lines.append(f"    move {m['pod']}: {m['from']['node']} "
                             f"({', '.join(m['from']['devices']) or 'no GPU'}) -> "
                             f"{m['to']['node']} ({', '.join(m['to']['devices']) or 'no GPU'})"
                             f"{result}")
    if body["notHelped"]:
        lines.append("NOT HELPED")
        lines += [f"  {n['pod']}: {n['reason']}" for n in body["notHelped"]]
    moved = sum(1 for h in body["helped"] if h["moves"])
    lines.append(f"{len(body['helped'])} of {body['waiting']} waiting pod(s) placed, {moved} of "
                 f"them by moving {body['moves']} pod(s); {len(body['notHelped'])} not helped")
    if body["mayNotMove"]:
        lines.append(f"{sum(body['mayNotMove'].values())} of {body['placed']} placed pod(s) may "
                     "not move:")
        lines += [f"  {count} {reason}" for reason, count in body["mayNotMove"].items()]
    if "applied" in body:
        applied = body["applied"]
        lines.append(f"applied: {applied['evicted']} pod(s) evicted"
                     + (f"; STOPPED: {applied['stopped']}" if applied["stopped"] else ""))
    return "\n".join(lines)


def render_html(body: Mapping[str, Any]) -> str:
    e = html.escape
    rows = []
    for h in body["helped"]:
        moves = "".join(
            f"<li>{e(m['pod'])}: {e(m['from']['node'])} ({e(', '.join(m['from']['devices']))})"
            f" &rarr; {e(m['to']['node'])} ({e(', '.join(m['to']['devices']))})"
            + (f" <em>{e(m['result'])}</em>" if "result" in m else "") + "</li>"
            for m in h["moves"]) or "<li>fits now</li>"
        rows.append(f"<tr><td>{e(h['pod'])}</td><td>{h['priority']}</td>"
                    f"<td>{e(h['node'])} ({e(', '.join(h['devices']))})</td>"
                    f"<td><ul>{moves}</ul></td></tr>")
    not_helped = "".join(f"<tr><td>{e(n['pod'])}</td><td>{e(n['reason'])}</td></tr>"
                         for n in body["notHelped"])
    fixed = "".join(f"<li>{count} {e(reason)}</li>"
                    for reason, count in body["mayNotMove"].items())
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>dra-gateway defrag</title>"
        "<style>body{font-family:sans-serif}td{border-top:1px solid #ccc;padding:4px;"
        "vertical-align:top}</style></head><body><h1>Defrag plan</h1>"
        f"<p>{len(body['helped'])} of {body['waiting']} waiting pod(s) placed by moving "
        f"{body['moves']} pod(s).</p>"
        "<table><tr><th>waiting pod</th><th>priority</th><th>goes to</th><th>moves</th></tr>"
        f"{''.join(rows)}</table><h2>Not helped</h2><table>{not_helped}</table>"
        f"<h2>May not move</h2><ul>{fixed}</ul></body></html>")


__all__ = ["register", "render_html", "render_table", "to_dict"]

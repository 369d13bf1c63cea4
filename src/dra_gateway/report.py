"""`dra-gateway report`: quotas, cards and pending pods of a cluster, as a table, JSON or HTML.

It reads the cluster through the port (a kubeconfig's API, the embedded one included) and hands
the objects to the pure builder in dra_gateway.policy.report. Where each GPU node is in the move
from a legacy device plugin is read here, from the condition the node plugin writes on its Node
(`migration_nodes`), and added as one line per node.
"""

from __future__ import annotations

import argparse
import asyncio
import html
import json
import re
import sys
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from dra_gateway.kube import arguments, names

if TYPE_CHECKING:
    from dra_gateway.allocator.eviction.inputs import Snapshot


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    report = sub.add_parser(
        "report", help="quota usage, who holds which share of each card, pending pods",
        description="Read the cluster and show, per namespace, each GPUQuota's used and hard "
                    "amounts; per card who holds which share; free slivers too small for any "
                    "pending request; pending pods by reason. -o html draws the cards.")
    arguments.output_option(report, "table", "json", "html")
    arguments.namespace_option(report, default=names.GATEWAY_NAMESPACE,
                               help="the gateway's namespace, where defrag's holds are kept "
                               "(default: %(default)s)")
    arguments.kubeconfig_option(report)
    report.set_defaults(func=_run)


async def _read(kubeconfig: str | None, namespace: str = names.GATEWAY_NAMESPACE) -> dict[str, Any]:
    """One read of the cluster for the whole report, the defrag plan's part included."""
    from datetime import UTC, datetime

    from dra_gateway.allocator.eviction.store import list_items, read_snapshot
    from dra_gateway.kube.cluster.connect import DRA_GROUPS, connect
    from dra_gateway.kube.resources import EVENTS, RESOURCE_CLAIM_TEMPLATES
    from dra_gateway.policy.catalog import Catalog
    from dra_gateway.policy.report import build_report

    cluster = await connect("kube", kubeconfig, verify=DRA_GROUPS)
    try:
        snapshot = await read_snapshot(cluster, namespace=namespace, now=datetime.now(UTC),
                                       pod_selector=None)
        templates = await list_items(cluster, RESOURCE_CLAIM_TEMPLATES)
        # The preemptions' Events, for the last few (the API server selects them by reason).
        events = await list_items(cluster, EVENTS, field_selector="reason=Preempted")
    finally:
        await cluster.close()
    report = build_report(claims=snapshot.claims, slices=snapshot.slices, pods=snapshot.pods,
                          templates=templates, catalog=snapshot.catalog or Catalog.build(),
                          events=events)
    add_scheduler_pending(report, snapshot.pods)
    report["nodes"] = migration_nodes(snapshot.nodes)
    report["unhealthyDevices"] = unhealthy_devices(snapshot.slices, snapshot.nodes)
    report["defrag"] = _defrag(snapshot)
    return report


def _defrag(snapshot: Snapshot) -> dict[str, Any]:
    """The moves `dra-gateway defrag plan` would make now (its defaults), changing nothing."""
    from dra_gateway.allocator.eviction.inputs import build
    from dra_gateway.allocator.planner.defrag import Limits, plan_defrag
    from dra_gateway.defrag import to_dict

    inputs = build(snapshot)
    plan = plan_defrag(inputs.state, inputs.waiters, inputs.residents,
                       Limits(budgets=inputs.budgets))
    return to_dict(plan, inputs)


def defrag_table(body: Mapping[str, Any]) -> str:
    from dra_gateway.defrag import render_table

    return "\nDEFRAG (the moves `dra-gateway defrag plan` would make)\n" + render_table(body) + "\n"


def defrag_html(body: Mapping[str, Any] | None) -> str:
    if not body:
        return ""
    from dra_gateway.defrag import render_html

    page = render_html(body)
    inner = page[page.index("<h1>"):page.rindex("</body>")]
    return "<h2>Defrag</h2>" + inner.replace("<h1>Defrag plan</h1>", "")


def add_scheduler_pending(report: dict[str, Any], pods: Iterable[Mapping[str, Any]]) -> None:
    """Count the pending pods with DRA claims that the gateway does not hold (no gateway gate:
    their claims are for another driver's classes, kube-scheduler places them) beside the
    gateway's: a pod the demo shows pending was missing from PENDING."""
    listed = {(p["namespace"], p["pod"]) for p in report.get("pendingPods") or ()}
    found = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        spec = pod.get("spec") or {}
        key = (str(meta.get("namespace", "")), str(meta.get("name", "")))
        if key in listed or spec.get("nodeName") or not spec.get("resourceClaims") \
                or (pod.get("status") or {}).get("phase") not in (None, "Pending") \
                or meta.get("deletionTimestamp"):
            continue
        found.append({"namespace": key[0], "pod": key[1], "reason": "Unschedulable",
                      "waitsFor": "kube-scheduler"})
    if not found:
        return
    report["pendingPods"] = [*(report.get("pendingPods") or ()), *found]
    counts = dict(report.get("pending") or {})
    counts["Unschedulable"] = counts.get("Unschedulable", 0) + len(found)
    report["pending"] = dict(sorted(counts.items()))


def migration_nodes(nodes: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """Per node whose plugin said so, its state in the move from a legacy device plugin
    (Legacy, CuttingOver, DRA), why, and since when; nodes without the condition are left out."""
    out = []
    for node in nodes:
        for condition in (node.get("status") or {}).get("conditions") or []:
            if condition.get("type") == names.NODE_MIGRATION_CONDITION:
                state = str(condition.get("reason", ""))
                message = str(condition.get("message", ""))
                out.append({"node": str((node.get("metadata") or {}).get("name", "")),
                            "state": state, "message": node_message(state, message),
                            "detail": message,
                            "since": str(condition.get("lastTransitionTime", ""))})
    return sorted(out, key=lambda row: row["node"])


_PUBLISHED = re.compile(r"all \d+ card\(s\) published$")


def node_message(state: str, message: str) -> str:
    """What a NODES row says: the node plugin's message, but on a node in state DRA only its
    outcome. There the plugin may add why it could not ask the kubelet, with that error's
    fix-its (mount the pod-resources directory, ...), although the Node's status decided and
    nothing is wrong: fix-its are shown for real problems only; JSON keeps the whole message
    as `detail`."""
    found = _PUBLISHED.search(message) if state == names.NODE_STATE_DRA else None
    if found is None:
        return message
    return found.group()


def unhealthy_devices(slices: Iterable[Mapping[str, Any]],
                      nodes: Iterable[Mapping[str, Any]]) -> list[dict[str, str]]:
    """The devices the node plugins took out of service, one row each: what was done to it
    (tainted with its effect, or withheld where the cluster keeps no device taints), its
    fault and class, since when, and when it is healthy again by itself (or that an
    administrator keeps it), from the Nodes' condition (`dra-gateway devices list` shows the
    same). A device tainted `<driver>/unhealthy` that no condition lists (an older plugin's)
    has a row from its taint. A device leaves here once it recovered or was cleared."""
    from dra_gateway.devices import rows as device_rows

    rows = [{"node": r["node"], "device": r["device"], "effect": r["action"],
             "reason": f"{r['fault']} ({r['class']})", "since": r["since"],
             "healthyAgain": r["healthyAt"]} for r in device_rows(nodes)]
    listed = {(r["node"], r["device"]) for r in rows}
    for piece in slices:
        spec = piece.get("spec") or {}
        node = str(spec.get("nodeName") or "")
        for device in spec.get("devices") or ():
            for taint in device.get("taints") or ():
                if str(taint.get("key", "")).endswith(names.UNHEALTHY_TAINT_SUFFIX) and \
                        (node, str(device.get("name", ""))) not in listed:
                    rows.append({"node": node, "device": str(device.get("name", "")),
                                 "effect": f"tainted {taint.get('effect', '')}",
                                 "reason": str(taint.get("value", "")),
                                 "since": str(taint.get("timeAdded", "")),
                                 "healthyAgain": "-"})
    return sorted(rows, key=lambda row: (row["node"], row["device"]))


def unhealthy_table(rows: Iterable[Mapping[str, str]]) -> str:
    from dra_gateway.policy.report import hanging

    lines = ["", "UNHEALTHY DEVICES", f"{'NODE':<20} {'DEVICE':<14} {'EFFECT':<18} "
             f"{'SINCE':<21} {'HEALTHY AGAIN':<24} WHY"]
    lines += [line for r in rows for line in hanging(
        f"{r['node']:<20} {r['device']:<14} {r['effect']:<18} {r['since'] or '-':<21} "
        f"{r['healthyAgain']:<24} ", r["reason"])] or ["none"]
    return "\n".join(lines) + "\n"


def unhealthy_html(rows: Iterable[Mapping[str, str]]) -> str:
    body = "".join(f"<tr><td>{html.escape(r['node'])}</td><td>{html.escape(r['device'])}</td>"
                   f"<td>{html.escape(r['effect'])}</td><td>{html.escape(r['since'])}</td>"
                   f"<td>{html.escape(r['healthyAgain'])}</td>"
                   f"<td>{html.escape(r['reason'])}</td></tr>" for r in rows)
    return ("<h2>Unhealthy devices</h2><table><tr><th>Node</th><th>Device</th><th>Effect</th>"
            f"<th>Since</th><th>Healthy again</th><th>Why</th></tr>{body}</table>")


def nodes_table(rows: Iterable[Mapping[str, str]]) -> str:
    lines = ["", "NODES (move from legacy device plugins)",
             f"{'NODE':<20} {'STATE':<12} {'SINCE':<21} WHY"]
    from dra_gateway.policy.report import hanging

    lines += [line for r in rows for line in hanging(
        f"{r['node']:<20} {r['state']:<12} {r['since'] or '-':<21} ", r["message"])] or [
        "none: no node plugin has reported (or it runs with --no-legacy-coexistence)"]
    return "\n".join(lines) + "\n"


def nodes_html(rows: Iterable[Mapping[str, str]]) -> str:
    body = "".join(f"<tr><td>{html.escape(r['node'])}</td><td>{html.escape(r['state'])}</td>"
                   f"<td>{html.escape(r['since'])}</td><td>{html.escape(r['message'])}</td></tr>"
                   for r in rows)
    return ("<h2>Nodes: move from legacy device plugins</h2><table><tr><th>Node</th>"
            f"<th>State</th><th>Since</th><th>Why</th></tr>{body}</table>")


def _run(args: argparse.Namespace) -> int:
    from dra_gateway.kube.cluster.connect import ClusterConfigError
    from dra_gateway.kube.cluster.port import ApiError
    from dra_gateway.policy.report import render_html, render_table

    try:
        report = asyncio.run(_read(args.kubeconfig, args.namespace))
    except ClusterConfigError as exc:
        return arguments.error(f"{exc}", 2)
    except ApiError as exc:
        return arguments.error(f"reading the cluster: {exc.reason}: {exc.message}", 1)
    if args.output == "json":
        print(json.dumps(report, indent=2))
    elif args.output == "html":
        page = render_html(report)
        sys.stdout.write(page.replace("</body>", unhealthy_html(report["unhealthyDevices"])
                                      + nodes_html(report["nodes"])
                                      + defrag_html(report.get("defrag")) + "</body>", 1))
    else:
        sys.stdout.write(render_table(report) + unhealthy_table(report["unhealthyDevices"])
                         + nodes_table(report["nodes"])
                         + (defrag_table(report["defrag"]) if report.get("defrag") else ""))
    return 0

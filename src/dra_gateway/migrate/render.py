"""Rendering a `MigrationPlan`: a plain-text table for a terminal, and one self-contained HTML
page (inline style, no scripts, no outside resources; every value escaped).

JSON is `MigrationPlan.to_dict`. This module must not compute anything the plan does not hold.
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from dra_gateway.migrate.plan import ContainerMigration, MigrationPlan, WorkloadPlan
from dra_gateway.policy.amounts import format_amount


def _amounts(values: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}: {v}" for k, v in values.items()) or "-"


def request_text(container: ContainerMigration) -> str:
    """The DRA request a container gets, in one line: class, count, shares."""
    if container.request is None:
        return "-"
    request = dict(container.request)
    parts = [str(request.get("deviceClassName", ""))]
    count = request.get("count")
    if count is not None:
        parts.append(f"x{count}")
    capacity = (request.get("capacity") or {}).get("requests") or {}
    parts.extend(f"{k}={v}" for k, v in capacity.items())
    config = dict(container.config or {})
    for key in ("memoryPercent", "enforcement", "policy"):
        if config.get(key):
            parts.append(f"{key}={config[key]}")
    return " ".join(p for p in parts if p)


def _columns(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
            for r in rows]


def usage_text(usage: Mapping[str, int]) -> str:
    """`2 pods: 3 cards, 8Gi, 130 cores` (cores in percent of a card), `-` for none."""
    if not usage.get("pods"):
        return "-"
    parts = [f"{usage.get('devices', 0)} card(s)"]
    if usage.get("memory"):
        parts.append(format_amount("memory", usage["memory"]))
    if usage.get("cores"):
        parts.append(f"{usage['cores']} cores")
    return f"{usage['pods']} pod(s): " + ", ".join(parts)


def render_table(plan: MigrationPlan) -> str:
    out: list[str] = [f"Rules in force: {', '.join(plan.rules) or 'built-in'}; namespaces "
                      f"without the label: {plan.default_mode}", ""]
    out.append("NAMESPACES")
    rows = [["NAMESPACE", "MODE", "FROM", "GPU WORKLOADS", "GPUQUOTAS", "LEGACY USE",
             "TRANSLATED USE"]]
    rows += [[n.name, n.mode if n.mode != "unknown" else f"unknown ({n.label!r})", n.source,
              str(n.workloads), ", ".join(n.gpu_quotas) or "-", usage_text(n.legacy_usage),
              usage_text(n.translated_usage)] for n in plan.namespaces]
    out += [*_columns(rows), ""]

    out.append("WORKLOADS")
    if not plan.workloads:
        out.append("no workload asks for a legacy GPU resource")
    for w in plan.workloads:
        pods = f", {len(w.pods)} pod(s)" if w.pods else ", no pod running"
        legacy = f", {len(w.legacy_pods)} still legacy" if w.legacy_pods else ""
        out.append(f"{w.kind} {w.namespace}/{w.name}{pods}{legacy}: {w.status}: {w.why}")
        if w.group:
            out.append(f"  {w.group}")
        for c in w.containers:
            rule = f"rule {c.rule}" if c.rule else "no rule"
            out.append(f"  {c.kind} {c.name}: {_amounts(c.legacy)} -> {rule} -> "
                       f"{request_text(c)} [{c.outcome}]")
            if c.why:
                out.append(f"    {c.why}")
        out.extend(f"  warning: {x}" for x in w.warnings)
    out.append("")

    out.append("NODES")
    if not plan.nodes:
        out.append("no node offers legacy GPUs or takes part in the move")
    else:
        rows = [["NODE", "CUT-OVER", "LEGACY PLUGINS", "CARDS", "LEGACY PODS", "CONDITION"]]
        rows += [[n.name, "yes" if n.cut_over else "no", _amounts(n.legacy_plugins),
                  str(n.cards) if n.cards is not None else "-", str(len(n.legacy_pods)),
                  n.condition["reason"] if n.condition else "-"] for n in plan.nodes]
        out += _columns(rows)
    out.append("")

    out.append("QUOTAS")
    existing = plan.to_dict()["quotas"]["existing"]
    out.extend(f"GPUQuota {q['namespace']}/{q['name']} exists: {_amounts(q['hard'] or {})}"
               for q in existing)
    if not plan.quotas.conversions:
        out.append("no ResourceQuota names a legacy GPU resource")
    for conversion in plan.quotas.conversions:
        target = (_amounts(conversion.gpu_quota["spec"]["hard"])
                  if conversion.gpu_quota is not None else "no GPUQuota (nothing converts)")
        out.append(f"{conversion.where} -> GPUQuota {conversion.namespace}/{conversion.name}: "
                   f"{target}")
        out.extend(f"  {m.split(': ', 1)[1]}" for m in conversion.messages())
    out.append("")

    out.append("STEPS")
    for step in plan.steps:
        out.append(f"{step.number}. {step.title}" + (" (done)" if step.done else ""))
        out.extend(f"   $ {a}" for a in step.actions)
        out.extend(f"   waits for: {w}" for w in step.waits_for if not step.done)
    if plan.notes:
        out += ["", "NOTES"]
        out.extend(f"- {n}" for n in plan.notes)
    return "\n".join(out) + "\n"


# HTML -----------------------------------------------------------------------------------------

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}
th,td{border:1px solid #ccc;padding:.25em .6em;text-align:left;vertical-align:top}
th{background:#f2f2f2}
.translate,.translated{color:#17603a}.audit{color:#8a5a00}
.refused,.unknown-mode{color:#a01818}.legacy,.untranslated{color:#555}
code{background:#f6f6f6;padding:0 .2em}
"""


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A table of already escaped cells."""
    head = "".join(f"<th>{_e(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _workload_rows(w: WorkloadPlan) -> list[list[str]]:
    status = f'<span class="{_e(w.status)}">{_e(w.status)}</span>'
    head = [f"{_e(w.kind)} {_e(w.namespace)}/{_e(w.name)}", status, _e(w.why),
            _e(len(w.pods)), _e(", ".join(w.legacy_pods) or "-")]
    containers = "<br>".join(
        f"{_e(c.name)}: {_e(_amounts(c.legacy))} &rarr; "
        f"{_e('rule ' + c.rule if c.rule else 'no rule')} &rarr; <code>{_e(request_text(c))}"
        f"</code> ({_e(c.outcome)}){'<br><small>' + _e(c.why) + '</small>' if c.why else ''}"
        for c in w.containers)
    warnings = "".join(f"<br><small>warning: {_e(x)}</small>" for x in w.warnings)
    group = f"<br><small>{_e(w.group)}</small>" if w.group else ""
    return [[*head, containers + group + warnings]]


def render_html(plan: MigrationPlan) -> str:
    data = plan.to_dict()
    parts = [f"<p>Rules in force: {_e(', '.join(plan.rules) or 'built-in')}; namespaces without "
             f"the label: {_e(plan.default_mode)}</p>", "<h2>Namespaces</h2>",
             _table(["Namespace", "Mode", "From", "GPU workloads", "GPUQuotas",
                     "Legacy use", "Translated use"],
                    [[_e(n.name), _e(n.mode if n.mode != "unknown" else f"unknown ({n.label})"),
                      _e(n.source), _e(n.workloads), _e(", ".join(n.gpu_quotas) or "-"),
                      _e(usage_text(n.legacy_usage)), _e(usage_text(n.translated_usage))]
                     for n in plan.namespaces]),
             "<h2>Workloads</h2>",
             _table(["Workload", "Status", "Why", "Pods", "Legacy pods",
                     "Containers: legacy → rule → DRA request"],
                    [row for w in plan.workloads for row in _workload_rows(w)]),
             "<h2>Nodes</h2>",
             _table(["Node", "Cut over", "Legacy plugins", "Cards", "Legacy pods",
                     "DraGatewayMigration", "Waits for"],
                    [[_e(n.name), _e("yes" if n.cut_over else "no"),
                      _e(_amounts(n.legacy_plugins)), _e(n.cards if n.cards is not None else "-"),
                      _e(", ".join(n.legacy_pods) or "-"),
                      _e(f"{n.condition['reason']}: {n.condition['message']}"
                         if n.condition else "-"),
                      "<br>".join(_e(w) for w in n.waits_for) or "nothing"]
                     for n in plan.nodes]),
             "<h2>Quotas</h2>",
             _table(["GPUQuota that exists", "Hard"],
                    [[_e(f"{q['namespace']}/{q['name']}"), _e(_amounts(q["hard"] or {}))]
                     for q in data["quotas"]["existing"]]),
             _table(["ResourceQuota", "Becomes", "Not converted, warnings"],
                    [[_e(c.where),
                      f"<code>{_e(json.dumps(c.gpu_quota['spec']['hard']))}</code>"
                      if c.gpu_quota is not None else "no GPUQuota",
                      "<br>".join(_e(m.split(': ', 1)[1]) for m in c.messages()) or "-"]
                     for c in plan.quotas.conversions]),
             "<h2>Steps</h2><ol>"]
    for step in plan.steps:
        actions = "".join(f"<li><code>{_e(a)}</code></li>" for a in step.actions)
        waits = "".join(f"<li>waits for: {_e(w)}</li>" for w in step.waits_for)
        parts.append(f"<li><b>{_e(step.title)}</b>{' (done)' if step.done else ''}"
                     f"<ul>{actions}{'' if step.done else waits}</ul></li>")
    parts.append("</ol>")
    if plan.notes:
        parts.append("<h2>Notes</h2><ul>" + "".join(f"<li>{_e(n)}</li>" for n in plan.notes)
                     + "</ul>")
    return ("<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>dra-gateway migrate "
            f"plan</title><style>{_STYLE}</style></head><body><h1>dra-gateway migrate plan</h1>"
            + "".join(parts) + "</body></html>\n")

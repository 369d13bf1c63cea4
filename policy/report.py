"""What `dra-gateway report` shows, computed from plain objects: quotas, cards, slivers, waits.

`build_report` takes the cluster's objects as lists of dicts (however they were read) and returns
a JSON-ready dict: per namespace used and hard of each quota (counted from allocations, as the
allocator counts them), per card who holds which share, fragmentation (free slivers of cards
too small for the smallest pending request), and pending pods by reason. `render_table` and
`render_html` draw it; the HTML is one self-contained page (inline CSS and SVG, no external
assets). Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import html
import textwrap
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dra_gateway.kube import names
from dra_gateway.kube.api_rules import allocation_problems
from dra_gateway.kube.quantity import QuantityError, parse_quantity
from dra_gateway.policy.amounts import (
    FIELDS,
    DeviceKey,
    RequestShape,
    charges_of,
    format_amount,
    requests_of,
)
from dra_gateway.policy.catalog import Catalog
from dra_gateway.policy.quotas import QuotaLedger

QUOTA_CONDITION = f"{names.DOMAIN}/QuotaExceeded"


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _devices(slices: Iterable[Mapping[str, Any]]) -> dict[DeviceKey, tuple[str, Mapping[str, Any]]]:
    found: dict[DeviceKey, tuple[str, Mapping[str, Any]]] = {}
    for slice_ in slices:
        spec = slice_.get("spec") or {}
        driver = str(spec.get("driver", ""))
        pool = str((spec.get("pool") or {}).get("name", ""))
        for device in spec.get("devices") or ():
            found[(driver, pool, str(device.get("name", "")))] = (
                str(spec.get("nodeName", "")), device)
    return found


def _capacity(device: Mapping[str, Any], name: str, default: int) -> int:
    entry = (device.get("capacity") or {}).get(name) or {}
    try:
        return parse_quantity(entry.get("value", default)).value()
    except (QuantityError, TypeError):
        return default


def _pending_reason(pod: Mapping[str, Any]) -> str:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == QUOTA_CONDITION and condition.get("status") == "True":
            return "QuotaExceeded"
    gates = (pod.get("spec") or {}).get("schedulingGates") or ()
    if any(g.get("name") == names.SCHEDULING_GATE for g in gates):
        return "WaitingForAllocation"
    return "Unschedulable"


def _gpus_by_node(devices: Mapping[DeviceKey, tuple[str, Mapping[str, Any]]]
                  ) -> dict[str, list[int]]:
    """The memory of each whole GPU the gateway's driver publishes, per node."""
    by_node: dict[str, list[int]] = {}
    for (driver, _, _), (node, device) in devices.items():
        kind = ((device.get("attributes") or {}).get(names.ATTR_TYPE) or {}).get("string", "gpu")
        if driver == names.DRIVER and kind == "gpu":
            by_node.setdefault(node, []).append(_capacity(device, names.CAPACITY_MEMORY, 0))
    return by_node


def never_fits(shapes: Iterable[RequestShape], gpus: Mapping[str, list[int]]) -> str | None:
    """Why a pod's GPU requests fit no node of those published (`_gpus_by_node`), None when
    some node has the cards: a claim's devices are all on one node."""
    wanted = [s for s in shapes if s.class_name == names.GPU_CLASS]
    if not wanted or not gpus:
        return None
    largest = max(max(sizes, default=0) for sizes in gpus.values())
    for shape in wanted:
        if shape.memory is not None and shape.memory > largest:
            return (f"request {shape.name!r} asks for {format_amount('memory', shape.memory)} "
                    f"of memory per card; the largest card published has "
                    f"{format_amount('memory', largest)}")
    # The cards each node could give the whole pod (one claim: one node).
    asked = sum(s.count for s in wanted)
    for sizes in gpus.values():
        if len(sizes) >= asked and all(
                sum(1 for size in sizes if shape.memory is None or size >= shape.memory)
                >= shape.count for shape in wanted):
            return None
    most = max(len(sizes) for sizes in gpus.values())
    return (f"it asks for {asked} card(s) on one node; no node publishes as many that fit "
            f"(at most {most} on one node)")


# The preemptions the report lists, newest first.
LAST_PREEMPTIONS = 10


def cohort_view(ledger: QuotaLedger, gpus: Mapping[str, list[int]]) -> list[dict[str, Any]]:
    """Per GPUQuota cohort: each member's min, hard, used, borrowed and lent, the cohort's
    guarantees and usage, and a warning where its guarantees exceed what the cluster publishes
    (not refused: the cluster can grow)."""
    sizes = [size for node in gpus.values() for size in node]
    published = {"devices": len(sizes), "memory": sum(sizes),
                 "cores": len(sizes) * names.CORES_PER_CARD}
    view = []
    for name, members in ledger.cohorts().items():
        rows = [{"namespace": q.namespace, "name": q.name, **ledger.status(q)} for q in members]
        guaranteed: Counter[str] = Counter()
        used: Counter[str] = Counter()
        for quota in members:
            for field_, amount in quota.min:
                guaranteed[field_] += amount
                used[field_] += ledger.used(quota).get(field_)
        warnings = [f"its guarantees of {f} ({format_amount(f, guaranteed[f])}) exceed what "
                    f"the cluster publishes ({format_amount(f, published[f])}): not every "
                    "guarantee can be met at once"
                    for f in FIELDS if f in published and f in guaranteed
                    and guaranteed[f] > published[f]]
        view.append({"name": name, "members": rows,
                     "guaranteed": {f: format_amount(f, v) if f == "memory" else v
                                    for f, v in guaranteed.items()},
                     "used": {f: format_amount(f, v) if f == "memory" else v
                              for f, v in used.items()},
                     "warnings": warnings})
    return view


def last_preemptions(events: Iterable[Mapping[str, Any]],
                     most: int = LAST_PREEMPTIONS) -> list[dict[str, str]]:
    """The gateway's latest `Preempted` Events, newest first: when, which pod, and why."""
    found = [{"time": str(e.get("lastTimestamp") or e.get("eventTime") or ""),
              "pod": f"{(e.get('involvedObject') or {}).get('namespace', '')}/"
                     f"{(e.get('involvedObject') or {}).get('name', '')}",
              "message": str(e.get("message", ""))}
             for e in events if e.get("reason") == "Preempted"
             and (e.get("reportingComponent") or (e.get("source") or {}).get("component"))
             == names.ALLOCATOR_COMPONENT]
    return sorted(found, key=lambda e: e["time"], reverse=True)[:most]


@dataclass(frozen=True, slots=True)
class _Holdings:
    """What the claims' allocations charge: counted against the quotas, and listed per card."""

    ledger: QuotaLedger
    holders: Mapping[DeviceKey, list[dict[str, Any]]]


@dataclass(frozen=True, slots=True)
class _Waiting:
    """The pods the gateway's gate still holds, and the smallest share they ask for."""

    pods: list[dict[str, Any]]  # one entry per pod: namespace, pod, reason (and why)
    smallest: tuple[int, int] | None  # (memory, cores) of the smallest share; None: none asked


@dataclass(frozen=True, slots=True)
class _Cards:
    """The gateway's cards with who holds them, and the free slivers no waiting pod can use."""

    cards: list[dict[str, Any]]
    slivers: list[dict[str, Any]]


def build_report(*, claims: Iterable[Mapping[str, Any]], slices: Iterable[Mapping[str, Any]],
                 pods: Iterable[Mapping[str, Any]], catalog: Catalog,
                 templates: Iterable[Mapping[str, Any]] = (),
                 events: Iterable[Mapping[str, Any]] = ()) -> dict[str, Any]:
    claims = list(claims)
    devices = _devices(slices)
    holdings = _holdings(claims, devices, catalog)
    gpus = _gpus_by_node(devices)
    waiting = _waiting(pods, _template_requests(templates), gpus)
    cards = _cards(devices, holdings.holders, waiting)
    return {
        "quotas": [{"namespace": quota.namespace, "name": quota.name,
                    **holdings.ledger.status(quota)} for quota in holdings.ledger.quotas()],
        "cohorts": cohort_view(holdings.ledger, gpus),
        "preemptions": last_preemptions(events),
        "cards": cards.cards,
        "fragmentation": {
            "smallestPending": None if waiting.smallest is None else
            {"memory": waiting.smallest[0], "cores": waiting.smallest[1]},
            "slivers": cards.slivers,
            "strandedMemory": sum(s["memory"] for s in cards.slivers),
            "nodes": _stranded_by_node(cards.cards, cards.slivers),
        },
        "pending": dict(sorted(Counter(p["reason"] for p in waiting.pods).items())),
        "pendingPods": waiting.pods,
        "policyErrors": list(catalog.errors),
        "invalidClaims": invalid_claims(claims),
    }


def invalid_claims(claims: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The claims whose allocation holds what the API refuses from Kubernetes 1.38
    (`kube.api_rules`): the allocator counts their devices as held whole, and kube-scheduler
    1.38 stops every DRA pod while one holds a negative amount."""
    found = []
    for claim in claims:
        problems = allocation_problems((claim.get("status") or {}).get("allocation"))
        if problems:
            meta = _meta(claim)
            found.append({"namespace": meta.get("namespace", ""), "claim": meta.get("name", ""),
                          "problems": problems})
    return found


def _holdings(claims: Iterable[Mapping[str, Any]],
              devices: Mapping[DeviceKey, tuple[str, Mapping[str, Any]]],
              catalog: Catalog) -> _Holdings:
    """Each claim's charges, as the allocator counts them, in a quota ledger and per card."""

    def lookup(key: DeviceKey) -> Mapping[str, Any] | None:
        found = devices.get(key)
        return found[1] if found else None

    ledger = QuotaLedger()
    ledger.set_quotas(catalog.compiled_quotas())
    holders: dict[DeviceKey, list[dict[str, Any]]] = {}
    for claim in claims:
        meta = _meta(claim)
        charges = charges_of(claim, lookup)
        ledger.set_claim(str(meta.get("uid") or meta.get("name")),
                         str(meta.get("namespace", "")), charges)
        owner = next((r.get("name") for r in meta.get("ownerReferences") or ()
                      if r.get("kind") == "Pod"), None)
        for charge in charges:
            holders.setdefault(charge.key, []).append({
                "namespace": meta.get("namespace", ""), "claim": meta.get("name", ""),
                "pod": owner, "memory": charge.memory, "cores": charge.cores,
                "whole": charge.whole})
    return _Holdings(ledger, holders)


def _template_requests(templates: Iterable[Mapping[str, Any]]
                       ) -> dict[tuple[str, str], list[RequestShape]]:
    """The gateway-class requests of each template, by (namespace, name)."""
    return {(str(_meta(t).get("namespace", "")), str(_meta(t).get("name", ""))):
            requests_of((t.get("spec") or {}).get("spec") or {}) for t in templates}


def _gated(pod: Mapping[str, Any]) -> bool:
    """Is the pod unbound, pending and held by the gateway's gate?"""
    spec = pod.get("spec") or {}
    if spec.get("nodeName") or (pod.get("status") or {}).get("phase") not in (None, "Pending"):
        return False
    return any(g.get("name") == names.SCHEDULING_GATE for g in spec.get("schedulingGates") or ())


def _waiting(pods: Iterable[Mapping[str, Any]],
             template_requests: Mapping[tuple[str, str], Sequence[RequestShape]],
             gpus: Mapping[str, list[int]]) -> _Waiting:
    """The gated pods, each with its reason (`NeverFits` where no node has the cards its
    templates ask for), and the smallest share any of them asks for."""
    waiting: list[dict[str, Any]] = []
    smallest: tuple[int, int] | None = None
    for pod in pods:
        if not _gated(pod):
            continue
        meta = _meta(pod)
        entry: dict[str, Any] = {"namespace": meta.get("namespace", ""),
                                 "pod": meta.get("name", ""), "reason": _pending_reason(pod)}
        waiting.append(entry)
        for claim in (pod.get("spec") or {}).get("resourceClaims") or ():
            shapes = template_requests.get((str(meta.get("namespace", "")),
                                            str(claim.get("resourceClaimTemplateName", ""))))
            why = never_fits(shapes or (), gpus)
            if why is not None:
                entry["reason"] = "NeverFits"
                entry["why"] = why
            for shape in shapes or ():
                if shape.whole or shape.memory is None:
                    continue
                need = (shape.memory, shape.cores or 0)
                smallest = need if smallest is None or need < smallest else smallest
    return _Waiting(waiting, smallest)


def _cards(devices: Mapping[DeviceKey, tuple[str, Mapping[str, Any]]],
           holders: Mapping[DeviceKey, list[dict[str, Any]]], waiting: _Waiting) -> _Cards:
    """The gateway driver's cards by node, each with its holders and free room; a sliver is
    free room on a card others hold that no waiting request can use (below the smallest
    waiting share, or only whole cards waiting)."""
    cards = []
    slivers = []
    # A card cut into MIG instances on demand is one card: its profiles' devices (and the
    # instances made by hand on it) draw on its counter set, and their holders are its own.
    on_card: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for key, (_, device) in devices.items():
        counter_set = _attribute(device, names.ATTR_COUNTER_SET)
        if key[0] == names.DRIVER and counter_set and not _cut_card(device):
            on_card.setdefault((key[1], counter_set), []).extend(holders.get(key, []))
    for key in sorted(devices, key=lambda k: (devices[k][0], k)):
        node, device = devices[key]
        if key[0] != names.DRIVER:
            continue
        counter_set = _attribute(device, names.ATTR_COUNTER_SET)
        if counter_set and not _cut_card(device):
            continue  # counted on its card
        held = holders.get(key, []) + on_card.get((key[1], counter_set), []) \
            if counter_set else holders.get(key, [])
        card = _card(node, key, device, held)
        cards.append(card)
        free_memory, free_cores = card["free"]["memory"], card["free"]["cores"]
        too_small = waiting.smallest is None or (free_memory < waiting.smallest[0]
                                                 or free_cores < waiting.smallest[1])
        if card["holders"] and (free_memory or free_cores) and waiting.pods and too_small:
            slivers.append({"node": node, "device": key[2], "memory": free_memory,
                            "cores": free_cores})
    return _Cards(cards, slivers)


def _attribute(device: Mapping[str, Any], name: str) -> str:
    return str(((device.get("attributes") or {}).get(name) or {}).get("string", ""))


def _cut_card(device: Mapping[str, Any]) -> bool:
    """The whole-card device of a card cut into MIG instances on demand."""
    return bool(_attribute(device, names.ATTR_COUNTER_SET)) and \
        _attribute(device, names.ATTR_TYPE) in ("", "gpu")


def _card(node: str, key: DeviceKey, device: Mapping[str, Any],
          held: list[dict[str, Any]]) -> dict[str, Any]:
    """One card of the report: its size, what its holders leave free, and the holders."""
    memory = _capacity(device, names.CAPACITY_MEMORY, 0)
    cores = _capacity(device, names.CAPACITY_CORES, names.CORES_PER_CARD)
    free_memory = max(0, memory - sum(h["memory"] for h in held))
    free_cores = max(0, cores - sum(h["cores"] for h in held))
    product = ((device.get("attributes") or {}).get(names.ATTR_PRODUCT_NAME) or {}).get(
        "string", "")
    return {"node": node, "pool": key[1], "device": key[2], "product": product,
            "memory": memory, "cores": cores, "free": {"memory": free_memory,
                                                       "cores": free_cores},
            "holders": held}


def _stranded_by_node(cards: Iterable[Mapping[str, Any]],
                      slivers: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Per node with slivers: its free memory and cores, and how much of it is stranded."""
    free: dict[str, list[int]] = {}
    for card in cards:
        entry = free.setdefault(card["node"], [0, 0])
        entry[0] += card["free"]["memory"]
        entry[1] += card["free"]["cores"]
    stranded: dict[str, list[int]] = {}
    for sliver in slivers:
        entry = stranded.setdefault(sliver["node"], [0, 0, 0])
        entry[0] += sliver["memory"]
        entry[1] += sliver["cores"]
        entry[2] += 1
    return [{"node": node, "freeMemory": free[node][0], "freeCores": free[node][1],
             "strandedMemory": memory, "strandedCores": cores, "slivers": count}
            for node, (memory, cores, count) in sorted(stranded.items())]


def render_table(report: Mapping[str, Any]) -> str:
    lines = ["QUOTAS", f"{'NAMESPACE':<20} {'QUOTA':<24} {'USED / HARD'}"]
    for q in report["quotas"]:
        pairs = ", ".join(f"{f} {q['used'][f]}/{q['hard'][f]}" for f in q["hard"])
        lines.append(f"{q['namespace']:<20} {q['name']:<24} {pairs}")
    lines += _cohort_lines(report)
    lines += ["", "CARDS", f"{'NODE':<20} {'DEVICE':<10} {'FREE MEMORY':>12} {'FREE CORES':>10} "
              "HOLDERS"]
    for card in report["cards"]:
        who = ", ".join(f"{h['namespace']}/{h['pod'] or h['claim']} "
                        f"({format_amount('memory', h['memory'])}, {h['cores']}%)"
                        for h in card["holders"]) or "-"
        lines += hanging(f"{card['node']:<20} {card['device']:<10} "
                         f"{format_amount('memory', card['free']['memory']):>12} "
                         f"{card['free']['cores']:>10} ", who)
    frag = report["fragmentation"]
    stranded = format_amount("memory", frag["strandedMemory"]) if frag["strandedMemory"] \
        else "0Gi"
    lines += ["", *hanging("", f"FRAGMENTATION: {len(frag['slivers'])} free slivers too small "
                               f"for the smallest pending share, {stranded} of GPU memory "
                               "stranded")]
    if frag.get("nodes"):
        lines.append(f"{'NODE':<20} {'FREE MEMORY':>12} {'FREE CORES':>10} "
                     f"{'STRANDED MEMORY':>16} {'STRANDED CORES':>14} SLIVERS")
        lines += [f"{n['node']:<20} {format_amount('memory', n['freeMemory']):>12} "
                  f"{n['freeCores']:>10} {format_amount('memory', n['strandedMemory']):>16} "
                  f"{n['strandedCores']:>14} {n['slivers']}" for n in frag["nodes"]]
    pending = ", ".join(f"{reason}={count}" for reason, count in report["pending"].items())
    lines += [f"PENDING: {pending or 'none'}"]
    for pod in report.get("pendingPods") or ():
        if pod.get("why"):
            lines += hanging("  ", f"{pod['namespace']}/{pod['pod']} can never fit the cards "
                                   f"published: {pod['why']}")
        elif pod.get("waitsFor"):
            lines += hanging("  ", f"{pod['namespace']}/{pod['pod']} waits for "
                                   f"{pod['waitsFor']}: its claims are not the gateway's")
    for error in report["policyErrors"]:
        lines.append(f"POLICY ERROR: {error}")
    for claim in report.get("invalidClaims") or ():
        lines += hanging("INVALID CLAIM: ", f"{claim['namespace']}/{claim['claim']}: "
                         + "; ".join(claim["problems"]) + " (its devices count as held whole; "
                         "delete the claim or have its writer deallocate it)")
    return "\n".join(lines) + "\n"


def _cohort_lines(report: Mapping[str, Any]) -> list[str]:
    """The cohorts (who lends what to whom) and the last preemptions, for the table."""
    lines: list[str] = []
    for cohort in report.get("cohorts") or ():
        total = ", ".join(f"{f} {cohort['used'][f]}/{cohort['guaranteed'][f]}"
                          for f in cohort["guaranteed"])
        lines += ["", f"COHORT {cohort['name']} (used / guaranteed: {total})",
                  f"{'NAMESPACE':<20} {'QUOTA':<24} USED / MIN / HARD, BORROWED, LENT"]
        for q in cohort["members"]:
            pairs = "; ".join(f"{f} {q['used'][f]}/{q['min'][f]}/{q['hard'][f]}, "
                              f"borrowed {q['borrowed'][f]}, lent {q['lent'][f]}"
                              for f in q["min"])
            lines += hanging(f"{q['namespace']:<20} {q['name']:<24} ", pairs)
        lines += [line for w in cohort["warnings"] for line in hanging("  warning: ", w)]
    if report.get("preemptions"):
        lines += ["", f"LAST PREEMPTIONS (newest first, at most {LAST_PREEMPTIONS})"]
        for e in report["preemptions"]:
            lines += hanging(f"{e['time']:<21} {e['pod']:<36} ", e["message"])
    return lines


# What the tables fit: a 120-column terminal.
WIDTH = 120


def hanging(prefix: str, text: str, width: int = WIDTH) -> list[str]:
    """`prefix` then `text` wrapped at spaces within `width`, its later lines indented under
    its first (a table's last column that would run past the terminal)."""
    lines = textwrap.wrap(text, max(20, width - len(prefix)), break_long_words=False,
                          break_on_hyphens=False) or [""]
    return [prefix + lines[0], *(" " * len(prefix) + line for line in lines[1:])]


def _colour(namespace: str) -> str:
    hue = int(hashlib.sha256(namespace.encode()).hexdigest()[:4], 16) % 360
    return f"hsl({hue},65%,55%)"


def _cohort_html(report: Mapping[str, Any]) -> str:
    parts = []
    for cohort in report.get("cohorts") or ():
        rows = "".join(
            f"<tr><td>{html.escape(q['namespace'])}</td><td>{html.escape(q['name'])}</td><td>"
            + html.escape("; ".join(f"{f} {q['used'][f]} / {q['min'][f]} / {q['hard'][f]}, "
                                    f"borrowed {q['borrowed'][f]}, lent {q['lent'][f]}"
                                    for f in q["min"])) + "</td></tr>"
            for q in cohort["members"])
        warnings = "".join(f"<p>Warning: {html.escape(w)}</p>" for w in cohort["warnings"])
        parts.append(f"<h2>Cohort {html.escape(cohort['name'])}</h2><table><tr><th>Namespace"
                     "</th><th>Quota</th><th>Used / min / hard, borrowed, lent</th></tr>"
                     f"{rows}</table>{warnings}")
    if report.get("preemptions"):
        rows = "".join(f"<tr><td>{html.escape(e['time'])}</td><td>{html.escape(e['pod'])}</td>"
                       f"<td>{html.escape(e['message'])}</td></tr>"
                       for e in report["preemptions"])
        parts.append("<h2>Last preemptions</h2><table><tr><th>Time</th><th>Pod</th>"
                     f"<th>Why</th></tr>{rows}</table>")
    return "".join(parts)


def render_html(report: Mapping[str, Any]) -> str:
    """One self-contained page: nodes as rows, cards as boxes filled by memory (upper bar) and
    compute (lower bar), each share coloured by its namespace."""
    nodes: dict[str, list[Mapping[str, Any]]] = {}
    for card in report["cards"]:
        nodes.setdefault(card["node"], []).append(card)
    width, height, gap = 90, 44, 8
    rows = []
    namespaces: set[str] = set()
    for row, (node, cards) in enumerate(sorted(nodes.items())):
        y = row * (height + gap) + 4
        parts = [f'<text x="0" y="{y + 26}" class="n">{html.escape(node)}</text>']
        for col, card in enumerate(cards):
            x = 170 + col * (width + gap)
            title = html.escape(f"{card['device']} {card['product']}")
            parts.append(f'<rect x="{x}" y="{y}" width="{width}" height="{height}" '
                         f'class="card"><title>{title}</title></rect>')
            for bar, (field, total) in enumerate((("memory", card["memory"]),
                                                  ("cores", card["cores"]))):
                offset = 0.0
                for holder in card["holders"]:
                    namespaces.add(holder["namespace"])
                    share = holder[field] / total if total else 0.0
                    w = max(0.0, min(width - offset, share * width))
                    tip = html.escape(f"{holder['namespace']}/{holder['pod'] or holder['claim']}"
                                      f": {format_amount('memory', holder['memory'])}, "
                                      f"{holder['cores']}% compute")
                    parts.append(f'<rect x="{x + offset:.1f}" y="{y + 2 + bar * 21}" '
                                 f'width="{w:.1f}" height="19" '
                                 f'fill="{_colour(holder["namespace"])}"><title>{tip}</title>'
                                 f'</rect>')
                    offset += w
        rows.append("".join(parts))
    most = max((len(c) for c in nodes.values()), default=0)
    svg_width = 170 + most * (width + gap)
    svg_height = len(nodes) * (height + gap) + 8
    legend = "".join(f'<span class="k" style="background:{_colour(ns)}"></span>'
                     f"{html.escape(ns)} " for ns in sorted(namespaces))
    quota_rows = "".join(
        f"<tr><td>{html.escape(q['namespace'])}</td><td>{html.escape(q['name'])}</td><td>"
        + ", ".join(f"{f} {q['used'][f]} / {q['hard'][f]}" for f in q["hard"]) + "</td></tr>"
        for q in report["quotas"])
    pending = ", ".join(f"{html.escape(r)}: {n}" for r, n in report["pending"].items())
    invalid = "".join(
        f"<li>{html.escape(c['namespace'])}/{html.escape(c['claim'])}: "
        f"{html.escape('; '.join(c['problems']))}</li>" for c in report.get("invalidClaims") or ())
    return (
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>dra-gateway report</title>"
        "<style>body{font-family:sans-serif;margin:1em}.card{fill:#f4f4f4;stroke:#999}"
        ".n{font-size:12px}.k{display:inline-block;width:1em;height:1em;margin:0 .3em}"
        "td,th{padding:.2em .8em;text-align:left}</style></head><body>"
        "<h1>dra-gateway report</h1><h2>Quotas</h2><table><tr><th>Namespace</th><th>Quota"
        f"</th><th>Used / hard</th></tr>{quota_rows}</table>"
        f"{_cohort_html(report)}"
        "<h2>Cards</h2><p>Each card: memory (upper bar) and compute (lower bar) by namespace."
        f"</p><p>{legend}</p>"
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{svg_width}" height="{svg_height}">'
        f"{''.join(rows)}</svg>"
        f"<h2>Pending pods</h2><p>{pending or 'none'}</p>"
        + (f"<h2>Invalid claims</h2><p>Their allocation holds what the API refuses from "
           f"Kubernetes 1.38; their devices count as held whole.</p><ul>{invalid}</ul>"
           if invalid else "")
        + "</body></html>\n")

"""The preflight's output: a table that fits the terminal, or one stable JSON document.

The JSON document (`kind: PreflightReport`) keeps its keys and the order of its checks from run
to run, so scripts may read it: `checks[].name` is an identifier, `severity` one of ok, info,
warning, error, `exitCode` the command's. It must not read the cluster.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from typing import Any

from dra_gateway.kube import names
from dra_gateway.preflight.checks import EXIT_CODES, Check, worst
from dra_gateway.preflight.reading import Facts

_MARKS = {"ok": "OK", "info": "INFO", "warning": "WARN", "error": "ERROR"}
_SEVERITY_WIDTH = 6
MIN_WIDTH = 60


def document(facts: Facts, checks: Sequence[Check]) -> dict[str, Any]:
    severity = worst(c.severity for c in checks)
    release = facts.release or {}
    return {"apiVersion": f"{names.DOMAIN}/v1alpha1", "kind": "PreflightReport",
            "namespace": facts.namespace,
            "server": str((facts.version or {}).get("gitVersion") or ""),
            "chart": {"installed": facts.chart_installed,
                      "release": str(release.get("name") or "")},
            "severity": severity, "exitCode": EXIT_CODES[severity],
            "checks": [c.to_dict() for c in checks]}


def table(facts: Facts, checks: Sequence[Check], width: int) -> str:
    """A block per check: its severity and title, the summary, the fix, then its items, each
    line wrapped to `width` (at least MIN_WIDTH)."""
    width = max(width, MIN_WIDTH)
    lines: list[str] = []

    def put(first: str, text: str, indent: int) -> None:
        lines.extend(textwrap.wrap(text, width, initial_indent=first.ljust(indent),
                                   subsequent_indent=" " * indent, break_on_hyphens=False)
                     or [first])

    for check in checks:
        put(_MARKS[check.severity], f"{check.title}: {check.summary}", _SEVERITY_WIDTH + 1)
        if check.fix:
            put("", f"fix: {check.fix}", _SEVERITY_WIDTH + 3)
        for item in check.items:
            put(" " * (_SEVERITY_WIDTH + 3) + _MARKS[item.severity],
                f"{item.name}: {item.message}", _SEVERITY_WIDTH * 2 + 4)
    severity = worst(c.severity for c in checks)
    counts = {s: sum(1 for c in checks if c.severity == s) for s in _MARKS}
    installed = "installed" if facts.chart_installed else "not installed"
    put("", f"{len(checks)} checks: {counts['ok']} ok, {counts['info']} info, "
            f"{counts['warning']} warning(s), {counts['error']} error(s); chart {installed} in "
            f"namespace {facts.namespace}; exit code {EXIT_CODES[severity]}", 0)
    return "\n".join(lines) + "\n"

"""The quota step: one GPUQuota at work with the bundled examples (the second pod held back with
a condition and an Event until the first finishes, then placed), and its report.

It must not start processes or touch the other pods: it creates its own two pods and reads
what the allocator did with them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dra_gateway.kube.cluster.port import Cluster
from dra_gateway.devkit.demo.common import _POLL_S, QUOTA_PODS, QUOTA_POLICIES, text_width
from dra_gateway.devkit.demo.pods import DemoPod, read_pods
from dra_gateway.devkit.demo.processes import Children

QUOTA_CONDITION = "dra-gateway.io/QuotaExceeded"


@dataclass
class QuotaReport:
    """The quota step: the waiting pod's condition and Event, and where each pod went."""

    quota: str  # namespace/name of the GPUQuota
    hard: dict[str, Any] = field(default_factory=dict)
    first: str = ""
    first_node: str | None = None
    waiting: str = ""
    condition: dict[str, Any] | None = None  # the waiting pod's condition while held back
    event: str | None = None  # the QuotaExceeded Event's message
    used_while_waiting: dict[str, Any] = field(default_factory=dict)
    node: str | None = None  # where the waiting pod went once the first finished
    cleared: dict[str, Any] | None = None  # its condition once placed
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"quota": self.quota, "hard": self.hard, "first": self.first,
                "firstNode": self.first_node, "waiting": self.waiting,
                "condition": self.condition, "event": self.event,
                "usedWhileWaiting": self.used_while_waiting, "node": self.node,
                "clearedCondition": self.cleared, "ok": self.ok, "problems": self.problems}


def _condition(pod: Mapping[str, Any], kind: str) -> dict[str, Any] | None:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind:
            return dict(condition)
    return None


async def _poll(children: Children, step: str, deadline: float,
                check: Callable[[], Awaitable[Any]]) -> Any:
    """`check()` until it returns something truthy, or None once the deadline passed."""
    while True:
        children.check(step)
        found = await check()
        if found:
            return found
        if time.monotonic() > deadline:
            return None
        await asyncio.sleep(_POLL_S)


async def show_quota(cluster: Cluster, children: Children, *, place_s: float,
                     say: Callable[[str], None]) -> QuotaReport:
    """One GPUQuota at work: the first pod placed, the second held back for quota (condition
    and Event), the first finished, the second placed."""
    import yaml

    from dra_gateway.kube.resources import EVENTS, GPU_QUOTAS, PODS

    quota_doc = yaml.safe_load(QUOTA_POLICIES.read_text(encoding="utf-8"))
    quota_ns = str(quota_doc["metadata"]["namespace"])
    quota_name = str(quota_doc["metadata"]["name"])
    first, second = read_pods([QUOTA_PODS])
    report = QuotaReport(f"{quota_ns}/{quota_name}", hard=dict(quota_doc["spec"]["hard"]),
                         first=f"{first.namespace}/{first.name}",
                         waiting=f"{second.namespace}/{second.name}")
    step = "showing a quota at work"

    async def node_of(pod: DemoPod) -> str | None:
        found = await cluster.get(PODS, pod.name, namespace=pod.namespace)
        return (found.get("spec") or {}).get("nodeName")

    say(f"quota: creating {report.first}, within GPUQuota {report.quota}")
    await cluster.create(PODS, first.pod, namespace=first.namespace)
    report.first_node = await _poll(children, step, time.monotonic() + place_s,
                                    lambda: node_of(first))
    if report.first_node is None:
        report.problems.append(f"{report.first} was not placed within {place_s:g}s")
        return report
    say(f"quota: creating {report.waiting}, which the quota cannot hold next to it")
    await cluster.create(PODS, second.pod, namespace=second.namespace)

    async def held() -> dict[str, Any] | None:
        pod = await cluster.get(PODS, second.name, namespace=second.namespace)
        found = _condition(pod, QUOTA_CONDITION)
        return found if found and found.get("status") == "True" else None

    report.condition = await _poll(children, step, time.monotonic() + place_s, held)
    if report.condition is None:
        report.problems.append(f"{report.waiting} never got the condition {QUOTA_CONDITION}")
        return report
    if await node_of(second):
        report.problems.append(f"{report.waiting} was placed although the quota was full")
    events = (await cluster.list(EVENTS, namespace=second.namespace)).items
    report.event = next((str(e.get("message")) for e in reversed(events)
                         if e.get("reason") == "QuotaExceeded"
                         and (e.get("involvedObject") or {}).get("name") == second.name), None)
    if report.event is None:
        report.problems.append(f"no QuotaExceeded Event names {report.waiting}")

    async def used() -> dict[str, Any] | None:
        quota = await cluster.get(GPU_QUOTAS, quota_name, namespace=quota_ns)
        found = dict((quota.get("status") or {}).get("used") or {})
        return found if any(str(v) not in ("0", "") for v in found.values()) else None

    # The allocator writes status.used at most every 2s: the first pod's share shows by then.
    report.used_while_waiting = await _poll(children, step, time.monotonic() + 6, used) or {}
    say(f"quota: {report.first} finishes (phase Succeeded, as its kubelet would write)")
    await cluster.patch(PODS, first.name, {"status": {"phase": "Succeeded"}},
                        namespace=first.namespace, subresource="status")
    report.node = await _poll(children, step, time.monotonic() + place_s,
                              lambda: node_of(second))
    if report.node is None:
        report.problems.append(f"{report.waiting} was not placed within {place_s:g}s of "
                               f"{report.first} finishing")
        return report
    pod = await cluster.get(PODS, second.name, namespace=second.namespace)
    report.cleared = _condition(pod, QUOTA_CONDITION)
    return report


def print_quota(report: QuotaReport, out: IO[str]) -> None:
    import textwrap

    hard = ", ".join(f"{k}={v}" for k, v in report.hard.items())
    used = ", ".join(f"{k}={v}" for k, v in report.used_while_waiting.items())
    width = max(len(report.first), len(report.waiting))
    indent = " " * (width + 4)

    def line(pod: str, text: str) -> None:
        out.write(textwrap.fill(text, text_width(), initial_indent=f"  {pod:<{width}}  ",
                                subsequent_indent=indent, break_on_hyphens=False) + "\n")

    out.write(f"\nOne quota at work: GPUQuota {report.quota} (hard {hard}).\n")
    if report.first_node:
        line(report.first, f"placed on {report.first_node}")
    if report.condition:
        line(report.waiting, f"waits, gated: condition {QUOTA_CONDITION}="
                             f"{report.condition.get('status')} "
                             f"({report.condition.get('reason')}): "
                             f"{report.condition.get('message')}")
    if report.event:
        line("", f"Event QuotaExceeded: {report.event}")
    if used:
        line("", f"status.used of the quota: {used}")
    if report.node:
        line(report.first, "finished (phase Succeeded): its claim released")
        cleared = report.cleared or {}
        line(report.waiting, f"placed on {report.node}" + (
            f" (condition {cleared.get('status')}: {cleared.get('reason')})" if cleared else ""))
    for problem in report.problems:
        out.write(f"\nFAILED quota step: {problem}\n")

"""Cutting a node over: from the legacy device plugin to the gateway's node plugin.

A card must never be offered by two allocators at once, so a node moves in order: it is
labelled `dra-gateway.io/cut-over=true`; the legacy plugin's DaemonSet, given the node affinity
`dra-gateway.io/cut-over NotIn [true]`, leaves it, and the kubelet stops offering the legacy
names (allocatable 0); the legacy pods still holding cards end; the gateway's node plugin, which
withholds cards those pods hold, reports the condition `DraGatewayMigration` with reason `DRA`.

`node_state` judges where a node stands from its object and its pods (pure; the plan uses it
too); `cut_over` reads one node through the cluster port and labels it. This module must not
touch the legacy plugin's DaemonSet (it prints the patch) nor evict pods.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.port import Cluster
from dra_gateway.kube.quantity import QuantityError, parse_quantity
from dra_gateway.kube.resources import NODES, PODS
from dra_gateway.migrate.rules import holds_devices, is_legacy
from dra_gateway.translator.rules import RuleSet

# Exit code of `migrate node` while the node still waits for something (0: fully cut over).
EXIT_WAITING: Final = 3
_CARD_COUNT_LABEL: Final = "nvidia.com/gpu.count"
_PRODUCT_LABEL: Final = "nvidia.com/gpu.product"


@dataclass(frozen=True, slots=True)
class NodeState:
    """Where a node stands in the move, and what it still waits for (empty: cut over)."""

    name: str
    cut_over: bool  # carries the cut-over label
    legacy_plugins: Mapping[str, str]  # legacy names still allocatable (> 0) -> amount
    cards: int | None
    product: str
    legacy_pods: tuple[str, ...]  # namespace/name of pods holding legacy cards here
    condition: Mapping[str, str] | None  # DraGatewayMigration: status, reason, message
    waits_for: tuple[str, ...]

    @property
    def done(self) -> bool:
        return not self.waits_for

    @property
    def relevant(self) -> bool:
        """Whether the node takes part in the move at all."""
        return bool(self.legacy_plugins or self.cut_over or self.condition or self.legacy_pods)

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["done"] = self.done
        return out


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _positive(value: Any) -> bool:
    try:
        return parse_quantity(str(value)).sign() > 0
    except (QuantityError, ValueError):
        return False


def pod_legacy_requests(pod: Mapping[str, Any], rules: RuleSet, *,
                        devices_only: bool = False) -> dict[str, str]:
    """The legacy GPU resources a pod asks for (non-zero), with their values (the limit, else
    the request), over all its containers. `devices_only`: only names that hold devices (not
    hints such as HAMi's nvidia.com/priority)."""
    out: dict[str, str] = {}
    spec = objects.spec(pod)
    for key in ("initContainers", "containers"):
        for container in spec.get(key) or ():
            resources = container.get("resources") or {}
            for part in ("limits", "requests"):
                for name, value in (resources.get(part) or {}).items():
                    wanted = holds_devices(rules, name) if devices_only else is_legacy(rules,
                                                                                      name)
                    if wanted and _positive(value):
                        out.setdefault(str(name), str(value))
    return out


def holds_legacy_cards(pod: Mapping[str, Any], rules: RuleSet) -> bool:
    """A running pod whose cards the legacy device plugin allocated."""
    if objects.status(pod).get("phase") in ("Succeeded", "Failed"):
        return False
    if names.ANNOTATION_TRANSLATED in objects.annotations(pod):
        return False
    return bool(pod_legacy_requests(pod, rules, devices_only=True))


def node_state(node: Mapping[str, Any], pods: Sequence[Mapping[str, Any]],
               rules: RuleSet) -> NodeState:
    """Where `node` stands, given the pods bound to it."""
    name = objects.name(node)
    labels = objects.labels(node)
    cut_over = labels.get(names.NODE_CUT_OVER_LABEL) == names.NODE_CUT_OVER_VALUE
    status = objects.status(node)
    allocatable = _mapping(status.get("allocatable"))
    legacy_plugins = {str(k): str(v) for k, v in sorted(allocatable.items())
                      if holds_devices(rules, str(k)) and _positive(v)}
    cards: int | None = None
    count = labels.get(_CARD_COUNT_LABEL)
    if count is not None and count.isdigit():
        cards = int(count)
    else:
        capacity = _mapping(status.get("capacity")).get("nvidia.com/gpu",
                                                        allocatable.get("nvidia.com/gpu"))
        if capacity is not None and str(capacity).isdigit():
            cards = int(capacity)
    holding = tuple(sorted(f"{objects.namespace(p)}/{objects.name(p)}" for p in pods
                           if objects.spec(p).get("nodeName") == name
                           and holds_legacy_cards(p, rules)))
    condition = None
    conditions = status.get("conditions")
    for c in conditions if isinstance(conditions, list) else ():
        if isinstance(c, Mapping) and c.get("type") == names.NODE_MIGRATION_CONDITION:
            condition = {k: str(c.get(k) or "") for k in ("status", "reason", "message")}
    waits: list[str] = []
    # A node whose status never named a legacy GPU resource, holding no legacy pod, where the
    # node plugin publishes every card, has nothing to cut over.
    never_legacy = not holding and not any(holds_devices(rules, str(k)) for k in allocatable) \
        and condition is not None and condition["reason"] == names.NODE_STATE_DRA
    if not cut_over and not never_legacy:
        waits.append(f"the label {names.NODE_CUT_OVER_LABEL}={names.NODE_CUT_OVER_VALUE} "
                     f"(dra-gateway migrate node {name})")
    if legacy_plugins:
        offered = ", ".join(f"{k}: {v}" for k, v in legacy_plugins.items())
        waits.append(f"the legacy device plugin to leave: it still offers {offered}; give its "
                     f"DaemonSet the node affinity {names.NODE_CUT_OVER_LABEL} NotIn "
                     f"[{names.NODE_CUT_OVER_VALUE}]")
    if holding:
        waits.append(f"{len(holding)} legacy pod(s) holding cards to end: {', '.join(holding)}")
    if condition is None:
        waits.append(f"the gateway's node plugin to report the condition "
                     f"{names.NODE_MIGRATION_CONDITION} (is it running on {name}?)")
    elif condition["reason"] != names.NODE_STATE_DRA:
        detail = f": {condition['message']}" if condition["message"] else ""
        waits.append(f"the gateway's node plugin to reach {names.NODE_STATE_DRA}: it reports "
                     f"{condition['reason'] or 'no reason'}{detail}")
    return NodeState(name=name, cut_over=cut_over, legacy_plugins=legacy_plugins, cards=cards,
                     product=labels.get(_PRODUCT_LABEL, ""), legacy_pods=holding,
                     condition=condition, waits_for=tuple(waits))


def daemonset_affinity_patch() -> dict[str, Any]:
    """The strategic merge patch that keeps a legacy plugin's DaemonSet off cut-over nodes."""
    return {"spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": names.NODE_CUT_OVER_LABEL, "operator": "NotIn",
                                   "values": [names.NODE_CUT_OVER_VALUE]}]}]}}}}}}}


def patch_command() -> str:
    patch = json.dumps(daemonset_affinity_patch(), separators=(",", ":"))
    return (f"kubectl -n <namespace> patch daemonset <legacy-device-plugin> --type strategic "
            f"-p '{patch}'")


@dataclass(frozen=True, slots=True)
class CutOver:
    """What `migrate node` did and found."""

    state: NodeState
    labelled: bool  # this run set the label
    dry_run: bool

    @property
    def exit_code(self) -> int:
        return 0 if self.state.done else EXIT_WAITING

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.state.to_dict(), "labelled": self.labelled, "dryRun": self.dry_run,
                "daemonSetPatch": daemonset_affinity_patch() if self.state.legacy_plugins
                else None}

    def render(self) -> str:
        state = self.state
        label = f"{names.NODE_CUT_OVER_LABEL}={names.NODE_CUT_OVER_VALUE}"
        if self.labelled:
            lines = [f"node {state.name}: labelled {label}"]
        elif state.cut_over:
            lines = [f"node {state.name}: labelled {label} already"]
        else:
            lines = [f"node {state.name}: would label {label} (dry run: nothing changed)"]
        if state.legacy_plugins:
            offered = ", ".join(f"{k}: {v}" for k, v in state.legacy_plugins.items())
            lines += [f"legacy device plugin: still offers {offered}",
                      "  give the legacy plugin's DaemonSet this node affinity, so that its pod "
                      "leaves cut-over nodes:",
                      f"  {patch_command()}",
                      "  (a strategic merge replaces nodeSelectorTerms: if the DaemonSet already "
                      "has required node affinity terms, add the expression to each of them)"]
        else:
            lines.append("legacy device plugin: offers no GPU here")
        lines.append("legacy pods holding cards: " + (", ".join(state.legacy_pods) or "none"))
        condition = state.condition
        lines.append(f"gateway node plugin: {names.NODE_MIGRATION_CONDITION} "
                     + (f"{condition['reason']}" + (f" ({condition['message']})"
                                                    if condition["message"] else "")
                        if condition is not None else "not reported"))
        if state.done:
            lines.append(f"node {state.name} is cut over")
        else:
            lines.append("still waiting for:")
            lines.extend(f"  - {w}" for w in state.waits_for)
        return "\n".join(lines) + "\n"


async def cut_over(cluster: Cluster, name: str, rules: RuleSet, *,
                   dry_run: bool = False) -> CutOver:
    """Label node `name` for cut-over (unless `dry_run`) and say where it stands.

    NotFound from the port when the node does not exist."""
    node = await cluster.get(NODES, name)
    labelled = False
    if objects.labels(node).get(names.NODE_CUT_OVER_LABEL) != names.NODE_CUT_OVER_VALUE \
            and not dry_run:
        node = await cluster.patch(NODES, name, {"metadata": {"labels": {
            names.NODE_CUT_OVER_LABEL: names.NODE_CUT_OVER_VALUE}}})
        labelled = True
    pods = (await cluster.list(PODS, field_selector=f"spec.nodeName={name}")).items
    return CutOver(node_state(node, pods, rules), labelled, dry_run)

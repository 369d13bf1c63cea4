"""What a pod asks of a node outside DRA: CPU and memory, taints it tolerates, nodes it accepts.

Plain functions over pod and node dicts, as kube-scheduler's NodeResourcesFit, TaintToleration
and NodeAffinity plugins read them. Pure: no I/O, no cluster access.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_gateway.kube.quantity import QuantityError, parse_quantity

_NO_EFFECTS = ("NoSchedule", "NoExecute")


def _milli(value: Any) -> int:
    try:
        return parse_quantity(value).milli_value()
    except QuantityError:
        return 0


def _whole(value: Any) -> int:
    try:
        return parse_quantity(value).value()
    except QuantityError:
        return 0


def _container_requests(container: Mapping[str, Any]) -> tuple[int, int]:
    resources = container.get("resources") or {}
    # As the API server defaults it: a limit without a request is the request.
    amounts = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return _milli(amounts.get("cpu", 0)), _whole(amounts.get("memory", 0))


def pod_requests(pod: Mapping[str, Any]) -> tuple[int, int]:
    """CPU (milli) and memory (bytes) the pod needs on its node: the larger of the containers'
    sum and the largest init container, plus the pod overhead (upstream `PodRequests`)."""
    spec = pod.get("spec") or {}
    cpu = mem = 0
    for container in spec.get("containers") or ():
        c, m = _container_requests(container)
        cpu += c
        mem += m
    restartable_cpu = restartable_mem = 0
    for init in spec.get("initContainers") or ():
        c, m = _container_requests(init)
        if init.get("restartPolicy") == "Always":
            # Sidecars run alongside the app containers.
            restartable_cpu += c
            restartable_mem += m
            cpu += c
            mem += m
        else:
            cpu = max(cpu, c + restartable_cpu)
            mem = max(mem, m + restartable_mem)
    overhead = spec.get("overhead") or {}
    return cpu + _milli(overhead.get("cpu", 0)), mem + _whole(overhead.get("memory", 0))


def node_allocatable(node: Mapping[str, Any]) -> tuple[int, int]:
    """Allocatable CPU (milli) and memory (bytes); capacity when allocatable is absent."""
    status = node.get("status") or {}
    amounts = status.get("allocatable") or status.get("capacity") or {}
    return _milli(amounts.get("cpu", 0)), _whole(amounts.get("memory", 0))


def tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    """Whether one of `tolerations` tolerates `taint` (core/v1 and DRA tolerations alike)."""
    for toleration in tolerations:
        effect = toleration.get("effect") or ""
        if effect and effect != taint.get("effect"):
            continue
        key = toleration.get("key") or ""
        operator = toleration.get("operator") or "Equal"
        if operator == "Exists":
            if not key or key == taint.get("key"):
                return True
            continue
        if key == taint.get("key") and (toleration.get("value") or "") == (
            taint.get("value") or ""
        ):
            return True
    return False


def untolerated_taint(
    taints: Sequence[Mapping[str, Any]], tolerations: Sequence[Mapping[str, Any]]
) -> Mapping[str, Any] | None:
    """The first NoSchedule/NoExecute taint no toleration covers, or None."""
    for taint in taints:
        if taint.get("effect") in _NO_EFFECTS and not tolerates(tolerations, taint):
            return taint
    return None


def node_taints(node: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    spec = node.get("spec") or {}
    taints: list[Mapping[str, Any]] = list(spec.get("taints") or ())
    if spec.get("unschedulable"):
        taints.append({"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"})
    return taints


def _match_expression(values: Mapping[str, str], expr: Mapping[str, Any]) -> bool:
    key = expr.get("key", "")
    operator = expr.get("operator", "")
    wanted: Sequence[str] = expr.get("values") or []
    present = key in values
    if operator == "In":
        return present and values[key] in wanted
    if operator == "NotIn":
        return not present or values[key] not in wanted
    if operator == "Exists":
        return present
    if operator == "DoesNotExist":
        return not present
    if operator in ("Gt", "Lt") and present and len(wanted) == 1:
        try:
            have, limit = int(values[key]), int(wanted[0])
        except ValueError:
            return False
        return have > limit if operator == "Gt" else have < limit
    return False


def _match_term(name: str, labels: Mapping[str, str], term: Mapping[str, Any]) -> bool:
    expressions = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not expressions and not fields:
        return False  # an empty term matches nothing (upstream)
    fields_view = {"metadata.name": name}
    return all(_match_expression(labels, e) for e in expressions) and all(
        _match_expression(fields_view, f) for f in fields
    )


def node_selector_matches(
    name: str, labels: Mapping[str, str], selector: Mapping[str, Any] | None
) -> bool:
    """A core/v1 NodeSelector: terms are ORed, expressions within a term ANDed."""
    if not selector:
        return True
    return any(_match_term(name, labels, t) for t in selector.get("nodeSelectorTerms") or ())


def pod_accepts_node(pod: Mapping[str, Any], name: str, labels: Mapping[str, str]) -> bool:
    """spec.nodeSelector and required node affinity of the pod."""
    spec = pod.get("spec") or {}
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return False
    affinity = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
        "requiredDuringSchedulingIgnoredDuringExecution"
    )
    return node_selector_matches(name, labels, affinity)


def pod_is_finished(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")

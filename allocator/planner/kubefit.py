"""What a pod asks of a node outside DRA: CPU and memory, taints it tolerates.

Plain functions over pod and node dicts, as kube-scheduler's NodeResourcesFit and
TaintToleration plugins read them. The nodes a pod accepts (NodeAffinity) are
`kube.nodeselectors.pod_accepts_node`'s, whether a pod finished `kube.objects.is_finished`'s.
Pure: no I/O, no cluster access.
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

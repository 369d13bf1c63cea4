"""Objects as `meta.k8s.io/v1` Tables: the columns `kubectl get` prints, as the API server
fills them.

kubectl asks for a Table (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`) and prints the
columns it gets; a server that answers with a plain list leaves it NAME and AGE. The printers
here are upstream's (kubernetes pkg/printers/internalversion/printers.go) for the kinds the
simulator serves and users look at: pods (with the wide columns), nodes, namespaces, the DRA
kinds, ConfigMaps, Secrets, Leases and webhook configurations; the gateway's custom resources
print their CRD's `additionalPrinterColumns` (`crds`) as the apiextensions server does. Every
other kind gets the CRD default, Name and Age. Ages are rendered here, as upstream renders them
(`duration.HumanDuration`), against the server's clock.

Pure: objects and a clock in, a Table out; it must not read the store.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from dra_gateway.devkit.sim import crds
from dra_gateway.kube.cluster.port import Object
from dra_gateway.kube.resources import (
    CONFIG_MAPS,
    DEVICE_CLASSES,
    LEASES,
    MUTATING_WEBHOOK_CONFIGURATIONS,
    NAMESPACES,
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
    SECRETS,
    VALIDATING_WEBHOOK_CONFIGURATIONS,
    ResourceType,
)

_NAME_DOC = ("Name must be unique within a namespace. Is required when creating resources, "
             "although some resources may allow a client to request the generation of an "
             "appropriate name automatically. Name is primarily intended for creation "
             "idempotence and configuration definition. Cannot be updated. More info: "
             "https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names")
_AGE_DOC = ("CreationTimestamp is a timestamp representing the server time when this object "
            "was created. It is not guaranteed to be set in happens-before order across "
            "separate operations. Clients may not set this value. It is represented in RFC3339 "
            "form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More "
            "info: https://git.k8s.io/community/contributors/devel/sig-architecture/"
            "api-conventions.md#metadata")


def wants_table(accept: str) -> bool:
    """Whether an Accept header asks for a meta.k8s.io/v1 Table (kubectl get's first choice)."""
    for choice in accept.split(","):
        params = {k.strip(): v.strip() for k, _, v in
                  (p.partition("=") for p in choice.split(";")[1:])}
        if (params.get("as") == "Table" and params.get("g") == "meta.k8s.io"
                and params.get("v") == "v1"):
            return True
    return False


def human_duration(seconds: float) -> str:
    """apimachinery's duration.HumanDuration: "45s", "5m3s", "3h20m", "2d4h", "1y30d"."""
    s = int(seconds)
    if s < -1:
        return "<invalid>"
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    minutes = s // 60
    if minutes < 10:
        rest = s % 60
        return f"{minutes}m" if rest == 0 else f"{minutes}m{rest}s"
    if minutes < 180:
        return f"{minutes}m"
    hours = s // 3600
    if hours < 8:
        rest = minutes % 60
        return f"{hours}h" if rest == 0 else f"{hours}h{rest}m"
    if hours < 48:
        return f"{hours}h"
    if hours < 24 * 8:
        rest = hours % 24
        return f"{hours // 24}d" if rest == 0 else f"{hours // 24}d{rest}h"
    if hours < 24 * 365 * 2:
        return f"{hours // 24}d"
    if hours < 24 * 365 * 8:
        days = (hours // 24) % 365
        return f"{hours // 24 // 365}y" if days == 0 else f"{hours // 24 // 365}y{days}d"
    return f"{hours // 24 // 365}y"


def _since(timestamp: Any, now: datetime) -> str:
    """translateTimestampSince: "<unknown>" for a missing time."""
    if not isinstance(timestamp, str) or not timestamp:
        return "<unknown>"
    try:
        moment = datetime.fromisoformat(timestamp.replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    return human_duration((now - moment).total_seconds())


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    type: str = "string"
    description: str = ""
    priority: int = 0  # 1: shown by `kubectl get -o wide` only
    format: str = ""

    def definition(self) -> dict[str, Any]:
        return {"name": self.name, "type": self.type, "format": self.format,
                "description": self.description, "priority": self.priority}


_NAME = Column("Name", format="name", description=_NAME_DOC)
_AGE = Column("Age", description=_AGE_DOC)

Cells = list[Any]
Printer = Callable[[Object, datetime], Cells]


def _meta(obj: Object) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _field(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(key)
    return obj


def _pod(obj: Object, now: datetime) -> Cells:
    """printPod, as of Kubernetes 1.34 (sidecar restarts left out: the simulator runs none)."""
    meta, spec = _meta(obj), obj.get("spec") or {}
    status = obj.get("status") or {}
    phase = str(status.get("phase") or "")
    reason = str(status.get("reason") or phase)
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("reason") == \
                "SchedulingGated":
            reason = "SchedulingGated"
    restarts = ready = 0
    has_running = False
    initializing = False
    init_statuses = status.get("initContainerStatuses") or []
    for i, container in enumerate(init_statuses):
        state = container.get("state") or {}
        restarts += int(container.get("restartCount") or 0)
        terminated, waiting = state.get("terminated"), state.get("waiting")
        if terminated is not None and terminated.get("exitCode") == 0:
            continue
        if terminated is not None:
            reason = "Init:" + (terminated.get("reason") or (
                f"Signal:{terminated['signal']}" if terminated.get("signal")
                else f"ExitCode:{terminated.get('exitCode', 0)}"))
        elif waiting is not None and waiting.get("reason") and \
                waiting.get("reason") != "PodInitializing":
            reason = "Init:" + str(waiting["reason"])
        else:
            reason = f"Init:{i}/{len(spec.get('initContainers') or [])}"
        initializing = True
        break
    if not initializing:
        restarts = 0
        for container in reversed(status.get("containerStatuses") or []):
            restarts += int(container.get("restartCount") or 0)
            state = container.get("state") or {}
            waiting, terminated = state.get("waiting"), state.get("terminated")
            if waiting is not None and waiting.get("reason"):
                reason = str(waiting["reason"])
            elif terminated is not None and terminated.get("reason"):
                reason = str(terminated["reason"])
            elif terminated is not None:
                reason = (f"Signal:{terminated['signal']}" if terminated.get("signal")
                          else f"ExitCode:{terminated.get('exitCode', 0)}")
            elif container.get("ready") and state.get("running") is not None:
                has_running = True
                ready += 1
        if reason == "Completed" and has_running:
            ready_condition = any(c.get("type") == "Ready" and c.get("status") == "True"
                                  for c in status.get("conditions") or [])
            reason = "Running" if ready_condition else "NotReady"
    if meta.get("deletionTimestamp"):
        if status.get("reason") == "NodeLost":
            reason = "Unknown"
        elif phase not in ("Succeeded", "Failed"):
            reason = "Terminating"
    ips = status.get("podIPs") or []
    ip = (ips[0].get("ip") if ips else None) or "<none>"
    gates = spec.get("readinessGates") or []
    readiness = "<none>"
    if gates:
        conditions = {c.get("type"): c.get("status") for c in status.get("conditions") or []}
        ok = sum(1 for g in gates if conditions.get(g.get("conditionType")) == "True")
        readiness = f"{ok}/{len(gates)}"
    return [meta.get("name"), f"{ready}/{len(spec.get('containers') or [])}", reason,
            str(restarts), _since(meta.get("creationTimestamp"), now), ip,
            spec.get("nodeName") or "<none>", status.get("nominatedNodeName") or "<none>",
            readiness]


def _node_roles(labels: Mapping[str, str]) -> str:
    roles = set()
    for key, value in labels.items():
        if key.startswith("node-role.kubernetes.io/"):
            role = key.removeprefix("node-role.kubernetes.io/")
            if role:
                roles.add(role)
        elif key == "kubernetes.io/role" and value:
            roles.add(value)
    return ",".join(sorted(roles)) or "<none>"


def _node(obj: Object, now: datetime) -> Cells:
    meta, status = _meta(obj), obj.get("status") or {}
    states = [("Ready" if c.get("status") == "True" else "NotReady")
              for c in status.get("conditions") or [] if c.get("type") == "Ready"][:1]
    states = states or ["Unknown"]
    if (obj.get("spec") or {}).get("unschedulable"):
        states.append("SchedulingDisabled")
    info = status.get("nodeInfo") or {}

    def address(kind: str) -> str:
        return next((a.get("address") for a in status.get("addresses") or []
                     if a.get("type") == kind), None) or "<none>"

    return [meta.get("name"), ",".join(states), _node_roles(meta.get("labels") or {}),
            _since(meta.get("creationTimestamp"), now), info.get("kubeletVersion") or "",
            address("InternalIP"), address("ExternalIP"), info.get("osImage") or "<unknown>",
            info.get("kernelVersion") or "<unknown>",
            info.get("containerRuntimeVersion") or "<unknown>"]


def claim_state(obj: Object) -> str:
    """resourceClaimState: "pending", "allocated,reserved", "deleted,allocated", ..."""
    states = []
    deleted = bool(_meta(obj).get("deletionTimestamp"))
    status = obj.get("status") or {}
    if deleted:
        states.append("deleted")
    if status.get("allocation") is None:
        if not deleted:
            states.append("pending")
    else:
        states.append("allocated")
        if status.get("reservedFor"):
            states.append("reserved")
        elif deleted:
            states.append("deallocating")
    return ",".join(states)


def _named(*cells: Callable[[Object], Any]) -> Printer:
    def printer(obj: Object, now: datetime) -> Cells:
        meta = _meta(obj)
        return [meta.get("name"), *(cell(obj) for cell in cells),
                _since(meta.get("creationTimestamp"), now)]
    return printer


@dataclass(frozen=True, slots=True)
class _Kind:
    columns: tuple[Column, ...]
    cells: Printer


_PRINTERS: dict[ResourceType, _Kind] = {
    PODS: _Kind((
        _NAME,
        Column("Ready", description="The aggregate readiness state of this pod for accepting "
                                    "traffic."),
        Column("Status", description="The aggregate status of the containers in this pod."),
        Column("Restarts", description="The number of times the containers in this pod have "
                                       "been restarted and when the last container in this "
                                       "pod has restarted."),
        _AGE,
        Column("IP", priority=1, description="podIP address allocated to the pod. Routable at "
                                             "least within the cluster. Empty if not yet "
                                             "allocated."),
        Column("Node", priority=1, description="NodeName indicates in which node this pod is "
                                               "scheduled."),
        Column("Nominated Node", priority=1, description="nominatedNodeName is set only when "
                                                         "this pod preempts other pods on the "
                                                         "node."),
        Column("Readiness Gates", priority=1, description="If specified, all readiness gates "
                                                          "will be evaluated for pod "
                                                          "readiness."),
    ), _pod),
    NODES: _Kind((
        _NAME, Column("Status", description="The status of the node"),
        Column("Roles", description="The roles of the node"), _AGE,
        Column("Version", description="Kubelet Version reported by the node."),
        Column("Internal-IP", priority=1, description="List of addresses reachable to the "
                                                      "node. Queried from cloud provider, if "
                                                      "available."),
        Column("External-IP", priority=1, description="List of addresses reachable to the "
                                                      "node. Queried from cloud provider, if "
                                                      "available."),
        Column("OS-Image", priority=1, description="OS Image reported by the node from "
                                                   "/etc/os-release (e.g. Debian GNU/Linux 7 "
                                                   "(wheezy))."),
        Column("Kernel-Version", priority=1, description="Kernel Version reported by the node "
                                                         "from 'uname -r' (e.g. "
                                                         "3.16.0-0.bpo.4-amd64)."),
        Column("Container-Runtime", priority=1, description="ContainerRuntime Version reported "
                                                            "by the node through runtime "
                                                            "remote API (e.g. "
                                                            "containerd://1.4.2)."),
    ), _node),
    NAMESPACES: _Kind((_NAME, Column("Status", description="The status of the namespace"),
                       _AGE), _named(lambda o: _field(o, "status", "phase") or "")),
    RESOURCE_CLAIMS: _Kind((_NAME, Column("State", description="A summary of the current "
                                                               "state (allocated, pending, "
                                                               "reserved, etc.)."), _AGE),
                           _named(claim_state)),
    RESOURCE_CLAIM_TEMPLATES: _Kind((_NAME, _AGE), _named()),
    DEVICE_CLASSES: _Kind((_NAME, _AGE), _named()),
    RESOURCE_SLICES: _Kind((
        _NAME,
        Column("Node", description="NodeName identifies the node which provides the resources "
                                   "in this pool."),
        Column("Driver", description="Driver identifies the DRA driver providing the capacity "
                                     "information."),
        Column("Pool", description="Name is used to identify the pool."), _AGE,
    ), _named(lambda o: _field(o, "spec", "nodeName") or "",
              lambda o: _field(o, "spec", "driver") or "",
              lambda o: _field(o, "spec", "pool", "name") or "")),
    CONFIG_MAPS: _Kind((_NAME, Column("Data", type="integer",
                                      description="Data contains the configuration data."),
                        _AGE),
                       _named(lambda o: len(o.get("data") or {}) + len(o.get("binaryData")
                                                                       or {}))),
    SECRETS: _Kind((_NAME, Column("Type", description="Used to facilitate programmatic "
                                                      "handling of secret data."),
                    Column("Data", type="integer", description="Data contains the secret "
                                                               "data."), _AGE),
                   _named(lambda o: o.get("type") or "", lambda o: len(o.get("data") or {}))),
    LEASES: _Kind((_NAME, Column("Holder", description="HolderIdentity contains the identity "
                                                       "of the holder of a current lease."),
                   _AGE), _named(lambda o: _field(o, "spec", "holderIdentity") or "")),
    MUTATING_WEBHOOK_CONFIGURATIONS: _Kind(
        (_NAME, Column("Webhooks", type="integer", description="Webhooks is a list of webhooks "
                                                               "and the affected resources "
                                                               "and operations."), _AGE),
        _named(lambda o: len(o.get("webhooks") or []))),
}
_PRINTERS[VALIDATING_WEBHOOK_CONFIGURATIONS] = _PRINTERS[MUTATING_WEBHOOK_CONFIGURATIONS]
_DEFAULT = _Kind((_NAME, Column("Age", type="date", description=_AGE_DOC)), _named())

_PATH_STEP = re.compile(r"\.([^.\[\]]+)|\[(\d+)\]")


def json_path(obj: Any, path: str) -> tuple[bool, Any]:
    """The value at a simple JSONPath (`.a.b[0].c`, as CRD printer columns allow)."""
    path = path.strip()
    if path.startswith("{") and path.endswith("}"):
        path = path[1:-1]
    path = path.removeprefix("$")
    position = 0
    while position < len(path):
        match = _PATH_STEP.match(path, position)
        if match is None:
            return False, None
        position = match.end()
        if match.group(1) is not None:
            if not isinstance(obj, Mapping) or match.group(1) not in obj:
                return False, None
            obj = obj[match.group(1)]
        else:
            index = int(match.group(2))
            if not isinstance(obj, list) or index >= len(obj):
                return False, None
            obj = obj[index]
    return True, obj


def _custom_cell(column: crds.PrinterColumn, obj: Object, now: datetime) -> Any:
    """apiextensions' tableconvertor: the column's JSONPath, typed by the column's type."""
    found, value = json_path(obj, column.json_path)
    if not found or value is None:
        return None
    if column.type == "string":
        if isinstance(value, bool):
            return "true" if value else "false"
        return value if isinstance(value, str) else str(value)
    if column.type == "integer":
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
        return int(value)
    if column.type == "number":
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None
    if column.type == "boolean":
        return value if isinstance(value, bool) else None
    if column.type == "date":
        return _since(value, now) if isinstance(value, str) else None
    return None


def _custom(definition: crds.Definition) -> _Kind:
    columns = (_NAME, *(Column(c.name, type=c.type, format=c.format,
                               description=c.description, priority=c.priority)
                        for c in definition.printer_columns))

    def cells(obj: Object, now: datetime) -> Cells:
        return [_meta(obj).get("name"),
                *(_custom_cell(c, obj, now) for c in definition.printer_columns)]
    return _Kind(columns, cells)


def _kind(rt: ResourceType) -> _Kind:
    printer = _PRINTERS.get(rt)
    if printer is not None:
        return printer
    definition = crds.definition(rt)
    if definition is not None and definition.printer_columns:
        return _custom(definition)
    return _DEFAULT


def _row_object(obj: Object, include: str) -> dict[str, Any] | None:
    if include == "None":
        return None
    if include == "Object":
        return obj
    return {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
            "metadata": _meta(obj)}


def table(rt: ResourceType, items: Sequence[Object], *, resource_version: str | None = None,
          include_object: str = "Metadata", now: datetime | None = None,
          headers: bool = True) -> dict[str, Any]:
    """The Table of `items`: upstream's columns for `rt`, one row per object.

    `include_object` is the request's `includeObject` (None, Metadata, the default, or
    Object); without `headers` the column definitions are left out, as for a watch's events
    after the first.
    """
    kind = _kind(rt)
    moment = now or datetime.now(UTC)
    rows = []
    for obj in items:
        row: dict[str, Any] = {"cells": kind.cells(obj, moment)}
        shown = _row_object(obj, include_object)
        if shown is not None:
            row["object"] = shown
        rows.append(row)
    metadata: dict[str, Any] = {}
    if resource_version is not None:
        metadata["resourceVersion"] = resource_version
    return {"kind": "Table", "apiVersion": "meta.k8s.io/v1", "metadata": metadata,
            "columnDefinitions": [c.definition() for c in kind.columns] if headers else [],
            "rows": rows}

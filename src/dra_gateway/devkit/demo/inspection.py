"""What the demo shows of each pod: creating the pods, waiting for them to be bound, what each
asked for the legacy way, its claim template, the devices and share it got, and what its node
plugin prepared for a container (the demo plays the kubelet).

It must not start or stop processes, nor decide anything about pods: it reads what the
components did and reports it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dra_gateway.kube.cluster.port import Cluster
from dra_gateway.devkit.demo.common import _POLL_S, NAMESPACE, NODES, DemoError
from dra_gateway.devkit.demo.pods import DemoPod
from dra_gateway.devkit.demo.processes import Children, Layout

# Resource names the demo does not count as a legacy GPU request when it shows one.
_PLAIN_RESOURCES = ("cpu", "memory", "ephemeral-storage", "pods")


@dataclass
class PodReport:
    namespace: str
    name: str
    source: str
    legacy: str
    rule: str
    templates: list[str]
    expected: str  # "bound" | "pending"
    why_pending: str = ""
    node: str | None = None
    claims: list[dict[str, Any]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # The API's refusal of the pod (the webhook's message): the pod was never created.
    refused: str = ""
    # The allocator's words on a pod it refused once every other pod had settled: nothing in
    # the embedded cluster frees room while the demo waits, so the demo stops waiting for it.
    never_fits: str = ""

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_json(self) -> dict[str, Any]:
        return {"namespace": self.namespace, "name": self.name, "source": self.source,
                "legacyRequest": self.legacy, "rule": self.rule or None,
                "templates": self.templates, "expected": self.expected,
                "whyPending": self.why_pending or None, "node": self.node,
                "claims": self.claims, "ok": self.ok, "problems": self.problems,
                "refused": self.refused or None, "neverFits": self.never_fits or None}


def legacy_request(original: Mapping[str, Any], created: Mapping[str, Any]) -> tuple[str, str]:
    """What the pod asked for the legacy way, and the rule that translated it."""
    from dra_gateway.kube import names, objects

    annotations = objects.annotations(created)
    recorded = annotations.get(names.ANNOTATION_TRANSLATED)
    parts: list[str] = []
    rules: list[str] = []
    if recorded:
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            for container in (json.loads(recorded).get("containers") or {}).values():
                amounts = {**(container.get("requests") or {}), **(container.get("limits") or {})}
                parts.extend(f"{k}={v}" for k, v in amounts.items())
                if container.get("rule") and container["rule"] not in rules:
                    rules.append(str(container["rule"]))
    if not parts:
        spec = original.get("spec") or {}
        for container in [*(spec.get("initContainers") or []), *(spec.get("containers") or [])]:
            resources = container.get("resources") or {}
            amounts = {**(resources.get("requests") or {}), **(resources.get("limits") or {})}
            parts.extend(f"{k}={v}" for k, v in amounts.items()
                         if k not in _PLAIN_RESOURCES and not k.startswith("hugepages-"))
        if not parts and spec.get("resourceClaims"):
            parts.append("DRA claims (native)")
    return " ".join(parts) or "no GPU", ",".join(rules)


def _quantity_bytes(value: Any) -> int | None:
    from dra_gateway.kube.quantity import QuantityError, bytes_of

    try:
        return int(bytes_of(value))
    except (QuantityError, ValueError, TypeError):
        return None


def human_bytes(amount: int | None) -> str:
    if amount is None:
        return "?"
    units = (("Ti", 2**40), ("Gi", 2**30), ("Mi", 2**20), ("Ki", 2**10))
    for unit, size in units:  # exact first: 8000Mi stays 8000Mi, not 7.812Gi
        if amount >= size and amount % size == 0:
            return f"{amount // size}{unit}"
    for unit, size in units:
        if amount >= size:
            return f"{amount / size:.4g}{unit}"
    return str(amount)


def claim_devices(claim: Mapping[str, Any], slices: Mapping[tuple[str, str, str], Any]
                  ) -> list[dict[str, Any]]:
    """Each allocated device with its node and the share of it the claim holds."""
    from dra_gateway.gpu.shares import recorded_shares, result_key
    from dra_gateway.kube import names

    allocation = (claim.get("status") or {}).get("allocation") or {}
    recorded = recorded_shares(claim)
    devices: list[dict[str, Any]] = []
    for result in (allocation.get("devices") or {}).get("results") or []:
        key = (str(result.get("driver")), str(result.get("pool")), str(result.get("device")))
        published = slices.get(key) or {}
        capacity = {k: (v or {}).get("value") for k, v in
                    ((published.get("device") or {}).get("capacity") or {}).items()}
        consumed = result.get("consumedCapacity")
        if consumed is None:
            consumed = next((r.consumed_capacity for r in recorded
                             if r.key == result_key(result)), None)
        held = consumed if consumed is not None else capacity
        memory = _quantity_bytes(held.get("memory")) if held.get("memory") is not None else None
        cores = held.get("cores")
        if consumed is None and cores is None and published.get("type") == "gpu":
            cores = str(names.CORES_PER_CARD)
        # A share of the whole card's capacity is the whole card, whatever the world.
        whole = consumed is None or all(
            _quantity_bytes(consumed.get(k)) == _quantity_bytes(capacity.get(k))
            for k in capacity)
        request = str(result.get("request") or "")
        devices.append({
            "request": result.get("request"), "driver": key[0], "pool": key[1],
            "device": key[2], "node": published.get("node"),
            "share": "whole" if whole else "shared",
            "memory": memory, "cores": int(str(cores)) if cores is not None else None,
            "enforcement": _share_config(allocation, request).get("enforcement"),
        })
    return devices


def _share_config(allocation: Mapping[str, Any], request: str) -> dict[str, Any]:
    """The GpuShareConfig parameters the allocation hands a request (later entries win)."""
    from dra_gateway.kube.models import share_parameters

    configs = (allocation.get("devices") or {}).get("config") or []
    try:
        return share_parameters(configs, request)
    except ValueError:
        return {}  # the node plugin refuses such a claim; the demo only shows what it can


def describe_devices(devices: Sequence[Mapping[str, Any]]) -> str:
    parts = []
    for d in devices:
        what = [human_bytes(d["memory"])] if d["memory"] is not None else []
        if d["cores"] is not None:
            what.append(f"{d['cores']}% cores")
        if d["share"] == "shared" and d.get("enforcement"):
            # What the share's numbers mean in the container: limits or only accounting.
            what.append("not enforced" if d["enforcement"] == "none"
                        else f"{d['enforcement']} limits")
        parts.append(f"{d['device']} ({d['share']}: {', '.join(what) or 'device'})")
    return "; ".join(parts) or "-"


def _index_slices(items: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str, str], Any]:
    index: dict[tuple[str, str, str], Any] = {}
    for item in items:
        spec = item.get("spec") or {}
        pool = (spec.get("pool") or {}).get("name")
        for device in spec.get("devices") or []:
            attributes = device.get("attributes") or {}
            kind = (attributes.get("type") or {}).get("string")
            index[(str(spec.get("driver")), str(pool), str(device.get("name")))] = {
                "node": spec.get("nodeName"), "device": device, "type": kind}
    return index


async def _template_classes(cluster: Cluster, namespace: str, name: str) -> set[str]:
    from dra_gateway.kube.cluster.port import NotFound
    from dra_gateway.kube.resources import RESOURCE_CLAIM_TEMPLATES

    try:
        template = await cluster.get(RESOURCE_CLAIM_TEMPLATES, name, namespace=namespace)
    except NotFound:
        return set()
    requests = (((template.get("spec") or {}).get("spec") or {}).get("devices") or {}).get(
        "requests") or []
    classes: set[str] = set()
    for request in requests:
        if (request.get("exactly") or {}).get("deviceClassName"):
            classes.add(str(request["exactly"]["deviceClassName"]))
        for alternative in request.get("firstAvailable") or []:
            if alternative.get("deviceClassName"):
                classes.add(str(alternative["deviceClassName"]))
    return classes


async def create_pods(cluster: Cluster, pods: Sequence[DemoPod]) -> list[PodReport]:
    from dra_gateway.kube.cluster.port import ApiError
    from dra_gateway.kube.resources import DEVICE_CLASSES, PODS

    installed = {c["metadata"]["name"] for c in (await cluster.list(DEVICE_CLASSES)).items}
    reports = []
    for item in pods:
        try:
            created = await cluster.create(PODS, item.pod, namespace=item.namespace)
        except ApiError as exc:
            # One refused pod is reported and the others go on: it is what the user came to see.
            legacy, _ = legacy_request(item.pod, item.pod)
            refused = PodReport(item.namespace, item.name, item.source, legacy, "", [],
                                expected="bound", refused=exc.message)
            refused.problems.append(f"refused by the API: {exc.message}")
            reports.append(refused)
            continue
        legacy, rule = legacy_request(item.pod, created)
        templates = [str(e["resourceClaimTemplateName"])
                     for e in (created.get("spec") or {}).get("resourceClaims") or []
                     if e.get("resourceClaimTemplateName")]
        missing: set[str] = set()
        for template in templates:
            missing |= await _template_classes(cluster, item.namespace, template) - installed
        report = PodReport(item.namespace, item.name, item.source, legacy, rule, templates,
                           expected="pending" if missing else "bound")
        if missing:
            report.why_pending = (f"DeviceClass {', '.join(sorted(missing))} is not installed "
                                  "here: on a real cluster its vendor's DRA driver serves it")
        if not rule and not templates and legacy != "no GPU":
            # Nothing in the embedded cluster would stop such a pod from being bound.
            report.problems.append(
                f"its request {legacy} was not translated into a claim: no rule matches it, or "
                f"the webhook skips its namespace (it skips {NAMESPACE} and kube-system)")
        reports.append(report)
    return reports


# How long no pod may have been bound before the demo trusts the allocator's refusals: more
# than the allocator's retry interval (2 s), so each waiting pod was planned again after the
# last pod took its room.
SETTLE_S = 5.0
# The allocator's Event reasons for a pod that no node can hold now (a group's too).
_NO_FIT_REASONS = ("AllocationFailed", "GroupDoesNotFit")


async def wait_bound(cluster: Cluster, children: Children, reports: Sequence[PodReport],
                     deadline: float, *, settle_s: float = SETTLE_S) -> None:
    """Wait until every pod expected to be bound is, or until the allocator refused every pod
    still waiting once no pod was bound for `settle_s` (marked `never_fits`), or the
    deadline."""
    from dra_gateway.kube.resources import PODS

    waiting = {(r.namespace, r.name) for r in reports if r.expected == "bound" and not r.refused}
    by_key = {(r.namespace, r.name): r for r in reports}
    last_bound = time.monotonic()
    while waiting:
        children.check("placing pods")
        for namespace, name in sorted(waiting):
            pod = await cluster.get(PODS, name, namespace=namespace)
            if (pod.get("spec") or {}).get("nodeName"):
                waiting.discard((namespace, name))
                last_bound = time.monotonic()
        if waiting and time.monotonic() - last_bound >= settle_s:
            # The embedded cluster runs no workload: no pod ends and no room frees while the
            # demo waits, so a pod the allocator refuses after the last bind never fits here.
            # A refusal written before the last bind stands: binds only take room.
            refusals = {key: await _no_fit(cluster, *key) for key in waiting}
            if all(refusals.values()):
                for key, words in refusals.items():
                    by_key[key].never_fits = words or ""
                return
        if waiting and time.monotonic() > deadline:
            return  # the caller reports each pod still unbound
        if waiting:
            await asyncio.sleep(_POLL_S)


async def _no_fit(cluster: Cluster, namespace: str, pod: str) -> str | None:
    """The allocator's message on the pod if its latest Warning says no node can hold it."""
    last = await _last_warning_event(cluster, namespace, pod)
    if last is None or last.get("reason") not in _NO_FIT_REASONS:
        return None
    return str(last.get("message") or last.get("reason"))


async def inspect(cluster: Cluster, reports: Sequence[PodReport]) -> None:
    """Fill in each pod's node and claims, and note every way it differs from what it should."""
    from dra_gateway.kube.cluster.port import NotFound
    from dra_gateway.kube.resources import PODS, RESOURCE_CLAIMS, RESOURCE_SLICES

    slices = _index_slices((await cluster.list(RESOURCE_SLICES)).items)
    for report in reports:
        if report.refused:
            continue  # never created
        pod = await cluster.get(PODS, report.name, namespace=report.namespace)
        spec = pod.get("spec") or {}
        report.node = spec.get("nodeName")
        generated = {s.get("name"): s.get("resourceClaimName")
                     for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        for entry in spec.get("resourceClaims") or []:
            claim_name = entry.get("resourceClaimName") or generated.get(entry.get("name"))
            info: dict[str, Any] = {"name": claim_name, "podClaim": entry.get("name"),
                                    "template": entry.get("resourceClaimTemplateName"),
                                    "allocated": False, "devices": []}
            report.claims.append(info)
            if not claim_name:
                if report.expected == "bound":
                    report.problems.append(f"claim {entry.get('name')} was never created")
                continue
            try:
                claim = await cluster.get(RESOURCE_CLAIMS, claim_name,
                                          namespace=report.namespace)
            except NotFound:
                report.problems.append(f"claim {claim_name} does not exist")
                continue
            info["uid"] = claim["metadata"].get("uid")
            info["allocated"] = bool((claim.get("status") or {}).get("allocation"))
            info["devices"] = claim_devices(claim, slices)
            if report.expected == "pending":
                continue
            if not info["allocated"]:
                report.problems.append(f"claim {claim_name} is not allocated")
            elif not info["devices"]:
                report.problems.append(f"claim {claim_name} is allocated no device")
            for device in info["devices"]:
                if device["node"] is None:
                    report.problems.append(f"claim {claim_name}: device {device['pool']}/"
                                           f"{device['device']} is published by no slice")
                elif report.node and device["node"] != report.node:
                    report.problems.append(f"claim {claim_name}: device {device['device']} is "
                                           f"on {device['node']}, the pod on {report.node}")
        if report.expected == "bound" and not report.node:
            gates = [g.get("name") for g in spec.get("schedulingGates") or []]
            report.problems.insert(0, "not bound" + (f" (still gated by {', '.join(gates)})"
                                                     if gates else ""))
            reason = await _latest_warning(cluster, report.namespace, report.name)
            if reason:
                report.problems.insert(1, reason)
        if report.expected == "pending" and report.node:
            report.problems.append(f"bound to {report.node} although {report.why_pending}")


async def _last_warning_event(cluster: Cluster, namespace: str,
                              pod: str) -> Mapping[str, Any] | None:
    """The last Warning event about a pod (the allocator says there why it cannot place it)."""
    from dra_gateway.kube.resources import EVENTS

    events = [e for e in (await cluster.list(EVENTS, namespace=namespace)).items
              if e.get("type") == "Warning"
              and (e.get("involvedObject") or {}).get("kind") == "Pod"
              and (e.get("involvedObject") or {}).get("name") == pod]
    if not events:
        return None
    return max(events, key=lambda e: str(e.get("lastTimestamp") or e.get("eventTime") or ""))


async def _latest_warning(cluster: Cluster, namespace: str, pod: str) -> str | None:
    """The last Warning event about a pod, as a line: its source, reason and message."""
    last = await _last_warning_event(cluster, namespace, pod)
    if last is None:
        return None
    source = (last.get("source") or {}).get("component") or last.get("reportingComponent")
    return f"{source or 'event'}: {last.get('reason')}: {last.get('message')}"


def _cdi_env(cdi_dir: Path) -> dict[str, list[str]]:
    """Environment per qualified CDI device name (`vendor/class=name`) of the specs in a dir."""
    env: dict[str, list[str]] = {}
    for path in sorted(cdi_dir.glob("*.json")):
        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        common = list((spec.get("containerEdits") or {}).get("env") or [])
        for device in spec.get("devices") or []:
            edits = device.get("containerEdits") or {}
            env[f"{spec.get('kind')}={device.get('name')}"] = [*common,
                                                                *(edits.get("env") or [])]
    return env


async def prepare_on_nodes(layout: Layout, reports: Sequence[PodReport]) -> None:
    """Play the kubelet: ask each node's plugin to prepare the claims of the pods bound there.

    Over the plugin's DRA gRPC socket, as the kubelet does before starting a container; the
    CDI specs the plugin writes say what each container would see (devices and limits).
    """
    import grpc
    import grpc.aio

    from dra_gateway.kube import names
    from dra_gateway.node_plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc
    from dra_gateway.node_plugin.server import dra_socket_path

    simulated = {node for node, _ in NODES}
    for node in sorted(simulated):
        work = [(r, c) for r in reports if r.node == node for c in r.claims
                if c["allocated"] and c.get("uid")
                and any(d["driver"] == names.DRIVER for d in c["devices"])]
        if not work:
            continue
        socket_path = dra_socket_path(layout.node(node) / "plugins")
        request = dra_v1_pb2.NodePrepareResourcesRequest(claims=[
            dra_v1_pb2.Claim(namespace=r.namespace, name=c["name"], uid=c["uid"])
            for r, c in work])
        try:
            async with grpc.aio.insecure_channel(f"unix://{socket_path}") as channel:
                response = await dra_v1_pb2_grpc.DRAPluginStub(channel).NodePrepareResources(
                    request, timeout=30)
        except grpc.aio.AioRpcError as exc:
            raise DemoError("preparing claims on the nodes", f"NodePrepareResources on "
                            f"{socket_path} failed: {exc.code().name}: {exc.details()}",
                            log=layout.logs / f"node-plugin-{node}.log") from None
        env = _cdi_env(layout.node(node) / "cdi")
        for report, claim in work:
            result = response.claims[claim["uid"]]
            ids = [i for d in result.devices for i in d.cdi_device_ids]
            claim["prepared"] = {"error": result.error or None, "cdiDevices": ids,
                                 # Devices of one request carry the same environment.
                                 "env": list(dict.fromkeys(e for i in ids
                                                           for e in env.get(i, [])))}
            if result.error:
                report.problems.append(f"node plugin on {node} could not prepare claim "
                                       f"{claim['name']}: {result.error}")
            elif not ids:
                report.problems.append(f"node plugin on {node} prepared claim {claim['name']} "
                                       "without any CDI device")


async def show_template(cluster: Cluster, reports: Sequence[PodReport]
                        ) -> tuple[dict[str, Any] | None, str | None]:
    """One translated pod's ResourceClaimTemplate: a HAMi share first (its container shows
    HAMi-core's memory and compute limits), else any shared (fractional) one."""
    from dra_gateway.kube.resources import RESOURCE_CLAIM_TEMPLATES

    candidates = [r for r in reports if r.rule and r.templates and r.node]
    candidates.sort(key=lambda r: (r.rule != "hami", not any(
        d["share"] == "shared" for c in r.claims for d in c["devices"])))
    for report in candidates:
        template = await cluster.get(RESOURCE_CLAIM_TEMPLATES, report.templates[0],
                                     namespace=report.namespace)
        meta = template.get("metadata") or {}
        for noisy in ("uid", "resourceVersion", "creationTimestamp", "managedFields",
                      "generation"):
            meta.pop(noisy, None)
        return template, f"{report.namespace}/{report.name}"
    return None, None

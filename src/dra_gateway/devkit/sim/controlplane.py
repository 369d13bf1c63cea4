"""The control-plane parts the embedded default lacks: claims from templates, and binding.

On a real cluster, kube-controller-manager's ResourceClaim controller creates each pod's claims
from its ResourceClaimTemplates and drops finished pods from `reservedFor`, and kube-scheduler
binds pods. The in-memory cluster has neither, so `dra-gateway cluster serve` runs this stand-in
beside it and a pod flows as it would in production: webhook, claim from template, allocator,
binding. It works only through the `Cluster` port, as the upstream controllers work through the
API. It must never run against a real cluster (it would race the real controllers).

Deliberate simplifications (each is the upstream behaviour the project does not depend on):
- the scheduler never allocates a claim itself: a pod waits until every claim is allocated
  (the gateway's allocator does that), then goes to the first node, by name, that matches the
  pod's `nodeSelector`, every allocation's `nodeSelector` and is not unschedulable; taints,
  affinity and resources are not considered;
- the scheduler plays a 1.36+ kube-scheduler with binding conditions on
  (`DRADeviceBindingConditions` with `DRAResourceClaimDeviceStatus`, beta and on since 1.36):
  adding the pod to `reservedFor` also fills `allocation.allocationTimestamp` when it is
  missing, which the API server refuses for an allocation already stored, so a claim allocated
  without that field never lets its pod bind, as on a real cluster. `binding_conditions=False`
  plays 1.34 and 1.35, where the field is left alone;
- binding patches `spec.nodeName` (the in-memory cluster allows it; a real API server requires
  the `binding` subresource) and marks the pod `PodScheduled`; then, playing the kubelet as
  KWOK does, the pod runs: phase Running, its containers started and ready (a pod a client
  finished meanwhile stays finished). Nothing runs a container, and nothing ends a pod;
- claims are never deallocated here (upstream only deallocates claims carrying the reserved
  `resource.kubernetes.io/delete-protection` finalizer, which the gateway does not use).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from dra_gateway.kube import objects
from dra_gateway.kube.cluster.port import (
    ApiError,
    BadRequest,
    Cluster,
    Conflict,
    Expired,
    Invalid,
    NotFound,
    Object,
)
from dra_gateway.kube.nodeselectors import node_selector_matches
from dra_gateway.kube.resources import (
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    ResourceType,
)

log = logging.getLogger(__name__)

POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
# The scheduler a pod names when it names none; pods of any other are not this one's to bind.
DEFAULT_SCHEDULER = "default-scheduler"
# Upstream leaves room for "-" and the 5-character suffix in a 63-character name.
_MAX_GENERATE_BASE = 57
_DONE_PHASES = frozenset({"Succeeded", "Failed"})

Key = tuple[str, str, str]  # (kind of work: "pod" | "claim", namespace, name)


def claim_generate_name(pod_name: str, claim_name: str) -> str:
    """The generateName upstream gives a pod's claim: both parts cut in proportion to 57."""
    base = f"{pod_name}-{claim_name}"
    if len(base) > _MAX_GENERATE_BASE:
        base = (pod_name[: len(pod_name) * _MAX_GENERATE_BASE // len(base)] + "-"
                + claim_name[: len(claim_name) * _MAX_GENERATE_BASE // len(base)])
    return base + "-"


class SimulatedControllers:
    """The ResourceClaim controller and a minimal scheduler over one `Cluster`.

    Run `await control_plane.run()` in a task (cancel it to stop) or use `running()`.
    `retry_delay` is how long failed work waits before it is tried again; `binding_conditions`
    whether binding fills a missing `allocationTimestamp` (Kubernetes 1.36 and later).
    """

    def __init__(self, cluster: Cluster, *, retry_delay: float = 0.5,
                 watch_timeout: float = 300.0, binding_conditions: bool = True) -> None:
        self.cluster = cluster
        self.binding_conditions = binding_conditions
        self.retry_delay = retry_delay
        self.watch_timeout = watch_timeout
        self._pods: dict[tuple[str, str], Object] = {}
        self._claims: dict[tuple[str, str], Object] = {}
        self._nodes: dict[str, Object] = {}
        self._queue: asyncio.Queue[Key] = asyncio.Queue()
        self._queued: set[Key] = set()
        self._retries: set[asyncio.TimerHandle] = set()

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[SimulatedControllers]:
        task = asyncio.create_task(self.run(), name="dra-gateway control plane")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._follow(NODES, self._on_node))
                group.create_task(self._follow(RESOURCE_CLAIMS, self._on_claim))
                group.create_task(self._follow(RESOURCE_CLAIM_TEMPLATES, self._on_template))
                group.create_task(self._follow(PODS, self._on_pod))
                group.create_task(self._work())
        finally:
            for handle in self._retries:
                handle.cancel()
            self._retries.clear()

    # Watching ---------------------------------------------------------------------------------

    async def _follow(self, rt: ResourceType, handle: Callable[[Object, bool], None]) -> None:
        """List, then watch from the list's version; relist on Expired or failure."""
        resource_version: str | None = None
        while True:
            try:
                if resource_version is None:
                    listed = await self.cluster.list(rt)
                    for item in listed.items:
                        handle(item, False)
                    resource_version = listed.resource_version
                async for event in self.cluster.watch(rt, resource_version=resource_version,
                                                      timeout_seconds=self.watch_timeout):
                    resource_version = (objects.resource_version(event.object)
                                        or resource_version)
                    if event.type != "BOOKMARK":
                        handle(event.object, event.type == "DELETED")
            except Expired:
                resource_version = None
            except ApiError as exc:
                log.warning("control plane: watching %s failed (%s); relisting", rt.plural,
                            exc.message)
                resource_version = None
                await asyncio.sleep(self.retry_delay)

    def _enqueue(self, key: Key) -> None:
        if key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def _retry(self, key: Key) -> None:
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._retries.discard(handle)
            self._enqueue(key)

        handle = loop.call_later(self.retry_delay, fire)
        self._retries.add(handle)

    def _on_pod(self, pod: Object, deleted: bool) -> None:
        key = objects.namespace_name(pod)
        if deleted:
            self._pods.pop(key, None)
            self._enqueue_reserving(key[0], objects.uid(pod))
            return
        self._pods[key] = pod
        if (pod.get("status") or {}).get("phase") in _DONE_PHASES:
            self._enqueue_reserving(key[0], objects.uid(pod))
        self._enqueue(("pod", *key))

    def _enqueue_reserving(self, namespace: str, pod_uid: str) -> None:
        for (ns, name), claim in self._claims.items():
            reserved = (claim.get("status") or {}).get("reservedFor") or []
            if ns == namespace and any(r.get("uid") == pod_uid for r in reserved):
                self._enqueue(("claim", ns, name))

    def _on_claim(self, claim: Object, deleted: bool) -> None:
        key = objects.namespace_name(claim)
        if deleted:
            self._claims.pop(key, None)
        else:
            self._claims[key] = claim
            if (claim.get("status") or {}).get("reservedFor"):
                self._enqueue(("claim", *key))
        # The pods using this claim may now be schedulable (or blocked).
        owners = {ref.get("uid") for ref in objects.owner_references(claim)
                  if ref.get("kind") == "Pod"}
        for (ns, name), pod in self._pods.items():
            if ns != key[0]:
                continue
            direct = any(e.get("resourceClaimName") == key[1]
                         for e in (pod.get("spec") or {}).get("resourceClaims") or [])
            if direct or objects.uid(pod) in owners:
                self._enqueue(("pod", ns, name))

    def _on_template(self, template: Object, deleted: bool) -> None:
        if deleted:
            return
        template_ns, template_name = objects.namespace_name(template)
        for (ns, name), pod in self._pods.items():
            if ns == template_ns and any(
                    e.get("resourceClaimTemplateName") == template_name
                    for e in (pod.get("spec") or {}).get("resourceClaims") or []):
                self._enqueue(("pod", ns, name))

    def _on_node(self, node: Object, deleted: bool) -> None:
        name = objects.name(node)
        if deleted:
            self._nodes.pop(name, None)
            return
        self._nodes[name] = node
        for (ns, pod_name), pod in self._pods.items():
            if not (pod.get("spec") or {}).get("nodeName"):
                self._enqueue(("pod", ns, pod_name))

    # Reconciling ------------------------------------------------------------------------------

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            kind, namespace, name = key
            try:
                if kind == "pod":
                    await self._reconcile_pod(namespace, name)
                else:
                    await self._reconcile_claim(namespace, name)
            except (Conflict, NotFound):
                self._retry(key)  # something moved underneath: look again shortly
            except ApiError as exc:
                log.warning("control plane: %s %s/%s: %s; retrying", kind, namespace, name,
                            exc.message)
                self._retry(key)

    async def _reconcile_pod(self, namespace: str, name: str) -> None:
        try:
            pod = await self.cluster.get(PODS, name, namespace=namespace)
        except NotFound:
            return
        meta, spec = pod["metadata"], pod.get("spec") or {}
        if meta.get("deletionTimestamp") or (pod.get("status") or {}).get("phase") in \
                _DONE_PHASES:
            return
        statuses = list((pod.get("status") or {}).get("resourceClaimStatuses") or [])
        recorded = {s.get("name") for s in statuses}
        created = False
        for entry in spec.get("resourceClaims") or []:
            if entry.get("resourceClaimTemplateName") and entry.get("name") not in recorded:
                claim_name = await self._claim_from_template(pod, entry)
                if claim_name is None:
                    return  # the template is missing: its creation will bring us back
                statuses.append({"name": entry["name"], "resourceClaimName": claim_name})
                created = True
        if created:
            pod = await self.cluster.patch(
                PODS, name, {"status": {"resourceClaimStatuses": statuses}},
                namespace=namespace, subresource="status")
        await self._schedule(pod)

    async def _claim_from_template(self, pod: Object, entry: Mapping[str, Any]) -> str | None:
        meta = pod["metadata"]
        namespace, pod_uid = meta["namespace"], meta["uid"]
        # An earlier attempt may have created the claim before recording it: adopt it.
        for (ns, name), claim in self._claims.items():
            if (ns == namespace
                    and objects.annotations(claim).get(POD_CLAIM_NAME_ANNOTATION)
                    == entry["name"]
                    and any(ref.get("uid") == pod_uid and ref.get("controller")
                            for ref in objects.owner_references(claim))):
                return name
        try:
            template = await self.cluster.get(RESOURCE_CLAIM_TEMPLATES,
                                              entry["resourceClaimTemplateName"],
                                              namespace=namespace)
        except NotFound:
            log.info("control plane: pod %s/%s waits for ResourceClaimTemplate %s", namespace,
                     meta["name"], entry["resourceClaimTemplateName"])
            return None
        template_spec = template.get("spec") or {}
        template_meta = template_spec.get("metadata") or {}
        claim = {
            "apiVersion": RESOURCE_CLAIMS.api_version, "kind": RESOURCE_CLAIMS.kind,
            "metadata": {
                "generateName": claim_generate_name(meta["name"], entry["name"]),
                "namespace": namespace,
                "labels": dict(template_meta.get("labels") or {}),
                "annotations": {**(template_meta.get("annotations") or {}),
                                POD_CLAIM_NAME_ANNOTATION: entry["name"]},
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                     "uid": pod_uid, "controller": True,
                                     "blockOwnerDeletion": True}],
            },
            "spec": template_spec.get("spec") or {},
        }
        made = await self.cluster.create(RESOURCE_CLAIMS, claim, namespace=namespace)
        self._claims[(namespace, made["metadata"]["name"])] = made
        return str(made["metadata"]["name"])

    async def _schedule(self, pod: Object) -> None:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        if spec.get("nodeName") or spec.get("schedulingGates"):
            return
        if spec.get("schedulerName", DEFAULT_SCHEDULER) != DEFAULT_SCHEDULER:
            return  # another scheduler's pod: kube-scheduler leaves it alone too
        namespace = meta["namespace"]
        generated = {s.get("name"): s.get("resourceClaimName")
                     for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []}
        claims: list[Object] = []
        for entry in spec.get("resourceClaims") or []:
            claim_name = entry.get("resourceClaimName") or generated.get(entry.get("name"))
            if not claim_name:
                return  # not created yet
            try:
                claim = await self.cluster.get(RESOURCE_CLAIMS, claim_name, namespace=namespace)
            except NotFound:
                return
            if claim["metadata"].get("deletionTimestamp") or not (
                    claim.get("status") or {}).get("allocation"):
                return  # waits for the allocator
            claims.append(claim)
        wanted_labels = spec.get("nodeSelector") or {}
        node = next((n for _, n in sorted(self._nodes.items())
                     if not (n.get("spec") or {}).get("unschedulable")
                     and all(objects.labels(n).get(k) == v for k, v in wanted_labels.items())
                     and all(node_selector_matches(c["status"]["allocation"].get("nodeSelector"),
                                                   name=objects.name(n), labels=objects.labels(n))
                             for c in claims)), None)
        if node is None:
            return  # a new node or allocation brings the pod back
        consumer = {"resource": "pods", "name": meta["name"], "uid": meta["uid"]}
        for claim in claims:
            status = claim["status"]
            reserved = list(status.get("reservedFor") or [])
            if not any(r.get("uid") == meta["uid"] for r in reserved):
                if self.binding_conditions and not status["allocation"].get(
                        "allocationTimestamp"):
                    # As kube-scheduler's bindClaim does (metav1.Time: seconds, UTC).
                    status["allocation"] = {
                        **status["allocation"],
                        "allocationTimestamp": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}
                status["reservedFor"] = [*reserved, consumer]
                await self.cluster.update(RESOURCE_CLAIMS, claim, namespace=namespace,
                                          subresource="status")
        node_name = node["metadata"]["name"]
        await self.cluster.patch(PODS, meta["name"], {"spec": {"nodeName": node_name}},
                                 namespace=namespace)
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        await self.cluster.patch(
            PODS, meta["name"],
            {"status": {"conditions": [{"type": "PodScheduled", "status": "True",
                                        "lastTransitionTime": now,
                                        "reason": None, "message": None}]}},
            namespace=namespace, subresource="status", patch_type="strategic")
        log.info("control plane: bound pod %s/%s to %s", namespace, meta["name"], node_name)
        await self._start(pod, node, now)

    async def _start(self, pod: Object, node: Object, now: str) -> None:
        """Play the kubelet, as KWOK does: a bound pod runs, its containers ready. Only a pod
        still Pending: one a client marked finished meanwhile stays as it was written."""
        meta, spec = pod["metadata"], pod.get("spec") or {}
        addresses = (node.get("status") or {}).get("addresses") or []
        host_ip = next((a.get("address") for a in addresses if a.get("type") == "InternalIP"),
                       None)
        status: dict[str, Any] = {
            "phase": "Running", "startTime": now,
            "containerStatuses": [
                {"name": c.get("name"), "image": c.get("image", ""), "imageID": "",
                 "ready": True, "started": True, "restartCount": 0,
                 "state": {"running": {"startedAt": now}}}
                for c in spec.get("containers") or []]}
        if host_ip:
            status["hostIP"] = host_ip
            status["hostIPs"] = [{"ip": host_ip}]
        patch = [{"op": "test", "path": "/status/phase", "value": "Pending"},
                 *({"op": "add", "path": f"/status/{key}", "value": value}
                   for key, value in status.items())]
        try:
            await self.cluster.patch(PODS, meta["name"], patch, namespace=meta["namespace"],
                                     subresource="status", patch_type="json")
        except (Invalid, BadRequest):
            return  # no longer Pending: finished or failed meanwhile
        # Merged by type: the conditions others wrote (the allocator's) stay.
        await self.cluster.patch(
            PODS, meta["name"],
            {"status": {"conditions": [{"type": kind, "status": "True",
                                        "lastTransitionTime": now}
                                       for kind in ("PodReadyToStartContainers", "Initialized",
                                                    "ContainersReady", "Ready")]}},
            namespace=meta["namespace"], subresource="status", patch_type="strategic")

    async def _reconcile_claim(self, namespace: str, name: str) -> None:
        """Drop pods that are gone, replaced or done from the claim's reservedFor."""
        try:
            claim = await self.cluster.get(RESOURCE_CLAIMS, name, namespace=namespace)
        except NotFound:
            return
        reserved = (claim.get("status") or {}).get("reservedFor") or []
        keep = []
        for consumer in reserved:
            if consumer.get("resource") != "pods" or consumer.get("apiGroup"):
                keep.append(consumer)
                continue
            try:
                pod = await self.cluster.get(PODS, str(consumer.get("name")),
                                             namespace=namespace)
            except NotFound:
                continue
            if (pod["metadata"].get("uid") == consumer.get("uid")
                    and (pod.get("status") or {}).get("phase") not in _DONE_PHASES):
                keep.append(consumer)
        if len(keep) != len(reserved):
            status = dict(claim["status"])
            if keep:
                status["reservedFor"] = keep
            else:
                status.pop("reservedFor", None)
            claim["status"] = status
            await self.cluster.update(RESOURCE_CLAIMS, claim, namespace=namespace,
                                      subresource="status")

"""End to end on the served cluster: the allocator reaches `cluster serve` by kubernetes-asyncio.

The example pods are translated by the real translator (templates created, patch applied), the
node plugin's pure builders publish the demo nodes' devices, and the test plays the built-in
claim controller (claims owned by the pod, recorded in the pod's status). The allocator runs as
in production, behind its Lease, and everything it does is checked from the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
import yaml
from testkit import eventually

from dra_gateway.allocator.controller import ControllerSettings
from dra_gateway.allocator.metrics import Metrics
from dra_gateway.allocator.process import run_allocator
from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.devkit.sim.server import serve, write_kubeconfig
from dra_gateway.kube import names
from dra_gateway.kube.cluster.connect import connect
from dra_gateway.kube.cluster.port import AlreadyExists, Cluster, Object
from dra_gateway.kube.resources import (
    DEVICE_CLASSES,
    LEASES,
    NODES,
    PODS,
    RESOURCE_CLAIM_TEMPLATES,
    RESOURCE_CLAIMS,
    RESOURCE_SLICES,
)
from dra_gateway.kube.runtime.leader import LeaseSettings
from dra_gateway.node_plugin.deviceclasses import device_classes
from dra_gateway.node_plugin.devices import DeviceOptions, devices_of
from dra_gateway.node_plugin.inventory import load_inventory
from dra_gateway.node_plugin.publish import build_slices
from dra_gateway.translator.manifests import pod_specs
from dra_gateway.translator.rules import load_rules
from dra_gateway.translator.translate import translate

from .conftest import check_no_overcommit, is_ungated

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
LEASE_NAMESPACE = "dra-gateway"
SETTINGS = ControllerSettings(base_delay=0.01, max_delay=0.5, retry_unplaceable_after=0.05,
                              resync_period=5.0)

pytestmark = pytest.mark.slow


def lease(identity: str) -> LeaseSettings:
    return LeaseSettings(identity=identity, namespace=LEASE_NAMESPACE, lease_duration=1.5,
                         renew_deadline=1.0, retry_period=0.1)


def example_pods() -> list[Object]:
    """Pods of the examples: bare pods, and one pod per workload template."""
    pods: list[Object] = []
    for name in ("hami.yaml", "whole-gpu.yaml", "koordinator.yaml", "mixed.yaml"):
        for document in yaml.safe_load_all((EXAMPLES / "pods" / name).read_text()):
            if not document:
                continue
            namespace = document["metadata"].get("namespace", "default")
            for n, (_path, pod_like) in enumerate(pod_specs(document)):
                spec = copy.deepcopy(pod_like["spec"])
                _quantities_as_strings(spec)
                template_meta = pod_like.get("metadata") or {}
                if document["kind"] == "Pod":
                    pod_name = document["metadata"]["name"]
                else:
                    pod_name = f"{document['metadata']['name']}-{n}"
                pods.append({"apiVersion": "v1", "kind": "Pod",
                             "metadata": {"name": pod_name[:63].strip("-"),
                                          "namespace": namespace,
                                          "labels": dict(template_meta.get("labels") or {}),
                                          "annotations": dict(
                                              template_meta.get("annotations") or {})},
                             "spec": spec})
    return pods


def _quantities_as_strings(spec: Object) -> None:
    """YAML reads `nvidia.com/gpu: 1` as a number; the API server serves quantities as text."""
    for key in ("containers", "initContainers"):
        for container in spec.get(key) or []:
            for part in ("limits", "requests"):
                amounts = (container.get("resources") or {}).get(part) or {}
                for name, value in amounts.items():
                    amounts[name] = str(value)


@dataclass
class Cluster_:
    memory: MemoryCluster
    api: Cluster  # kubernetes-asyncio over HTTP
    rules: Any = field(default_factory=load_rules)

    async def seed(self) -> None:
        await self.memory.load(doc for doc in yaml.safe_load_all(
            (EXAMPLES / "demo" / "seed.yaml").read_text()) if doc)
        for obj in device_classes():
            await self.api.create(DEVICE_CLASSES, obj)
        for node_name, inventory in (("gpu-h100-1", "gpu-h100-1.yaml"),
                                     ("gpu-a100-1", "gpu-a100-1.yaml")):
            node = await self.api.get(NODES, node_name)
            devices = devices_of(load_inventory(EXAMPLES / "demo" / inventory),
                                 DeviceOptions(default_sharing="shared", consumable_capacity=True))
            for obj in build_slices(node_name=node_name, driver=names.DRIVER, devices=devices,
                                    generation=1, node_uid=node["metadata"]["uid"]):
                await self.api.create(RESOURCE_SLICES, obj)

    async def submit(self, pod: Object) -> Object:
        """What the webhook and the claim controller do for a new pod."""
        plan = translate(pod, self.rules)
        assert plan.refusal is None, plan.refusal
        namespace = pod["metadata"]["namespace"]
        for template in plan.templates:
            kubernetes_validate.validate(template, "1.34", strict=True)
            with contextlib.suppress(AlreadyExists):
                await self.api.create(RESOURCE_CLAIM_TEMPLATES, template, namespace=namespace)
        mutated = jsonpatch.apply_patch(pod, plan.patch) if plan.patch else pod
        created = await self.api.create(PODS, mutated, namespace=namespace)
        await self.make_claims(created)
        return created

    async def make_claims(self, pod: Object) -> None:
        """Play the claim controller: a claim per template entry, then the pod's statuses."""
        namespace = pod["metadata"]["namespace"]
        statuses = []
        for entry in pod["spec"].get("resourceClaims") or []:
            template_name = entry.get("resourceClaimTemplateName")
            if not template_name:
                continue
            template = await self.api.get(RESOURCE_CLAIM_TEMPLATES, template_name,
                                          namespace=namespace)
            claim = await self.api.create(RESOURCE_CLAIMS, {
                "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {
                    "generateName": f"{pod['metadata']['name']}-{entry['name']}-",
                    "namespace": namespace,
                    "labels": template["spec"].get("metadata", {}).get("labels") or {},
                    "annotations": {names.K8S_POD_CLAIM_NAME_ANNOTATION: entry["name"]},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Pod",
                                         "name": pod["metadata"]["name"],
                                         "uid": pod["metadata"]["uid"], "controller": True,
                                         "blockOwnerDeletion": True}]},
                "spec": template["spec"]["spec"]}, namespace=namespace)
            statuses.append({"name": entry["name"],
                             "resourceClaimName": claim["metadata"]["name"]})
        if statuses:
            await self.api.patch(PODS, pod["metadata"]["name"],
                                 {"status": {"resourceClaimStatuses": statuses}},
                                 namespace=namespace, subresource="status")

    def claims_of(self, pod: Object) -> list[Object]:
        current = self.pod(pod)
        wanted = {s["resourceClaimName"] for s in
                  ((current or pod).get("status") or {}).get("resourceClaimStatuses") or []}
        return [c for c in self.memory.objects(RESOURCE_CLAIMS)
                if c["metadata"]["name"] in wanted]

    def pod(self, pod: Object) -> Object | None:
        for obj in self.memory.objects(PODS):
            if obj["metadata"]["uid"] == pod["metadata"]["uid"]:
                return obj
        return None

    def ungated(self, pod: Object) -> bool:
        current = self.pod(pod)
        return current is not None and is_ungated(current)

    def check(self) -> None:
        check_no_overcommit(self.memory.objects(RESOURCE_CLAIMS),
                            self.memory.objects(RESOURCE_SLICES))


class GateOrder:
    """Records, by resourceVersion, when each claim got its allocation and each pod its gate
    removed: the gate must go after every one of the pod's claims is allocated."""

    def __init__(self, memory: MemoryCluster) -> None:
        self.memory = memory
        self.allocated_at: dict[str, int] = {}
        self.ungated_at: dict[str, int] = {}
        self.claims_of: dict[str, set[str]] = {}
        self.gated: set[str] = set()

    async def run(self) -> None:
        await asyncio.gather(self._claims(), self._pods())

    async def _claims(self) -> None:
        async for event in self.memory.watch(RESOURCE_CLAIMS, resource_version="0"):
            claim = event.object
            if (claim.get("status") or {}).get("allocation"):
                self.allocated_at.setdefault(claim["metadata"]["uid"],
                                             int(claim["metadata"]["resourceVersion"]))

    async def _pods(self) -> None:
        async for event in self.memory.watch(PODS, resource_version="0"):
            pod = event.object
            uid = pod["metadata"]["uid"]
            names_ = {s["resourceClaimName"] for s in
                      (pod.get("status") or {}).get("resourceClaimStatuses") or []}
            if names_:
                self.claims_of[uid] = names_
            if not is_ungated(pod):
                self.gated.add(uid)
            elif event.type != "DELETED" and uid in self.gated and uid not in self.ungated_at:
                self.ungated_at[uid] = int(pod["metadata"]["resourceVersion"])

    def check(self) -> None:
        by_name = {c["metadata"]["name"]: c["metadata"]["uid"]
                   for c in self.memory.objects(RESOURCE_CLAIMS)}
        for pod_uid, ungated in self.ungated_at.items():
            for claim_name in self.claims_of.get(pod_uid, set()):
                claim_uid = by_name.get(claim_name)
                if claim_uid is None:
                    continue  # released and collected since: checked while it lived
                assert claim_uid in self.allocated_at, f"{claim_name} never allocated"
                assert self.allocated_at[claim_uid] < ungated, (
                    f"gate removed at {ungated} before {claim_name} was allocated at "
                    f"{self.allocated_at[claim_uid]}")


@contextlib.asynccontextmanager
async def served(tmp_path: Path) -> AsyncIterator[Cluster_]:
    memory = MemoryCluster()
    async with serve(memory, token="e2e-token", admission=False) as server:
        kubeconfig = tmp_path / "kubeconfig"
        write_kubeconfig(kubeconfig, server.url, token="e2e-token")
        api = await connect("kube", str(kubeconfig))
        try:
            yield Cluster_(memory, api)
        finally:
            await api.close()
            await memory.close()


@contextlib.asynccontextmanager
async def allocator(tmp_path: Path, identity: str,
                    metrics: Metrics | None = None) -> AsyncIterator[asyncio.Task[None]]:
    """An allocator replica with its own connection to the served API, like a process."""
    kubeconfig = tmp_path / "kubeconfig"
    api = await connect("kube", str(kubeconfig))
    stop = asyncio.Event()
    task = asyncio.create_task(run_allocator(
        api, namespace=LEASE_NAMESPACE, identity=identity, settings=SETTINGS,
        lease=lease(identity), metrics=metrics, stop=stop), name=f"allocator-{identity}")
    try:
        yield task
    finally:
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        await api.close()


@contextlib.asynccontextmanager
async def background(coro: Any) -> AsyncIterator[None]:
    task = asyncio.create_task(coro)
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


def by_name(pods: list[Object], name: str) -> Object:
    return next(p for p in pods if p["metadata"]["name"] == name)


async def test_translated_pods_are_allocated_ungated_released_and_rebuilt_after_restart(
        tmp_path: Path) -> None:
    async with served(tmp_path) as cluster:
        await cluster.seed()
        order = GateOrder(cluster.memory)
        async with background(order.run()):
            async with allocator(tmp_path, "replica-a"):
                submitted = [await cluster.submit(pod) for pod in example_pods()]
                gated = [p for p in submitted
                         if not is_ungated(p)]
                assert {p["metadata"]["name"] for p in gated} >= {"llm-serve", "train-resnet"}
                await eventually(lambda: all(cluster.ungated(p) for p in gated), within=20)
                for pod in gated:
                    claims = cluster.claims_of(pod)
                    assert claims, pod["metadata"]["name"]
                    for claim in claims:
                        assert claim["status"]["allocation"]
                        assert names.FINALIZER in claim["metadata"]["finalizers"]
                        kubernetes_validate.validate(claim, "1.34", strict=True)
                cluster.check()
                llm = by_name(gated, "llm-serve")
                (llm_claim,) = cluster.claims_of(llm)
                result = llm_claim["status"]["allocation"]["devices"]["results"][0]
                assert result["consumedCapacity"]["memory"] == "8000Mi"
                whole = by_name(gated, "train-resnet")
                (whole_claim,) = cluster.claims_of(whole)
                assert len(whole_claim["status"]["allocation"]["devices"]["results"]) == 2

                # The pod goes: its claims are released, then collected.
                await cluster.api.delete(PODS, "train-resnet", namespace="ml")
                await eventually(lambda: not cluster.claims_of(whole) and not [
                    c for c in cluster.memory.objects(RESOURCE_CLAIMS)
                    if c["metadata"]["uid"] == whole_claim["metadata"]["uid"]])

            # Allocator down: a pod finishes and a new one arrives meanwhile.
            await cluster.api.patch(PODS, "llm-serve", {"status": {"phase": "Succeeded"}},
                                    namespace="inference", subresource="status")
            again = copy.deepcopy(by_name(example_pods(), "train-resnet"))
            again["metadata"]["name"] = "train-resnet-2"
            late = await cluster.submit(again)
            await asyncio.sleep(0.2)
            assert not cluster.ungated(late)

            # A new replica rebuilds from the API alone: releases and allocates what it finds.
            async with allocator(tmp_path, "replica-b"):
                await eventually(lambda: cluster.ungated(late), within=20)
                await eventually(lambda: all(
                    not (c.get("status") or {}).get("allocation")
                    and names.FINALIZER not in (c["metadata"].get("finalizers") or [])
                    for c in cluster.claims_of(llm)), within=20)
                cluster.check()
            order.check()
            assert order.ungated_at


async def test_of_two_replicas_one_leads_and_the_other_takes_over_when_it_stops(
        tmp_path: Path) -> None:
    async with served(tmp_path) as cluster:
        await cluster.seed()
        metrics = {"a": Metrics(), "b": Metrics()}
        async with contextlib.AsyncExitStack() as stack:
            replicas = {
                name: await stack.enter_async_context(
                    allocator(tmp_path, f"replica-{name}", metrics[name]))
                for name in ("a", "b")}
            first = await cluster.submit(by_name(example_pods(), "llm-serve"))
            await eventually(lambda: cluster.ungated(first), within=20)
            leaders = [n for n, m in metrics.items() if m.leader._value.get() == 1]
            assert len(leaders) == 1
            leader = leaders[0]
            held = await cluster.api.get(LEASES, "dra-gateway-allocator",
                                         namespace=LEASE_NAMESPACE)
            assert held["spec"]["holderIdentity"] == f"replica-{leader}"

            replicas[leader].cancel()  # the leader goes away (its Lease is released)
            await asyncio.gather(replicas[leader], return_exceptions=True)
            other = "b" if leader == "a" else "a"
            second = await cluster.submit(by_name(example_pods(), "train-resnet"))
            await eventually(lambda: cluster.ungated(second), within=20)
            assert metrics[other].leader._value.get() == 1
            held = await cluster.api.get(LEASES, "dra-gateway-allocator",
                                         namespace=LEASE_NAMESPACE)
            assert held["spec"]["holderIdentity"] == f"replica-{other}"
            assert held["spec"]["leaseTransitions"] >= 1
            cluster.check()

"""Helpers for the `dra-gateway migrate` tests: objects as `kubectl get -o yaml` writes them,
dump files, the GPUQuota CRD's schema, and an in-memory cluster served over HTTP with a
kubeconfig (on a thread of its own, since the command runs its own event loop)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import jsonschema
import pytest
import yaml

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.devkit.sim.server import serve
from dra_gateway.kube import names
from dra_gateway.policy.models import parse_quota

ROOT = Path(__file__).resolve().parents[2]
CRD = ROOT / "helm" / "dra-gateway" / "crds" / "gpuquotas.dra-gateway.io.yaml"
_T = TypeVar("_T")


def gpu_quota_schema() -> dict[str, Any]:
    (version,) = yaml.safe_load(CRD.read_text())["spec"]["versions"]
    return dict(version["schema"]["openAPIV3Schema"])


def assert_valid_gpu_quota(obj: Mapping[str, Any]) -> None:
    """As the API server (the CRD's schema) and the gateway (its model) would check it."""
    jsonschema.validate(dict(obj), gpu_quota_schema())
    parse_quota(dict(obj))


def namespace(name: str, mode: str | None = None, *, opt_out: bool = False) -> dict[str, Any]:
    labels = {names.TRANSLATION_LABEL: mode} if mode is not None else {}
    if opt_out:
        labels[names.POD_OPT_OUT_LABEL] = names.POD_OPT_OUT_ALLOWED
    return {"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": name, "labels": labels}}


def pod(name: str, ns: str, limits: Mapping[str, Any] | None = None, *,
        node: str | None = None, owner: tuple[str, str] | None = None,
        annotations: Mapping[str, str] | None = None, labels: Mapping[str, str] | None = None,
        phase: str = "Running") -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": ns, "uid": f"uid-{ns}-{name}",
                            "annotations": dict(annotations or {}), "labels": dict(labels or {})}
    if owner is not None:
        meta["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1],
                                    "uid": f"uid-{owner[1]}", "controller": True}]
    spec: dict[str, Any] = {"containers": [container("main", limits)]}
    if node is not None:
        spec["nodeName"] = node
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec,
            "status": {"phase": phase}}


def container(name: str, limits: Mapping[str, Any] | None) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": "cuda:12"}
    if limits:
        out["resources"] = {"limits": {k: str(v) for k, v in limits.items()}}
    return out


def deployment(name: str, ns: str, limits: Mapping[str, Any] | None, *,
               replicas: int = 2) -> dict[str, Any]:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": {"containers": [container("main", limits)]}}}}


def node(name: str, allocatable: Mapping[str, Any] | None = None, *,
         labels: Mapping[str, str] | None = None,
         condition: tuple[str, str] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {"allocatable": {"cpu": "64", **{k: str(v) for k, v in
                                                             (allocatable or {}).items()}}}
    if condition is not None:
        status["conditions"] = [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": ""},
            {"type": names.NODE_MIGRATION_CONDITION, "status": "True", "reason": condition[0],
             "message": condition[1]}]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": dict(labels or {})}, "status": status}


def resource_quota(name: str, ns: str, hard: Mapping[str, Any],
                   **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"hard": {k: str(v) for k, v in hard.items()}, **spec}}


def rules_config_map(name: str, ns: str, document: Mapping[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns,
                         "labels": {names.RULES_LABEL: names.RULES_LABEL_VALUE}},
            "data": {"rules.yaml": yaml.safe_dump(dict(document))}}


def write_dump(path: Path, objects: list[dict[str, Any]], *, as_list: bool = True) -> Path:
    """`kubectl get ... -o yaml` output: a List, or one document per object."""
    if as_list:
        path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objects}))
    else:
        path.write_text(yaml.safe_dump_all(objects))
    return path


@dataclass
class LiveCluster:
    """An in-memory cluster served on loopback, and the kubeconfig that reaches it."""

    memory: MemoryCluster
    kubeconfig: Path
    loop: asyncio.AbstractEventLoop

    def run(self, coroutine: Coroutine[Any, Any, _T]) -> _T:
        """Run `coroutine` on the cluster's loop (the store belongs to that thread)."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=10)

    def load(self, objects: list[dict[str, Any]]) -> None:
        self.run(self.memory.load(objects))


@pytest.fixture
def live_cluster(tmp_path: Path) -> Iterator[LiveCluster]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="served-cluster", daemon=True)
    thread.start()
    kubeconfig = tmp_path / "kubeconfig"
    ready: asyncio.Future[MemoryCluster] = loop.create_future()
    stop = asyncio.Event()

    async def serving() -> None:
        memory = MemoryCluster()
        async with serve(memory, kubeconfig=kubeconfig, admission=False):
            ready.set_result(memory)
            await stop.wait()
        await memory.close()

    task = asyncio.run_coroutine_threadsafe(serving(), loop)

    async def started() -> MemoryCluster:
        return await ready

    memory = asyncio.run_coroutine_threadsafe(started(), loop).result(timeout=10)
    try:
        yield LiveCluster(memory, kubeconfig, loop)
    finally:
        loop.call_soon_threadsafe(stop.set)
        task.result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def scenario() -> list[dict[str, Any]]:
    """A cluster half-way through nothing: legacy GPU stacks everywhere, the gateway installed.

    team-a (unlabelled): a HAMi Deployment with a running pod on gpu-1, and a ResourceQuota;
    team-b (audit): a whole-GPU Job; team-c (disabled): a pod; team-d (granting opt-outs): a
    pod that opts out;
    team-e (label "maybe"): a pod; ml: a pod a rule refuses. gpu-1 runs the legacy plugin.
    """
    hami = {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4096, "nvidia.com/gpucores": 30}
    rs_pod = pod("infer-7d9f-abcde", "team-a", hami, node="gpu-1",
                 owner=("ReplicaSet", "infer-7d9f"), labels={"pod-template-hash": "7d9f"})
    job = deployment("train", "team-b", {"nvidia.com/gpu": 2})
    job.update(apiVersion="batch/v1", kind="Job")
    del job["spec"]["replicas"], job["spec"]["selector"]
    job["spec"]["template"]["spec"]["restartPolicy"] = "Never"
    return [
        namespace("team-a"), namespace("team-b", "audit"), namespace("team-c", "disabled"),
        namespace("team-d", "enabled", opt_out=True), namespace("team-e", "maybe"),
        namespace("ml", "enabled"),
        deployment("infer", "team-a", hami), rs_pod, job,
        pod("old", "team-c", {"nvidia.com/gpu": 1}, node="gpu-1"),
        pod("optout", "team-d", {"nvidia.com/gpu": 1},
            annotations={names.TRANSLATION_LABEL: "disabled"}),
        pod("odd", "team-e", {"nvidia.com/gpu": 1}),
        pod("bad", "ml", {"nvidia.com/gpumem": 1024, "nvidia.com/gpumem-percentage": 50}),
        pod("web", "team-a", {"cpu": 1}),
        node("gpu-1", {"nvidia.com/gpu": 8}, labels={"nvidia.com/gpu.product": "H100"}),
        node("gpu-2", {"nvidia.com/gpu": 0}, labels={names.NODE_CUT_OVER_LABEL: "true"},
             condition=("DRA", "every card published")),
        node("cpu-1"),
        resource_quota("gpus", "team-a", {"requests.nvidia.com/gpu": 4,
                                          "limits.nvidia.com/gpumem": 16384}),
        resource_quota("compute", "team-a", {"cpu": 100}),
    ]

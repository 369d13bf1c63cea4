"""The gateway on real Kubernetes control planes, installed with its Helm chart.

Per supported release and feature-gate setting (conftest.SETUPS): the example pods are placed
as `dra-gateway demo` places them, with workloads created by the real Deployment, Job and CronJob
controllers; a burst of share and whole-GPU pods fills the cluster without any card over its
capacity; a deleted pod frees its share for a waiting one and a finished Job's claim is
released; with the webhook down, GPU-free pods are still created and GPU pods are refused.
The tests run in file order on one installation.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from dra_gateway.devkit.realcluster import Api, path_of
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError
from e2e.support import (
    EXAMPLES,
    Gateway,
    apply_manifests,
    cards,
    free_capacity,
    holdings,
    over_capacity,
    pod_claims,
    pods,
    wait_until,
)

JSON = dict[str, Any]
PLACE_S = 120.0
GiB = 1 << 30
MiB = 1 << 20


def _known_gateway_bugs(gateway: Gateway) -> str:
    """Log lines that name the gateway bugs being fixed now (issue 10), for failure messages."""
    return "\n".join(gateway.grep("allocationTimestamp")[:3])


def _why_unbound(api: Api, pod: Mapping[str, Any]) -> str:
    meta = pod["metadata"]
    gates = [g.get("name") for g in (pod.get("spec") or {}).get("schedulingGates") or []]
    events = [e for e in api.list(path_of("v1", "events", namespace=meta["namespace"]))
              if (e.get("involvedObject") or {}).get("name") == meta["name"]
              and e.get("type") == "Warning"]
    last = events[-1] if events else {}
    scheduler = (pod.get("spec") or {}).get("schedulerName") or "default-scheduler"
    return (f"{meta['namespace']}/{meta['name']}: gates {gates}, schedulerName {scheduler}, "
            f"last warning {last.get('reason')}: {last.get('message')}")


def _bound(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


# a. The examples --------------------------------------------------------------------------------

def _example_documents() -> list[JSON]:
    documents: list[JSON] = []
    for path in sorted((EXAMPLES / "pods").glob("*.yaml")):
        documents += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return documents


def _create_examples(api: Api) -> tuple[int, list[str]]:
    """Create every example as a user would on a bare cluster: the number of pods to expect,
    and the API server's refusals.

    Pods, Deployments and Jobs go through the API as they are; a CronJob is created and run
    once now, as `kubectl create job --from=cronjob/NAME` does; a kind this cluster has no
    controller for (Kubeflow's PyTorchJob) gets the pods such a controller would create, named
    as the demo names them.
    """
    from dra_gateway.devkit.demo import pods_of

    expected = 0
    refused: list[str] = []
    for document in _example_documents():
        kind = document["kind"]
        where = f"{kind} {document['metadata'].get('namespace')}/{document['metadata']['name']}"
        try:
            if kind in ("Pod", "Deployment", "Job"):
                apply_manifests(api, [document])
                spec = document.get("spec") or {}
                expected += int(spec.get("replicas", 1)) if kind == "Deployment" else \
                    int(spec.get("parallelism", 1)) if kind == "Job" else 1
            elif kind == "CronJob":
                [cronjob] = apply_manifests(api, [document])
                meta = cronjob["metadata"]
                job = {"apiVersion": "batch/v1", "kind": "Job",
                       "metadata": {
                           "name": f"{meta['name']}-manual", "namespace": meta["namespace"],
                           "annotations": {"cronjob.kubernetes.io/instantiate": "manual"},
                           "ownerReferences": [{
                               "apiVersion": "batch/v1", "kind": "CronJob",
                               "name": meta["name"], "uid": meta["uid"], "controller": True}]},
                       "spec": copy.deepcopy(document["spec"]["jobTemplate"]["spec"])}
                apply_manifests(api, [job])
                expected += int(job["spec"].get("parallelism", 1))
            else:
                made = pods_of([document], kind)
                apply_manifests(api, [p.pod for p in made])
                expected += len(made)
        except ApiError as exc:
            refused.append(f"{where}: {exc.message}")
    return expected, refused


def _example_pods(api: Api) -> list[JSON]:
    namespaces = {str(d["metadata"].get("namespace") or "default") for d in _example_documents()}
    return [p for ns in sorted(namespaces) for p in pods(api, ns)]


def _missing_classes(api: Api, pod: Mapping[str, Any], installed: set[str]) -> set[str]:
    """DeviceClasses the pod's claim templates name that this cluster does not have (their
    vendors' drivers would serve them): such a pod stays pending, as in the demo."""
    missing: set[str] = set()
    namespace = pod["metadata"]["namespace"]
    for entry in (pod.get("spec") or {}).get("resourceClaims") or []:
        name = entry.get("resourceClaimTemplateName")
        if not name:
            continue
        try:
            template = api.get(path_of("resource.k8s.io/v1", "resourceclaimtemplates",
                                       namespace=namespace, name=name))
        except ApiError:
            continue
        for request in template["spec"]["spec"].get("devices", {}).get("requests") or []:
            for alternative in [request.get("exactly") or {}, *request.get("firstAvailable", [])]:
                if alternative.get("deviceClassName"):
                    missing.add(str(alternative["deviceClassName"]))
    return missing - installed


def test_every_example_is_placed_as_the_demo_places_it(gateway: Gateway) -> None:
    api = gateway.api
    expected, refused = _create_examples(api)
    installed = {c["metadata"]["name"] for c in
                 api.list(path_of("resource.k8s.io/v1", "deviceclasses"))}

    def pending_by_design(pod: Mapping[str, Any]) -> bool:
        return bool(_missing_classes(api, pod, installed))

    def all_placed() -> bool:
        current = _example_pods(api)
        return len(current) >= expected and all(
            _bound(p) for p in current if not pending_by_design(p))

    try:
        wait_until("every example pod but those of other vendors' classes to be bound",
                   all_placed, PLACE_S, gateway.check)
    except AssertionError as exc:
        current = _example_pods(api)
        unbound = [_why_unbound(api, p) for p in current
                   if not _bound(p) and not pending_by_design(p)]
        raise AssertionError(f"{exc}: {len(current)} of {expected} pods exist; refused: "
                             f"{refused}; unbound:\n" + "\n".join(unbound) + "\n"
                             + _known_gateway_bugs(gateway)) from None

    published = cards(api)
    problems: list[str] = [f"refused: {r}" for r in refused]
    pending = []
    for pod in _example_pods(api):
        meta = pod["metadata"]
        where = f"{meta['namespace']}/{meta['name']}"
        if pending_by_design(pod):
            pending.append(where)
            if _bound(pod):
                problems.append(f"{where} is bound although no driver serves "
                                f"{_missing_classes(api, pod, installed)}")
            continue
        finished = (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")
        for claim in pod_claims(api, pod):
            allocation = (claim.get("status") or {}).get("allocation")
            if not allocation:
                if not finished:
                    problems.append(f"{where}: claim {claim['metadata']['name']} is not "
                                    "allocated")
                continue
            for holding in holdings(claim, published):
                card = published.get(holding.device)
                if card is None:
                    problems.append(f"{where}: device {holding.device} is published by no "
                                    "slice")
                elif card.node != pod["spec"]["nodeName"]:
                    problems.append(f"{where}: device {card.device} is on {card.node}, the "
                                    f"pod on {pod['spec']['nodeName']}")
    translated = [p for p in _example_pods(api)
                  if names.ANNOTATION_TRANSLATED in (p["metadata"].get("annotations") or {})]
    web = [p for p in _example_pods(api) if p["metadata"]["name"] == "web"]
    assert problems == []
    assert "ml/rocm-smoke" in pending
    assert len(translated) >= 10, [p["metadata"]["name"] for p in translated]
    assert web, "the GPU-free pod is missing"
    assert not web[0]["spec"].get("resourceClaims"), "the GPU-free pod was changed"
    assert over_capacity(api) == []


def test_a_finished_job_releases_its_claim(gateway: Gateway) -> None:
    api = gateway.api

    def job_pods() -> list[JSON]:
        return [p for p in _example_pods(api) if _bound(p) and any(
            o.get("kind") == "Job" for o in p["metadata"].get("ownerReferences") or [])]

    assert job_pods(), "the example Jobs made no pod that was placed"

    def unreleased() -> list[str]:
        left = []
        for pod in job_pods():
            where = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
            if (pod.get("status") or {}).get("phase") != "Succeeded":
                left.append(f"{where} is {(pod.get('status') or {}).get('phase')}")
            left += [f"{where}: claim {c['metadata']['name']} is still allocated"
                     for c in pod_claims(api, pod) if (c.get("status") or {}).get("allocation")]
        return left

    try:
        wait_until("the example Jobs' pods to finish and their claims to be released",
                   lambda: not unreleased(), PLACE_S, gateway.check)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: {unreleased()}") from None


def _clear_examples(gateway: Gateway) -> None:
    """Delete every example workload and pod, and wait until their claims are gone or
    released: the burst starts from an empty cluster."""
    api = gateway.api
    namespaces = sorted({str(d["metadata"].get("namespace") or "default")
                         for d in _example_documents()})
    for namespace in namespaces:
        for api_version, plural in (("apps/v1", "deployments"), ("batch/v1", "cronjobs"),
                                    ("batch/v1", "jobs"), ("v1", "pods")):
            for item in api.list(path_of(api_version, plural, namespace=namespace)):
                with contextlib.suppress(ApiError):
                    api.delete(path_of(api_version, plural, namespace=namespace,
                                       name=item["metadata"]["name"]),
                               propagation="Background")

    def cleared() -> bool:
        if any(pods(api, ns) for ns in namespaces):
            return False
        return not any((c.get("status") or {}).get("allocation")
                       for ns in namespaces
                       for c in api.list(path_of("resource.k8s.io/v1", "resourceclaims",
                                                 namespace=ns)))

    wait_until("the examples to be deleted and their claims released", cleared, PLACE_S,
               gateway.check)


# b. A burst up to a full cluster ----------------------------------------------------------------

@dataclass(frozen=True)
class Share:
    """A kind of burst pod: its legacy resources and what it takes of one card."""

    name: str
    limits: Mapping[str, str]
    whole: bool = False
    memory: int = 0  # bytes; 0 for a ratio (memory_ratio)
    memory_ratio: int = 0  # percent of the card
    cores: int = 0


WHOLE = Share("whole", {"nvidia.com/gpu": "1"}, whole=True)
KOORDINATOR = Share("koord", {"koordinator.sh/gpu-core": "50",
                              "koordinator.sh/gpu-memory-ratio": "50"}, memory_ratio=50,
                    cores=50)
HAMI = Share("hami", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000",
                      "nvidia.com/gpucores": "25"}, memory=20000 * MiB, cores=25)
VOLCANO = Share("volcano", {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "20000",
                            "volcano.sh/vgpu-cores": "25"}, memory=20000 * MiB, cores=25)
# The ten full GPUs of the two nodes, exactly: 2 whole + 4 halves + 24 quarters; then 4 more.
BURST: tuple[tuple[Share, int], ...] = ((WHOLE, 2), (KOORDINATOR, 4), (HAMI, 16), (VOLCANO, 8),
                                        (HAMI, 4))
BURST_NAMESPACE = "burst"


def _burst_pod(share: Share, index: int) -> JSON:
    resources: JSON = {"limits": dict(share.limits)}
    if share is KOORDINATOR:
        resources["requests"] = dict(share.limits)
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{share.name}-{index}", "namespace": BURST_NAMESPACE,
                         "labels": {"share": share.name}},
            "spec": {"containers": [{"name": "main", "image": "example.com/cuda:1",
                                     "resources": resources}]}}


def _fits(share: Share, free: Mapping[Any, tuple[int, int, bool]], card_memory: int) -> bool:
    for memory, cores, untouched in free.values():
        if share.whole:
            if untouched:
                return True
            continue
        wanted = share.memory or card_memory * share.memory_ratio // 100
        if memory >= wanted and cores >= share.cores:
            return True
    return False


def _share_of(pod: Mapping[str, Any]) -> Share:
    return {s.name: s for s, _ in BURST}[pod["metadata"]["labels"]["share"]]


def _waiting_that_fit(api: Api) -> list[str]:
    """Burst pods still unbound although some card has room for them now."""
    free = free_capacity(api)
    card_memory = max((c.memory for c in cards(api).values() if c.kind == "gpu"), default=0)
    return [p["metadata"]["name"] for p in pods(api, BURST_NAMESPACE)
            if not _bound(p) and _fits(_share_of(p), free, card_memory)]


def test_a_burst_of_share_and_whole_gpu_pods_fills_the_cluster_within_capacity(
        gateway: Gateway) -> None:
    api = gateway.api
    _clear_examples(gateway)
    assert over_capacity(api) == []
    api.create(path_of("v1", "namespaces"), {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": BURST_NAMESPACE}})
    started = time.monotonic()
    counter = 0
    for share, count in BURST:
        for _ in range(count):
            counter += 1
            api.create(path_of("v1", "pods", namespace=BURST_NAMESPACE),
                       _burst_pod(share, counter))
    total = counter

    def settled() -> bool:
        current = pods(api, BURST_NAMESPACE)
        bound = sum(_bound(p) for p in current)
        # Placed: everything that fits now; the last four HAMi pods cannot all fit.
        return bound >= total - 4 and not _waiting_that_fit(api)

    try:
        wait_until("the burst to be placed", settled, PLACE_S, gateway.check)
    except AssertionError as exc:
        current = pods(api, BURST_NAMESPACE)
        bound = sum(_bound(p) for p in current)
        unbound = [_why_unbound(api, p) for p in current if not _bound(p)][:8]
        raise AssertionError(
            f"{exc}: {bound}/{total} bound; waiting although they fit: "
            f"{_waiting_that_fit(api)}; over capacity: {over_capacity(api)}\n"
            + "\n".join(unbound) + "\n" + _known_gateway_bugs(gateway)) from None
    bound = sum(_bound(p) for p in pods(api, BURST_NAMESPACE))
    print(f"burst: {bound}/{total} pods bound in {time.monotonic() - started:.1f}s")
    assert over_capacity(api) == []


# c. Releasing shares ----------------------------------------------------------------------------

def test_a_deleted_pod_frees_its_share_for_a_waiting_pod(gateway: Gateway) -> None:
    api = gateway.api
    waiting = [p for p in pods(api, BURST_NAMESPACE) if not _bound(p)]
    if not waiting:  # the burst test placed everything: add one that cannot fit now
        api.create(path_of("v1", "pods", namespace=BURST_NAMESPACE), _burst_pod(HAMI, 999))
        time.sleep(3)
        waiting = [p for p in pods(api, BURST_NAMESPACE) if not _bound(p)]
    assert waiting, "nothing waits: the cluster is not full"
    target = waiting[0]
    # Free one card entirely: delete every burst pod holding a share of some card.
    published = cards(api)
    by_card: dict[Any, list[JSON]] = {}
    for pod in pods(api, BURST_NAMESPACE):
        if not _bound(pod):
            continue
        for claim in pod_claims(api, pod):
            for holding in holdings(claim, published):
                by_card.setdefault(holding.device, []).append(pod)
    shared = [(k, v) for k, v in by_card.items() if not any(_share_of(p).whole for p in v)]
    assert shared, "no card holds burst shares: the burst placed no share pod"
    card, holders = min(shared, key=lambda kv: len(kv[1]))
    for pod in holders:  # graceful deletes: KWOK finishes them as a kubelet would
        api.delete(path_of("v1", "pods", namespace=BURST_NAMESPACE,
                           name=pod["metadata"]["name"]))
    name = target["metadata"]["name"]

    def placed() -> bool:
        pod = api.get(path_of("v1", "pods", namespace=BURST_NAMESPACE, name=name))
        return _bound(pod)

    try:
        wait_until(f"waiting pod {name} to take the share freed on {card[2]}", placed,
                   PLACE_S, gateway.check)
    except AssertionError as exc:
        pod = api.get(path_of("v1", "pods", namespace=BURST_NAMESPACE, name=name))
        raise AssertionError(f"{exc}: {_why_unbound(api, pod)}; free: {free_capacity(api)}"
                             ) from None
    assert over_capacity(api) == []


# d. The webhook down ----------------------------------------------------------------------------

def _plain_pod(name: str, limits: Mapping[str, str]) -> JSON:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "main", "image": "example.com/app:1",
                                     "resources": {"limits": dict(limits)}}]}}


def test_with_the_webhook_down_gpu_pods_are_refused_and_others_created(
        gateway: Gateway) -> None:
    api = gateway.api
    webhook = gateway.components["webhook"]
    webhook.stop()
    try:
        created = api.create(path_of("v1", "pods", namespace="default"),
                             _plain_pod("plain-while-down", {"cpu": "100m"}))
        assert created["metadata"]["name"] == "plain-while-down"
        with pytest.raises(ApiError) as refused:
            api.create(path_of("v1", "pods", namespace="default"),
                       _plain_pod("gpu-while-down", {"nvidia.com/gpu": "1"}))
        assert refused.value.code >= 400
        message = refused.value.message
        assert "mutate.dra-gateway.io" in message, message
        assert "failed calling webhook" in message, message
        assert not api.exists(path_of("v1", "pods", namespace="default", name="gpu-while-down"))
    finally:
        webhook.start()
        wait_until("the webhook to serve again", gateway.webhook_ready, 60, gateway.check)

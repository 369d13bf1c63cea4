"""MIG on demand on a real control plane (issue 47): a KWOK node of two H100s in MIG mode, its
node plugin run with `--nvml --mig-on-demand` on the NVML stand-in (the cards' instances kept
in a file, as the hardware keeps them), and pods asking NVIDIA's legacy MIG names.

1. The plugin publishes each card cut on demand: the whole card and every profile at every
   placement, with counter sets where the API server keeps them (DRAPartitionableDevices) and
   the same counters in attributes where it drops them.
2. Seven `nvidia.com/mig-1g.10gb` pods in a burst are translated, allocated and packed onto one
   card, so that the other card stays whole: a `nvidia.com/mig-7g.80gb` pod is placed on it.
3. An eighth 1g pod waits: no card has a free placement for it (the counters say so); once a 1g
   pod is deleted, it is placed. At no time do two allocated devices hold one memory slice, or
   a card's instances more compute slices than it has.
4. The kubelet's calls (NodePrepareResources over the plugin's DRA socket, as the kubelet makes
   them; KWOK runs no kubelet) make the 7g pod's instance on the stand-in's card at the
   allocated placement, with a CDI spec naming its MIG UUID; NodeUnprepareResources destroys
   it.
5. Once the 7g pod is gone, the other legacy forms each get a 1g.10gb instance there: NVIDIA's
   single strategy (`nvidia.com/gpu` selecting `nvidia.com/gpu.product: <model>-MIG-1g.10gb`),
   GKE's partition size, HAMi's MIG mode and Volcano's (8000 MiB: the smallest profile that
   fits, offered first).
6. An administrator makes a 3g by hand over the placement a ReplicaSet's pod was allocated,
   before the kubelet prepares it: the prepare fails and leaves nothing behind, the plugin
   marks the placement (fatal), the pod is evicted (kube-controller-manager on a device taint,
   or the allocator where the API drops taints) and its replacement gets another placement.
7. A GPUSharingPolicy selecting the namespace says `shares.servedBy: MIG`: a ResourceClaim for
   a share of a card is refused with the fix, and a HAMi share (8000 MiB, 10% of the compute,
   no MIG annotation) is translated to the smallest instances that hold it and gets a 1g.10gb.

The node, its plugin, slices, namespace and policy are removed at the end: the other modules of the
tier see the installation as `install` made it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc

from dra_gateway.devkit.realcluster import Api, path_of
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError
from dra_gateway.node_plugin.proto import dra_v1_pb2, dra_v1_pb2_grpc
from dra_gateway.node_plugin.server import dra_socket_path
from e2e.support import (
    Component,
    Gateway,
    node_plugin_kubeconfig,
    pod_claims,
    remove_gpu_node,
    short_dir,
    wait_until,
)

NS = "mig-on-demand"
NODE = "gpu-mig-1"
H100 = "NVIDIA H100 80GB HBM3"
POOL_LABEL = "e2e.dra-gateway.io/pool"
POOL = "mig"
SINGLE_PRODUCT = "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb"
ISOLATION_LABEL = "e2e.dra-gateway.io/isolation"
MIG_POLICY = "e2e-mig-shares"
CARD_DEVICES = 26  # the whole card and the 25 placements of an H100's profiles
JSON = dict[str, Any]


# The node ---------------------------------------------------------------------------------------

def _devices(api: Api) -> dict[str, JSON]:
    return {d["name"]: d for s in api.list(path_of("resource.k8s.io/v1", "resourceslices"))
            if s["spec"].get("nodeName") == NODE and s["spec"].get("driver") == names.DRIVER
            for d in s["spec"].get("devices") or []}


def _counter_sets(api: Api) -> list[str]:
    return sorted(c["name"] for s in api.list(path_of("resource.k8s.io/v1", "resourceslices"))
                  if s["spec"].get("driver") == names.DRIVER
                  and (s["spec"].get("nodeName") == NODE or s["spec"]["pool"]["name"] == NODE)
                  for c in s["spec"].get("sharedCounters") or [])


@contextlib.contextmanager
def _mig_node(gateway: Gateway) -> Iterator[tuple[Path, Path]]:
    """The node and its plugin on the stand-in: (the stand-in's cards file, the plugin's
    directory)."""
    api = gateway.api
    # The labels GPU feature discovery (single strategy) and GKE put on such a node, which the
    # pods of those conventions select.
    gateway.plane.add_node(NODE, labels={
        POOL_LABEL: POOL, "nvidia.com/gpu.product": SINGLE_PRODUCT,
        "cloud.google.com/gke-gpu-partition-size": "1g.10gb"})
    base = short_dir()
    cards = base / "cards.json"
    plugin = Component(f"node-plugin-{NODE}", [
        "--card", H100, "--card", H100, "--state", str(cards), "--uuid-prefix", "mig",
        "--", "node-plugin", "serve", "--nvml", "--mig-on-demand",
        "--node-name", NODE, "--cluster", "kube",
        "--kubeconfig", node_plugin_kubeconfig(gateway, NODE),
        "--plugins-dir", str(base / "plugins"), "--registry-dir", str(base / "registry"),
        "--cdi-dir", str(base / "cdi"), "--state-dir", str(base / "state"),
        "--no-legacy-coexistence"],
        gateway.work / "logs" / f"node-plugin-{NODE}.log",
        module="dra_gateway.devkit.standin_nvml")
    gateway.components[plugin.name] = plugin
    try:
        gateway.plane.wait_nodes_ready([NODE])
        plugin.start()
        wait_until(f"the two cards of {NODE} to be published cut on demand",
                   lambda: len(_devices(api)) == 2 * CARD_DEVICES, 90, gateway.check)
        yield cards, base
    finally:
        _clean_up(gateway)


def _clean_up(gateway: Gateway) -> None:
    api = gateway.api
    with contextlib.suppress(ApiError):
        api.delete(path_of(names.API_VERSION, "gpusharingpolicies", name=MIG_POLICY))
    with contextlib.suppress(ApiError):
        for pod in api.list(path_of("v1", "pods", namespace=NS)):
            api.delete(path_of("v1", "pods", namespace=NS, name=pod["metadata"]["name"]),
                       grace_period_s=0)
    with contextlib.suppress(ApiError):
        api.delete(path_of("v1", "namespaces", name=NS))
    wait_until(f"namespace {NS} to be gone",
               lambda: not api.exists(path_of("v1", "namespaces", name=NS)), 120)
    remove_gpu_node(gateway, NODE)


# The workload -----------------------------------------------------------------------------------

def _pod(name: str, profile: str) -> JSON:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"nodeSelector": {POOL_LABEL: POOL}, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "example.com/cuda:1",
                                     "resources": {"limits": {
                                         f"nvidia.com/mig-{profile}": "1"}}}]}}


def _other_forms() -> dict[str, JSON]:
    """A pod of each other legacy MIG form, each for one 1g.10gb instance."""
    def pod(name: str, limits: dict[str, str], *, selector: dict[str, str] | None = None,
            annotations: dict[str, str] | None = None) -> JSON:
        return {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": NS, "annotations": annotations or {}},
                "spec": {"nodeSelector": {POOL_LABEL: POOL, **(selector or {})},
                         "terminationGracePeriodSeconds": 0,
                         "containers": [{"name": "main", "image": "example.com/cuda:1",
                                         "resources": {"limits": limits}}]}}

    return {
        "single": pod("single", {"nvidia.com/gpu": "1"},
                      selector={"nvidia.com/gpu.product": SINGLE_PRODUCT}),
        "gke": pod("gke", {"nvidia.com/gpu": "1"},
                   selector={"cloud.google.com/gke-gpu-partition-size": "1g.10gb"}),
        "hami": pod("hami", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"},
                    annotations={"nvidia.com/vgpu-mode": "mig"}),
        "volcano": pod("volcano", {"volcano.sh/vgpu-number": "1",
                                   "volcano.sh/vgpu-memory": "8000"},
                       annotations={"volcano.sh/vgpu-mode": "mig"}),
    }


def _mig_policy() -> JSON:
    return {"apiVersion": names.API_VERSION, "kind": "GPUSharingPolicy",
            "metadata": {"name": MIG_POLICY},
            "spec": {"namespaceSelector": {"matchLabels": {ISOLATION_LABEL: "hardware"}},
                     "shares": {"servedBy": "MIG"}}}


def _hami_share(name: str) -> JSON:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": {"nodeSelector": {POOL_LABEL: POOL}, "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "example.com/cuda:1",
                                     "resources": {"limits": {
                                         "nvidia.com/gpumem": "8000",
                                         "nvidia.com/gpucores": "10"}}}]}}


def _native_share() -> JSON:
    """A share of one card written by hand: in capacity.requests where the cluster keeps it and
    in the claim's GpuShareConfig too (the API server drops capacity.requests without
    consumable capacity)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": "share", "namespace": NS},
            "spec": {"devices": {
                "requests": [{"name": "gpu", "exactly": {
                    "deviceClassName": names.GPU_CLASS,
                    "capacity": {"requests": {"memory": "8Gi", "cores": "10"}}}}],
                "config": [{"requests": ["gpu"], "opaque": {
                    "driver": names.DRIVER, "parameters": {
                        "apiVersion": names.API_VERSION, "kind": names.KIND_GPU_SHARE_CONFIG,
                        "memory": 8 << 30, "cores": 10}}}]}}}


def _until_refused(gateway: Gateway, what: str) -> ApiError:
    """The refusal the share claim meets once the webhooks have read the policy just written;
    what was created meanwhile is deleted."""
    api = gateway.api
    claims = path_of("resource.k8s.io/v1", "resourceclaims", namespace=NS)
    refusal: ApiError | None = None

    def refused() -> bool:
        nonlocal refusal
        try:
            api.create(claims, _native_share())
        except ApiError as exc:
            refusal = exc
            return True
        api.delete(path_of("resource.k8s.io/v1", "resourceclaims", namespace=NS, name="share"))
        return False

    wait_until(f"the webhook to refuse {what}", refused, 30, gateway.check, poll_s=0.5)
    assert refusal is not None
    return refusal


def _held(api: Api, name: str) -> list[str]:
    """The devices of NODE the pod's claims are allocated."""
    pod = api.get(path_of("v1", "pods", namespace=NS, name=name))
    return [r["device"] for claim in pod_claims(api, pod)
            for r in (((claim.get("status") or {}).get("allocation") or {}).get("devices")
                      or {}).get("results") or [] if r["pool"] == NODE]


def _slices_of(device: JSON) -> tuple[str, range, int]:
    """(counter set, memory slices, compute slices) a device holds, from the attributes the
    plugin publishes in both worlds (with and without counter sets)."""
    attrs = device["attributes"]
    start = attrs.get(names.ATTR_MIG_START, {"int": 0})["int"]
    size = attrs[names.ATTR_MIG_MEMORY_SLICES]["int"]
    return (attrs[names.ATTR_COUNTER_SET]["string"], range(start, start + size),
            attrs[names.ATTR_MIG_COMPUTE_SLICES]["int"])


def _over_committed(api: Api) -> list[str]:
    """Every memory slice held twice and every card whose instances pass its compute slices,
    over all allocated claims."""
    published = _devices(api)
    slices: dict[tuple[str, int], list[str]] = {}
    compute: dict[str, int] = {}
    for claim in api.list(path_of("resource.k8s.io/v1", "resourceclaims")):
        for result in (((claim.get("status") or {}).get("allocation") or {}).get("devices")
                       or {}).get("results") or []:
            if result["pool"] != NODE:
                continue
            card, memory, cores = _slices_of(published[result["device"]])
            compute[card] = compute.get(card, 0) + cores
            for i in memory:
                slices.setdefault((card, i), []).append(result["device"])
    return ([f"{card} memory slice {i}: {held}" for (card, i), held in slices.items()
             if len(held) > 1] +
            [f"{card}: {used} compute slices" for card, used in compute.items() if used > 7])


def _prepare(base: Path, claim: JSON, *, unprepare: bool = False) -> Any:
    """One call of the kubelet's: NodePrepareResources (or NodeUnprepareResources) of the claim
    over the plugin's DRA socket."""
    meta = claim["metadata"]
    message = dra_v1_pb2.Claim(namespace=meta["namespace"], uid=meta["uid"], name=meta["name"])

    async def call() -> Any:
        socket = dra_socket_path(base / "plugins")
        async with grpc.aio.insecure_channel(f"unix://{socket}") as channel:
            stub = dra_v1_pb2_grpc.DRAPluginStub(channel)
            if unprepare:
                return await stub.NodeUnprepareResources(
                    dra_v1_pb2.NodeUnprepareResourcesRequest(claims=[message]), timeout=60)
            return await stub.NodePrepareResources(
                dra_v1_pb2.NodePrepareResourcesRequest(claims=[message]), timeout=60)

    return asyncio.run(call())


def _make_by_hand(cards: Path, card: int, profile: str, start: int, slices: int) -> None:
    """An instance made as an administrator makes one (nvidia-smi): on the stand-in's card."""
    saved = json.loads(cards.read_text())
    taken = {gi["gi"] for gi in saved["cards"][card]}
    gi = next(i for i in range(1, 16) if i not in taken)
    saved["cards"][card].append({"gi": gi, "profile": profile, "start": start,
                                 "compute": {"0": slices}})
    temporary = cards.with_suffix(".new")
    temporary.write_text(json.dumps(saved))
    temporary.replace(cards)


def _replica_set(name: str, profile: str) -> JSON:
    """One pod kept running by its ReplicaSet (KWOK completes a Job's pods at once)."""
    return {"apiVersion": "apps/v1", "kind": "ReplicaSet",
            "metadata": {"name": name, "namespace": NS},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name}},
                                  "spec": _pod(name, profile)["spec"]}}}


def _instances(cards: Path) -> list[list[tuple[str, int]]]:
    """(profile, first memory slice) of each instance on each of the stand-in's cards."""
    if not cards.exists():
        return [[], []]
    saved = json.loads(cards.read_text())["cards"]
    return [sorted((gi["profile"], gi["start"]) for gi in card) for card in saved]


def test_legacy_mig_names_are_served_by_instances_made_on_demand(gateway: Gateway) -> None:
    api = gateway.api
    with _mig_node(gateway) as (cards, base):
        devices = _devices(api)
        # 1. Cut on demand, with counter sets where the server keeps them.
        assert {"gpu-0", "gpu-1", "gpu-0-mig-1g10gb-19-0", "gpu-1-mig-7g80gb-0-0"} <= set(devices)
        assert _counter_sets(api) == (["gpu-0-counter-set", "gpu-1-counter-set"]
                                      if gateway.partitionable_devices else [])
        assert ("consumesCounters" in devices["gpu-0-mig-1g10gb-19-0"]) \
            is gateway.partitionable_devices
        api.create(path_of("v1", "namespaces"), {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": NS}})

        # 2. A burst of seven 1g pods, packed onto one card; the other takes a 7g.
        small = [f"small-{i}" for i in range(7)]
        for name in small:
            api.create(path_of("v1", "pods", namespace=NS), _pod(name, "1g.10gb"))
        wait_until("the seven 1g pods to be allocated",
                   lambda: all(_held(api, n) for n in small), 120, gateway.check)
        held = {n: _held(api, n) for n in small}
        assert all(len(d) == 1 and "-mig-1g10gb-" in d[0] for d in held.values()), held
        assert len({_slices_of(devices[d[0]])[0] for d in held.values()}) == 1, held
        api.create(path_of("v1", "pods", namespace=NS), _pod("big", "7g.80gb"))
        wait_until("the 7g pod to be allocated", lambda: bool(_held(api, "big")), 120,
                   gateway.check)
        (big,) = _held(api, "big")
        assert _slices_of(devices[big])[1] == range(8)
        assert _over_committed(api) == []

        # 3. An eighth 1g waits while no card has a free placement for it, then takes the
        #    slices a deleted one leaves.
        api.create(path_of("v1", "pods", namespace=NS), _pod("waiting", "1g.10gb"))
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            assert _held(api, "waiting") == []
            assert _over_committed(api) == []
            time.sleep(1)
        api.delete(path_of("v1", "pods", namespace=NS, name="small-3"), grace_period_s=0)
        wait_until("the waiting 1g pod to be allocated", lambda: bool(_held(api, "waiting")),
                   120, gateway.check)
        assert _over_committed(api) == []

        # 4. Prepared as the kubelet would: the 7g instance is made where it was allocated,
        #    named in the CDI spec, and destroyed at unprepare.
        pod = api.get(path_of("v1", "pods", namespace=NS, name="big"))
        (claim,) = pod_claims(api, pod)
        card = int(big.split("-")[1])
        before = _instances(cards)
        response = _prepare(base, claim)
        prepared = response.claims[claim["metadata"]["uid"]]
        assert prepared.error == ""
        assert [d.device_name for d in prepared.devices] == [big]
        after = _instances(cards)
        assert after[card] == [("7g.80gb", 0)]
        assert before[card] == []
        specs = [json.loads(p.read_text()) for p in (base / "cdi").glob("*.json")]
        env = [e for spec in specs for d in spec["devices"]
               for e in d["containerEdits"].get("env") or []]
        assert any(e.startswith("NVIDIA_VISIBLE_DEVICES=MIG-") for e in env), env
        response = _prepare(base, claim, unprepare=True)
        assert response.claims[claim["metadata"]["uid"]].error == ""
        assert _instances(cards)[card] == []

        # 5. The other legacy forms, on the card the 7g leaves.
        api.delete(path_of("v1", "pods", namespace=NS, name="big"), grace_period_s=0)
        forms = _other_forms()
        for manifest in forms.values():
            api.create(path_of("v1", "pods", namespace=NS), manifest)
        wait_until("a pod of each other form to be allocated",
                   lambda: all(_held(api, n) for n in forms), 120, gateway.check)
        held = {n: _held(api, n) for n in forms}
        assert all(len(d) == 1 and "-mig-1g10gb-" in d[0] for d in held.values()), held
        assert _over_committed(api) == []

        # 6. A placement taken by hand before its prepare: the pod goes, its replacement is
        #    placed elsewhere.
        for pod in api.list(path_of("v1", "pods", namespace=NS)):
            api.delete(path_of("v1", "pods", namespace=NS, name=pod["metadata"]["name"]),
                       grace_period_s=0)
        wait_until("every pod of the namespace to be gone",
                   lambda: not api.list(path_of("v1", "pods", namespace=NS)), 60, gateway.check)
        api.create(path_of("apps/v1", "replicasets", namespace=NS),
                   _replica_set("train", "3g.40gb"))

        def train_pods() -> list[JSON]:
            return api.list(path_of("v1", "pods", namespace=NS), labelSelector="app=train")

        wait_until("the ReplicaSet's pod to be allocated",
                   lambda: any(_held(api, p["metadata"]["name"]) for p in train_pods()), 120,
                   gateway.check)
        (first,) = train_pods()
        (taken,) = _held(api, first["metadata"]["name"])
        card, start = int(taken.split("-")[1]), int(taken.rsplit("-", 1)[1])
        _make_by_hand(cards, card, "3g.40gb", start, 3)
        (claim,) = pod_claims(api, first)
        failed = _prepare(base, claim).claims[claim["metadata"]["uid"]]
        assert "3g.40gb" in failed.error
        assert f"memory slice {start}" in failed.error
        assert _instances(cards)[card] == [("3g.40gb", start)]  # the administrator's alone

        def replaced() -> bool:
            pods = [p for p in train_pods() if p["metadata"]["uid"] != first["metadata"]["uid"]]
            return not api.exists(path_of("v1", "pods", namespace=NS,
                                          name=first["metadata"]["name"])) and any(
                _held(api, p["metadata"]["name"]) for p in pods)

        wait_until("the pod on the taken placement to be evicted and replaced", replaced, 180,
                   gateway.check)
        (second,) = [p for p in train_pods() if p["metadata"]["uid"] != first["metadata"]["uid"]]
        (now,) = _held(api, second["metadata"]["name"])
        # Another placement, or the administrator's 3g itself (published as it is, free).
        assert now != taken
        assert _devices(api)[now]["attributes"][names.ATTR_PROFILE] == {"string": "3g.40gb"}
        assert _over_committed(api) == []

        # 7. The namespace's GPUSharingPolicy serves shares with MIG instances: a claim for a
        #    share of a card is refused, and a HAMi share (no MIG annotation) gets the
        #    smallest instance that holds it.
        api.patch(path_of("v1", "namespaces", name=NS),
                  {"metadata": {"labels": {ISOLATION_LABEL: "hardware"}}})
        api.create(path_of(names.API_VERSION, "gpusharingpolicies"), _mig_policy())
        refusal = _until_refused(gateway, "a claim for a share in the MIG namespace")
        assert refusal.code == 403, refusal
        assert "shares.servedBy: MIG" in refusal.message, refusal.message
        assert "ask for a MIG instance" in refusal.message, refusal.message
        api.create(path_of("v1", "pods", namespace=NS), _hami_share("isolated"))
        wait_until("the HAMi share to be allocated a MIG instance",
                   lambda: bool(_held(api, "isolated")), 120, gateway.check)
        (isolated,) = _held(api, "isolated")
        assert "-mig-1g10gb-" in isolated, isolated  # 8000 MiB: 1g.10gb holds it
        assert _over_committed(api) == []

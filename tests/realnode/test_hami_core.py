"""D1: a share HAMi-core enforces needs HAMi-core's library on its node.

Before, a HAMi share on a node without the library prepared "successfully" and then never
started: runc failed every start on the CDI spec's bind mount of the missing file, and the user
saw `failed to fulfil mount request` and CrashLoopBackOff. Now the node plugin says whether the
library is there (`hamiCore` on its cards), translated HAMi-core shares select only such cards
(they wait, saying why), and a claim that asks for HAMi-core enforcement anyway (written for
DRA by hand) fails to prepare with the node, the path and the fix, before the runtime is asked.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from e2e.support import wait_until

from dra_gateway.devkit.realcluster import path_of
from dra_gateway.devkit.realnode import STATE_ROOT
from dra_gateway.kube import names
from realnode.support import WORKLOADS, Cluster, container_env
from realnode.test_node import legacy_pod

GiB = 1 << 30


def _hami_core(cluster: Cluster) -> set[bool]:
    return {d["attributes"][names.ATTR_HAMI_CORE]["bool"]
            for s in cluster.slices() for d in s["spec"].get("devices") or []}


@pytest.fixture
def without_hami_core(cluster: Cluster) -> Iterator[None]:
    """The node plugin looking for HAMi-core where the node has none, then back as it was."""
    cluster.stop_plugin()
    cluster.start_plugin(hami_library=STATE_ROOT / "nowhere" / "libvgpu.so")
    wait_until("cards published with hamiCore=false", lambda: _hami_core(cluster) == {False},
               60, cluster.check)
    try:
        yield
    finally:
        cluster.stop_plugin()
        cluster.start_plugin()
        wait_until("cards published with hamiCore=true", lambda: _hami_core(cluster) == {True},
                   60, cluster.check)


def _native_share(cluster: Cluster, name: str) -> None:
    """A claim written for DRA by hand: a share of one card that HAMi-core is to enforce, with
    no selector for the library; and a pod using it."""
    cluster.api.create(path_of("resource.k8s.io/v1", "resourceclaims", namespace=WORKLOADS), {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": WORKLOADS},
        "spec": {"devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": names.GPU_CLASS}}],
            "config": [{"requests": ["gpu"], "opaque": {"driver": names.DRIVER, "parameters": {
                "apiVersion": names.API_VERSION, "kind": names.KIND_GPU_SHARE_CONFIG,
                "memory": 4 * GiB, "enforcement": "hami-core"}}}]}}})
    cluster.create_pod({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
                 "containers": [{"name": "c0",
                                 "command": ["sh", "-c", "env; echo done; sleep 3600"],
                                 "resources": {"claims": [{"name": "gpu"}]}}]}})


def _events(cluster: Cluster, pod: str) -> list[str]:
    return [f"{e.get('reason')}: {e.get('message')}"
            for e in cluster.api.list(path_of("v1", "events", namespace=WORKLOADS))
            if (e.get("involvedObject") or {}).get("name") == pod]


def test_a_hami_share_waits_for_a_node_with_hami_core_and_says_why(
        cluster: Cluster, without_hami_core: None) -> None:
    cluster.create_pod(legacy_pod("hami-waits", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000}))
    cluster.create_pod(legacy_pod("whole-runs", {"nvidia.com/gpu": 1}))
    cluster.wait_running("whole-runs")  # a whole card needs no HAMi-core
    wait_until("the allocator to say why the HAMi share waits",
               lambda: any("hamiCore" in e for e in _events(cluster, "hami-waits")), 60,
               cluster.check)
    assert not cluster.pod("hami-waits")["spec"].get("nodeName")
    print(_events(cluster, "hami-waits"))
    cluster.delete_pod("hami-waits")
    cluster.delete_pod("whole-runs")


def test_a_claim_asking_hami_core_anyway_fails_to_prepare_naming_the_fix(
        cluster: Cluster, without_hami_core: None) -> None:
    _native_share(cluster, "by-hand")
    wait_until("the kubelet to report the failed prepare",
               lambda: any("no HAMi-core library" in e for e in _events(cluster, "by-hand")), 90,
               cluster.check)
    [event] = {e for e in _events(cluster, "by-hand") if "no HAMi-core library" in e}
    assert "FailedPrepareDynamicResources" in event
    assert f"node {cluster.node.name} has no HAMi-core library at" in event
    assert "nodePlugin.hamiCore.hostPath" in event
    # The runtime was never handed the missing mount: no container was created at all.
    assert not (cluster.pod("by-hand").get("status") or {}).get("containerStatuses", [{}])[0].get(
        "containerID")
    assert not any("failed to fulfil mount request" in e for e in _events(cluster, "by-hand"))
    cluster.delete_pod("by-hand")
    cluster.api.delete(path_of("resource.k8s.io/v1", "resourceclaims", namespace=WORKLOADS,
                               name="by-hand"))


def test_the_same_claim_runs_once_the_node_has_hami_core(cluster: Cluster) -> None:
    _native_share(cluster, "by-hand-ok")
    cluster.wait_running("by-hand-ok")
    env = container_env(cluster.container_output("by-hand-ok", "c0", until="done"))
    assert env["CUDA_DEVICE_MEMORY_LIMIT"] == "4096m"
    assert env["LD_PRELOAD"] == str(cluster.hami_library)
    cluster.delete_pod("by-hand-ok")
    cluster.api.delete(path_of("resource.k8s.io/v1", "resourceclaims", namespace=WORKLOADS,
                               name="by-hand-ok"))

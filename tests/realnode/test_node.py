"""The node plugin under a real kubelet, and its CDI edits applied by a real container runtime.

Every pod here is created with kubectl's verbs against the API server: the webhook translates its
legacy request, the allocator binds the claims, kube-scheduler binds the pod, and then the real
kubelet calls the node plugin (NodePrepareResources) and containerd applies the CDI spec the
plugin wrote. What the container sees is read from its own output (`env`, `test -f`).
"""

from __future__ import annotations

import threading
import time

import pytest
from e2e.support import Component, wait_until

from dra_gateway.devkit.realnode import STATE_ROOT
from dra_gateway.kube import names
from realnode.support import WORKLOADS, Cluster, NodeClient, check_hami_share, container_env

ENV_THEN_SLEEP = 'env; test -f "$LD_PRELOAD" && echo preload-mounted; echo done; sleep 3600'


def legacy_pod(name: str, limits: dict[str, int], containers: int = 1) -> dict[str, object]:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [
            {"name": f"c{i}", "command": ["sh", "-c", ENV_THEN_SLEEP],
             "resources": {"limits": dict(limits)}} for i in range(containers)]},
    }


def spec_names(cluster: NodeClient) -> set[str]:
    return {path.name for path in cluster.cdi_specs()}


def claim_specs(cluster: NodeClient, pod: dict[str, object]) -> set[str]:
    """The CDI spec files of the pod's claims (one per claim, named by its UID)."""
    uids = {claim["metadata"]["uid"] for claim in cluster.claims_of(pod)}
    return {name for name in spec_names(cluster) if any(uid in name for uid in uids)}


def test_the_kubelet_registers_the_plugin_and_it_publishes_the_node(cluster: Cluster) -> None:
    assert cluster.registrations() >= 1, cluster.node.kubelet_log()[-3000:]
    devices = [d["name"] for s in cluster.slices() for d in s["spec"].get("devices") or []]
    assert len(devices) == 8, devices
    node = cluster.api.get(f"/api/v1/nodes/{cluster.slices()[0]['spec']['nodeName']}")
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://2.")


def test_a_whole_card_is_prepared_and_seen_in_the_container(cluster: Cluster) -> None:
    cluster.create_pod(legacy_pod("whole", {"nvidia.com/gpu": 1}))
    pod = cluster.wait_running("whole")
    [uuid] = cluster.allocated_uuids(pod)
    env = container_env(cluster.container_output("whole", "c0", until="done"))
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid
    assert env["CUDA_VISIBLE_DEVICES"] == uuid
    # A whole card has no limits to enforce.
    assert "CUDA_DEVICE_MEMORY_LIMIT" not in env
    assert "LD_PRELOAD" not in env
    specs = claim_specs(cluster, pod)
    assert len(specs) == 1, spec_names(cluster)

    cluster.delete_pod("whole")
    # NodeUnprepareResources removed the claim's CDI spec.
    wait_until("the claim's CDI spec to be removed", lambda: not specs & spec_names(cluster), 30,
               cluster.check)


def test_a_hami_share_gets_its_limits_and_the_library_mounted(cluster: Cluster) -> None:
    cluster.create_pod(legacy_pod("share", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 8000,
                                            "nvidia.com/gpucores": 30}))
    # Its limits in the environment; the library bind-mounted from the node at the same path.
    check_hami_share(cluster, "share", cluster.hami_library)
    cluster.delete_pod("share")


def test_each_container_of_a_pod_sees_only_its_own_card(cluster: Cluster) -> None:
    cluster.create_pod(legacy_pod("pair", {"nvidia.com/gpu": 1}, containers=2))
    pod = cluster.wait_running("pair")
    allocated = set(cluster.allocated_uuids(pod))
    assert len(allocated) == 2, allocated
    seen = [container_env(cluster.container_output("pair", f"c{i}", until="done"))
            ["NVIDIA_VISIBLE_DEVICES"] for i in range(2)]
    assert len(set(seen)) == 2, seen
    assert set(seen) == allocated, seen
    cluster.delete_pod("pair")


def _container_ids(cluster: Cluster, name: str) -> list[str]:
    return [c["containerID"] for c in cluster.pod(name)["status"]["containerStatuses"]]


def test_a_restarted_plugin_keeps_running_pods_and_republishes_nothing_twice(
        cluster: Cluster) -> None:
    cluster.create_pod(legacy_pod("steady", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000}))
    pod = cluster.wait_running("steady")
    before = _container_ids(cluster, "steady")
    specs = claim_specs(cluster, pod)
    slices = {s["metadata"]["name"] for s in cluster.slices()}
    since = cluster.kubelet_log_size()

    cluster.stop_plugin()
    cluster.start_plugin()
    cluster.wait_registered(since)
    time.sleep(3)  # a republish, if the plugin did one, lands within its first seconds

    assert {s["metadata"]["name"] for s in cluster.slices()} == slices
    assert _container_ids(cluster, "steady") == before
    assert cluster.pod("steady")["status"]["phase"] == "Running"
    # The claim stayed prepared: its spec is still there, and deleting the pod unprepares it
    # through the new plugin process (its checkpoint).
    assert specs <= spec_names(cluster)
    cluster.delete_pod("steady")
    wait_until("the claim's CDI spec to be removed", lambda: not specs & spec_names(cluster), 30,
               cluster.check)


def test_a_restarted_kubelet_republishes_and_keeps_pods_running(cluster: Cluster) -> None:
    cluster.create_pod(legacy_pod("survivor", {"nvidia.com/gpu": 1}))
    cluster.wait_running("survivor")
    before = _container_ids(cluster, "survivor")
    since = cluster.kubelet_log_size()

    cluster.node.stop_kubelet()
    cluster.node.start_kubelet()
    cluster.wait_registered(since)
    # The kubelet deletes the node's slices when it starts; the plugin publishes them again.
    wait_until("the slices to be republished", lambda: len(
        [d for s in cluster.slices() for d in s["spec"].get("devices") or []]) == 8, 60,
        cluster.check)
    assert _container_ids(cluster, "survivor") == before
    assert cluster.pod("survivor")["status"]["phase"] == "Running"
    cluster.delete_pod("survivor")


@pytest.mark.slow
def test_a_plugin_gone_longer_than_the_kubelet_waits_comes_back(cluster: Cluster) -> None:
    cluster.create_pod(legacy_pod("waiting", {"nvidia.com/gpu": 1}))
    pod = cluster.wait_running("waiting")
    specs = claim_specs(cluster, pod)
    cluster.stop_plugin()
    # About 30 s without its plugin, the kubelet deletes the node's slices.
    wait_until("the kubelet to delete the node's slices", lambda: not cluster.slices(), 90,
               cluster.check)
    # A pod deleted meanwhile cannot be unprepared: it stays Terminating.
    cluster.delete_pod("waiting", wait=False)
    time.sleep(3)
    assert cluster.pod("waiting")["metadata"].get("deletionTimestamp")
    assert specs <= spec_names(cluster)

    since = cluster.kubelet_log_size()
    cluster.start_plugin()
    cluster.wait_registered(since)
    wait_until("the slices to be published again", lambda: bool(cluster.slices()), 60,
               cluster.check)
    cluster.delete_pod("waiting")
    wait_until("the claim's CDI spec to be removed", lambda: not specs & spec_names(cluster), 30,
               cluster.check)
    assert names.DRIVER in cluster.node.kubelet_log()


def test_a_rolling_update_replaces_the_plugin_without_a_gap(cluster: Cluster) -> None:
    """As the chart's DaemonSet does it (maxSurge 1): the new pod's plugin registers beside the
    old one's, each on sockets named by its pod UID (--instance), then the old one stops. The
    kubelet keeps the driver all along: no slice is deleted, and pods keep being prepared and
    unprepared."""
    cluster.stop_plugin()
    since = cluster.kubelet_log_size()
    cluster.start_plugin(instance="old-pod-uid")
    cluster.wait_registered(since)
    cluster.create_pod(legacy_pod("before", {"nvidia.com/gpu": 1}))
    before = cluster.wait_running("before")
    specs = claim_specs(cluster, before)
    slices = {s["metadata"]["name"] for s in cluster.slices()}

    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(sum(len(s["spec"].get("devices") or []) for s in cluster.slices()))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    old = cluster.plugin
    new = Component("node-plugin-new", cluster.plugin_args(instance="new-pod-uid"),
                    cluster.gateway.work / "logs" / "node-plugin-new.log")
    try:
        since = cluster.kubelet_log_size()
        new.start()
        cluster.wait_registered(since)
        old.stop()  # its sockets go with it; the new one's stay
        time.sleep(3)
        cluster.create_pod(legacy_pod("after", {"nvidia.com/gpu": 1}))
        cluster.wait_running("after")
        cluster.delete_pod("before")
        wait_until("the old pod's claim to be unprepared (by the new plugin)",
                   lambda: not specs & spec_names(cluster), 30, cluster.check)
        cluster.delete_pod("after")
    finally:
        stop.set()
        watcher.join()
        new.stop()
        again = cluster.kubelet_log_size()
        cluster.start_plugin()
        cluster.wait_registered(again)
    assert min(seen) == 8, f"the node's devices dropped during the update: {sorted(set(seen))}"
    assert {s["metadata"]["name"] for s in cluster.slices()} == slices
    assert "Deleted ResourceSlices" not in cluster.node.kubelet_log()[since:]


def test_sockets_removed_under_the_plugin_are_served_again(cluster: Cluster) -> None:
    since = cluster.kubelet_log_size()
    for path in [*cluster.node.registry_dir.glob(f"{names.DRIVER}*-reg.sock"),
                 *(cluster.node.plugins_dir / names.DRIVER).glob("dra*.sock")]:
        path.unlink()
    # The kubelet drops the plugin when its registration socket goes, and registers it again
    # once the plugin serves it anew.
    cluster.wait_registered(since, timeout_s=30)
    cluster.create_pod(legacy_pod("after-removal", {"nvidia.com/gpu": 1}))
    cluster.wait_running("after-removal")
    cluster.delete_pod("after-removal")


def test_cdi_specs_written_where_the_runtime_does_not_read_fail_the_container_clearly(
        cluster: Cluster) -> None:
    """A plugin whose --cdi-dir (the chart's nodePlugin.cdiDir) is not one of the runtime's CDI
    folders prepares the claim, and then the runtime cannot resolve its CDI device: the
    container is never created, and the pod's Events name the device that was not found, so
    the misconfiguration shows instead of a container without its card."""
    elsewhere = STATE_ROOT / "cdi-not-read"
    since = cluster.kubelet_log_size()
    cluster.stop_plugin()
    cluster.start_plugin(cdi_dir=elsewhere)
    try:
        cluster.wait_registered(since)
        cluster.create_pod(legacy_pod("unread-cdi", {"nvidia.com/gpu": 1}))

        def refused() -> str:
            return "\n".join(line for line in cluster.events(WORKLOADS).splitlines()
                             if line.startswith("unread-cdi:") and "CDI" in line)

        wait_until("the runtime to refuse the container", lambda: bool(refused()), 90,
                   cluster.check)
        assert "unresolvable CDI devices" in refused(), refused()
        assert f"k8s.{names.DRIVER}/claim=" in refused(), refused()
        assert list(elsewhere.glob("*.json")), "the plugin wrote no spec"
        assert cluster.pod("unread-cdi")["status"]["phase"] == "Pending"
        cluster.delete_pod("unread-cdi")
    finally:
        since = cluster.kubelet_log_size()
        cluster.stop_plugin()
        cluster.start_plugin()
        cluster.wait_registered(since)

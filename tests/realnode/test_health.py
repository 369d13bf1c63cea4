"""Device health reaches the pods that use the device, through the real kubelet.

The node plugin advertises the kubelet's optional DRAResourceHealth service and streams each
device's health on its DRA socket. A kubelet from 1.36 on (ResourceHealthStatus beta and on)
asks for that stream and writes it into `status.containerStatuses[].allocatedResourcesStatus`
of every pod that holds the device: the pod learns that its card failed, and that it recovered.
The fault is driven as NVML would report it, through the plugin's --fault-file.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from e2e.support import wait_until

from dra_gateway.kube import names
from dra_gateway.kube.device_health import node_marks
from realnode.support import WORKLOADS, Cluster
from realnode.test_node import claim_specs, legacy_pod, spec_names

# An XID outside the application and fatal tables: degraded (the card takes no new work and
# its pods keep running; a fatal one would have them evicted).
DEGRADED_XID = 94
FATAL_XID = 79  # the GPU has fallen off the bus
# Fatal, and the card still enumerates: nothing but an administrator says it is back.
STILL_ENUMERATES_XID = 48


def _kubelet_minor(cluster: Cluster) -> int:
    node = cluster.api.get(f"/api/v1/nodes/{cluster.node.name}")
    return int(node["status"]["nodeInfo"]["kubeletVersion"].split(".")[1])


def _health(cluster: Cluster, pod: str, device: str) -> str:
    """What the pod's status says of `device`'s health ("" while it says nothing)."""
    return str(_resource(cluster, pod, device).get("health", ""))


def _resource(cluster: Cluster, pod: str, device: str) -> dict[str, Any]:
    """The pod's status entry of `device` ({} while there is none). The kubelet names a
    DRA device by the CDI device the plugin prepared for it: `k8s.<driver>/claim=<claim
    UID>-<device>`."""
    for status in cluster.pod(pod)["status"].get("containerStatuses") or []:
        for entry in status.get("allocatedResourcesStatus") or []:
            for resource in entry.get("resources") or []:
                if str(resource.get("resourceID", "")).endswith(f"-{device}"):
                    return dict(resource)
    return {}


def _device(cluster: Cluster, pod: dict[str, Any]) -> str:
    [claim] = cluster.claims_of(pod)
    [result] = claim["status"]["allocation"]["devices"]["results"]
    return str(result["device"])


def test_a_pod_status_shows_its_card_unhealthy_and_healthy_again(cluster: Cluster) -> None:
    minor = _kubelet_minor(cluster)
    if minor < 36:
        pytest.skip(f"kubelet 1.{minor}: ResourceHealthStatus is alpha and off before 1.36")
    cluster.create_pod(legacy_pod("health", {"nvidia.com/gpu": 1}))
    pod = cluster.wait_running("health")
    device = _device(cluster, pod)
    wait_until(f"the pod's status to show {device} healthy",
               lambda: _health(cluster, "health", device) == "Healthy", 60, cluster.check)
    cluster.fault({"device": device, "event": "xid", "code": DEGRADED_XID})
    wait_until(f"the pod's status to show {device} unhealthy",
               lambda: _health(cluster, "health", device) == "Unhealthy", 60, cluster.check)
    # With the plugin's reason, and the pod keeps running on a degraded card.
    assert f"xid-{DEGRADED_XID} (degraded fault)" in _resource(cluster, "health", device).get(
        "message", ""), _resource(cluster, "health", device)
    assert cluster.pod("health")["status"]["phase"] == "Running"
    cluster.fault({"device": device, "event": "recovered"})
    wait_until(f"the pod's status to show {device} healthy again",
               lambda: _health(cluster, "health", device) == "Healthy", 60, cluster.check)
    cluster.delete_pod("health")


def test_a_pod_on_a_card_that_falls_off_the_bus_is_evicted_and_its_claim_unprepared(
        cluster: Cluster) -> None:
    """A fatal fault under the real kubelet: the pod is evicted, its containers stopped and
    its claim unprepared (its CDI spec removed). On 1.34 the API server drops device taints and
    the gateway's allocator evicts it (allocator/eviction/drain.py); from 1.36 the card is tainted
    NoExecute and kube-controller-manager does. Then the card recovers."""
    cluster.create_pod(legacy_pod("fatal", {"nvidia.com/gpu": 1}))
    pod = cluster.wait_running("fatal")
    device = _device(cluster, pod)
    specs = claim_specs(cluster, pod)
    assert specs
    cluster.fault({"device": device, "event": "xid", "code": FATAL_XID})
    try:
        wait_until("the pod on the failed card to be evicted and gone",
                   lambda: not cluster.api.exists(f"/api/v1/namespaces/{WORKLOADS}/pods/fatal"),
                   90, cluster.check)
        wait_until("its claim to be unprepared (its CDI spec removed)",
                   lambda: not specs & spec_names(cluster), 60, cluster.check)
        tainted = any(t.get("key") == f"{names.DRIVER}/unhealthy"
                      for s in cluster.slices() for d in s["spec"].get("devices") or ()
                      if d["name"] == device for t in d.get("taints") or ())
        said = cluster.events(WORKLOADS)
        if tainted:
            assert "fatal: DeviceTaintManagerEviction" in said, said
        else:
            assert f"fatal: UnhealthyDevice: device {device} on node" in said, said
    finally:
        cluster.fault({"device": device, "event": "recovered"})

        def healthy() -> bool:
            devices = {d["name"]: d for s in cluster.slices()
                       for d in s["spec"].get("devices") or ()}
            return device in devices and not devices[device].get("taints")

        wait_until(f"{device} to be published healthy again", healthy, 60, cluster.check)


def test_a_card_with_a_fatal_fault_stays_out_of_service_when_the_plugin_restarts(
        cluster: Cluster) -> None:
    """XID 48 gives no sign of recovery: a restarted plugin (a helm upgrade, a changed
    inventory, a deleted pod) must not publish the card again, untainted, nor tell the Node
    that every device is healthy. The marks live in the plugin's state directory and the
    Node's condition (node-plugin/healthstate.py)."""
    device = sorted(d["name"] for s in cluster.slices() for d in s["spec"].get("devices") or ())[-1]

    def out_of_service() -> bool:
        devices = {d["name"]: d for s in cluster.slices() for d in s["spec"].get("devices") or ()}
        node = cluster.api.get(f"/api/v1/nodes/{cluster.node.name}")
        marked = any(m.device == device for m in node_marks(node))
        withheld_or_tainted = device not in devices or any(
            t.get("effect") == "NoExecute" for t in devices[device].get("taints") or ())
        return marked and withheld_or_tainted

    cluster.fault({"device": device, "event": "xid", "code": STILL_ENUMERATES_XID})
    try:
        wait_until(f"{device} out of service", out_of_service, 60, cluster.check)
        since = cluster.kubelet_log_size()
        cluster.stop_plugin()
        cluster.start_plugin()
        cluster.wait_registered(since)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert out_of_service(), f"{device} came back after the plugin restarted"
            time.sleep(1)
    finally:
        cluster.fault({"device": device, "event": "recovered"})

        def healthy() -> bool:
            devices = {d["name"]: d for s in cluster.slices()
                       for d in s["spec"].get("devices") or ()}
            return device in devices and not devices[device].get("taints")

        wait_until(f"{device} to be published healthy again", healthy, 60, cluster.check)

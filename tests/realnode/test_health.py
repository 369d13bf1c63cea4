"""Device health reaches the pods that use the device, through the real kubelet.

The node plugin advertises the kubelet's optional DRAResourceHealth service and streams each
device's health on its DRA socket. A kubelet from 1.36 on (ResourceHealthStatus beta and on)
asks for that stream and writes it into `status.containerStatuses[].allocatedResourcesStatus`
of every pod that holds the device: the pod learns that its card failed, and that it recovered.
The fault is driven as NVML would report it, through the plugin's --fault-file.
"""

from __future__ import annotations

from typing import Any

import pytest
from e2e.support import wait_until

from realnode.support import Cluster
from realnode.test_node import legacy_pod

# An XID outside the application and fatal tables: degraded (the card takes no new work and
# its pods keep running; a fatal one would have them evicted).
DEGRADED_XID = 94


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

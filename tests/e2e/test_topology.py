"""Multi-card pods on aligned cards, on a real control plane (allocator/planner/topology.py).

The demo's H100 node is laid out as a DGX H100: one NVLink island of eight cards, cards 0-3 on
NUMA node 0 and 4-7 on NUMA node 1, a PCIe root each. A three-card pod takes three cards of one
NUMA node; a two-card pod then gets two cards of the other NUMA node, where the first free cards
in order (the one left on the first NUMA node and one of the second) would straddle them.
"""

from __future__ import annotations

from typing import Any

from e2e.support import Gateway, path_of, placed_on_its_node, pod_devices, wait_until
from e2e.test_preemption import NODE, PLACE_S, _no_over_capacity, _pod_path, _scene

JSON = dict[str, Any]
TOPOLOGY_NS = "topology"


def _pod(name: str, cards: int) -> JSON:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": TOPOLOGY_NS},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": NODE},
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "example.com/cuda:1",
                                     "resources": {"limits": {"nvidia.com/gpu": str(cards)}}}]}}


def _numa_of(api: Any) -> dict[str, int]:
    """NODE's devices' NUMA nodes, as its ResourceSlice publishes them."""
    found: dict[str, int] = {}
    for item in api.list(path_of("resource.k8s.io/v1", "resourceslices")):
        if item["spec"].get("nodeName") != NODE:
            continue
        for device in item["spec"].get("devices") or []:
            numa = (device.get("attributes") or {}).get("resource.kubernetes.io/numaNode")
            if numa is not None:
                found[device["name"]] = numa["int"]
    return found


def test_multi_card_pods_land_on_one_numa_node(gateway: Gateway) -> None:
    with _scene(gateway, TOPOLOGY_NS) as api:
        numa = _numa_of(api)
        assert sorted(numa.values()) == [0, 0, 0, 0, 1, 1, 1, 1], numa

        def placed(name: str) -> list[str]:
            pod = api.get(_pod_path(TOPOLOGY_NS, name))
            if not placed_on_its_node(api, pod):
                return []
            return [device for _, device, _ in pod_devices(api, pod)]

        api.create(_pod_path(TOPOLOGY_NS), _pod("three", 3))
        wait_until("the three-card pod to be placed", lambda: bool(placed("three")), PLACE_S,
                   lambda: _no_over_capacity(gateway))
        three = placed("three")
        assert len({numa[d] for d in three}) == 1, three
        api.create(_pod_path(TOPOLOGY_NS), _pod("two", 2))
        wait_until("the two-card pod to be placed", lambda: bool(placed("two")), PLACE_S,
                   lambda: _no_over_capacity(gateway))
        two = placed("two")
        assert len({numa[d] for d in two}) == 1, (three, two)
        assert {numa[d] for d in two} != {numa[d] for d in three}, (three, two)
        print(f"three-card pod on {sorted(three)}, two-card pod on {sorted(two)}")

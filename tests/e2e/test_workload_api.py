"""Pod groups declared through upstream's Workload API, on a real 1.37.2 control plane with the
GenericWorkload gate on and scheduling.k8s.io/v1beta1 served (gpu/groups.py).

A PodGroup (`scheduling.k8s.io/v1beta1`) asks for a gang of two; its two workers, each asking
for three cards by their legacy name and naming it in `spec.schedulingGroup.podGroupName`, are
pinned to the demo's eight-card node where a filler pod holds three cards. Five cards are free,
six are needed: neither worker holds a card, both say so in `dra-gateway.io/PodGroup`
(GroupDoesNotFit). Once the filler is gone both are allocated together, and kube-scheduler (its
gang scheduling on with the gate) binds them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

from dra_gateway.kube.cluster.port import ApiError
from e2e.support import (
    Gateway,
    build_binaries,
    find_helm,
    install,
    path_of,
    placed_on_its_node,
    pod_devices,
    pods,
    wait_until,
)
from e2e.test_groups import _condition
from e2e.test_preemption import (
    CARDS,
    NODE,
    PLACE_S,
    _free_cards,
    _gated,
    _no_over_capacity,
    _pod_path,
    _scene,
)

JSON = dict[str, Any]
VERSION = "1.37.2"
pytestmark = pytest.mark.needs_build("control-plane", VERSION)
NS = "workload-api"
PODGROUPS = "scheduling.k8s.io/v1beta1"


@pytest.fixture(scope="module")
def workload_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    helm = find_helm()
    bin_dir = build_binaries(VERSION)
    work = tmp_path_factory.mktemp("e2e-workload-api")
    with install(VERSION, {"GenericWorkload": True}, bin_dir, helm, work,
                 apiserver_args=("--runtime-config=scheduling.k8s.io/v1beta1=true",)) as gw:
        yield gw


@contextlib.contextmanager
def _podgroup(api: Any, name: str, min_count: int) -> Iterator[None]:
    """A gang PodGroup, deleted afterwards: its finalizer is the controller manager's, which
    this control plane does not run, so it is lifted first (else the namespace never goes)."""
    path = path_of(PODGROUPS, "podgroups", namespace=NS)
    api.create(path, {"apiVersion": PODGROUPS, "kind": "PodGroup",
                      "metadata": {"name": name, "namespace": NS},
                      "spec": {"schedulingPolicy": {"gang": {"minCount": min_count}}}})
    try:
        yield
    finally:
        with contextlib.suppress(ApiError):
            api.patch(f"{path}/{name}", {"metadata": {"finalizers": None}})
            api.delete(f"{path}/{name}")


def _worker(name: str, cards: int, group: str | None) -> JSON:
    spec: JSON = {"nodeSelector": {"kubernetes.io/hostname": NODE},
                  "terminationGracePeriodSeconds": 0,
                  "containers": [{"name": "main", "image": "example.com/cuda:1",
                                  "resources": {"limits": {"nvidia.com/gpu": str(cards)}}}]}
    if group is not None:
        spec["schedulingGroup"] = {"podGroupName": group}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS},
            "spec": spec}


def test_a_workload_api_gang_is_allocated_whole_or_not_at_all(
        workload_gateway: Gateway) -> None:
    gateway = workload_gateway
    with _scene(gateway, NS) as api, _podgroup(api, "train", 2):
        api.create(_pod_path(NS), _worker("filler", 3, None))
        wait_until("the filler to hold three cards",
                   lambda: placed_on_its_node(api, api.get(_pod_path(NS, "filler"))), PLACE_S,
                   gateway.check)
        assert _free_cards(api) == CARDS - 3

        def workers() -> list[JSON]:
            return [p for p in pods(api, NS) if p["metadata"]["name"].startswith("w-")]

        for index in range(2):
            created = api.create(_pod_path(NS), _worker(f"w-{index}", 3, "train"))
            # The API server keeps the field with the gate on: the pod names its PodGroup.
            assert created["spec"].get("schedulingGroup") == {"podGroupName": "train"}
        wait_until("the gang to say it does not fit", lambda: len(workers()) == 2 and all(
            (_condition(p) or {}).get("reason") == "GroupDoesNotFit" for p in workers()), 30,
            lambda: _no_over_capacity(gateway))
        said = (_condition(workers()[0]) or {}).get("message", "")
        assert f"pod group {NS}/train" in said, said
        assert "spec.schedulingGroup.podGroupName=train" in said, said
        assert "spec.schedulingPolicy.gang.minCount=2" in said, said
        assert sum(len(pod_devices(api, p)) for p in workers()) == 0
        assert all(_gated(p) for p in workers())

        api.delete(_pod_path(NS, "filler"), grace_period_s=0)
        wait_until("the gang to be placed whole", lambda: all(
            placed_on_its_node(api, p) for p in workers()), PLACE_S,
            lambda: _no_over_capacity(gateway))
        assert sum(len(pod_devices(api, p)) for p in workers()) == 6

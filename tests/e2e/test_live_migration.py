"""Moving a live cluster, on a real control plane: a node whose GPUs a legacy device plugin
serves is cut over to the gateway while a legacy pod still holds two of its cards, and no card
is ever offered to both; a namespace in audit mode admits a HAMi pod unchanged with its
warning; `migrate plan` and `migrate quotas` read the live cluster, and the GPUQuotas they write
are accepted by the real API server.

The node, its fake kubelet and its namespaces are `e2e/legacynode.py`'s, removed at the end: the
other modules of the tier see the installation as `install` made it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from gotools import build_go_tool

from dra_gateway.devkit.realcluster import path_of
from dra_gateway.kube import names
from e2e.legacynode import (
    AUDIT_NS,
    BURST,
    HELD,
    LEGACY_NS,
    NODE,
    TRAIN_NS,
    UUIDS,
    burst_cards,
    condition,
    device_uuids,
    gpu_pod,
    legacy_node,
    published_uuids,
    set_gpus,
)
from e2e.support import NAMESPACE, REPO, Gateway, over_capacity, wait_until


@pytest.fixture(scope="module")
def fake_kubelet_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_go_tool(REPO / "tests" / "node_plugin" / "podresources",
                         tmp_path_factory.mktemp("podresources"),
                         "the fake kubelet pod-resources server")


def _migrate(gateway: Gateway, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_gateway", "migrate", *args,
         "--kubeconfig", str(gateway.plane.admin_kubeconfig)],
        capture_output=True, text=True, timeout=120, check=False)


def test_a_node_is_cut_over_while_a_legacy_pod_holds_two_cards_and_none_is_booked_twice(
        gateway: Gateway, fake_kubelet_binary: Path) -> None:
    api = gateway.api
    with legacy_node(gateway, fake_kubelet_binary) as kubelet:
        # 1. Legacy: NVIDIA's device plugin offers the four cards; the gateway publishes none.
        wait_until("the node plugin to report Legacy",
                   lambda: condition(gateway).get("reason") == names.NODE_STATE_LEGACY, 60,
                   gateway.check)
        assert published_uuids(gateway) == set()
        # A legacy trainer takes two cards through the device plugin (its namespace is
        # disabled: the webhook is not even called).
        api.create(path_of("v1", "pods", namespace=LEGACY_NS),
                   gpu_pod("trainer", LEGACY_NS, 2))
        wait_until("the legacy trainer to be bound", lambda: bool(api.get(path_of(
            "v1", "pods", namespace=LEGACY_NS, name="trainer"))["spec"].get("nodeName")), 60)
        trainer = api.get(path_of("v1", "pods", namespace=LEGACY_NS, name="trainer"))
        assert "resourceClaims" not in trainer["spec"]
        kubelet.write(offered=True, holders={f"{LEGACY_NS}/trainer": HELD})

        # `migrate node` labels the node and says what it still waits for.
        waiting = _migrate(gateway, "node", NODE, "-o", "json")
        assert waiting.returncode == 3, waiting.stderr
        said = json.loads(waiting.stdout)
        assert said["labelled"] is True
        state = said["node"]
        assert state["cut_over"] is True
        assert state["legacy_plugins"] == {"nvidia.com/gpu": "4"}
        assert state["legacy_pods"] == [f"{LEGACY_NS}/trainer"]
        node = api.get(path_of("v1", "nodes", name=NODE))
        assert node["metadata"]["labels"][names.NODE_CUT_OVER_LABEL] == "true"

        # 2. The legacy plugin leaves (its DaemonSet avoids cut-over nodes): the kubelet offers
        # nothing and the Node's amount drops to zero, but the trainer still holds its cards.
        kubelet.write(offered=False, holders={f"{LEGACY_NS}/trainer": HELD})
        set_gpus(gateway, "0")
        wait_until("the node plugin to report CuttingOver", lambda: condition(gateway).get(
            "reason") == names.NODE_STATE_CUTTING_OVER, 60, gateway.check)
        assert condition(gateway)["message"].startswith(
            f"2 of 4 card(s) held by legacy pods: {LEGACY_NS}/trainer (nvidia.com/gpu)")
        wait_until("the two free cards to be published",
                   lambda: published_uuids(gateway) == set(UUIDS[2:]), 30, gateway.check)

        # 3. A burst of translated pods: two fit on the free cards, the rest wait.
        for i in range(BURST):
            api.create(path_of("v1", "pods", namespace=TRAIN_NS), gpu_pod(f"w{i}", TRAIN_NS, 1))
        uuids = device_uuids(gateway)
        wait_until("two burst pods to be allocated",
                   lambda: len(burst_cards(gateway, uuids)) == 2, 90, gateway.check)
        time.sleep(3)  # the allocator has seen every pod: nothing more may land
        placed = burst_cards(gateway, uuids)
        assert sorted(placed.values()) == sorted(UUIDS[2:]), placed
        gated = [p["metadata"]["name"] for p in api.list(path_of("v1", "pods",
                                                                 namespace=TRAIN_NS))
                 if any(g.get("name") == names.SCHEDULING_GATE
                        for g in p["spec"].get("schedulingGates") or [])]
        assert len(gated) == BURST - 2
        assert published_uuids(gateway) == set(UUIDS[2:])

        # 4. The trainer ends: its two cards come back within seconds and take waiting pods.
        api.delete(path_of("v1", "pods", namespace=LEGACY_NS, name="trainer"), grace_period_s=0)
        kubelet.write(offered=False, holders={})
        wait_until("the node plugin to report DRA",
                   lambda: condition(gateway).get("reason") == names.NODE_STATE_DRA, 30,
                   gateway.check)
        # The condition is written as the republication starts, not after it: the cards
        # follow within seconds.
        wait_until("the four cards to be published",
                   lambda: set(device_uuids(gateway).values()) == set(UUIDS), 30, gateway.check)
        uuids = device_uuids(gateway)
        wait_until("four burst pods to be allocated",
                   lambda: len(burst_cards(gateway, uuids)) == 4, 90, gateway.check)
        assert sorted(burst_cards(gateway, uuids).values()) == sorted(UUIDS)
        assert over_capacity(api) == []
        done = _migrate(gateway, "node", NODE, "-o", "json")
        assert done.returncode == 0, done.stdout + done.stderr
        assert json.loads(done.stdout)["node"]["condition"]["reason"] == names.NODE_STATE_DRA

        # 5. The audit namespace admits a HAMi pod unchanged and says what it would become.
        warnings: list[str] = []
        hami = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "llm", "namespace": AUDIT_NS},
                "spec": {"containers": [{"name": "server", "image": "vllm:0.6", "resources": {
                    "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000",
                               "nvidia.com/gpucores": "30"}}}]}}
        created = api.create(path_of("v1", "pods", namespace=AUDIT_NS), hami, warnings=warnings)
        assert "resourceClaims" not in created["spec"]
        assert "schedulingGates" not in created["spec"]
        # As written (the API server spells 8000 as 8k).
        assert created["spec"]["containers"][0]["resources"]["limits"] == {
            "nvidia.com/gpu": "1", "nvidia.com/gpumem": "8k", "nvidia.com/gpucores": "30"}
        (said,) = [w for w in warnings if w.startswith("dra-gateway audit: ")]
        assert said.startswith(
            'dra-gateway audit: container "server" (nvidia.com/gpu: 1, nvidia.com/gpucores: 30, '
            "nvidia.com/gpumem: 8k) would get 1 device of class gpu.dra-gateway.io, capacity "
            "memory 8000Mi, cores 30 by rule hami, from ResourceClaimTemplate dra-gateway-"), said
        assert api.list(path_of("resource.k8s.io/v1", "resourceclaimtemplates",
                                namespace=AUDIT_NS)) == []

        # 6. `migrate plan` and `migrate quotas` read the live cluster.
        api.create(path_of("v1", "resourcequotas", namespace=TRAIN_NS), {
            "apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": "gpus", "namespace": TRAIN_NS},
            "spec": {"hard": {"requests.nvidia.com/gpu": "4"}}})
        plan = _migrate(gateway, "plan", "-o", "json")
        assert plan.returncode == 0, plan.stderr
        planned = json.loads(plan.stdout)
        modes = {n["name"]: n["mode"] for n in planned["namespaces"]}
        assert (modes[LEGACY_NS], modes[TRAIN_NS], modes[AUDIT_NS]) == (
            "disabled", "enabled", "audit")
        quotas = _migrate(gateway, "quotas", "-o", "json")
        assert quotas.returncode == 0, quotas.stderr
        written = [q for q in json.loads(quotas.stdout)["gpuQuotas"]
                   if q["metadata"]["namespace"] == TRAIN_NS]
        assert [q["spec"]["hard"] for q in written] == [{"devices": 4}], written
        for quota in written:
            api.create(path_of(names.API_VERSION, "gpuquotas", namespace=TRAIN_NS), quota)
        assert api.exists(path_of(names.API_VERSION, "gpuquotas", namespace=TRAIN_NS,
                                  name="gpus"))
    assert NAMESPACE  # the gateway's own namespace is untouched by the scenario

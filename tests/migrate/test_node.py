"""`migrate node NODE`: label one node for cut-over and say what it still waits for; exit 3 while
it waits, 0 once cut over."""

from __future__ import annotations

import copy
import json
from typing import Any

import kubernetes_validate
import pytest

from dra_gateway.cli import main
from dra_gateway.kube import names
from dra_gateway.kube.resources import NODES
from dra_gateway.migrate.node import EXIT_WAITING, daemonset_affinity_patch, node_state
from dra_gateway.translator.rules import load_rules

from .conftest import LiveCluster, node, pod


def _labels(live: LiveCluster, name: str) -> dict[str, str]:
    return dict(live.run(live.memory.get(NODES, name))["metadata"].get("labels") or {})


def _node(live: LiveCluster, *args: str) -> int:
    return main(["migrate", "node", *args, "--kubeconfig", str(live.kubeconfig)])


def test_a_legacy_node_is_labelled_and_waits_for_the_plugin_and_its_pods(
        live_cluster: LiveCluster, capsys: pytest.CaptureFixture[str]) -> None:
    live_cluster.load([node("gpu-1", {"nvidia.com/gpu": 8}),
                       pod("train", "team-a", {"nvidia.com/gpu": 2}, node="gpu-1"),
                       pod("web", "team-a", {"cpu": 1}, node="gpu-1")])

    assert _node(live_cluster, "gpu-1") == EXIT_WAITING == 3

    assert _labels(live_cluster, "gpu-1")[names.NODE_CUT_OVER_LABEL] == "true"
    out = capsys.readouterr().out
    assert out.startswith("node gpu-1: labelled dra-gateway.io/cut-over=true\n"
                          "legacy device plugin: still offers nvidia.com/gpu: 8\n")
    assert "kubectl -n <namespace> patch daemonset <legacy-device-plugin> --type strategic" in out
    assert "legacy pods holding cards: team-a/train\n" in out
    assert out.endswith(
        "still waiting for:\n"
        "  - the legacy device plugin to leave: it still offers nvidia.com/gpu: 8; give its "
        "DaemonSet the node affinity dra-gateway.io/cut-over NotIn [true]\n"
        "  - 1 legacy pod(s) holding cards to end: team-a/train\n"
        "  - the gateway's node plugin to report the condition DraGatewayMigration (is it "
        "running on gpu-1?)\n")


def test_a_dry_run_changes_nothing_and_still_waits(
        live_cluster: LiveCluster, capsys: pytest.CaptureFixture[str]) -> None:
    live_cluster.load([node("gpu-1", {"nvidia.com/gpu": 8})])
    assert _node(live_cluster, "gpu-1", "--dry-run") == 3
    assert names.NODE_CUT_OVER_LABEL not in _labels(live_cluster, "gpu-1")
    out = capsys.readouterr().out
    assert out.startswith("node gpu-1: would label dra-gateway.io/cut-over=true (dry run: "
                          "nothing changed)\n")
    assert "  - the label dra-gateway.io/cut-over=true (dra-gateway migrate node gpu-1)\n" in out


def test_a_node_cut_over_exits_0(live_cluster: LiveCluster,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    live_cluster.load([node("gpu-1", {"nvidia.com/gpu": 0},
                            labels={names.NODE_CUT_OVER_LABEL: "true"},
                            condition=("DRA", "8 cards published")),
                       pod("translated", "a", {},  node="gpu-1",
                           annotations={names.ANNOTATION_TRANSLATED: "{}"})])
    assert _node(live_cluster, "gpu-1", "-o", "json") == 0
    out = json.loads(capsys.readouterr().out)
    assert out["node"]["done"] is True
    assert out["labelled"] is False
    assert out["daemonSetPatch"] is None
    assert out["exitCode"] == 0


def test_the_node_plugin_still_cutting_over_keeps_the_node_waiting(
        live_cluster: LiveCluster, capsys: pytest.CaptureFixture[str]) -> None:
    live_cluster.load([node("gpu-1", {}, labels={names.NODE_CUT_OVER_LABEL: "true"},
                            condition=("CuttingOver", "2 cards held by legacy pods"))])
    assert _node(live_cluster, "gpu-1") == 3
    assert capsys.readouterr().out.endswith(
        "still waiting for:\n  - the gateway's node plugin to reach DRA: it reports "
        "CuttingOver: 2 cards held by legacy pods\n")


def test_a_node_that_does_not_exist_is_named_and_exits_2(
        live_cluster: LiveCluster, capsys: pytest.CaptureFixture[str]) -> None:
    assert _node(live_cluster, "ghost") == 2
    assert capsys.readouterr().err == ("error: node ghost does not exist; "
                                       "list the nodes with kubectl get nodes\n")


def test_the_daemonset_patch_gives_a_valid_daemonset_that_avoids_cut_over_nodes() -> None:
    daemonset: dict[str, Any] = {
        "apiVersion": "apps/v1", "kind": "DaemonSet",
        "metadata": {"name": "nvidia-device-plugin", "namespace": "kube-system"},
        "spec": {"selector": {"matchLabels": {"app": "dp"}},
                 "template": {"metadata": {"labels": {"app": "dp"}},
                              "spec": {"containers": [{"name": "dp", "image": "dp:1"}]}}}}

    def merge(into: dict[str, Any], patch: dict[str, Any]) -> None:
        for key, value in patch.items():
            if isinstance(value, dict) and isinstance(into.get(key), dict):
                merge(into[key], value)
            else:
                into[key] = copy.deepcopy(value)

    merge(daemonset, daemonset_affinity_patch())
    kubernetes_validate.validate(daemonset, "1.34", strict=True)
    (term,) = (daemonset["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
               ["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"])
    assert term == {"matchExpressions": [{"key": "dra-gateway.io/cut-over",
                                          "operator": "NotIn", "values": ["true"]}]}


def test_only_running_untranslated_pods_asking_for_cards_hold_legacy_cards() -> None:
    pods = [pod("running", "a", {"nvidia.com/gpu": 1}, node="n"),
            pod("finished", "a", {"nvidia.com/gpu": 1}, node="n", phase="Failed"),
            pod("translated", "a", {"nvidia.com/gpu": 1}, node="n",
                annotations={names.ANNOTATION_TRANSLATED: "{}"}),
            pod("hint", "a", {"nvidia.com/priority": 1}, node="n"),
            pod("zero", "a", {"nvidia.com/gpu": 0}, node="n"),
            pod("elsewhere", "a", {"nvidia.com/gpu": 1}, node="m"),
            pod("amd", "a", {"amd.com/gpu": 1}, node="n")]
    state = node_state(node("n", {"nvidia.com/gpu": 2}), pods, load_rules())
    assert state.legacy_pods == ("a/amd", "a/running")


def test_a_node_that_never_ran_a_legacy_plugin_needs_no_cut_over_label() -> None:
    rules = load_rules()
    fresh = node_state(node("gpu-new", {}, condition=("DRA", "8 cards published")), [], rules)
    assert fresh.waits_for == ()
    # A legacy name at zero: a plugin ran there and may come back without the label.
    left = node_state(node("gpu-old", {"nvidia.com/gpu": 0},
                           condition=("DRA", "8 cards published")), [], rules)
    assert left.waits_for == ("the label dra-gateway.io/cut-over=true "
                              "(dra-gateway migrate node gpu-old)",)

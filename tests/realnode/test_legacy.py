"""Legacy coexistence against the kubelet's real device manager (D2).

A legacy device plugin (tests/realnode/deviceplugin, on the kubelet's own device plugin API)
offers two of the node's cards as `nvidia.com/gpu`, by UUID as NVIDIA's plugin does. The node
plugin reads the real pod-resources API and the Node's status beside it and must never publish a
card the device manager may hand out: while a legacy plugin offers GPUs on the node, it is
`Legacy` and publishes none. Before D2 was fixed, cards the legacy plugin reported Unhealthy (as
NVIDIA's does after an XID) vanished from `GetAllocatableResources` and `status.allocatable`, the
node plugin concluded that no legacy plugin offered GPUs and published every card, and the device
manager handed them out again once they turned healthy while DRA could hold them; the same
happened the moment the plugin left, although the kubelet takes its devices back if it returns
within about five minutes.

These tests run last in each setup (conftest.py): a departed plugin's devices stay in the Node's
capacity for that grace, and the node stays Legacy.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from e2e.support import wait_until
from gotools import build_go_tool

from dra_gateway.devkit.realcluster import path_of
from dra_gateway.devkit.realnode import DEVICE_PLUGINS
from dra_gateway.kube import names
from dra_gateway.node_plugin.inventory import load_inventory
from realnode.support import INVENTORY, Cluster, container_env

LEGACY = "nvidia.com/gpu"
HERE = Path(__file__).resolve().parent
# Namespace whose pods the webhook leaves as they are: they keep using the device plugin.
UNTRANSLATED = "legacy-workloads"


@pytest.fixture(scope="module")
def device_plugin_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_go_tool(HERE / "deviceplugin", tmp_path_factory.mktemp("deviceplugin"),
                         "the legacy device plugin")


@dataclass
class LegacyPlugin:
    binary: Path
    cards: list[str]  # the UUIDs it offers
    unhealthy_file: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [str(self.binary), "-dir", f"{DEVICE_PLUGINS}/", "-resource", LEGACY,
                 "-devices", ",".join(self.cards), "-unhealthy-file", str(self.unhealthy_file)],
                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=10)
        self.process = None

    def report_unhealthy(self, *cards: str) -> None:
        self.unhealthy_file.write_text("".join(f"{c}\n" for c in cards))


def _node_amounts(cluster: Cluster) -> tuple[str | None, str | None]:
    status = cluster.api.get(path_of("v1", "nodes", name=cluster.node.name))["status"]
    return status.get("capacity", {}).get(LEGACY), status.get("allocatable", {}).get(LEGACY)


def _published_uuids(cluster: Cluster) -> set[str]:
    return set(cluster.card_uuids().values())


@pytest.fixture
def legacy(cluster: Cluster, device_plugin_binary: Path, tmp_path: Path) -> Iterator[LegacyPlugin]:
    """The legacy plugin offering the node's first two cards, and the node plugin withholding
    every card (the node is Legacy); stopped afterwards."""
    uuids = [gpu.uuid for gpu in load_inventory(INVENTORY).gpus]
    plugin = LegacyPlugin(device_plugin_binary, uuids[:2], tmp_path / "unhealthy",
                          tmp_path / "deviceplugin.log")
    plugin.report_unhealthy()
    plugin.start()
    try:
        wait_until("the kubelet to offer the legacy cards", lambda: _node_amounts(cluster) == (
            "2", "2"), 60, cluster.check)
        wait_until("the node plugin to withhold every card (Legacy)",
                   lambda: not _published_uuids(cluster), 30, cluster.check)
        yield plugin
    finally:
        plugin.stop()


def _namespace(cluster: Cluster) -> None:
    if not cluster.api.exists(path_of("v1", "namespaces", name=UNTRANSLATED)):
        cluster.api.create(path_of("v1", "namespaces"), {
            "apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": UNTRANSLATED,
                         "labels": {names.TRANSLATION_LABEL: names.TRANSLATION_DISABLED}}})


def test_cards_the_legacy_plugin_reports_unhealthy_stay_withheld(
        cluster: Cluster, legacy: LegacyPlugin) -> None:
    legacy.report_unhealthy(*legacy.cards)
    # The kubelet counts healthy devices only in allocatable (and its pod-resources API lists
    # none), all of them in capacity.
    wait_until("the kubelet to count the cards unhealthy",
               lambda: _node_amounts(cluster) == ("2", "0"), 60, cluster.check)
    time.sleep(4)  # several passes of the node plugin (it reads both every second)
    assert not _published_uuids(cluster), "cards the device manager may hand out were published"
    legacy.report_unhealthy()
    wait_until("the cards to be healthy again", lambda: _node_amounts(cluster) == ("2", "2"), 60,
               cluster.check)
    assert not _published_uuids(cluster)


def test_a_legacy_pod_keeps_its_card_across_the_plugins_departure(
        cluster: Cluster, legacy: LegacyPlugin) -> None:
    _namespace(cluster)
    cluster.create_pod({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "legacy", "namespace": UNTRANSLATED},
        "spec": {"containers": [{"name": "c0",
                                 "command": ["sh", "-c", "env; echo done; sleep 3600"],
                                 "resources": {"limits": {LEGACY: 1}}}]}})
    pod = cluster.wait_running("legacy", UNTRANSLATED)
    assert not pod["spec"].get("resourceClaims")  # not translated: the device manager's
    held = container_env(cluster.container_output("legacy", "c0", until="done",
                                                  namespace=UNTRANSLATED))["NVIDIA_VISIBLE_DEVICES"]
    assert held in legacy.cards

    # The cut-over: the legacy plugin leaves (its DaemonSet removed from the node).
    legacy.stop()
    wait_until("the kubelet to mark the departed plugin's cards unhealthy",
               lambda: _node_amounts(cluster)[1] == "0", 60, cluster.check)
    time.sleep(4)
    # Every card stays withheld while the kubelet's capacity keeps the departed plugin's
    # devices: it may come back and hand them out (the one its pod holds, and the other).
    assert not _published_uuids(cluster)
    assert cluster.pod("legacy", UNTRANSLATED)["status"]["phase"] == "Running"

    # The plugin back (a restarted pod): its cards are offered again, the pod keeps its card.
    legacy.start()
    wait_until("the kubelet to offer the cards again",
               lambda: _node_amounts(cluster)[1] == "2", 60, cluster.check)
    assert not _published_uuids(cluster)
    [status] = cluster.pod("legacy", UNTRANSLATED)["status"]["containerStatuses"]
    assert status["restartCount"] == 0
    cluster.delete_pod("legacy", UNTRANSLATED)

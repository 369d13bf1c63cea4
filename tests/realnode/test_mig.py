"""MIG on demand under a real kubelet (issue 47): the node plugin run with `--nvml
--mig-on-demand` on the NVML stand-in (two H100s in MIG mode, their instances kept in a file as
the hardware keeps them), and a pod asking NVIDIA's legacy `nvidia.com/mig-1g.10gb`.

The webhook translates it, the allocator gives its claim a 1g placement, the kubelet prepares
it: the plugin makes the instance there and containerd applies the CDI spec that names its MIG
UUID, which the container sees. Once the pod is deleted, the kubelet unprepares the claim and
the instance is gone with its spec. The node's usual plugin (its inventory) comes back after.
"""

from __future__ import annotations

import json
from pathlib import Path

from e2e.support import Component, wait_until

from dra_gateway.devkit.realnode import STATE_ROOT
from dra_gateway.kube import names
from realnode.support import Cluster, container_env

H100 = "NVIDIA H100 80GB HBM3"
CARD_DEVICES = 26  # the whole card and the 25 placements of an H100's profiles
ENV_THEN_SLEEP = "env; echo done; sleep 3600"


def _stand_in_args(cluster: Cluster, cards: Path) -> list[str]:
    """The node plugin's command line as the chart runs it with nodePlugin.migOnDemand, on
    the stand-in instead of the node's inventory (NVML reports health itself: no fault file)."""
    args = cluster.plugin_args()
    for flag in ("--inventory", "--fault-file"):
        at = args.index(flag)
        del args[at:at + 2]
    return ["--card", H100, "--card", H100, "--state", str(cards), "--uuid-prefix", "node1",
            "--", *args, "--nvml", "--mig-on-demand"]


def _instances(cards: Path) -> list[tuple[int, str, int]]:
    """(card, profile, first memory slice) of each instance on the stand-in's cards."""
    if not cards.exists():
        return []
    saved = json.loads(cards.read_text())["cards"]
    return sorted((i, gi["profile"], gi["start"]) for i, card in enumerate(saved) for gi in card)


def _devices(cluster: Cluster) -> int:
    return sum(len(s["spec"].get("devices") or []) for s in cluster.slices())


def test_a_legacy_mig_pod_runs_on_an_instance_made_for_it_and_gone_after(
        cluster: Cluster) -> None:
    cards = STATE_ROOT / "mig-stand-in-cards.json"
    cards.unlink(missing_ok=True)
    cluster.stop_plugin()
    stand_in = Component("node-plugin", _stand_in_args(cluster, cards),
                         cluster.gateway.work / "logs" / "node-plugin-mig.log",
                         module="dra_gateway.devkit.standin_nvml")
    cluster.gateway.components["node-plugin"] = stand_in
    stand_in.start()
    try:
        wait_until("the two cards to be published cut on demand",
                   lambda: _devices(cluster) == 2 * CARD_DEVICES, 60, cluster.check)
        cluster.create_pod({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "mig"},
            "spec": {"containers": [{"name": "c0", "command": ["sh", "-c", ENV_THEN_SLEEP],
                                     "resources": {"limits": {"nvidia.com/mig-1g.10gb": 1}}}]}})
        pod = cluster.wait_running("mig")
        [claim] = cluster.claims_of(pod)
        [result] = claim["status"]["allocation"]["devices"]["results"]
        assert "-mig-1g10gb-" in result["device"]
        card, start = int(result["device"].split("-")[1]), int(result["device"].split("-")[-1])
        assert _instances(cards) == [(card, "1g.10gb", start)]
        env = container_env(cluster.container_output("mig", "c0", until="done"))
        journal = (cluster.node.plugins_dir / names.DRIVER / "mig-instances.json").read_text()
        assert env["NVIDIA_VISIBLE_DEVICES"].startswith("MIG-")
        assert env["NVIDIA_VISIBLE_DEVICES"] in journal

        cluster.delete_pod("mig")
        wait_until("the instance made for the pod to be destroyed",
                   lambda: _instances(cards) == [], 30, cluster.check)
        assert not [p for p in cluster.cdi_specs() if claim["metadata"]["uid"] in p.name]
    finally:
        stand_in.stop()
        cluster.start_plugin()
        wait_until("the node's inventory to be published again",
                   lambda: _devices(cluster) == 8, 60, cluster.check)

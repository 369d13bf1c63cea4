"""The "Moving a live cluster" walk of docs/migrate.md, on a real control plane, printing what
each step says: for a closing note, a demo to a team, or checking a change by eye.

    .venv/bin/python hack/live-migration-walkthrough.py [--version 1.37.2]

It installs the gateway as the e2e tier does (tests/e2e/support.py: the chart, the components as
local processes, KWOK nodes) and adds the e2e scenario's node, whose four GPUs NVIDIA's device
plugin serves as far as a fake kubelet pod-resources server says (tests/e2e/legacynode.py).
Then: a legacy trainer holds two cards; a ResourceQuota on legacy names and a HAMi Deployment
exist; a pod created in an audit namespace gets its warning; `migrate plan`, `migrate quotas`
and `migrate node` speak; the legacy plugin leaves; a burst of six translated pods gets only the
two free cards; the trainer ends and its cards are used. Needs Go and helm
(DRA_GATEWAY_HELM, or .ci/bin/helm from .ci/run), like the e2e tier.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from e2e import legacynode as scenario  # noqa: E402
from e2e.support import Gateway, build_binaries, find_helm, install, wait_until  # noqa: E402
from gotools import build_go_tool  # noqa: E402

from dra_gateway.devkit.realcluster import path_of  # noqa: E402


def _say(gateway: Gateway, *args: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "dra_gateway", *args,
         "--kubeconfig", str(gateway.plane.admin_kubeconfig)],
        capture_output=True, text=True, check=False)
    print(f"\n$ dra-gateway {' '.join(args)}    # exit {result.returncode}\n"
          f"{result.stdout}{result.stderr}", flush=True)


def _walk(gateway: Gateway, kubelet: scenario.FakeKubelet) -> None:
    api = gateway.api
    wait_until("the node to be Legacy",
               lambda: scenario.condition(gateway).get("reason") == "Legacy", 60)
    api.create(path_of("v1", "pods", namespace=scenario.LEGACY_NS),
               scenario.gpu_pod("trainer", scenario.LEGACY_NS, 2))
    wait_until("the trainer to be bound", lambda: bool(api.get(path_of(
        "v1", "pods", namespace=scenario.LEGACY_NS, name="trainer"))["spec"].get("nodeName")), 60)
    kubelet.write(offered=True, holders={f"{scenario.LEGACY_NS}/trainer": scenario.HELD})
    api.create(path_of("v1", "resourcequotas", namespace=scenario.TRAIN_NS), {
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "gpus", "namespace": scenario.TRAIN_NS},
        "spec": {"hard": {"requests.nvidia.com/gpu": "4", "limits.nvidia.com/gpumem": "160000",
                          "requests.nvidia.com/gpumem-percentage": "200"}}})
    hami = {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000",
                       "nvidia.com/gpucores": "30"}}
    api.create(path_of("apps/v1", "deployments", namespace=scenario.AUDIT_NS), {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "llm", "namespace": scenario.AUDIT_NS},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "llm"}},
                 "template": {"metadata": {"labels": {"app": "llm"}}, "spec": {"containers": [
                     {"name": "server", "image": "vllm:0.6", "resources": hami}]}}}})
    warnings: list[str] = []
    api.create(path_of("v1", "pods", namespace=scenario.AUDIT_NS), {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "notebook", "namespace": scenario.AUDIT_NS},
        "spec": {"containers": [{"name": "lab", "image": "jupyter", "resources": hami}]}},
        warnings=warnings)
    print(f"\n$ kubectl -n {scenario.AUDIT_NS} apply -f notebook.yaml\n"
          + "".join(f"Warning: {w}\n" for w in warnings) + "pod/notebook created")
    time.sleep(2)  # the Deployment's pod
    _say(gateway, "migrate", "plan")
    _say(gateway, "migrate", "quotas")
    _say(gateway, "migrate", "node", scenario.NODE)

    print("\n# the legacy plugin's DaemonSet leaves the cut-over node; the trainer runs on")
    kubelet.write(offered=False, holders={f"{scenario.LEGACY_NS}/trainer": scenario.HELD})
    scenario.set_gpus(gateway, "0")
    wait_until("CuttingOver",
               lambda: scenario.condition(gateway).get("reason") == "CuttingOver", 60)
    _say(gateway, "migrate", "node", scenario.NODE)
    for i in range(scenario.BURST):
        api.create(path_of("v1", "pods", namespace=scenario.TRAIN_NS),
                   scenario.gpu_pod(f"w{i}", scenario.TRAIN_NS, 1))
    uuids = scenario.device_uuids(gateway)
    wait_until("two burst pods", lambda: len(scenario.burst_cards(gateway, uuids)) == 2, 90)
    time.sleep(3)
    print(f"\n# {scenario.BURST} translated pods while the trainer holds "
          f"{', '.join(scenario.HELD)}; placed:\n"
          + json.dumps(scenario.burst_cards(gateway, uuids), indent=1))
    _say(gateway, "report")

    print("\n# the trainer ends")
    api.delete(path_of("v1", "pods", namespace=scenario.LEGACY_NS, name="trainer"),
               grace_period_s=0)
    kubelet.write(offered=False, holders={})
    ended = time.monotonic()
    wait_until("DRA", lambda: scenario.condition(gateway).get("reason") == "DRA", 30)
    print(f"DRA {time.monotonic() - ended:.1f}s later (the node plugin asks every 0.5 s here, "
          "2 s by default)")
    uuids = scenario.device_uuids(gateway)
    wait_until("four burst pods", lambda: len(scenario.burst_cards(gateway, uuids)) == 4, 90)
    print(f"4 burst pods placed {time.monotonic() - ended:.1f}s later:\n"
          + json.dumps(scenario.burst_cards(gateway, uuids), indent=1))
    _say(gateway, "migrate", "node", scenario.NODE)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--version", default="1.37.2", help="Kubernetes release (default: "
                        "%(default)s)")
    args = parser.parse_args()
    os.environ.setdefault("DRA_GATEWAY_HELM", str(REPO / ".ci" / "bin" / "helm"))
    with tempfile.TemporaryDirectory(prefix="dra-gateway-walk-") as folder:
        work = Path(folder)
        with install(args.version, {}, build_binaries(args.version), find_helm(),
                     work / "gateway") as gateway:
            binary = build_go_tool(REPO / "tests" / "node_plugin" / "podresources", work,
                                   "the fake kubelet pod-resources server")
            with scenario.legacy_node(gateway, binary) as kubelet:
                _walk(gateway, kubelet)
    return 0


if __name__ == "__main__":
    sys.exit(main())

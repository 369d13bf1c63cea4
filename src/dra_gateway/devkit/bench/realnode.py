"""A pod's time from create to Running on a real node: translated by the gateway against the same
pod written for DRA natively, side by side, one run, one cluster.

    sudo .venv/bin/python -m dra_gateway.devkit.bench.realnode [--version 1.34.4] [--kubelet 1.34.4]
        [--pods 10] [--keep]

It starts what the real-node tier starts (tests/realnode/support.py: a real control plane, a real
kubelet with containerd, runc and CNI in a network namespace of its own, the gateway's chart,
webhook, allocator and node plugin as that node's DaemonSet pod would run it), then creates, one
at a time and alternating (gateway pod i, native pod i, ...), `--pods` pods of each kind, each
deleted once Running:

- gateway: a legacy whole-GPU pod (`nvidia.com/gpu: 1`): the webhook translates and gates it, the
  claim controller makes its claim from the translated template, the allocator allocates the
  claim and lifts the gate, kube-scheduler binds the pod, the kubelet prepares the claim through
  the node plugin and containerd starts the container with the CDI edits;
- native: the same request written for DRA, a ResourceClaimTemplate asking one device of a
  DeviceClass that selects the same driver's full GPUs (kube-scheduler allocates it: the gateway
  leaves classes that are not its own to kube-scheduler); the claim controller makes the claim,
  kube-scheduler allocates it and binds the pod, and the same kubelet, plugin and runtime follow.

Both paths use the same cards of the same node, the same image and the same container, and differ
only in who allocates: the gateway (webhook, allocator, gate) or kube-scheduler. Time is from just
before the create request to the first poll (every 50 ms) that sees the pod Running with its
container ready. It prints p50, p90 and max per path and the ratio of the p50s (goal: gateway at
most 1.2x native). Needs root (the kubelet, containerd, a network namespace).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The repository root (src/dra_gateway/devkit/bench/ is four levels down): the tiers' helpers
# under tests/ are not installed.
REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "tests"))

from e2e.support import find_helm  # type: ignore[import-not-found]  # noqa: E402
from realnode.support import (  # type: ignore[import-not-found]  # noqa: E402
    NODE,
    WORKLOADS,
    Cluster,
    real_node_cluster,
)

from dra_gateway.devkit.realcluster import path_of  # noqa: E402
from dra_gateway.devkit.realnode import preflight  # noqa: E402
from dra_gateway.kube import names  # noqa: E402

NATIVE_CLASS = "bench-native-gpu.example.com"
NATIVE_TEMPLATE = "bench-native-gpu"
COMMAND = ["sh", "-c", "sleep 3600"]


def _native_objects(cluster: Cluster) -> None:
    api = cluster.api
    api.create(path_of("resource.k8s.io/v1", "deviceclasses"), {
        "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
        "metadata": {"name": NATIVE_CLASS},
        "spec": {"selectors": [{"cel": {"expression": (
            f'device.driver == "{names.DRIVER}" && '
            f'device.attributes["{names.DRIVER}"].type == "gpu"')}}]}})
    api.create(path_of("resource.k8s.io/v1", "resourceclaimtemplates", namespace=WORKLOADS), {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": NATIVE_TEMPLATE, "namespace": WORKLOADS},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": NATIVE_CLASS}}]}}}})


def _pod(name: str, native: bool) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c0", "command": COMMAND}
    spec: dict[str, Any] = {"containers": [container]}
    if native:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": NATIVE_TEMPLATE}]
        container["resources"] = {"claims": [{"name": "gpu"}]}
    else:
        container["resources"] = {"limits": {"nvidia.com/gpu": 1}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _time_to_running(cluster: Cluster, name: str, native: bool, timeout_s: float) -> float:
    started = time.monotonic()
    created = cluster.create_pod(_pod(name, native))
    # Who allocates: the gateway's pods wait behind its scheduling gate, the native ones do not.
    gated = names.SCHEDULING_GATE in {g["name"] for g in created["spec"].get(
        "schedulingGates") or []}
    if gated == native:
        raise SystemExit(f"pod {name}: {'gated' if gated else 'not gated'} by the gateway, "
                         "so the two paths are not the ones compared")
    deadline = started + timeout_s
    while True:
        status = cluster.pod(name).get("status") or {}
        if status.get("phase") == "Running" and all(
                c.get("ready") for c in status.get("containerStatuses") or [{}]):
            took = time.monotonic() - started
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"pod {WORKLOADS}/{name} not Running after {timeout_s:g}s:\n"
                             f"{cluster.events(WORKLOADS)}")
        time.sleep(0.05)
    cluster.delete_pod(name)
    return took


def _summary(label: str, times: list[float]) -> str:
    ordered = sorted(times)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return (f"{label:<8} n={len(times):<3} p50 {statistics.median(times):6.2f}s   "
            f"p90 {p90:6.2f}s   max {ordered[-1]:6.2f}s")


def run(args: argparse.Namespace) -> int:
    why_not = preflight()
    if why_not:
        print(f"error: {why_not}", file=sys.stderr)
        return 2
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="realnode-bench-"))
    with real_node_cluster(args.version, args.kubelet, find_helm(), work) as cluster:
        _native_objects(cluster)
        times: dict[str, list[float]] = {"gateway": [], "native": []}
        # One of each first, not counted: the image's first start and the first claims.
        for native in (False, True):
            _time_to_running(cluster, f"warm-{'native' if native else 'gateway'}", native,
                             args.timeout)
        for i in range(args.pods):
            for path in ("gateway", "native"):
                times[path].append(_time_to_running(cluster, f"{path}-{i}", path == "native",
                                                    args.timeout))
        print(f"create to Running on real node {NODE}: control plane {args.version}, kubelet "
              f"{args.kubelet}, containerd 2.2; one pod at a time, alternating; load average "
              f"{os.getloadavg()[0]:.2f}")
        for path, measured in times.items():
            print(_summary(path, measured))
        ratio = statistics.median(times["gateway"]) / statistics.median(times["native"])
        print(f"gateway p50 / native p50 = {ratio:.2f} (goal: at most 1.2)")
    if args.keep:
        print(f"work directory kept: {work}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="1.34.4", help="control plane release")
    parser.add_argument("--kubelet", default="1.34.4", help="kubelet release")
    parser.add_argument("--pods", type=int, default=10, help="pods per path")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per pod")
    parser.add_argument("--work-dir", help="work here (kept)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())

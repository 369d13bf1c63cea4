"""Defragmentation on a real control plane (issue #22): a node whose eight cards each hold one
share of a Deployment, and a pod pinned there that asks for two whole cards and waits.

1. While the Deployment's PodDisruptionBudget allows no disruption (its status as the real
   disruption controller computes it), `dra-gateway defrag plan` names none of its pods and
   `defrag apply` evicts nothing: the pod keeps waiting.
2. Once the budget allows two disruptions, `defrag plan` names at most two moves (shares to a
   second node with free cards) and `defrag apply` carries them out through the Eviction API:
   the waiting pod is placed on two cards of its node, the ReplicaSet's replacements of the
   moved pods are placed again, and no card is over its capacity at any time.

3. Separately, the allocator's own defrag (`--defrag`, with the RBAC the chart grants only with
   `allocator.defrag.enabled`) does the same on its own for the pod once it has waited
   `--defrag-after`, and moves nothing while the budget allows no disruption.

The two nodes (KWOK, each with its own node plugin), the namespace and the defrag records are
removed at the end of each test, and the allocator and the release go back to the install's:
the other modules of the tier see the installation as `install` made it.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import yaml

from dra_gateway.devkit.realcluster import Api, path_of
from dra_gateway.devkit.simnode import install_hami_core
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError
from e2e.support import (
    CHART,
    NAMESPACE,
    RELEASE,
    Component,
    Gateway,
    find_helm,
    node_plugin_kubeconfig,
    over_capacity,
    placed_on_its_node,
    pod_devices,
    remove_gpu_node,
    run_helm,
    short_dir,
    wait_until,
)

# One namespace per test: the webhook believes a ResourceClaimTemplate it made exists for its
# cache's TTL (webhook/templates.py), so a namespace re-created under the same name within it
# would get pods whose claims cannot be made.
APPLY_NS = "defrag-apply"
MODE_NS = "defrag-mode"
FRAGMENTED = "gpu-defrag-1"  # eight cards, one share on each
SPARE = "gpu-defrag-2"  # two free cards, added once the shares are placed
POOL_LABEL = "e2e.dra-gateway.io/pool"
POOL = "defrag"
DEPLOYMENT = "shares"
REPLICAS = 8
BUDGET = "shares"
WAITING = "wide"
# 60% of a card's memory and compute: no two shares fit on one card.
SHARE = {"nvidia.com/gpu": "1", "nvidia.com/gpumem-percentage": "60",
         "nvidia.com/gpucores": "60"}
RECORDS = "dra-gateway-defrag"  # allocator/eviction/holds.py CONFIG_MAP
JSON = dict[str, Any]


# The scenario's nodes ---------------------------------------------------------------------------

def _inventory(gateway: Gateway, node: str, index: int, count: int) -> str:
    gpus = [{"index": i, "uuid": f"GPU-defa{index:04x}-0000-4000-8000-{i:012x}",
             "productName": "NVIDIA A100-SXM4-80GB", "brand": "Nvidia",
             "architecture": "Ampere", "memory": "80Gi", "cudaComputeCapability": "8.0",
             "pciBusID": f"0000:{0x10 + i:02x}:00.0", "numaNode": 0} for i in range(count)]
    path = gateway.work / f"{node}.yaml"
    path.write_text(yaml.safe_dump({"driverVersion": "535.104.05", "cudaDriverVersion": "12.2",
                                    "sharing": "shared", "gpus": gpus}))
    return str(path)


def _published(api: Api, node: str) -> int:
    return sum(len(s["spec"].get("devices") or [])
               for s in api.list(path_of("resource.k8s.io/v1", "resourceslices"))
               if s["spec"].get("nodeName") == node and s["spec"].get("driver") == names.DRIVER)


def _add_node(gateway: Gateway, node: str, index: int, count: int) -> None:
    """A KWOK node of `count` A100s in the scenario's pool, its node plugin publishing them."""
    gateway.plane.add_node(node, labels={POOL_LABEL: POOL,
                                         "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"})
    gateway.plane.wait_nodes_ready([node])
    base = short_dir()
    plugin = Component(f"node-plugin-{node}", [
        "node-plugin", "serve", "--inventory", _inventory(gateway, node, index, count),
        "--node-name", node, "--cluster", "kube",
        "--kubeconfig", node_plugin_kubeconfig(gateway, node),
        "--plugins-dir", str(base / "plugins"), "--registry-dir", str(base / "registry"),
        "--cdi-dir", str(base / "cdi"), "--state-dir", str(base / "state"),
        "--hami-library", str(install_hami_core(base / "hami-core"))],
        gateway.work / "logs" / f"node-plugin-{node}.log")
    gateway.components[plugin.name] = plugin
    plugin.start()
    wait_until(f"the {count} cards of {node} to be published",
               lambda: _published(gateway.api, node) == count, 60, gateway.check)


@contextlib.contextmanager
def _scenario(gateway: Gateway, ns: str) -> Iterator[None]:
    api = gateway.api
    api.create(path_of("v1", "namespaces"), {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": ns}})
    try:
        yield
    finally:
        _clean_up(gateway, ns)


def _clean_up(gateway: Gateway, ns: str) -> None:
    """Remove what the scenario made: the Deployment (so nothing re-creates pods), the pods
    (force: KWOK plays their kubelet), the namespace, the node plugins, their slices and
    stand-in pods, the nodes, and the defrag records."""
    api = gateway.api
    with contextlib.suppress(ApiError):
        api.delete(path_of("apps/v1", "deployments", namespace=ns, name=DEPLOYMENT),
                   propagation="Foreground")
    with contextlib.suppress(ApiError):
        for pod in api.list(path_of("v1", "pods", namespace=ns)):
            api.delete(path_of("v1", "pods", namespace=ns, name=pod["metadata"]["name"]),
                       grace_period_s=0)
    with contextlib.suppress(ApiError):
        api.delete(path_of("v1", "namespaces", name=ns))
    wait_until(f"namespace {ns} to be gone",
               lambda: not api.exists(path_of("v1", "namespaces", name=ns)), 120)
    for node in (FRAGMENTED, SPARE):
        remove_gpu_node(gateway, node)
    with contextlib.suppress(ApiError):
        api.delete(path_of("v1", "configmaps", namespace=NAMESPACE, name=RECORDS))


# The workload -----------------------------------------------------------------------------------

def _deployment(ns: str) -> JSON:
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": DEPLOYMENT, "namespace": ns},
            "spec": {"replicas": REPLICAS, "selector": {"matchLabels": {"app": DEPLOYMENT}},
                     "template": {
                         "metadata": {"labels": {"app": DEPLOYMENT}},
                         "spec": {"nodeSelector": {POOL_LABEL: POOL},
                                  "terminationGracePeriodSeconds": 0,
                                  "containers": [{"name": "main",
                                                  "image": "example.com/cuda:1",
                                                  "resources": {"limits": dict(SHARE)}}]}}}}


def _budget(ns: str, min_available: int) -> JSON:
    return {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
            "metadata": {"name": BUDGET, "namespace": ns},
            "spec": {"minAvailable": min_available,
                     "selector": {"matchLabels": {"app": DEPLOYMENT}}}}


def _waiting_pod(ns: str) -> JSON:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": WAITING, "namespace": ns},
            "spec": {"nodeSelector": {"kubernetes.io/hostname": FRAGMENTED},
                     "terminationGracePeriodSeconds": 0,
                     "containers": [{"name": "main", "image": "example.com/cuda:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}}


def _live(pod: JSON) -> bool:
    return not pod["metadata"].get("deletionTimestamp") and \
        (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _share_pods(api: Api, ns: str) -> list[JSON]:
    return [p for p in api.list(path_of("v1", "pods", namespace=ns),
                                labelSelector=f"app={DEPLOYMENT}") if _live(p)]


def _budget_status(api: Api, ns: str) -> JSON:
    budget = api.get(path_of("policy/v1", "poddisruptionbudgets", namespace=ns, name=BUDGET))
    status = dict(budget.get("status") or {})
    status["_current"] = status.get("observedGeneration") == budget["metadata"]["generation"]
    return status


def _wait_budget(gateway: Gateway, ns: str, allowed: int) -> None:
    """Until the disruption controller has seen the budget's spec and the eight healthy pods,
    and allows `allowed` disruptions."""
    def ready() -> bool:
        status = _budget_status(gateway.api, ns)
        return bool(status["_current"]) and status.get("expectedPods") == REPLICAS \
            and status.get("currentHealthy") == REPLICAS \
            and status.get("disruptionsAllowed") == allowed
    try:
        wait_until(f"the disruption controller to allow {allowed} disruption(s)", ready, 60,
                   gateway.check)
    except AssertionError as exc:
        raise AssertionError(f"{exc}: status {_budget_status(gateway.api, ns)}") from None


def _defrag(gateway: Gateway, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dra_gateway", "defrag", *args,
         "--kubeconfig", str(gateway.plane.admin_kubeconfig), "--namespace", NAMESPACE,
         "-o", "json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run_defrag(gateway: Gateway, *args: str, expect_rc: int = 0) -> JSON:
    """Run `dra-gateway defrag ... -o json`, checking no card is over capacity meanwhile."""
    process = _defrag(gateway, *args)
    deadline = time.monotonic() + 300
    while process.poll() is None:
        problems = over_capacity(gateway.api)
        if problems:
            process.kill()
            process.communicate()
            raise AssertionError(f"over capacity during defrag {args[0]}: {problems}")
        if time.monotonic() > deadline:
            process.kill()
            process.communicate()
            raise AssertionError(f"defrag {' '.join(args)} ran past 300s")
        time.sleep(0.5)
    out, err = process.communicate()
    assert process.returncode == expect_rc, \
        f"defrag {' '.join(args)} exited {process.returncode}:\n{out}\n{err}"
    body: JSON = json.loads(out)
    print(f"$ dra-gateway defrag {' '.join(args)} -o json\n{json.dumps(body, indent=1)}")
    return body


def _no_over_capacity(gateway: Gateway) -> None:
    gateway.check()
    problems = over_capacity(gateway.api)
    assert problems == [], problems


def _gated(pod: JSON) -> bool:
    return any(g.get("name") == names.SCHEDULING_GATE
               for g in pod["spec"].get("schedulingGates") or [])


# The scenario ----------------------------------------------------------------------------------

def _fragment(gateway: Gateway, ns: str) -> set[str]:
    """Eight shares on the eight cards of one node (60% of a card each, so one a card), a
    budget that allows no disruption (as the real disruption controller computes it), a second
    node with two free cards, and a pod pinned to the first asking for two whole cards, which
    waits. The share pods' names."""
    api = gateway.api
    _add_node(gateway, FRAGMENTED, 1, REPLICAS)
    api.create(path_of("apps/v1", "deployments", namespace=ns), _deployment(ns))
    wait_until(f"the {REPLICAS} shares to be placed", lambda: sum(
        placed_on_its_node(api, p) for p in _share_pods(api, ns)) == REPLICAS, 120,
        lambda: _no_over_capacity(gateway))
    shares = _share_pods(api, ns)
    assert {p["spec"]["nodeName"] for p in shares} == {FRAGMENTED}
    held = sorted(d for p in shares for d in pod_devices(api, p))
    assert len(held) == REPLICAS, held
    assert len({d[1] for d in held}) == REPLICAS, held
    assert not any(whole for _, _, whole in held), held
    api.create(path_of("policy/v1", "poddisruptionbudgets", namespace=ns), _budget(ns, REPLICAS))
    _wait_budget(gateway, ns, 0)
    # Room for two moved shares, on a second node of the pool.
    _add_node(gateway, SPARE, 2, 2)
    api.create(path_of("v1", "pods", namespace=ns), _waiting_pod(ns))
    wait_until(f"the allocator to find no room for {WAITING}", lambda: any(
        e.get("reason") == "AllocationFailed" for e in api.list(
            path_of("v1", "events", namespace=ns),
            fieldSelector=f"involvedObject.name={WAITING}")), 60, gateway.check)
    wide = _wide(api, ns)
    assert _gated(wide)
    assert not wide["spec"].get("nodeName")
    return {p["metadata"]["name"] for p in shares}


def _wide(api: Api, ns: str) -> JSON:
    return api.get(path_of("v1", "pods", namespace=ns, name=WAITING))


def _assert_placed_after_moves(gateway: Gateway, ns: str, moved: set[str]) -> None:
    """The pod helped holds two whole cards of its node; the moved pods are gone and their
    replacements are placed on the spare node, so the Deployment has its eight shares again;
    every move is an Event on the pod moved and on the pod it made room for."""
    api = gateway.api
    wait_until(f"{WAITING}'s claim to be allocated",
               lambda: placed_on_its_node(api, _wide(api, ns)), 30,
               lambda: _no_over_capacity(gateway))
    wide = _wide(api, ns)
    assert wide["spec"]["nodeName"] == FRAGMENTED
    devices = pod_devices(api, wide)
    assert len(devices) == 2, devices
    assert all(node == FRAGMENTED and whole for node, _, whole in devices), devices
    wait_until(f"the {REPLICAS} shares to be placed again", lambda: sum(
        placed_on_its_node(api, p) for p in _share_pods(api, ns)) == REPLICAS, 120,
        lambda: _no_over_capacity(gateway))
    now = _share_pods(api, ns)
    assert not moved & {p["metadata"]["name"] for p in now}
    assert sorted(p["spec"]["nodeName"] for p in now) == \
        sorted([FRAGMENTED] * (REPLICAS - len(moved)) + [SPARE] * len(moved))
    _no_over_capacity(gateway)
    reasons = {(e["involvedObject"]["name"], e.get("reason"))
               for e in api.list(path_of("v1", "events", namespace=ns))}
    assert (WAITING, "DefragRoomMade") in reasons, reasons
    assert all((name, "DefragMoved") in reasons for name in moved), reasons


def _moved_by_events(api: Api, ns: str) -> set[str]:
    return {e["involvedObject"]["name"] for e in api.list(path_of("v1", "events", namespace=ns))
            if e.get("reason") == "DefragMoved"}


# The tests --------------------------------------------------------------------------------------

def test_defrag_frees_two_whole_cards_by_moving_two_shares_within_disruption_budgets(
        gateway: Gateway) -> None:
    api = gateway.api
    ns = APPLY_NS
    with _scenario(gateway, ns):
        shares = _fragment(gateway, ns)
        before = {p["metadata"]["uid"] for p in _share_pods(api, ns)}

        # No disruption left: no plan moves a share, and apply evicts nothing.
        plan = _run_defrag(gateway, "plan")
        assert plan["moves"] == 0, plan
        assert not any(m["pod"].split("/")[1] in shares
                       for h in plan["helped"] for m in h["moves"]), plan
        assert f"{ns}/{WAITING}" in [n["pod"] for n in plan["notHelped"]], plan
        applied = _run_defrag(gateway, "apply", "--for", f"{ns}/{WAITING}", "--wait", "20s")
        assert applied["applied"]["evicted"] == 0, applied
        assert {p["metadata"]["uid"] for p in _share_pods(api, ns)} == before
        wide = _wide(api, ns)
        assert _gated(wide)
        assert not wide["spec"].get("nodeName")
        _no_over_capacity(gateway)

        # Two disruptions allowed: at most two moves, and apply places the pod.
        api.patch(path_of("policy/v1", "poddisruptionbudgets", namespace=ns, name=BUDGET),
                  {"spec": {"minAvailable": REPLICAS - 2}})
        _wait_budget(gateway, ns, 2)
        plan = _run_defrag(gateway, "plan")
        (helped,) = [h for h in plan["helped"] if h["pod"] == f"{ns}/{WAITING}"]
        assert 1 <= len(helped["moves"]) <= 2, plan
        assert plan["moves"] <= 2, plan
        assert helped["node"] == FRAGMENTED, plan
        assert len(helped["devices"]) == 2, plan
        for move in helped["moves"]:
            assert move["pod"].split("/")[1] in shares, plan
            assert move["from"]["node"] == FRAGMENTED, plan
            assert move["to"]["node"] == SPARE, plan

        applied = _run_defrag(gateway, "apply", "--for", f"{ns}/{WAITING}", "--wait", "90s")
        (done,) = [h for h in applied["helped"] if h["pod"] == f"{ns}/{WAITING}"]
        assert applied["applied"] == {"evicted": len(done["moves"]), "stopped": None}, applied
        assert 1 <= len(done["moves"]) <= 2, applied
        assert done["placed"] == f"bound to {FRAGMENTED}", applied
        moved = {m["pod"].split("/")[1] for m in done["moves"]}
        assert moved <= shares, applied
        for move in done["moves"]:
            assert move["result"] == "evicted", applied
            assert move["replacement"].endswith(" on " + SPARE), applied
        _assert_placed_after_moves(gateway, ns, moved)


@contextlib.contextmanager
def _allocator_with_defrag(gateway: Gateway) -> Iterator[None]:
    """The release upgraded with allocator.defrag.enabled (the RBAC defrag needs) and the
    allocator restarted with --defrag, acting for pods gated 2 s; both as installed after."""
    helm = find_helm()
    values = str(gateway.work / "values.yaml")
    release = ("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", values)
    original = gateway.components["allocator"]
    defrag = Component("allocator", [*original.args, "--defrag", "--defrag-after", "2s",
                                     "--defrag-interval", "2s", "--defrag-hold", "2m"],
                       original.log)
    run_helm(helm, gateway.work, gateway.plane.admin_kubeconfig, *release,
          "--set", "allocator.defrag.enabled=true")
    try:
        original.stop()  # graceful: it releases the Lease
        gateway.components["allocator"] = defrag
        defrag.start()
        wait_until("the allocator with --defrag to lead", lambda: _leads(gateway), 60,
                   gateway.check)
        yield
    finally:
        defrag.stop()
        gateway.components["allocator"] = original
        original.start()
        run_helm(helm, gateway.work, gateway.plane.admin_kubeconfig, *release)
        wait_until("the allocator to lead again", lambda: _leads(gateway), 60, gateway.check)


def _leads(gateway: Gateway) -> bool:
    try:
        lease = gateway.api.get(path_of("coordination.k8s.io/v1", "leases", namespace=NAMESPACE,
                                        name="dra-gateway-allocator"))
    except ApiError:
        return False
    return bool((lease.get("spec") or {}).get("holderIdentity"))


def test_the_allocators_defrag_mode_places_the_waiting_pod_by_moving_at_most_two_shares(
        gateway: Gateway) -> None:
    api = gateway.api
    ns = MODE_NS
    with _allocator_with_defrag(gateway), _scenario(gateway, ns):
        shares = _fragment(gateway, ns)
        before = {p["metadata"]["uid"] for p in _share_pods(api, ns)}
        # No disruption left: rounds go by (every 2 s) and nothing moves.
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            _no_over_capacity(gateway)
            time.sleep(0.5)
        assert _moved_by_events(api, ns) == set()
        assert {p["metadata"]["uid"] for p in _share_pods(api, ns)} == before
        assert not _wide(api, ns)["spec"].get("nodeName")

        # Two disruptions allowed: the allocator moves at most two shares and places the pod.
        api.patch(path_of("policy/v1", "poddisruptionbudgets", namespace=ns, name=BUDGET),
                  {"spec": {"minAvailable": REPLICAS - 2}})
        wait_until(f"the allocator's defrag to place {WAITING}",
                   lambda: bool(_wide(api, ns)["spec"].get("nodeName")), 120,
                   lambda: _no_over_capacity(gateway))
        moved = _moved_by_events(api, ns)
        assert 1 <= len(moved) <= 2, moved
        assert moved <= shares, moved
        gone = before - {p["metadata"]["uid"] for p in _share_pods(api, ns)}
        assert len(gone) == len(moved), (gone, moved)
        _assert_placed_after_moves(gateway, ns, moved)

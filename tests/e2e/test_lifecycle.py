"""The gateway's own lifecycle on a live cluster: upgrading the chart and restarting a node plugin
while GPU pods run, on real control planes.

Runs first on each installation (file order) and leaves it as it found it: its pods deleted,
their claims released, the release back on this repository's chart.

- `helm upgrade` to the previous release's chart (commit PREVIOUS_CHART_COMMIT, read from git
  history) and back to the current one, with translated GPU pods placed: no pod is re-created,
  no claim deleted or re-allocated (same UIDs, same `status.allocation`), the webhook
  configurations are at each step exactly the webhooks and paths that chart renders (the
  current one has a pod webhook per translation mode of a namespace, the previous one had one),
  a new GPU pod is placed after each upgrade, no card is held past its capacity, and the
  webhook's Deployment and PodDisruptionBudget keep it available through a rollout.
- A node plugin process restarted while claims on its node are allocated: its ResourceSlices
  are not written at all (same names, resourceVersions and pool generation).
"""

from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
import tarfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_gateway.devkit.realcluster import Api, path_of
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError
from dra_gateway.webhook.config import pod_webhook_names
from dra_gateway.webhook.settings import MUTATING_WEBHOOK, VALIDATING_WEBHOOK
from e2e.support import (
    CHART,
    GPU_NODES,
    NAMESPACE,
    RELEASE,
    REPO,
    Gateway,
    find_helm,
    over_capacity,
    pod_claims,
    pods,
    wait_until,
)

JSON = dict[str, Any]
# The chart of the last release before per-namespace translation modes (the release users
# upgrade from); the webhook configurations changed shape since.
PREVIOUS_CHART_COMMIT = "69fce14"
LIFECYCLE_NAMESPACE = "lifecycle"
PLACE_S = 60.0
CONFIGURATIONS = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")


def _previous_chart(into: Path) -> Path:
    """The chart as it was at PREVIOUS_CHART_COMMIT, extracted from git history under `into`;
    skips where the history is missing (.ci/run deepens a shallow clone first; a CI that still
    lacks it must not fail the whole tier for a chart it cannot read)."""
    git = shutil.which("git")
    found = git is not None and subprocess.run(
        [git, "-C", str(REPO), "cat-file", "-e", f"{PREVIOUS_CHART_COMMIT}^{{commit}}"],
        capture_output=True, check=False).returncode == 0
    if not found:
        why = "no git on PATH" if git is None else "a shallow clone or an export"
        pytest.skip(f"the previous release's chart (commit {PREVIOUS_CHART_COMMIT}) is not in "
                      f"this checkout's git history ({why}); run from a full clone, or "
                      "`git fetch --unshallow`")
    assert git is not None
    archive = subprocess.run([git, "-C", str(REPO), "archive", PREVIOUS_CHART_COMMIT,
                              "helm/dra-gateway"], capture_output=True, check=True, timeout=60)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    return into / "helm" / "dra-gateway"


def _helm(gateway: Gateway, *args: str) -> str:
    """Run helm against the installation, with the same private home as its install."""
    home = gateway.work / "helm-home"
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home),
           "HELM_CACHE_HOME": str(home / "cache"), "HELM_CONFIG_HOME": str(home / "config"),
           "HELM_DATA_HOME": str(home / "data"),
           "KUBECONFIG": str(gateway.plane.admin_kubeconfig)}
    result = subprocess.run([find_helm(), *args], capture_output=True, text=True, env=env,
                            timeout=120, check=False)
    assert result.returncode == 0, f"helm {' '.join(args)} failed:\n{result.stderr}"
    return result.stdout


def _upgrade(gateway: Gateway, chart: Path) -> float:
    """`helm upgrade` the release to `chart` with the install's values; seconds it took."""
    started = time.monotonic()
    _helm(gateway, "upgrade", RELEASE, str(chart), "--namespace", NAMESPACE,
          "--values", str(gateway.work / "values.yaml"))
    return time.monotonic() - started


Webhooks = dict[str, list[tuple[str, str]]]  # configuration kind -> [(webhook, URL it calls)]


def _webhooks_by_configuration(objects: list[Mapping[str, Any]]) -> Webhooks:
    """The webhooks of each configuration among `objects`, in order."""
    found: Webhooks = {}
    for obj in objects:
        if obj.get("kind") in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            found[str(obj["kind"])] = [
                (str(hook["name"]), str(hook["clientConfig"].get("url")
                                        or hook["clientConfig"].get("service")))
                for hook in obj.get("webhooks") or []]
    return found


def _rendered_webhooks(gateway: Gateway) -> Webhooks:
    """What the release's chart rendered (`helm get manifest`)."""
    manifest = _helm(gateway, "get", "manifest", RELEASE, "--namespace", NAMESPACE)
    return _webhooks_by_configuration([d for d in yaml.safe_load_all(manifest) if d])


def _live_webhooks(api: Api) -> Webhooks:
    return _webhooks_by_configuration([
        api.get(path_of("admissionregistration.k8s.io/v1", plural, name=RELEASE))
        for plural in CONFIGURATIONS])


def _namespace(api: Api, name: str) -> None:
    try:
        api.create(path_of("v1", "namespaces"), {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": name}})
    except ApiError as exc:
        if exc.code != 409:
            raise


def _gpu_pod(name: str, limits: Mapping[str, str]) -> JSON:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": LIFECYCLE_NAMESPACE},
            "spec": {"containers": [{"name": "main", "image": "example.com/cuda:1",
                                     "resources": {"limits": dict(limits)}}]}}


SHARE = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "2000", "nvidia.com/gpucores": "10"}
WHOLE = {"nvidia.com/gpu": "1"}


def _placed(api: Api, name: str) -> bool:
    """Bound to a node, every claim allocated."""
    try:
        pod = api.get(path_of("v1", "pods", namespace=LIFECYCLE_NAMESPACE, name=name))
    except ApiError:
        return False
    claims = pod_claims(api, pod)
    return bool((pod.get("spec") or {}).get("nodeName")) and bool(claims) and all(
        (c.get("status") or {}).get("allocation") for c in claims)


def _create_and_place(gateway: Gateway, wanted: Mapping[str, Mapping[str, str]]) -> None:
    api = gateway.api
    for name, limits in wanted.items():
        api.create(path_of("v1", "pods", namespace=LIFECYCLE_NAMESPACE), _gpu_pod(name, limits))
    wait_until(f"pods {', '.join(wanted)} to be bound with their claims allocated",
               lambda: all(_placed(api, name) for name in wanted), PLACE_S, gateway.check)


@dataclass(frozen=True)
class Running:
    """What must not change while the gateway is upgraded under running pods."""

    pods: dict[str, str]  # name -> UID
    claims: dict[str, tuple[str, JSON]]  # namespace/name -> (UID, status.allocation)


def _running(api: Api) -> Running:
    current = pods(api, LIFECYCLE_NAMESPACE)
    claims = {}
    for pod in current:
        for claim in pod_claims(api, pod):
            meta = claim["metadata"]
            claims[f"{meta['namespace']}/{meta['name']}"] = (
                str(meta["uid"]), (claim.get("status") or {}).get("allocation") or {})
    return Running({p["metadata"]["name"]: str(p["metadata"]["uid"]) for p in current}, claims)


def _assert_untouched(api: Api, before: Running, after_what: str) -> None:
    now = _running(api)
    assert {n: now.pods.get(n) for n in before.pods} == before.pods, \
        f"pods re-created or gone after {after_what}"
    assert {n: now.claims.get(n) for n in before.claims} == before.claims, \
        f"claims deleted, re-created or re-allocated after {after_what}"


def _delete_all(gateway: Gateway) -> None:
    """Delete this module's pods and wait until their claims are gone or released."""
    api = gateway.api
    for pod in pods(api, LIFECYCLE_NAMESPACE):
        try:
            api.delete(path_of("v1", "pods", namespace=LIFECYCLE_NAMESPACE,
                               name=pod["metadata"]["name"]), grace_period_s=0)
        except ApiError as exc:
            if exc.code != 404:
                raise

    def released() -> bool:
        return not pods(api, LIFECYCLE_NAMESPACE) and not any(
            (c.get("status") or {}).get("allocation")
            for c in api.list(path_of("resource.k8s.io/v1", "resourceclaims",
                                      namespace=LIFECYCLE_NAMESPACE)))

    wait_until("this module's pods to be gone and their claims released", released, PLACE_S,
               gateway.check)


def _assert_webhook_rolls_without_a_gap(api: Api) -> None:
    """The API server holds what keeps the webhook available through a rollout: two replicas,
    a new pod ready before an old one stops, and a budget that lets a drain take only one."""
    component = {"app.kubernetes.io/component": "webhook"}
    selector = ",".join(f"{k}={v}" for k, v in component.items())
    (deployment,) = api.list(path_of("apps/v1", "deployments", namespace=NAMESPACE),
                             labelSelector=selector)
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    (budget,) = api.list(path_of("policy/v1", "poddisruptionbudgets", namespace=NAMESPACE),
                         labelSelector=selector)
    assert budget["spec"]["minAvailable"] == 1
    assert budget["spec"]["selector"] == deployment["spec"]["selector"]


def test_upgrading_to_the_previous_chart_and_back_keeps_every_running_pod_and_claim(
        gateway: Gateway, tmp_path: Path) -> None:
    api = gateway.api
    previous = _previous_chart(tmp_path)
    _namespace(api, LIFECYCLE_NAMESPACE)
    current_hooks = _rendered_webhooks(gateway)
    # The change the upgrade must carry both ways: a pod webhook per translation mode now.
    assert [name for name, _ in current_hooks["MutatingWebhookConfiguration"]] == \
        list(pod_webhook_names(MUTATING_WEBHOOK))
    assert _live_webhooks(api) == current_hooks
    try:
        _create_and_place(gateway, {"share-0": SHARE, "share-1": SHARE, "share-2": SHARE,
                                    "whole-0": WHOLE})
        before = _running(api)
        assert len(before.claims) == 4

        took = _upgrade(gateway, previous)
        previous_hooks = _rendered_webhooks(gateway)
        assert [name for name, _ in previous_hooks["MutatingWebhookConfiguration"]] == \
            [MUTATING_WEBHOOK]
        assert [name for name, _ in previous_hooks["ValidatingWebhookConfiguration"]][:1] == \
            [VALIDATING_WEBHOOK]
        assert _live_webhooks(api) == previous_hooks
        _assert_untouched(api, before, "the upgrade to the previous chart")
        _create_and_place(gateway, {"under-previous": SHARE})
        print(f"lifecycle: helm upgrade to the chart of {PREVIOUS_CHART_COMMIT} in {took:.1f}s")

        before = _running(api)
        took = _upgrade(gateway, CHART)
        assert _rendered_webhooks(gateway) == current_hooks
        assert _live_webhooks(api) == current_hooks
        _assert_untouched(api, before, "the upgrade back to the current chart")
        _create_and_place(gateway, {"under-current": SHARE})
        print(f"lifecycle: helm upgrade back to the current chart in {took:.1f}s")
        _assert_webhook_rolls_without_a_gap(api)
        assert over_capacity(api) == []
        history = yaml.safe_load(_helm(gateway, "history", RELEASE, "--namespace", NAMESPACE,
                                       "-o", "yaml"))
        assert [entry["status"] for entry in history][-3:] == [
            "superseded", "superseded", "deployed"], history
    finally:
        # Later modules expect the current chart and a cluster free of this module's pods.
        if _rendered_webhooks(gateway) != current_hooks:
            _upgrade(gateway, CHART)
        _delete_all(gateway)


def _slices_of(api: Api, node: str) -> dict[str, tuple[str, int]]:
    """The gateway's slices of `node`: name -> (resourceVersion, pool generation)."""
    return {str(s["metadata"]["name"]): (str(s["metadata"]["resourceVersion"]),
                                         int(s["spec"]["pool"]["generation"]))
            for s in api.list(path_of("resource.k8s.io/v1", "resourceslices"))
            if s["spec"].get("driver") == names.DRIVER and s["spec"].get("nodeName") == node}


def test_a_restarted_node_plugin_writes_none_of_its_slices(gateway: Gateway) -> None:
    api = gateway.api
    _namespace(api, LIFECYCLE_NAMESPACE)
    try:
        # The plugin of the node a placed pod's claim is allocated on.
        _create_and_place(gateway, {"during-restart": WHOLE})
        node = str(api.get(path_of("v1", "pods", namespace=LIFECYCLE_NAMESPACE,
                                   name="during-restart"))["spec"]["nodeName"])
        assert node in {name for name, _ in GPU_NODES}
        plugin = gateway.components[f"node-plugin-{node}"]
        before = _slices_of(api, node)
        assert before
        logged = plugin.log.stat().st_size
        plugin.stop()
        plugin.start()

        def settled() -> bool:
            # The state line comes after discovery and the consumable-capacity probe, right
            # before the publisher's first reconcile; a write would be logged as "published N
            # device(s)".
            with plugin.log.open("rb") as log:
                log.seek(logged)
                return b"is in state" in log.read()

        wait_until(f"the restarted node plugin of {node} to judge its node", settled, 60,
                   gateway.check)
        time.sleep(3)  # its first reconcile, and the watch's relist
        with plugin.log.open("rb") as log:
            log.seek(logged)
            since = log.read().decode(errors="replace")
        assert not re.search(r"published \d+ device", since), since
        assert _slices_of(api, node) == before
        assert _placed(api, "during-restart")
    finally:
        _delete_all(gateway)

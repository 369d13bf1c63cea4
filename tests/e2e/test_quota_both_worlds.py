"""One GPUQuota over both worlds, on a real control plane: a namespace's translated pods and the
pods a legacy device plugin serves are counted together, and a pod may hold itself back from
translation only where the namespace grants it.

The namespace moves from a ResourceQuota of `requests.nvidia.com/gpu: 2` to the GPUQuota
`dra-gateway migrate quotas` makes of it (`devices: 2`, `admission: Refuse`); this control plane
runs no resourcequota controller, so the ResourceQuota itself enforces nothing here: every refusal
and every wait below is the gateway's. The namespace is enabled and labelled
`dra-gateway.io/pod-opt-out=allowed`; a tenant with the `edit` ClusterRole there:

- cannot label its namespace (granting the opt-out is the administrator's), and in a namespace
  without the label its opted-out pod is refused by /mutate (403) with the label's fix;
- creates two translated one-card pods (allocated on the demo's GPU nodes): the quota is used,
  and two opted-out pods asking `nvidia.com/gpu: 1` are refused by /validate, naming it;
- once those are gone, one opted-out pod is admitted and bound to the legacy node; the allocator
  charges it (status.used), a translated pod still fits beside it, and then a legacy pod and (the
  quota refusing) a translated one are refused;
- with the quota in Queue mode, a translated pod waits, gated with QuotaExceeded, while the
  legacy pod holds the quota, and is allocated within seconds of its deletion.

At every sample the namespace holds at most two cards across both worlds (allocated claims and
legacy pods admitted), and no card is held past its capacity. The legacy node, its fake kubelet
and namespaces are `e2e/legacynode.py`'s; everything made here is removed at the end.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from gotools import build_go_tool

from dra_gateway.devkit.realcluster import Api, path_of
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError
from e2e.legacynode import NODE, UUIDS, condition, gpu_pod, legacy_node, published_uuids
from e2e.support import REPO, Gateway, over_capacity, pods, wait_until

JSON = dict[str, Any]
RBAC = "rbac.authorization.k8s.io/v1"
RESOURCE = "resource.k8s.io/v1"
QUOTA_NS = "both-worlds"  # enabled, opt-out granted, the quota
UNGRANTED_NS = "both-worlds-ungranted"  # enabled, opt-out not granted
TENANT = "tenant"
QUOTA = "gpus"  # the ResourceQuota's name, which its GPUQuota keeps
HARD = 2
PLACE_S = 60.0
QUOTA_CONDITION = "dra-gateway.io/QuotaExceeded"
LEGACY_GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def fake_kubelet_binary(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_go_tool(REPO / "tests" / "node_plugin" / "podresources",
                         tmp_path_factory.mktemp("podresources"),
                         "the fake kubelet pod-resources server")


def _pod_path(namespace: str, name: str | None = None) -> str:
    return path_of("v1", "pods", namespace=namespace, name=name)


def _quota_path(name: str | None = None) -> str:
    return path_of(names.API_VERSION, "gpuquotas", namespace=QUOTA_NS, name=name)


def _translated(name: str) -> JSON:
    """A pod asking for one whole card by its legacy name, which the webhook translates."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": QUOTA_NS},
            "spec": {"containers": [{"name": "main", "image": "example.com/cuda:1",
                                     "resources": {"limits": {LEGACY_GPU: "1"}}}]}}


def _opted_out(name: str, namespace: str = QUOTA_NS) -> JSON:
    """A one-card pod that holds itself back from translation, for the legacy node's plugin."""
    pod = gpu_pod(name, namespace, 1)
    pod["metadata"]["annotations"] = {names.TRANSLATION_LABEL: names.TRANSLATION_DISABLED}
    return pod


def _bound(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def _gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == names.SCHEDULING_GATE
               for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def _quota_condition(pod: Mapping[str, Any]) -> JSON | None:
    for found in (pod.get("status") or {}).get("conditions") or []:
        if found.get("type") == QUOTA_CONDITION:
            return dict(found)
    return None


def _legacy_cards(pod: Mapping[str, Any]) -> int:
    """The cards a pod asks the legacy device plugin for (0 for a translated pod, whose legacy
    name became a claim)."""
    return sum(int(((c.get("resources") or {}).get("limits") or {}).get(LEGACY_GPU, 0))
               for c in (pod.get("spec") or {}).get("containers") or [])


def _held(api: Api) -> tuple[int, int]:
    """(cards of allocated claims, cards of legacy pods admitted) in the quota's namespace."""
    translated = sum(
        len((((c.get("status") or {}).get("allocation") or {}).get("devices") or {})
            .get("results") or [])
        for c in api.list(path_of(RESOURCE, "resourceclaims", namespace=QUOTA_NS)))
    return translated, sum(_legacy_cards(p) for p in pods(api, QUOTA_NS))


def _used(api: Api) -> int:
    status = api.get(_quota_path(QUOTA)).get("status") or {}
    return int((status.get("used") or {}).get("devices") or 0)


def _refused(call: Callable[..., JSON], *args: Any) -> ApiError:
    with pytest.raises(ApiError) as refused:
        call(*args)
    return refused.value


def _dry_run(api: Api, body: Mapping[str, Any]) -> Callable[[], JSON]:
    """Create `body` with dryRun=All: through every admission webhook (theirs are side-effect
    free on dry runs), nothing stored."""
    namespace = str(body["metadata"]["namespace"])
    return lambda: api.request("POST", _pod_path(namespace), dict(body),
                               query={"dryRun": "All"})


def _until(what: str, create: Callable[[], JSON], *, admitted: bool,
           check: Callable[[], None]) -> None:
    """Wait until a dry-run creation is admitted (or refused): the webhook reads quotas, their
    status and namespaces from its watches, a moment after the API server stored them, so the
    real creation that follows meets the answer the test means."""
    def answered() -> bool:
        try:
            create()
        except ApiError:
            return not admitted
        return admitted

    wait_until(what, answered, 30, check, poll_s=0.5)


def _migrate_quotas(gateway: Gateway) -> list[JSON]:
    """The GPUQuotas `dra-gateway migrate quotas` writes of the live cluster's ResourceQuotas
    in the quota's namespace."""
    result = subprocess.run(
        [sys.executable, "-m", "dra_gateway", "migrate", "quotas", "-o", "json",
         "--kubeconfig", str(gateway.plane.admin_kubeconfig)],
        capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return [q for q in json.loads(result.stdout)["gpuQuotas"]
            if q["metadata"]["namespace"] == QUOTA_NS]


def _edit_aggregated(gateway: Gateway) -> None:
    """Wait for the `edit` ClusterRole to have its rules: the bootstrap role only names the
    roles it aggregates, and the clusterrole-aggregation controller copies their rules in."""
    path = path_of(RBAC, "clusterroles", name="edit")
    wait_until("the edit ClusterRole to be aggregated",
               lambda: bool(gateway.api.get(path).get("rules")), 60, gateway.check)


@contextlib.contextmanager
def _scene(gateway: Gateway) -> Iterator[Api]:
    """The two namespaces and the tenant, a ServiceAccount bound to `edit` in both; the
    tenant's Api. Afterwards every pod is gone, every claim released and both namespaces
    deleted, failed or not."""
    api = gateway.api
    labels = {QUOTA_NS: {names.TRANSLATION_LABEL: names.TRANSLATION_ENABLED,
                         names.POD_OPT_OUT_LABEL: names.POD_OPT_OUT_ALLOWED},
              UNGRANTED_NS: {names.TRANSLATION_LABEL: names.TRANSLATION_ENABLED}}
    _edit_aggregated(gateway)
    try:
        for name, namespace_labels in labels.items():
            api.create(path_of("v1", "namespaces"), {
                "apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": name, "labels": namespace_labels}})
        api.create(path_of("v1", "serviceaccounts", namespace=QUOTA_NS), {
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": TENANT}})
        for name in labels:
            api.create(path_of(RBAC, "rolebindings", namespace=name), {
                "apiVersion": RBAC, "kind": "RoleBinding",
                "metadata": {"name": f"{TENANT}-edit"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": "edit"},
                "subjects": [{"kind": "ServiceAccount", "name": TENANT,
                              "namespace": QUOTA_NS}]})
        token = gateway.plane.service_account_token(QUOTA_NS, TENANT, expiration_s=3600)
        yield gateway.plane.api(token)
    finally:
        _clean_up(gateway, tuple(labels))


def _clean_up(gateway: Gateway, namespaces: tuple[str, ...]) -> None:
    api = gateway.api
    for namespace in namespaces:
        with contextlib.suppress(ApiError):
            for pod in pods(api, namespace):
                with contextlib.suppress(ApiError):
                    api.delete(_pod_path(namespace, pod["metadata"]["name"]), grace_period_s=0)

    def released() -> bool:
        return not any(
            pods(api, ns) or any((c.get("status") or {}).get("allocation") for c in
                                 api.list(path_of(RESOURCE, "resourceclaims", namespace=ns)))
            for ns in namespaces)

    wait_until("the scene's pods to be gone and their claims released", released, PLACE_S,
               gateway.check)
    for namespace in namespaces:
        with contextlib.suppress(ApiError):
            api.delete(path_of("v1", "namespaces", name=namespace))
    for namespace in namespaces:
        wait_until(f"namespace {namespace} to be gone", _gone(api, namespace), 120)


def _gone(api: Api, namespace: str) -> Callable[[], bool]:
    return lambda: not api.exists(path_of("v1", "namespaces", name=namespace))


def test_one_gpuquota_counts_legacy_and_translated_pods_and_opt_outs_need_the_grant(
        gateway: Gateway, fake_kubelet_binary: Path) -> None:
    api = gateway.api
    with legacy_node(gateway, fake_kubelet_binary) as kubelet, _scene(gateway) as tenant:
        samples: list[tuple[int, int]] = []

        def within_quota() -> None:
            # Checked at every poll of every wait below: both worlds together within `hard`.
            gateway.check()
            held = _held(api)
            samples.append(held)
            assert sum(held) <= HARD, f"{QUOTA_NS} holds {held} (claims, legacy) cards"

        # The legacy node: NVIDIA's device plugin offers its cards, the gateway publishes none
        # there (translated pods go to the demo's GPU nodes).
        wait_until("the legacy node's plugin to report Legacy",
                   lambda: condition(gateway).get("reason") == names.NODE_STATE_LEGACY, 60,
                   gateway.check)
        assert published_uuids(gateway) == set()

        # 1. The grant is the administrator's: the tenant cannot label its namespace, and
        # where the label is missing its opted-out pod is refused, told the fix.
        grant = {names.POD_OPT_OUT_LABEL: names.POD_OPT_OUT_ALLOWED}
        refused = _refused(tenant.patch, path_of("v1", "namespaces", name=UNGRANTED_NS),
                           {"metadata": {"labels": grant}})
        assert refused.code == 403, refused
        assert f"system:serviceaccount:{QUOTA_NS}:{TENANT}" in refused.message, refused.message
        refused = _refused(tenant.create, _pod_path(UNGRANTED_NS),
                           _opted_out("opted-out", UNGRANTED_NS))
        assert refused.code == 403, refused
        assert "does not let its pods opt out of translation" in refused.message, \
            refused.message
        assert f"kubectl label namespace {UNGRANTED_NS} dra-gateway.io/pod-opt-out=allowed" \
            in refused.message, refused.message
        assert not api.exists(_pod_path(UNGRANTED_NS, "opted-out"))

        # 2. The namespace's ResourceQuota, and the GPUQuota `migrate quotas` makes of it.
        api.create(path_of("v1", "resourcequotas", namespace=QUOTA_NS), {
            "apiVersion": "v1", "kind": "ResourceQuota",
            "metadata": {"name": QUOTA, "namespace": QUOTA_NS},
            "spec": {"hard": {f"requests.{LEGACY_GPU}": str(HARD)}}})
        (quota,) = _migrate_quotas(gateway)
        assert quota["metadata"]["name"] == QUOTA, quota
        assert quota["spec"] == {"hard": {"devices": HARD}, "admission": "Refuse"}, quota
        api.create(_quota_path(), quota)

        # 3. Two translated pods use the quota up ...
        for name in ("t-0", "t-1"):
            created = tenant.create(_pod_path(QUOTA_NS), _translated(name))
            assert created["spec"].get("resourceClaims"), created["spec"]
            assert _legacy_cards(created) == 0, created["spec"]

        def bound(*wanted: str) -> Callable[[], bool]:
            return lambda: all(_bound(api.get(_pod_path(QUOTA_NS, n))) for n in wanted)

        def used(devices: int) -> Callable[[], bool]:
            return lambda: _used(api) == devices

        wait_until("the two translated pods to be allocated", bound("t-0", "t-1"), PLACE_S,
                   within_quota)
        assert _held(api) == (2, 0)
        wait_until("status.used of the GPUQuota to count them", used(2), 30, within_quota)

        # ... so a legacy pod would take it past hard: /validate refuses both, naming it.
        _until("/validate to refuse a legacy pod over the quota",
               _dry_run(tenant, _opted_out("legacy-0")), admitted=False, check=within_quota)
        for name in ("legacy-0", "legacy-1"):
            refused = _refused(tenant.create, _pod_path(QUOTA_NS), _opted_out(name))
            assert refused.code == 403, refused
            assert refused.message == (
                f'admission webhook "enabled.validate.dra-gateway.io" denied the request: pod '
                f"{QUOTA_NS}/{name} keeps its legacy GPU requests, which a legacy device plugin "
                f"serves and GPUQuota {QUOTA_NS}/{QUOTA} counts together with the namespace's "
                f"translated pods: exceeded quota {QUOTA}: requested devices=1, used devices=2, "
                "limited devices=2; wait for GPU pods of the namespace to end, or raise "
                "spec.hard"), refused.message
            assert not api.exists(_pod_path(QUOTA_NS, name))

        # 4. The translated pods go; once the quota says so, one legacy pod is admitted and
        # bound to the legacy node, and the allocator charges it.
        for name in ("t-0", "t-1"):
            tenant.delete(_pod_path(QUOTA_NS, name), grace_period_s=0)
        wait_until("the translated pods' claims to be released",
                   lambda: _held(api)[0] == 0, PLACE_S, within_quota)
        wait_until("status.used of the GPUQuota to drop to 0", used(0), 30, within_quota)
        _until("/validate to admit a legacy pod within the quota",
               _dry_run(tenant, _opted_out("legacy-0")), admitted=True, check=within_quota)
        created = tenant.create(_pod_path(QUOTA_NS), _opted_out("legacy-0"))
        assert "resourceClaims" not in created["spec"], created["spec"]
        assert _legacy_cards(created) == 1
        wait_until("the legacy pod to be bound", bound("legacy-0"), PLACE_S, within_quota)
        assert api.get(_pod_path(QUOTA_NS, "legacy-0"))["spec"]["nodeName"] == NODE
        kubelet.write(offered=True, holders={f"{QUOTA_NS}/legacy-0": UUIDS[:1]})
        wait_until("status.used of the GPUQuota to count the legacy pod", used(1), 30,
                   within_quota)

        # 5. One translated pod still fits beside it (1 + 1 = hard) ...
        tenant.create(_pod_path(QUOTA_NS), _translated("t-2"))
        wait_until("a translated pod beside the legacy one to be allocated", bound("t-2"),
                   PLACE_S, within_quota)
        assert _held(api) == (1, 1)
        wait_until("status.used of the GPUQuota to count both worlds", used(2), 30,
                   within_quota)

        # ... then neither a legacy pod nor (the quota refuses: admission Refuse) a translated
        # one is admitted.
        _until("/validate to refuse a second legacy pod",
               _dry_run(tenant, _opted_out("legacy-1")), admitted=False, check=within_quota)
        refused = _refused(tenant.create, _pod_path(QUOTA_NS), _opted_out("legacy-1"))
        assert refused.code == 403, refused
        assert f"GPUQuota {QUOTA_NS}/{QUOTA}" in refused.message, refused.message
        assert "keeps its legacy GPU requests" in refused.message, refused.message
        refused = _refused(tenant.create, _pod_path(QUOTA_NS), _translated("t-3"))
        assert refused.code == 403, refused
        assert f"pod {QUOTA_NS}/t-3: exceeded quota {QUOTA}: requested devices=1, used " \
            "devices=2, limited devices=2" in refused.message, refused.message

        # 6. In Queue mode a translated pod waits, gated, while the legacy pod holds the quota.
        api.patch(_quota_path(QUOTA), {"spec": {"admission": "Queue"}})
        _until("/validate to admit a translated pod to wait in Queue mode",
               _dry_run(tenant, _translated("t-3")), admitted=True, check=within_quota)
        tenant.create(_pod_path(QUOTA_NS), _translated("t-3"))

        def waits() -> bool:
            found = _quota_condition(api.get(_pod_path(QUOTA_NS, "t-3")))
            return bool(found and found["status"] == "True")

        wait_until("the translated pod past the quota to get QuotaExceeded", waits, PLACE_S,
                   within_quota)
        waiting = api.get(_pod_path(QUOTA_NS, "t-3"))
        found = _quota_condition(waiting)
        assert found is not None
        assert found["message"] == (f"exceeded quota {QUOTA}: requested devices=1, used "
                                    "devices=2, limited devices=2"), found
        assert _gated(waiting)
        assert not _bound(waiting)
        # It keeps waiting (the allocator retries it meanwhile).
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            within_quota()
            assert not _bound(api.get(_pod_path(QUOTA_NS, "t-3")))
            time.sleep(0.5)

        # 7. The legacy pod goes: the waiting pod is allocated within seconds. (A pod being
        # deleted counts until its grace period is over, as a ResourceQuota counts it; KWOK
        # plays a kubelet whose containers stop at once, so that is not seen here.)
        tenant.delete(_pod_path(QUOTA_NS, "legacy-0"), grace_period_s=0)
        kubelet.write(offered=True, holders={})
        freed = time.monotonic()
        wait_until("the waiting pod to be allocated once the legacy pod went", bound("t-3"),
                   15, within_quota)
        print(f"the waiting pod was allocated {time.monotonic() - freed:.1f}s after the "
              "legacy pod went")
        assert _held(api) == (2, 0)
        cleared = _quota_condition(api.get(_pod_path(QUOTA_NS, "t-3")))
        assert cleared is not None
        assert cleared["status"] == "False", cleared
        wait_until("status.used of the GPUQuota to follow", used(2), 30, within_quota)
        assert over_capacity(api) == []
        assert max(sum(s) for s in samples) == HARD, samples

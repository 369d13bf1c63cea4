"""GPUQuotas and GPUSharingPolicies on real control planes, as the chart installs them.

Runs first on each installation (file order: before test_real_cluster.py, whose examples need
every card free) and leaves it as it found it: each test deletes its pods, waits until their
claims are released, and deletes its quotas, sharing policies and namespaces, failed or not.

- The chart installs both CRDs; the real API server enforces their schemas (an enum, a minimum,
  a CEL rule, an unknown field under strict field validation), and serves their printer
  columns to `kubectl get` (the Table form).
- A namespace fills its GPUQuota: its pods are placed until the quota is used; the next one
  stays gated with the condition dra-gateway.io/QuotaExceeded and an Event in ResourceQuota's
  words; a placed pod deleted, the waiting one is placed; the quota's status.used follows.
- A GPUSharingPolicy isolating namespaces: pods of two isolated tenants never hold the same
  card, while the pods of one tenant do share one (they ask to be packed).
- /validate refuses at creation, through the API server, a share in an exclusive namespace
  (the translated template passes: the refusal is about the pod), a request larger than the
  hard quota by itself, and a ResourceClaim or ResourceClaimTemplate of a gateway class written
  natively that breaks a rule; another driver's claim is never sent to the webhook; and a pod
  whose selectors match only cards of models the namespace's policy does not allow, judged on
  the cards the demo inventories publish (its allowed twin is placed on an A100).
"""

from __future__ import annotations

import contextlib
import json
import re
import ssl
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pytest

from dra_gateway.devkit.realcluster import Api, path_of
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError
from e2e.support import (
    Gateway,
    cards,
    holdings,
    over_capacity,
    pod_claims,
    pods,
    wait_until,
)

JSON = dict[str, Any]
PLACE_S = 60.0
GROUP = "dra-gateway.io/v1alpha1"
RESOURCE = "resource.k8s.io/v1"
GATE = names.SCHEDULING_GATE
QUOTA_CONDITION = "dra-gateway.io/QuotaExceeded"
POLICY_LABEL = "e2e.dra-gateway.io/policy"
QUOTA_NS = "policy-quota"
TENANT_A = "policy-tenant-a"
TENANT_B = "policy-tenant-b"
EXCLUSIVE_NS = "policy-exclusive"
MODELS_NS = "policy-models"
SCHEMA_NS = "policy-schema"


def _bound(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def _gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def _condition(pod: Mapping[str, Any]) -> JSON | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == QUOTA_CONDITION:
            return dict(condition)
    return None


def _share_pod(name: str, namespace: str, *, memory_mib: int = 4096, cores: int = 10,
               gpus: int = 1, pack: bool = False) -> JSON:
    """A HAMi pod: a share of one card (memory and cores), or `gpus` whole cards."""
    limits = {"nvidia.com/gpu": str(gpus)}
    if gpus == 1:
        limits |= {"nvidia.com/gpumem": str(memory_mib), "nvidia.com/gpucores": str(cores)}
    metadata: JSON = {"name": name, "namespace": namespace}
    if pack:
        metadata["annotations"] = {"hami.io/gpu-scheduler-policy": "binpack"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata,
            "spec": {"containers": [{"name": "main", "image": "example.com/cuda:1",
                                     "resources": {"limits": limits}}]}}


def _quota(name: str, namespace: str, **hard: Any) -> JSON:
    return {"apiVersion": GROUP, "kind": "GPUQuota",
            "metadata": {"name": name, "namespace": namespace}, "spec": {"hard": hard}}


def _sharing(name: str, value: str, **spec: Any) -> JSON:
    return {"apiVersion": GROUP, "kind": "GPUSharingPolicy", "metadata": {"name": name},
            "spec": {"namespaceSelector": {"matchLabels": {POLICY_LABEL: value}}, **spec}}


def _pod_path(namespace: str, name: str) -> str:
    return path_of("v1", "pods", namespace=namespace, name=name)


def _quota_path(namespace: str, name: str | None = None) -> str:
    return path_of(GROUP, "gpuquotas", namespace=namespace, name=name)


def _table(api: Api, path: str) -> JSON:
    """`path` in the Table form `kubectl get` asks for: the server-side printer columns."""
    request = urllib.request.Request(api.server + path, headers={
        "Authorization": f"Bearer {api.token}",
        "Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"})
    context = ssl.create_default_context(cafile=str(api.ca_file))
    with urllib.request.urlopen(request, context=context, timeout=api.timeout_s) as response:
        table: JSON = json.loads(response.read())
    return table


def _refused(api: Api, path: str, body: Mapping[str, Any], **query: str) -> ApiError:
    with pytest.raises(ApiError) as refused:
        api.request("POST", path, dict(body), query=query or None)
    return refused.value


@contextlib.contextmanager
def _scene(gateway: Gateway, namespaces: Mapping[str, Mapping[str, str]],
           sharing: tuple[str, ...] = ()) -> Iterator[Api]:
    """Namespaces (name -> labels) made for one test, and everything in them (and the named
    sharing policies) gone afterwards, every claim released, whether the test passed or not."""
    api = gateway.api
    for name, labels in namespaces.items():
        api.create(path_of("v1", "namespaces"), {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": name,
                                                              "labels": dict(labels)}})
    try:
        yield api
    finally:
        for namespace in namespaces:
            for pod in pods(api, namespace):
                with contextlib.suppress(ApiError):
                    api.delete(_pod_path(namespace, pod["metadata"]["name"]),
                               grace_period_s=0)

        def released() -> bool:
            return not any(
                pods(api, ns) or any((c.get("status") or {}).get("allocation") for c in
                                     api.list(path_of(RESOURCE, "resourceclaims",
                                                      namespace=ns)))
                for ns in namespaces)

        wait_until(f"the pods of {', '.join(namespaces)} to be gone and their claims "
                   "released", released, PLACE_S, gateway.check)
        for name in sharing:
            with contextlib.suppress(ApiError):
                api.delete(path_of(GROUP, "gpusharingpolicies", name=name))
        for namespace in namespaces:
            for quota in api.list(_quota_path(namespace)):
                with contextlib.suppress(ApiError):
                    api.delete(_quota_path(namespace, quota["metadata"]["name"]))
            with contextlib.suppress(ApiError):
                api.delete(path_of("v1", "namespaces", name=namespace))


def _until_refused(gateway: Gateway, what: str, create: Callable[[], JSON],
                   delete: Callable[[JSON], None]) -> ApiError:
    """The refusal `create` meets once the webhook has read the policies just written (its
    informer sees them a moment after the API server stored them); what it created meanwhile
    is deleted."""
    refusal: ApiError | None = None

    def refused() -> bool:
        nonlocal refusal
        try:
            created = create()
        except ApiError as exc:
            refusal = exc
            return True
        delete(created)
        return False

    wait_until(f"/validate to refuse {what}", refused, 20, gateway.check, poll_s=0.5)
    assert refusal is not None
    return refusal


# a. The CRDs and their schemas ------------------------------------------------------------------

def test_the_chart_installs_the_crds_and_the_api_server_enforces_their_schemas(
        gateway: Gateway) -> None:
    with _scene(gateway, {SCHEMA_NS: {}}) as api:
        crds = {name: api.get(path_of("apiextensions.k8s.io/v1", "customresourcedefinitions",
                                      name=name))
                for name in ("gpuquotas.dra-gateway.io", "gpusharingpolicies.dra-gateway.io")}
        for name, crd in crds.items():
            established = {c["type"]: c["status"] for c in crd["status"]["conditions"]}
            assert established.get("Established") == "True", (name, established)

        # An enum, a minimum, a CEL rule and (strict field validation) an unknown field: each
        # refused by the API server with its own message.
        bad_admission = _quota("bad", SCHEMA_NS, memory="8Gi")
        bad_admission["spec"]["admission"] = "Sometimes"
        refused = _refused(api, _quota_path(SCHEMA_NS), bad_admission)
        assert refused.code == 422, refused
        assert 'spec.admission: Unsupported value: "Sometimes": supported values: "Queue", ' \
            '"Refuse"' in refused.message, refused.message
        refused = _refused(api, _quota_path(SCHEMA_NS), _quota("bad", SCHEMA_NS, cores=-5))
        assert refused.code == 422, refused
        assert "spec.hard.cores: Invalid value: -5: spec.hard.cores in body should be greater " \
            "than or equal to 0" in refused.message, refused.message
        refused = _refused(api, _quota_path(SCHEMA_NS), _quota("bad", SCHEMA_NS, gpus=2),
                           fieldValidation="Strict")
        assert 'unknown field "spec.hard.gpus"' in refused.message, refused.message
        refused = _refused(api, path_of(GROUP, "gpusharingpolicies"),
                           _sharing("bad", "none", isolation={"mode": "Label"}))
        assert refused.code == 422, refused
        assert "labelKey is required with mode Label and only read with it" in \
            refused.message, refused.message

        # `kubectl get gpuquotas`: the server prints the CRD's columns.
        api.create(_quota_path(SCHEMA_NS), _quota("team-gpu", SCHEMA_NS, memory="12Gi",
                                                  cores=50))
        table = _table(api, _quota_path(SCHEMA_NS))
        assert [c["name"] for c in table["columnDefinitions"]] == [
            "Name", "Memory-Used", "Memory-Hard", "Cores-Used", "Cores-Hard", "Devices",
            "Cohort", "Devices-Borrowed", "Memory-Borrowed", "Admission", "Age"]
        (row,) = table["rows"]
        assert row["cells"][:3] == ["team-gpu", None, "12Gi"] or \
            row["cells"][:3] == ["team-gpu", "", "12Gi"], row["cells"]
        assert row["cells"][4] == 50
        table = _table(api, path_of(GROUP, "gpusharingpolicies"))
        assert [c["name"] for c in table["columnDefinitions"]] == [
            "Name", "Exclusive", "Isolation", "Max-Claims", "Shares", "Age"]


# b. A namespace filling its quota ---------------------------------------------------------------

def test_a_namespace_fills_its_quota_and_the_next_pod_waits_until_one_is_deleted(
        gateway: Gateway) -> None:
    with _scene(gateway, {QUOTA_NS: {}}) as api:
        api.create(_quota_path(QUOTA_NS), _quota("policy-gpu", QUOTA_NS, memory="12Gi"))
        placed = ("fill-0", "fill-1", "fill-2")
        for name in placed:  # 4Gi each: three use the quota up
            api.create(path_of("v1", "pods", namespace=QUOTA_NS), _share_pod(name, QUOTA_NS))

        def all_bound(wanted: tuple[str, ...]) -> Callable[[], bool]:
            def check() -> bool:
                current = {p["metadata"]["name"]: p for p in pods(api, QUOTA_NS)}
                return all(n in current and _bound(current[n]) for n in wanted)
            return check

        wait_until("the pods within the quota to be placed", all_bound(placed), PLACE_S,
                   gateway.check)
        api.create(path_of("v1", "pods", namespace=QUOTA_NS), _share_pod("waiting", QUOTA_NS))
        message = ("exceeded quota policy-gpu: requested memory=4Gi, used memory=12Gi, limited "
                   "memory=12Gi")

        def held() -> bool:
            condition = _condition(api.get(_pod_path(QUOTA_NS, "waiting")))
            return bool(condition and condition["status"] == "True")

        wait_until("the pod past the quota to get its condition", held, PLACE_S, gateway.check)
        pod = api.get(_pod_path(QUOTA_NS, "waiting"))
        condition = _condition(pod)
        assert condition is not None
        assert (condition["reason"], condition["message"]) == ("QuotaExceeded", message)
        assert _gated(pod)
        assert not _bound(pod)
        events = [e for e in api.list(path_of("v1", "events", namespace=QUOTA_NS))
                  if e.get("reason") == "QuotaExceeded"
                  and (e.get("involvedObject") or {}).get("name") == "waiting"]
        assert [e["message"] for e in events][-1:] == [message], events

        def used(memory: str) -> Callable[[], bool]:
            def check() -> bool:
                status = api.get(_quota_path(QUOTA_NS, "policy-gpu")).get("status") or {}
                return bool((status.get("used") or {}).get("memory") == memory)
            return check

        # The allocator writes the quota's usage every few seconds.
        wait_until("status.used of the quota to show 12Gi", used("12Gi"), 20, gateway.check)
        (row,) = _table(api, _quota_path(QUOTA_NS))["rows"]
        assert row["cells"][:3] == ["policy-gpu", "12Gi", "12Gi"], row["cells"]

        # A placed pod goes: the waiting one takes its place, its condition turned False.
        api.delete(_pod_path(QUOTA_NS, "fill-0"), grace_period_s=0)
        wait_until("the waiting pod to be placed once a pod went", all_bound(("waiting",)),
                   PLACE_S, gateway.check)
        cleared = _condition(api.get(_pod_path(QUOTA_NS, "waiting")))
        assert cleared is not None
        assert cleared["status"] == "False", cleared
        api.delete(_pod_path(QUOTA_NS, "fill-1"), grace_period_s=0)
        wait_until("status.used of the quota to follow down to 8Gi", used("8Gi"), 30,
                   gateway.check)
        assert over_capacity(api) == []


# c. Tenants isolated by a GPUSharingPolicy ------------------------------------------------------

def _cards_of(api: Api, namespace: str) -> dict[str, set[tuple[str, str, str]]]:
    """pod -> the devices its claims hold."""
    published = cards(api)
    return {pod["metadata"]["name"]: {h.device for claim in pod_claims(api, pod)
                                      for h in holdings(claim, published)}
            for pod in pods(api, namespace)}


def test_isolated_tenants_never_share_a_card_while_one_tenants_pods_do(
        gateway: Gateway) -> None:
    tenants = {TENANT_A: {POLICY_LABEL: "isolated"}, TENANT_B: {POLICY_LABEL: "isolated"}}
    with _scene(gateway, tenants, sharing=("policy-isolated",)) as api:
        api.create(path_of(GROUP, "gpusharingpolicies"),
                   _sharing("policy-isolated", "isolated", isolation={"mode": "Namespace"}))
        # The allocator reads policies from its watch, a moment after the API server stored
        # this one; nothing it exposes here says when, so give it that moment.
        time.sleep(3)
        order = [(TENANT_A, "a-0"), (TENANT_B, "b-0"), (TENANT_A, "a-1"), (TENANT_B, "b-1")]
        for namespace, name in order:
            # Packed: without the policy the second tenant's pods would join the first's card.
            api.create(path_of("v1", "pods", namespace=namespace),
                       _share_pod(name, namespace, pack=True))

            def bound(namespace: str = namespace, name: str = name) -> bool:
                return _bound(api.get(_pod_path(namespace, name)))

            wait_until(f"{namespace}/{name} to be placed", bound, PLACE_S, gateway.check)
        held_a = _cards_of(api, TENANT_A)
        held_b = _cards_of(api, TENANT_B)
        assert all(held_a.values()), held_a
        assert all(held_b.values()), held_b
        cards_a = set().union(*held_a.values())
        cards_b = set().union(*held_b.values())
        assert cards_a.isdisjoint(cards_b), (held_a, held_b)
        # One tenant's pods do share: both of a tenant's packed shares sit on one card.
        assert len(cards_a) == 1, held_a
        assert len(cards_b) == 1, held_b
        assert over_capacity(api) == []


# d. /validate at creation -----------------------------------------------------------------------

def _native_share(kind: str, name: str) -> JSON:
    """A share of one card (8Gi, 20% of compute) of the gateway's class, written by hand: in
    capacity.requests where the cluster keeps it and in the claim's GpuShareConfig too (the API
    server drops capacity.requests without consumable capacity)."""
    spec = {"devices": {
        "requests": [{"name": "gpu", "exactly": {
            "deviceClassName": names.GPU_CLASS,
            "capacity": {"requests": {"memory": "8Gi", "cores": "20"}}}}],
        "config": [{"requests": ["gpu"], "opaque": {"driver": names.DRIVER, "parameters": {
            "apiVersion": names.API_VERSION, "kind": names.KIND_GPU_SHARE_CONFIG,
            "memory": 8 << 30, "cores": 20}}}]}}
    return {"apiVersion": RESOURCE, "kind": kind,
            "metadata": {"name": name, "namespace": EXCLUSIVE_NS},
            "spec": spec if kind == "ResourceClaim" else {"spec": spec}}


def _whole(device_class: str) -> JSON:
    return {"apiVersion": RESOURCE, "kind": "ResourceClaim",
            "metadata": {"name": "whole", "namespace": EXCLUSIVE_NS},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": device_class}}]}}}


def test_validate_refuses_at_creation_what_the_policies_can_never_admit(
        gateway: Gateway) -> None:
    with _scene(gateway, {EXCLUSIVE_NS: {POLICY_LABEL: "exclusive"}},
                sharing=("policy-exclusive",)) as api:
        api.create(path_of(GROUP, "gpusharingpolicies"),
                   _sharing("policy-exclusive", "exclusive", exclusive=True))
        api.create(_quota_path(EXCLUSIVE_NS), _quota("policy-cards", EXCLUSIVE_NS, devices=1))
        pods_path = path_of("v1", "pods", namespace=EXCLUSIVE_NS)

        def delete_pod(pod: JSON) -> None:
            api.delete(_pod_path(EXCLUSIVE_NS, pod["metadata"]["name"]), grace_period_s=0)

        # A share in an exclusive namespace. /mutate made its template first, through the API
        # server: the claims webhook leaves the gateway's own translation alone, so the refusal
        # is /validate's about the pod.
        refused = _until_refused(gateway, "a share pod",
                                 lambda: api.create(pods_path, _share_pod("share",
                                                                          EXCLUSIVE_NS)),
                                 delete_pod)
        assert refused.code == 403, refused
        assert refused.message == (
            'admission webhook "validate.dra-gateway.io" denied the request: pod '
            "policy-exclusive/share: request 'main' asks for a share of a GPU, but "
            "GPUSharingPolicy policy-exclusive makes the namespace exclusive (whole cards "
            "only); ask for whole GPUs"), refused.message

        # More whole cards than the quota allows, by itself.
        refused = _until_refused(gateway, "a pod over the quota by itself",
                                 lambda: api.create(pods_path, _share_pod("two-cards",
                                                                          EXCLUSIVE_NS, gpus=2)),
                                 delete_pod)
        assert refused.message == (
            'admission webhook "validate.dra-gateway.io" denied the request: pod '
            "policy-exclusive/two-cards: exceeded quota policy-cards: requested devices=2, used "
            "devices=0, limited devices=1; the request alone is more than the quota allows, so "
            "it could never run: ask for less or raise spec.hard"), refused.message

        # A ResourceClaim and a ResourceClaimTemplate of the gateway's class written natively.
        for kind, plural in (("ResourceClaim", "resourceclaims"),
                             ("ResourceClaimTemplate", "resourceclaimtemplates")):
            path = path_of(RESOURCE, plural, namespace=EXCLUSIVE_NS)
            refused = _refused(api, path, _native_share(kind, "shared"))
            spec = "spec" if kind == "ResourceClaim" else "spec.spec"
            assert refused.code == 403, refused
            assert refused.message == (
                f'admission webhook "claims.dra-gateway.io" denied the request: {kind} '
                f"policy-exclusive/shared: request 'gpu' ({spec}.devices.requests[0]) asks for "
                "a share of a GPU, but GPUSharingPolicy policy-exclusive makes the namespace "
                "exclusive (whole cards only); ask for whole GPUs"), refused.message
            assert not api.exists(path_of(RESOURCE, plural, namespace=EXCLUSIVE_NS,
                                          name="shared"))
        # A whole card passes; another driver's claim never reaches the webhook.
        claims = path_of(RESOURCE, "resourceclaims", namespace=EXCLUSIVE_NS)
        api.create(claims, _whole(names.GPU_CLASS))
        api.delete(path_of(RESOURCE, "resourceclaims", namespace=EXCLUSIVE_NS, name="whole"))
        wait_until("the whole-card claim to go", lambda: not api.exists(
            path_of(RESOURCE, "resourceclaims", namespace=EXCLUSIVE_NS, name="whole")), 20)
        api.create(claims, _whole("gpu.example.com"))


def _model_pod(name: str, models: str) -> JSON:
    """A HAMi share pod that may run only on the models named (nvidia.com/use-gputype)."""
    pod = _share_pod(name, MODELS_NS)
    pod["metadata"]["annotations"] = {"nvidia.com/use-gputype": models}
    return pod


def test_validate_refuses_at_creation_a_pod_that_could_run_only_on_forbidden_models(
        gateway: Gateway) -> None:
    # The demo publishes A100 and H100 cards; the namespace may use A100s only. The webhook
    # judges the pod's translated selectors on the cards its ResourceSlice mirror has seen.
    with _scene(gateway, {MODELS_NS: {POLICY_LABEL: "models"}},
                sharing=("policy-a100-only",)) as api:
        api.create(path_of(GROUP, "gpusharingpolicies"),
                   _sharing("policy-a100-only", "models", allowedModels=["*A100*"]))
        pods_path = path_of("v1", "pods", namespace=MODELS_NS)

        def delete_pod(pod: JSON) -> None:
            api.delete(_pod_path(MODELS_NS, pod["metadata"]["name"]), grace_period_s=0)

        refused = _until_refused(gateway, "a pod asking for H100s only",
                                 lambda: api.create(pods_path, _model_pod("h100", "H100")),
                                 delete_pod)
        assert refused.code == 403, refused
        found = re.search(r"ResourceClaimTemplate (\S+):", refused.message)
        assert found is not None, refused.message
        assert refused.message == (
            'admission webhook "validate.dra-gateway.io" denied the request: pod '
            "policy-models/h100: request 'main' (spec.resourceClaims[0] ResourceClaimTemplate "
            f"{found.group(1)}: spec.spec.devices.requests[0]) can run only on NVIDIA H100 80GB "
            "HBM3, which GPUSharingPolicy policy-a100-only does not allow (allowedModels: "
            "*A100*); ask for an allowed model"), refused.message
        assert not api.exists(_pod_path(MODELS_NS, "h100"))

        # An allowed model, and a choice of both: admitted, and placed on A100s.
        for name, models in (("a100", "A100"), ("either", "A100,H100")):
            api.create(pods_path, _model_pod(name, models))

        def placed() -> bool:
            return all(_bound(api.get(_pod_path(MODELS_NS, n))) for n in ("a100", "either"))

        wait_until("the pods asking for allowed models to be placed", placed, PLACE_S,
                   gateway.check)
        for pod in pods(api, MODELS_NS):
            assert api.get(_pod_path(MODELS_NS, pod["metadata"]["name"]))["spec"][
                "nodeName"].startswith("gpu-a100"), pod["metadata"]["name"]

"""Least privilege, read back from a real API server (one installation per conftest.SETUPS
entry, shared with the other e2e modules).

- Each identity of the chart (the webhook's, the allocator's and the node plugin's
  ServiceAccount tokens, the node plugin's bound to its pod on a node) asks the API server what
  it may do (SelfSubjectRulesReview) in the release namespace, in `default` and in
  `kube-system`: the answer is exactly `NEEDS`, the verbs each component's code sends through the
  cluster port (kube/cluster/port.py; informers list and watch), declared here beside where the
  code sends them. A grant no code uses, or a use the chart forgot, fails here by name.
- What RBAC cannot narrow, the chart's admission policies do; each identity tries a write it
  must not make and is refused (dry run: nothing changes): the allocator rewriting a pod's
  image, tolerations, labels, another system's gate, its phase or another condition (policy
  allocator-pod-writes); the node plugin writing an Event about another Node or a pod (policy
  node-plugin-events), in another namespace, or patching a Node (RBAC); the webhook touching
  another webhook configuration or a pod (RBAC). Their allowed counterparts pass.
- The running allocator's own writes pass its policy: a pod behind another system's gate gets
  the condition dra-gateway.io/WaitingForGates, and its gate removed once it is the last.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping
from typing import Any

import pytest

from dra_gateway.devkit.realcluster import Api, path_of
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError
from e2e.support import GPU_NODES, NAMESPACE, RELEASE, Gateway, wait_until

JSON = dict[str, Any]
Right = tuple[str, str, str, str]  # (apiGroup, resource, verb, resourceName or "*")
ANYWHERE = "*"  # rights of a ClusterRole: the same in every namespace


def _rights(groups: Iterable[str], resources: Iterable[str], verbs: Iterable[str],
            names_: Iterable[str] = ("*",)) -> set[Right]:
    return {(g, r, v, n) for g in groups for r in resources for v in verbs for n in names_}


CORE, RESOURCE, GATEWAY = "", "resource.k8s.io", "dra-gateway.io"
INFORMER = ("list", "watch")
DEFRAG = "dra-gateway-defrag"

# What each component's code sends, by where the right holds (ANYWHERE, or one namespace), with
# the chart's defaults (preemption and the drain of failed devices on, defrag off, gated-pod
# Events after two minutes).
NEEDS: dict[str, dict[str, set[Right]]] = {
    "webhook": {
        ANYWHERE: (
            # webhook/templates.py: the content-named templates exist (create, get).
            _rights([RESOURCE], ["resourceclaimtemplates"], ["get", "create"])
            # webhook/claimspecs.py: the classes of a pod's own claims.
            | _rights([RESOURCE], ["resourceclaims"], ["get"])
            # webhook/deviceclasses.py, deviceprofiles.py, policywatch.py: informers.
            | _rights([RESOURCE], ["deviceclasses", "resourceslices"], INFORMER)
            | _rights([GATEWAY], ["gpuquotas", "gpusharingpolicies"], INFORMER)
            | _rights([CORE], ["namespaces"], INFORMER)
            # webhook/config.py: its own two configurations, read and updated by name.
            | _rights(["admissionregistration.k8s.io"],
                      ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
                      ["get", "update"], [RELEASE])
            # webhook/allocatorwatch.py: pods left gated (an informer), Events on them and
            # webhook/rulestore.py's on refused rules.
            | _rights([CORE], ["pods"], INFORMER)
            | _rights([CORE], ["events"], ["create"])),
        NAMESPACE: (
            _rights([CORE], ["configmaps"], INFORMER)  # webhook/rulestore.py
            | _rights(["coordination.k8s.io"], ["leases"], INFORMER,  # allocatorwatch.py
                      [names.ALLOCATOR_LEASE])),
    },
    "allocator": {
        ANYWHERE: (
            # allocator/controller.py's informers; release.py, allocate.py and
            # eviction/moves.py read a pod by name; writes.py removes the gate (patch).
            _rights([CORE], ["pods"], ["get", "list", "watch", "patch"])
            # conditions.py and eviction/evict.py: conditions (a strategic merge patch).
            | _rights([CORE], ["pods/status"], ["patch"])
            | _rights([CORE], ["pods/eviction"], ["create"])  # eviction/evict.py
            # writes.py, release.py, uninstall.py: the finalizer and shares annotation
            # (patch), the allocation (a status update, authorised from 1.36 on
            # resourceclaims/binding as well).
            | _rights([RESOURCE], ["resourceclaims"], ["get", "list", "watch", "patch"])
            | _rights([RESOURCE], ["resourceclaims/status", "resourceclaims/binding"],
                      ["update"])
            | _rights([RESOURCE], ["resourceslices", "deviceclasses", "devicetaintrules"],
                      INFORMER)
            | _rights([CORE], ["nodes", "namespaces"], INFORMER)
            | _rights([CORE], ["events"], ["create", "patch"])  # events.py: a repeat counts
            | _rights([GATEWAY], ["gpuquotas", "gpusharingpolicies"], INFORMER)
            | _rights([GATEWAY], ["gpuquotas/status"], ["patch"])  # quotastatus.py
            | _rights(["scheduling.volcano.sh", "scheduling.x-k8s.io"], ["podgroups"], INFORMER)
            | _rights(["scheduling.k8s.io"], ["podgroups", "workloads"], INFORMER)
            | _rights(["jobset.x-k8s.io"], ["jobsets"], INFORMER)
            | _rights(["kubeflow.org"], ["pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs",
                                         "paddlejobs", "jaxjobs"], INFORMER)
            # eviction/preemption.py and defrag.py plan around the budgets.
            | _rights(["policy"], ["poddisruptionbudgets"], ["list"])),
        NAMESPACE: (
            # kube/runtime/leader.py: its Lease.
            _rights(["coordination.k8s.io"], ["leases"], ["create"])
            | _rights(["coordination.k8s.io"], ["leases"], ["get", "update"],
                      [names.ALLOCATOR_LEASE])
            # eviction/store.py and the records informer: its holds and moves, by name.
            | _rights([CORE], ["configmaps"], ["get", "list", "watch", "patch"], [DEFRAG])
            | _rights([CORE], ["configmaps"], ["create"])),
    },
    "node-plugin": {
        ANYWHERE: (
            _rights([RESOURCE], ["resourceclaims"], ["get"])  # prepare.py
            # publish.py (an informer of its slices, create, update, delete) and
            # kube/cluster/features.py (a dry-run create).
            | _rights([RESOURCE], ["resourceslices"], ["list", "watch", "create", "update",
                                                       "delete"])
            | _rights([CORE], ["nodes"], ["get"])  # publish.py, plugin.py, coexistence.py
            | _rights([CORE], ["nodes/status"], ["patch"])),  # health.py, coexistence.py
        # events.py: Events about its Node, where Node Events live.
        "default": _rights([CORE], ["events"], ["create"]),
    },
}
# A ServiceAccount of the release namespace that nothing binds: what it may do, every
# authenticated user and service account of that namespace may (system:basic-user's reviews,
# from 1.37 reading ClusterTrustBundles...), as each release's bootstrap policy says; not the
# chart's.
NOBODY = "e2e-no-rights"


def _token(gateway: Gateway, component: str, node: str | None = None) -> Api:
    """The component's ServiceAccount token; the node plugin's bound to its stand-in pod on
    `node` (support.py makes one per GPU node), as its DaemonSet pod there holds it."""
    account = gateway.service_accounts[component]
    bound = None
    if node is not None:
        bound = gateway.api.get(path_of("v1", "pods", namespace=NAMESPACE,
                                        name=f"{account}-{node}"))
    return gateway.plane.api(gateway.plane.service_account_token(
        NAMESPACE, account, expiration_s=3600, bound_pod=bound))


def _reviewed(api: Api, namespace: str) -> set[Right]:
    """What the API server says the holder of `api`'s token may do in `namespace`."""
    review = api.create(path_of("authorization.k8s.io/v1", "selfsubjectrulesreviews"), {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": namespace}})
    granted: set[Right] = set()
    for rule in review["status"].get("resourceRules") or ():
        granted |= _rights(rule.get("apiGroups") or [], rule.get("resources") or [],
                           rule["verbs"], rule.get("resourceNames") or ["*"])
    return granted


def _everyone(gateway: Gateway, namespace: str) -> set[Right]:
    """What an account nothing binds may do in `namespace`, as this release grants it."""
    with contextlib.suppress(ApiError):
        gateway.api.create(path_of("v1", "serviceaccounts", namespace=NAMESPACE), {
            "apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NOBODY}})
    nobody = gateway.plane.api(gateway.plane.service_account_token(NAMESPACE, NOBODY,
                                                                   expiration_s=600))
    return _reviewed(nobody, namespace)


def _granted(gateway: Gateway, api: Api, namespace: str) -> set[Right]:
    return _reviewed(api, namespace) - _everyone(gateway, namespace)


@pytest.mark.parametrize("component", sorted(NEEDS))
def test_each_identity_may_do_exactly_what_its_code_sends(gateway: Gateway,
                                                          component: str) -> None:
    api = _token(gateway, component, GPU_NODES[0][0] if component == "node-plugin" else None)
    needs = NEEDS[component]
    for namespace in (NAMESPACE, "default", "kube-system"):
        expected = needs[ANYWHERE] | needs.get(namespace, set())
        granted = _granted(gateway, api, namespace)
        assert sorted(granted - expected) == [], \
            f"{component} in {namespace}: granted beyond what its code sends"
        assert sorted(expected - granted) == [], \
            f"{component} in {namespace}: its code sends what it is not granted"


# Forbidden writes ------------------------------------------------------------------------------

def _dry_run(api: Api, method: str, path: str, body: Any,
             content_type: str = "application/merge-patch+json") -> JSON:
    return api.request(method, path, body, query={"dryRun": "All"}, content_type=content_type)


def _refused(api: Api, method: str, path: str, body: Any,
             content_type: str = "application/merge-patch+json") -> ApiError:
    with pytest.raises(ApiError) as refused:
        _dry_run(api, method, path, body, content_type)
    assert refused.value.code == 403, refused.value
    return refused.value


def _by_policy(refused: ApiError, policy: str, *words: str) -> None:
    assert f"ValidatingAdmissionPolicy '{RELEASE}-{policy}'" in refused.message, refused.message
    for word in words:
        assert word in refused.message, refused.message


def _by_rbac(refused: ApiError) -> None:
    assert "ValidatingAdmissionPolicy" not in refused.message, refused.message
    assert "cannot" in refused.message, refused.message  # "... cannot patch resource ..."


OTHER_GATE = "example.com/admission"
POD_NAME = "least-privilege"
POD = path_of("v1", "pods", namespace="kube-system", name=POD_NAME)
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"


def _held_pod(api: Api) -> JSON:
    """A pod in kube-system behind another system's gate and the gateway's: the allocator
    marks it WaitingForGates and leaves it gated until the other gate goes."""
    with contextlib.suppress(ApiError):
        api.delete(POD, grace_period_s=0)
    wait_until("an earlier run's pod to be gone", lambda: not _exists(api), 30)
    return api.create(path_of("v1", "pods", namespace="kube-system"), {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": POD_NAME, "labels": {"app": "least-privilege"}},
        "spec": {"schedulingGates": [{"name": OTHER_GATE}, {"name": names.SCHEDULING_GATE}],
                 "tolerations": [{"key": "example.com/gpu", "operator": "Exists"}],
                 "containers": [{"name": "main", "image": "example.com/app:1"}]}})


def _exists(api: Api) -> bool:
    try:
        api.get(POD)
    except ApiError as exc:
        if exc.code == 404:
            return False
        raise
    return True


def _condition(pod: Mapping[str, Any], kind: str) -> JSON | None:
    for condition in (pod.get("status") or {}).get("conditions") or ():
        if condition.get("type") == kind:
            return dict(condition)
    return None


def test_the_allocator_only_ungates_pods_and_writes_its_own_conditions(
        gateway: Gateway) -> None:
    api = gateway.api
    allocator = _token(gateway, "allocator")
    _held_pod(api)
    waiting = f"{names.DOMAIN}/WaitingForGates"
    # The running allocator's own status write passes its policy.
    wait_until("the allocator to mark the pod WaitingForGates",
               lambda: (_condition(api.get(POD), waiting) or {}).get("status") == "True",
               30, gateway.check)
    pod = api.get(POD)
    policy = "allocator-pod-writes"
    # Changes the API server accepts on a gated pod (an administrator's pass, dry run): only
    # the policy refuses them to the allocator.
    refusals: dict[str, list[JSON]] = {
        "an image": [{"op": "replace", "path": "/spec/containers/0/image",
                      "value": "attacker/miner:1"}],
        "a toleration": [{"op": "add", "path": "/spec/tolerations/-",
                          "value": {"operator": "Exists"}}],
        "a node selector": [{"op": "add", "path": "/spec/nodeSelector",
                             "value": {"kubernetes.io/hostname": GPU_NODES[0][0]}}],
        "a label": [{"op": "replace", "path": "/metadata/labels/app", "value": "other"}],
        "an annotation": [{"op": "add", "path": "/metadata/annotations",
                           "value": {"example.com/x": "y"}}],
        "another gate": [{"op": "remove", "path": "/spec/schedulingGates/0"}],
        "a deadline": [{"op": "add", "path": "/spec/activeDeadlineSeconds", "value": 1}],
    }
    for what, patch in refusals.items():
        _by_policy(_refused(allocator, "PATCH", POD, patch, JSON_PATCH), policy)
        _dry_run(api, "PATCH", POD, patch, JSON_PATCH)
        print(f"the allocator may not change {what} of a pod in kube-system")
    # Its own change: the gate removed as allocator/writes.py removes it (a JSON patch).
    index = [g["name"] for g in pod["spec"]["schedulingGates"]].index(names.SCHEDULING_GATE)
    ungated = _dry_run(allocator, "PATCH", POD, [
        {"op": "test", "path": "/metadata/uid", "value": pod["metadata"]["uid"]},
        {"op": "remove", "path": f"/spec/schedulingGates/{index}"}],
        JSON_PATCH)
    assert ungated["spec"]["schedulingGates"] == [{"name": OTHER_GATE}]

    status = POD + "/status"
    mine = {"type": f"{names.DOMAIN}/QuotaExceeded", "status": "True",
            "reason": "QuotaExceeded", "message": "e2e", "lastProbeTime": None}
    _dry_run(allocator, "PATCH", status, {"status": {"conditions": [mine]}}, STRATEGIC)
    theirs = {"type": "PodScheduled", "status": "True", "reason": "e2e"}
    _by_policy(_refused(allocator, "PATCH", status, {"status": {"conditions": [theirs]}},
                        STRATEGIC), policy, "writes only its own pod conditions")
    _by_policy(_refused(allocator, "PATCH", status, {"status": {"phase": "Failed"}}), policy,
               "may not change a pod's status")
    # RBAC: no pod creation or deletion, no Secret, no ConfigMap but its own.
    _by_rbac(_refused(allocator, "POST", path_of("v1", "pods", namespace="kube-system"),
                      {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                       "spec": {"containers": [{"name": "c", "image": "i"}]}},
                      "application/json"))
    for path in (POD, path_of("v1", "secrets", namespace=NAMESPACE, name="any"),
                 path_of("v1", "configmaps", namespace=NAMESPACE, name=f"{RELEASE}-rules")):
        with pytest.raises(ApiError) as refused:
            allocator.request("DELETE" if path == POD else "GET", path,
                              query={"dryRun": "All"} if path == POD else None)
        assert refused.value.code == 403, refused.value
    assert api.get(POD)["spec"]["schedulingGates"] == pod["spec"]["schedulingGates"]

    # The other gate goes: the running allocator clears its condition and removes its gate,
    # both through its policy.
    api.patch(POD, {"spec": {"schedulingGates": [{"name": names.SCHEDULING_GATE}]}})
    wait_until("the allocator to remove its gate",
               lambda: not api.get(POD)["spec"].get("schedulingGates"), 30, gateway.check)
    assert (_condition(api.get(POD), waiting) or {}).get("status") == "False"
    api.delete(POD, grace_period_s=0)


def test_the_node_plugin_records_events_about_its_own_node_only_and_patches_no_node(
        gateway: Gateway) -> None:
    (own, _), (other, _) = GPU_NODES
    plugin = _token(gateway, "node-plugin", own)

    def event(namespace: str, kind: str, name: str) -> JSON:
        return {"apiVersion": "v1", "kind": "Event",
                "metadata": {"name": f"{name}.e2e", "namespace": namespace},
                "involvedObject": {"apiVersion": "v1", "kind": kind, "name": name, "uid": name},
                "reason": "E2E", "message": "least privilege", "type": "Normal",
                "source": {"component": "dra-gateway-node-plugin", "host": own}}

    def events(namespace: str) -> str:
        return path_of("v1", "events", namespace=namespace)

    created = _dry_run(plugin, "POST", events("default"), event("default", "Node", own),
                       "application/json")
    assert created["involvedObject"]["name"] == own
    policy = "node-plugin-events"
    _by_policy(_refused(plugin, "POST", events("default"), event("default", "Node", other),
                        "application/json"), policy, f"on node '{own}'",
               f"not about Node {other}")
    _by_policy(_refused(plugin, "POST", events("default"), event("default", "Pod", own),
                        "application/json"), policy, "not about Pod")
    for namespace in ("kube-system", NAMESPACE):
        _by_rbac(_refused(plugin, "POST", events(namespace), event(namespace, "Node", own),
                          "application/json"))
    for node in (own, other):  # its Node's status only (node-plugin-status), never the Node
        _by_rbac(_refused(plugin, "PATCH", path_of("v1", "nodes", name=node),
                          {"metadata": {"labels": {"e2e": "x"}}}))


def test_the_webhook_touches_only_its_own_configurations_and_no_pod(gateway: Gateway) -> None:
    webhook = _token(gateway, "webhook")
    for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
        with pytest.raises(ApiError) as refused:
            webhook.get(path_of("admissionregistration.k8s.io/v1", plural, name="other"))
        assert refused.value.code == 403, refused.value
        _by_rbac(_refused(webhook, "PATCH", path_of("admissionregistration.k8s.io/v1", plural,
                                                    name=RELEASE),
                          {"metadata": {"labels": {"e2e": "x"}}}))
    _by_rbac(_refused(webhook, "POST", path_of("v1", "pods", namespace="kube-system"),
                      {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
                       "spec": {"containers": [{"name": "c", "image": "i"}]}},
                      "application/json"))

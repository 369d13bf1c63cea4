"""The chart's admission policies and the allocator's failover, on real control planes.

Runs after test_real_cluster.py on the same installation (one per conftest.SETUPS entry):

- An ordinary tenant (a ServiceAccount with a Role on pods and claims of its namespace; its
  token from the TokenRequest API) cannot remove the scheduling gate dra-gateway.io/allocation
  nor write status.allocation of a claim of a gateway class: the chart's
  ValidatingAdmissionPolicies refuse both with their messages. The allocator's ServiceAccount
  token may (dry-run requests, which go through admission without changing anything).
- The node plugin of one node (its token bound to a pod there, so the API server names the node
  in the user's extra `authentication.kubernetes.io/node-name`) may create, update and delete
  its own node's ResourceSlices and patch its own Node's status, not another node's; a token
  bound to no pod names no node and may write neither; its feature probe (a dry-run slice of
  its own node) passes the policy. The webhook may change caBundle and
  matchConditions of its two configurations, not clientConfig's URL or Service, rules,
  failurePolicy nor namespaceSelector. Each refusal carries its policy's message (dry run).
- The allocator down, then back: pods created meanwhile stay gated, with one Warning Event
  AllocatorUnavailable each from the webhook (two webhook replicas post it, the API keeps one),
  then are placed.
- Two allocators (the chart's ServiceAccount, different identities): one leads; the leader
  killed, the other takes over within the Lease's time and places new pods, no card over its
  capacity (on the newest setup only: waiting out the Lease takes ~20 s).
"""

from __future__ import annotations

import contextlib
import copy
import signal
import ssl
import time
import urllib.request
from collections.abc import Mapping
from typing import Any

import jsonpatch
import pytest

from dra_gateway.devkit.realcluster import Api, free_port, path_of
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError
from e2e.conftest import SETUPS
from e2e.support import (
    GATED_EVENT_AFTER_S,
    GPU_NODES,
    NAMESPACE,
    RELEASE,
    Component,
    Gateway,
    cards,
    over_capacity,
    pod_claims,
    pods,
    wait_until,
)

JSON = dict[str, Any]
GATE = "dra-gateway.io/allocation"
TENANT_NAMESPACE = "tenant"
FAILOVER_NAMESPACE = "failover"
# Leader election (kube/runtime/leader.py): a standby takes over lease_duration after the record
# last changed, retrying every retry_period.
LEASE_DURATION_S = 15.0
RETRY_PERIOD_S = 2.0
PLACE_S = 60.0
LEASE = path_of("coordination.k8s.io/v1", "leases", namespace=NAMESPACE,
                name="dra-gateway-allocator")


def _gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def _bound(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def _share_pod(name: str, namespace: str, gpus: int = 1) -> JSON:
    limits = {"nvidia.com/gpu": str(gpus)}
    if gpus == 1:
        limits |= {"nvidia.com/gpumem": "1000", "nvidia.com/gpucores": "5"}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"containers": [{"name": "main", "image": "example.com/cuda:1",
                                     "resources": {"limits": limits}}]}}


def _namespace(api: Api, name: str) -> None:
    with contextlib.suppress(ApiError):
        api.create(path_of("v1", "namespaces"), {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": name}})


def _dry_run_patch(api: Api, path: str, patch: Mapping[str, Any]) -> JSON:
    return api.request("PATCH", path, dict(patch), query={"dryRun": "All"},
                       content_type="application/merge-patch+json")


def _refusal(api: Api, path: str, patch: Mapping[str, Any]) -> ApiError:
    with pytest.raises(ApiError) as refused:
        _dry_run_patch(api, path, patch)
    return refused.value


# a. The admission policies ----------------------------------------------------------------------

def _tenant_api(gateway: Gateway) -> Api:
    """A token of ServiceAccount tenant/tenant, which may read and update pods and claims
    (their status too) of its namespace, as a namespace's users commonly may."""
    api = gateway.api
    _namespace(api, TENANT_NAMESPACE)
    rbac = "rbac.authorization.k8s.io/v1"
    for plural, body in (
        ("serviceaccounts", {"apiVersion": "v1", "kind": "ServiceAccount",
                             "metadata": {"name": "tenant"}}),
        ("roles", {"apiVersion": rbac, "kind": "Role", "metadata": {"name": "tenant"},
                   "rules": [
                       {"apiGroups": [""], "resources": ["pods"],
                        "verbs": ["get", "list", "update", "patch"]},
                       {"apiGroups": ["resource.k8s.io"],
                        "resources": ["resourceclaims", "resourceclaims/status"],
                        "verbs": ["get", "list", "update", "patch"]}]}),
        ("rolebindings", {"apiVersion": rbac, "kind": "RoleBinding",
                          "metadata": {"name": "tenant"},
                          "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": "tenant"},
                          "subjects": [{"kind": "ServiceAccount", "name": "tenant",
                                        "namespace": TENANT_NAMESPACE}]}),
    ):
        api_version = "v1" if plural == "serviceaccounts" else rbac
        with contextlib.suppress(ApiError):
            api.create(path_of(api_version, plural, namespace=TENANT_NAMESPACE), body)
    token = gateway.plane.service_account_token(TENANT_NAMESPACE, "tenant", expiration_s=3600)
    return gateway.plane.api(token)


def _grant_binding(api: Api) -> None:
    """Let the tenant write claims' allocations as far as RBAC goes (resourceclaims/binding,
    cluster-wide as the API server checks it)."""
    rbac = "rbac.authorization.k8s.io/v1"
    with contextlib.suppress(ApiError):
        api.create(path_of(rbac, "clusterroles"), {
            "apiVersion": rbac, "kind": "ClusterRole", "metadata": {"name": "e2e-tenant-binding"},
            "rules": [{"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/binding"],
                       "verbs": ["update", "patch"]}]})
    with contextlib.suppress(ApiError):
        api.create(path_of(rbac, "clusterrolebindings"), {
            "apiVersion": rbac, "kind": "ClusterRoleBinding",
            "metadata": {"name": "e2e-tenant-binding"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                        "name": "e2e-tenant-binding"},
            "subjects": [{"kind": "ServiceAccount", "name": "tenant",
                          "namespace": TENANT_NAMESPACE}]})


def _allocator_api(gateway: Gateway) -> Api:
    """A token of the chart's allocator ServiceAccount, as the running allocator holds."""
    account = gateway.service_accounts["allocator"]
    return gateway.plane.api(gateway.plane.service_account_token(NAMESPACE, account,
                                                                 expiration_s=3600))


def test_a_tenant_cannot_remove_the_gate_or_write_an_allocation_the_allocator_can(
        gateway: Gateway) -> None:
    api = gateway.api
    tenant = _tenant_api(gateway)
    allocator = _allocator_api(gateway)
    # More whole GPUs than any node has: the allocator leaves the pod gated.
    api.create(path_of("v1", "pods", namespace=TENANT_NAMESPACE),
               _share_pod("too-big", TENANT_NAMESPACE, gpus=16))
    pod_path = path_of("v1", "pods", namespace=TENANT_NAMESPACE, name="too-big")

    def claimed() -> bool:
        pod = api.get(pod_path)
        return _gated(pod) and bool(pod_claims(api, pod))

    wait_until("the gated pod's claim", claimed, 30, gateway.check)
    pod = api.get(pod_path)
    assert _gated(pod)
    assert not _bound(pod)
    [claim] = pod_claims(api, pod)
    assert not (claim.get("status") or {}).get("allocation")
    claim_path = path_of("resource.k8s.io/v1", "resourceclaims", namespace=TENANT_NAMESPACE,
                         name=claim["metadata"]["name"])
    # The tenant may read and update pods (RBAC allows it) ...
    tenant.get(pod_path)
    _dry_run_patch(tenant, pod_path, {"metadata": {"labels": {"team": "a"}}})
    # ... but removing the gate is refused by the policy, with its message.
    ungate = {"spec": {"schedulingGates": [g for g in pod["spec"]["schedulingGates"]
                                           if g.get("name") != GATE]}}
    refused = _refusal(tenant, pod_path, ungate)
    assert refused.code == 403, refused
    assert "only the dra-gateway allocator removes the scheduling gate" in refused.message, \
        refused.message
    assert "system:serviceaccount:tenant:tenant may not" in refused.message, refused.message
    assert "allocation-gate" in refused.message, refused.message
    assert _gated(api.get(pod_path))

    # An allocation the API server would accept (a published device on a node), written as
    # status by the tenant: refused by the policy.
    request = claim["spec"]["devices"]["requests"][0]["name"]
    card = sorted((c for c in cards(api).values() if c.kind == "gpu"),
                  key=lambda c: (c.node, c.device))[0]
    allocation = {"devices": {"results": [
        {"request": request, "driver": names.DRIVER, "pool": card.pool,
         "device": card.device}]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [card.node]}]}]}}
    status_path = claim_path + "/status"
    refused = _refusal(tenant, status_path, {"status": {"allocation": allocation}})
    if refused.code == 422 and "resourceclaims/binding" in refused.message:
        # From 1.36 the API server itself asks for resourceclaims/binding to write an
        # allocation (DRAResourceClaimGranularStatusAuthorization). Grant the tenant that too:
        # the policy must still refuse.
        assert int(gateway.version.split(".")[1]) >= 36, refused.message
        _grant_binding(api)

        def policy_refuses() -> bool:
            nonlocal refused
            refused = _refusal(tenant, status_path, {"status": {"allocation": allocation}})
            return refused.code == 403

        wait_until("the policy to refuse the tenant's allocation", policy_refuses, 15,
                   gateway.check)
    assert refused.code == 403, refused
    assert "only the dra-gateway allocator writes the allocation" in refused.message, \
        refused.message
    assert "claim-allocation" in refused.message, refused.message
    assert not (api.get(claim_path).get("status") or {}).get("allocation")

    # The allocator's own token passes both policies (dry run: nothing changes), writing the
    # allocation as allocator/writes.py does: a status update, the one verb its role grants.
    current = api.get(claim_path)
    current["status"] = {**(current.get("status") or {}), "allocation": allocation}
    written = allocator.request("PUT", status_path, current, query={"dryRun": "All"})
    assert written["status"]["allocation"]["devices"]["results"][0]["device"] == card.device
    ungated = _dry_run_patch(allocator, pod_path, ungate)
    assert not _gated(ungated)
    assert _gated(api.get(pod_path))
    assert not (api.get(claim_path).get("status") or {}).get("allocation")
    api.delete(pod_path, grace_period_s=0)


# a2. Each node plugin writes only its own node's slices and status ------------------------------

SLICES = path_of("resource.k8s.io/v1", "resourceslices")
SLICES_POLICY = "node-plugin-slices"
STATUS_POLICY = "node-plugin-status"


def _node_plugin_api(gateway: Gateway, node: str | None) -> Api:
    """A token of the chart's node-plugin ServiceAccount, bound to the stand-in pod on `node`
    (support.py made one per GPU node) as the DaemonSet's pod there holds it; None: a token of
    the same account bound to no pod, so the API server names no node."""
    account = gateway.service_accounts["node-plugin"]
    bound = None
    if node is not None:
        bound = gateway.api.get(path_of("v1", "pods", namespace=NAMESPACE,
                                        name=f"{account}-{node}"))
        assert bound["spec"]["nodeName"] == node
    return gateway.plane.api(gateway.plane.service_account_token(
        NAMESPACE, account, expiration_s=3600, bound_pod=bound))


def _published_slice(api: Api, node: str) -> JSON:
    found = api.list(SLICES, fieldSelector=f"spec.nodeName={node},spec.driver={names.DRIVER}")
    assert found, f"no ResourceSlice of {names.DRIVER} on {node}"
    return found[0]


def _new_slice(node: str) -> JSON:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"e2e-policy-{node}"},
            "spec": {"driver": names.DRIVER, "nodeName": node,
                     "pool": {"name": f"e2e-policy-{node}", "generation": 0,
                              "resourceSliceCount": 1},
                     "devices": [{"name": "gpu-0"}]}}


def _dry_run(api: Api, method: str, path: str, body: Any = None,
             content_type: str = "application/merge-patch+json") -> JSON:
    return api.request(method, path, body, query={"dryRun": "All"}, content_type=content_type)


def _refused(api: Api, method: str, path: str, body: Any = None,
             content_type: str = "application/merge-patch+json") -> ApiError:
    with pytest.raises(ApiError) as refused:
        _dry_run(api, method, path, body, content_type)
    return refused.value


def _by_policy(refused: ApiError, policy: str, *words: str) -> None:
    """`refused` is the chart's policy `policy` denying, with `words` in its message."""
    assert refused.code == 403, refused
    assert f"ValidatingAdmissionPolicy '{RELEASE}-{policy}'" in refused.message, refused.message
    for word in words:
        assert word in refused.message, refused.message


def _labelled(published: JSON) -> JSON:
    """The slice as published, with one label more: an update."""
    updated = copy.deepcopy(published)
    updated["metadata"]["labels"] = {**(updated["metadata"].get("labels") or {}), "e2e": "policy"}
    return updated


def test_each_node_plugin_writes_only_its_own_nodes_slices(gateway: Gateway) -> None:
    api = gateway.api
    (own, _), (other, _) = GPU_NODES
    plugin = _node_plugin_api(gateway, own)
    for node in (own, other):  # RBAC lets the node plugin write every node's slices ...
        assert plugin.list(SLICES, fieldSelector=f"spec.nodeName={node}")
    theirs = _published_slice(api, other)
    mine = _published_slice(api, own)
    theirs_path = path_of("resource.k8s.io/v1", "resourceslices", name=theirs["metadata"]["name"])
    mine_path = path_of("resource.k8s.io/v1", "resourceslices", name=mine["metadata"]["name"])
    denied = f"the dra-gateway node plugin on node {own} may not write ResourceSlices of " \
             f"node '{other}'"

    # ... the policy only its own node's: create, update and delete of the other node's refused.
    _by_policy(_refused(plugin, "POST", SLICES, _new_slice(other), "application/json"),
               SLICES_POLICY, denied)
    # Updates as node-plugin/publish.py sends them (PUT: the role grants no patch).
    _by_policy(_refused(plugin, "PUT", theirs_path, _labelled(theirs), "application/json"),
               SLICES_POLICY, denied)
    _by_policy(_refused(plugin, "DELETE", theirs_path), SLICES_POLICY, denied)
    # Moving the other node's slice to its own node is refused too (spec.nodeName is immutable).
    moved_slice = _labelled(theirs)
    moved_slice["spec"]["nodeName"] = own
    moved = _refused(plugin, "PUT", theirs_path, moved_slice, "application/json")
    assert moved.code in (403, 422), moved
    print(f"a node plugin moving another node's slice to its own: {moved.code} "
          f"{moved.message}")
    # A slice of no node (all nodes, or a node selector) is no node plugin's to write.
    everywhere = _new_slice(own)
    everywhere["spec"] = {**everywhere["spec"], "allNodes": True}
    del everywhere["spec"]["nodeName"]
    _by_policy(_refused(plugin, "POST", SLICES, everywhere, "application/json"), SLICES_POLICY,
               "may not write ResourceSlices of node ''")

    # Its own node's: allowed (dry run: nothing changes).
    created = _dry_run(plugin, "POST", SLICES, _new_slice(own), "application/json")
    assert created["spec"]["nodeName"] == own
    assert _dry_run(plugin, "PUT", mine_path, _labelled(mine), "application/json")[
        "metadata"]["labels"]["e2e"] == "policy"
    _dry_run(plugin, "DELETE", mine_path)

    # A token of the same account bound to no pod names no node: refused, even for a slice
    # of the node it claims to be on.
    unbound = _node_plugin_api(gateway, None)
    _by_policy(_refused(unbound, "POST", SLICES, _new_slice(own), "application/json"),
               SLICES_POLICY, "the dra-gateway node plugin's token names no node")
    _by_policy(_refused(unbound, "DELETE", mine_path), SLICES_POLICY, "names no node")

    # Nothing changed.
    assert _published_slice(api, other)["metadata"]["resourceVersion"] == \
        theirs["metadata"]["resourceVersion"]
    assert api.get(mine_path)["metadata"].get("labels", {}).get("e2e") is None
    assert not api.list(SLICES, fieldSelector="metadata.name=e2e-policy-" + own)


def test_each_node_plugin_learns_the_feature_gate_by_a_probe_the_policy_lets_through(
        gateway: Gateway) -> None:
    # The node plugin's dry-run probe slice names its own node: a probe of all nodes would be
    # refused by the policy above, leaving the plugin to guess until its slices were read back.
    for node, _ in GPU_NODES:
        log = gateway.components[f"node-plugin-{node}"].log.read_text(errors="replace")
        verdicts = [line for line in log.splitlines() if "consumable capacity o" in line]
        assert verdicts, f"node-plugin-{node} logged no consumable-capacity verdict"
        assert "dry-run probe slice" in verdicts[0], verdicts[0]


def test_each_node_plugin_patches_only_its_own_nodes_status(gateway: Gateway) -> None:
    (own, _), (other, _) = GPU_NODES
    plugin = _node_plugin_api(gateway, own)
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    # What the node plugin sends (node-plugin/health.py): a strategic patch of one condition.
    condition = {"status": {"conditions": [{
        "type": "GpuDevicesUnhealthy", "status": "True", "reason": "E2ePolicy",
        "message": "a dry run", "lastHeartbeatTime": now, "lastTransitionTime": now}]}}
    strategic = "application/strategic-merge-patch+json"

    def status(node: str) -> str:
        return path_of("v1", "nodes", name=node, subresource="status")

    _by_policy(_refused(plugin, "PATCH", status(other), condition, strategic), STATUS_POLICY,
               f"the dra-gateway node plugin on node '{own}' may not write the status of node "
               f"{other}")
    patched = _dry_run(plugin, "PATCH", status(own), condition, strategic)
    assert any(c["reason"] == "E2ePolicy" for c in patched["status"]["conditions"])
    _by_policy(_refused(_node_plugin_api(gateway, None), "PATCH", status(own), condition,
                        strategic), STATUS_POLICY, "may not write the status of node")
    for node in (own, other):
        conditions = gateway.api.get(path_of("v1", "nodes", name=node))["status"]["conditions"]
        assert not any(c.get("reason") == "E2ePolicy" for c in conditions)


# a3. The webhook changes only caBundle and matchConditions of its configurations --------------

WEBHOOK_POLICY = "webhook-configurations"
CONFIGURATIONS = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")


def test_the_webhook_changes_only_ca_bundle_and_match_conditions_of_its_configurations(
        gateway: Gateway) -> None:
    import base64

    api = gateway.api
    webhook = gateway.plane.api(gateway.plane.service_account_token(
        NAMESPACE, gateway.service_accounts["webhook"], expiration_s=3600))
    json_patch = "application/json-patch+json"
    for plural in CONFIGURATIONS:
        path = path_of("admissionregistration.k8s.io/v1", plural, name=RELEASE)
        stored = api.get(path)
        first = stored["webhooks"][0]
        # A rotated CA (both certificates in the bundle) and narrowed conditions: what the
        # webhook's reconcile writes.
        ca = base64.b64decode(first["clientConfig"]["caBundle"])
        rotated = base64.b64encode(ca + ca).decode()
        conditions = [{"name": "gpu-pods", "expression": "object.spec.containers.size() > 0"}]
        # Sent as webhook/config.py sends it: an update (PUT), the one write its role grants.
        written = _dry_run(webhook, "PUT", path, jsonpatch.apply_patch(stored, [
            {"op": "replace", "path": "/webhooks/0/clientConfig/caBundle", "value": rotated},
            {"op": "replace", "path": "/webhooks/0/matchConditions", "value": conditions}]),
            "application/json")
        assert written["webhooks"][0]["clientConfig"]["caBundle"] == rotated, plural
        assert written["webhooks"][0]["matchConditions"] == conditions, plural

        rules = [dict(rule) for rule in first["rules"]]
        rules[0] = {**rules[0], "operations": sorted({*rules[0]["operations"], "UPDATE"})}
        changes: dict[str, list[JSON]] = {
            "clientConfig.url": [{"op": "replace", "path": "/webhooks/0/clientConfig/url",
                                  "value": "https://attacker.example:8443/validate"}],
            "clientConfig.service": [
                {"op": "remove", "path": "/webhooks/0/clientConfig/url"},
                {"op": "add", "path": "/webhooks/0/clientConfig/service",
                 "value": {"namespace": "attacker", "name": "attacker", "port": 443}}],
            "rules": [{"op": "replace", "path": "/webhooks/0/rules", "value": rules}],
            "failurePolicy": [{"op": "replace", "path": "/webhooks/0/failurePolicy",
                               "value": "Ignore" if first["failurePolicy"] == "Fail"
                               else "Fail"}],
            "namespaceSelector": [{"op": "replace", "path": "/webhooks/0/namespaceSelector",
                                   "value": {}}],
        }
        assert "url" in first["clientConfig"]  # the e2e install points them at a URL
        for what, patch in changes.items():
            refused = _refused(webhook, "PUT", path, jsonpatch.apply_patch(stored, patch),
                               "application/json")
            _by_policy(refused, WEBHOOK_POLICY, "the dra-gateway webhook may change only "
                       "clientConfig.caBundle and matchConditions")
            # The policy binds the webhook only: an administrator may (dry run).
            _dry_run(api, "PATCH", path, patch, json_patch)
            print(f"{plural}: the webhook may not change {what}")
        assert api.get(path)["metadata"]["resourceVersion"] == \
            stored["metadata"]["resourceVersion"]


# b. The allocator down, then back ---------------------------------------------------------------

def _free_room(gateway: Gateway) -> None:
    """Delete the earlier tests' burst pods and wait until their claims are released, so the
    pods below have cards to go to."""
    api = gateway.api
    for pod in pods(api, "burst"):
        with contextlib.suppress(ApiError):
            api.delete(path_of("v1", "pods", namespace="burst", name=pod["metadata"]["name"]),
                       grace_period_s=0)

    def released() -> bool:
        return not pods(api, "burst") and not any(
            (c.get("status") or {}).get("allocation")
            for c in api.list(path_of("resource.k8s.io/v1", "resourceclaims",
                                      namespace="burst")))

    wait_until("the burst pods to be gone and their claims released", released, PLACE_S,
               gateway.check)


def _holder(api: Api) -> str:
    return str((api.get(LEASE).get("spec") or {}).get("holderIdentity") or "")


def _create_and_place(gateway: Gateway, prefix: str, count: int) -> float:
    """Create `count` small share pods and wait until all are bound; seconds it took."""
    api = gateway.api
    started = time.monotonic()
    for index in range(count):
        api.create(path_of("v1", "pods", namespace=FAILOVER_NAMESPACE),
                   _share_pod(f"{prefix}-{index}", FAILOVER_NAMESPACE))
    wanted = {f"{prefix}-{index}" for index in range(count)}

    def placed() -> bool:
        current = {p["metadata"]["name"]: p for p in pods(api, FAILOVER_NAMESPACE)}
        return all(name in current and _bound(current[name]) for name in wanted)

    wait_until(f"pods {prefix}-* to be placed", placed, PLACE_S, gateway.check)
    return time.monotonic() - started


def _unavailable_events(api: Api) -> list[JSON]:
    """The webhook's AllocatorUnavailable Events, in every namespace."""
    return [e for e in api.list(path_of("v1", "events"))
            if e.get("reason") == "AllocatorUnavailable"]


def _start_second_webhook(gateway: Gateway) -> Component:
    """Another webhook replica, as the chart runs two (same ServiceAccount, another port),
    started and ready."""
    first = gateway.components["webhook"]
    args = list(first.args)
    port = free_port()
    args[args.index("--listen") + 1] = f"127.0.0.1:{port}"
    second = Component("webhook-b", args, first.log.with_name("webhook-b.log"))
    gateway.components[second.name] = second
    second.start()
    context = ssl.create_default_context(cafile=str(gateway.work / "webhook-tls" / "ca.crt"))

    def ready() -> bool:
        try:
            with urllib.request.urlopen(f"https://localhost:{port}/readyz", context=context,
                                        timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    wait_until("a second webhook to be ready", ready, 60, gateway.check)
    return second


def test_pods_created_while_the_allocator_is_down_wait_gated_then_are_placed(
        gateway: Gateway) -> None:
    api = gateway.api
    _free_room(gateway)
    _namespace(api, FAILOVER_NAMESPACE)
    allocator = gateway.components["allocator"]
    last_holder = _holder(api)
    assert last_holder
    before = {e["metadata"]["uid"] for e in _unavailable_events(api)}
    # Started while the allocator leads: like the first, it sees the holder before the release.
    second = _start_second_webhook(gateway)
    time.sleep(1)
    allocator.stop()  # graceful: it releases the Lease
    try:
        for index in range(3):
            api.create(path_of("v1", "pods", namespace=FAILOVER_NAMESPACE),
                       _share_pod(f"while-down-{index}", FAILOVER_NAMESPACE))
        time.sleep(3)
        waiting = pods(api, FAILOVER_NAMESPACE)
        assert len(waiting) == 3
        assert all(_gated(p) and not _bound(p) for p in waiting), waiting
        assert not any((c.get("status") or {}).get("allocation")
                       for p in waiting for c in pod_claims(api, p))
        uids = {p["metadata"]["uid"]: p["metadata"]["name"] for p in waiting}

        # The webhooks tell each waiting pod why, once the Lease has been vacant and the pod
        # gated for --gated-event-after; each replica posts the same Event, the API keeps one.
        def told() -> list[JSON]:
            return [e for e in _unavailable_events(api)
                    if e["metadata"]["uid"] not in before
                    and e["involvedObject"].get("uid") in uids]

        wait_until("an AllocatorUnavailable Event on each pod gated while the allocator is down",
                   lambda: {e["involvedObject"]["uid"] for e in told()} == set(uids),
                   GATED_EVENT_AFTER_S + 20, gateway.check)
        time.sleep(GATED_EVENT_AFTER_S)  # more rounds of both replicas
        events = told()
        assert sorted(e["involvedObject"]["name"] for e in events) == sorted(uids.values()), \
            events
        for event in events:
            assert event["type"] == "Warning", event
            assert event["count"] == 1, event
            assert event["metadata"]["namespace"] == FAILOVER_NAMESPACE, event
            message = event["message"]
            assert f"the Lease {NAMESPACE}/dra-gateway-allocator has had no holder" in message, \
                message
            assert f"its last holder was {last_holder}" in message, message
            assert f"allocator Deployment in namespace {NAMESPACE}" in message, message
        assert gateway.grep("posted AllocatorUnavailable"), "no webhook said it posted one"
        for webhook in ("webhook", "webhook-b"):  # each posted every Event, or found it
            log = gateway.components[webhook].log.read_text(errors="replace").splitlines()
            assert any("no allocator leads" in line for line in log), webhook
            said = [line for line in log if "posted AllocatorUnavailable" in line
                    or "AllocatorUnavailable already posted" in line]
            done = {name for name in uids.values()
                    if any(f'"{FAILOVER_NAMESPACE}/{name}"' in line for line in said)}
            assert done == set(uids.values()), (webhook, done)
        # Only gated pods are told.
        for event in _unavailable_events(api):
            if event["metadata"]["uid"] in before:
                continue
            involved = event["involvedObject"]
            with contextlib.suppress(ApiError):
                pod = api.get(path_of("v1", "pods", namespace=involved["namespace"],
                                      name=involved["name"]))
                assert _gated(pod), pod
    finally:
        second.stop()
        gateway.components.pop(second.name, None)
        allocator.start()

    def placed() -> bool:
        current = pods(api, FAILOVER_NAMESPACE)
        return len(current) == 3 and all(_bound(p) and not _gated(p) for p in current)

    wait_until("the pods created while the allocator was down to be placed", placed, PLACE_S,
               gateway.check)
    assert over_capacity(api) == []


# c. Two allocators, the leader killed -----------------------------------------------------------

def test_a_standby_allocator_takes_over_when_the_leader_is_killed(gateway: Gateway) -> None:
    # Leader election does not depend on the release and waiting out the Lease takes ~20 s:
    # checked on the newest setup only, to keep the tier short.
    if (gateway.version, dict(gateway.feature_gates)) != SETUPS[-1][1:]:
        pytest.skip(f"failover is checked on the newest setup ({SETUPS[-1][0]}) only")
    api = gateway.api
    _namespace(api, FAILOVER_NAMESPACE)
    first = gateway.components["allocator"]
    first_args = list(first.args)
    if "--identity" not in first_args:  # name the first one too, to tell them apart
        first.stop()
        first.args = [*first_args, "--identity", "e2e-allocator-a"]
        first.start()
    standby = Component("allocator-b", [*first_args, "--identity", "e2e-allocator-b"],
                        first.log.with_name("allocator-b.log"))
    gateway.components[standby.name] = standby
    standby.start()
    replicas = {"e2e-allocator-a": first, "e2e-allocator-b": standby}
    try:
        wait_until("one of the two allocators to lead", lambda: _holder(api) in replicas,
                   LEASE_DURATION_S + 2 * RETRY_PERIOD_S + 5, gateway.check)
        leader_id = _holder(api)
        [follower_id] = set(replicas) - {leader_id}
        took = _create_and_place(gateway, "before-kill", 2)
        print(f"failover: {leader_id} leads and placed 2 pods in {took:.1f}s")
        assert _holder(api) == leader_id

        leader = replicas[leader_id]
        assert leader.process is not None
        leader.process.send_signal(signal.SIGKILL)  # no graceful release of the Lease
        leader.process.wait()
        leader.process = None
        killed = time.monotonic()
        wait_until(f"{follower_id} to take the Lease over", lambda: _holder(api) == follower_id,
                   LEASE_DURATION_S + 2 * RETRY_PERIOD_S + 3, gateway.check)
        took_over = time.monotonic() - killed
        took = _create_and_place(gateway, "after-kill", 3)
        print(f"failover: {follower_id} took over {took_over:.1f}s after the kill and placed "
              f"3 pods in {took:.1f}s")
        assert took_over <= LEASE_DURATION_S + 2 * RETRY_PERIOD_S + 3
        assert over_capacity(api) == []
        for pod in pods(api, FAILOVER_NAMESPACE):
            for claim in pod_claims(api, pod):
                assert (claim.get("status") or {}).get("allocation"), claim["metadata"]["name"]
    finally:
        # Back to one allocator for whatever runs next: the first restarted, the other stopped
        # gracefully (it releases the Lease, so the first takes over at once).
        first.stop()
        first.args = first_args
        first.start()
        standby.stop()
        del gateway.components[standby.name]
        wait_until("the allocator to lead again", lambda: bool(_holder(api)),
                   LEASE_DURATION_S + 2 * RETRY_PERIOD_S + 5, gateway.check)

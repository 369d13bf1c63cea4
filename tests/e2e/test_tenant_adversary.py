"""A tenant adversary on real control planes: every write a tenant's role allows, against every
key the gateway reads, and the gateway's promises still hold after each.

Nothing here is written write by write. The writes are generated from two lists:

- what the tenant may do, as the API server answers a SelfSubjectRulesReview made with the
  tenant's own token: a ServiceAccount bound to the built-in `edit` ClusterRole in its
  namespace, and a second one that may only create pods;
- every key the gateway reads, found in the gateway's own modules (`gateway_keys`): each
  module-level constant of the form `dra-gateway.io/<key>`. A key added to any module joins
  the list by construction.

The `edit` tenant writes each key as a label and as an annotation, with each of a set of
hostile values (a forged share record, the words the gateway's keys take, an empty value, a
device list, a time far in the future), on each of the gateway's objects in its namespace its
role lets it patch (its pods, their ResourceClaims, the ResourceClaimTemplates the webhook made),
adds and removes each key as a finalizer, writes a status where its role reaches a status
subresource, and creates a ConfigMap labelled as the gateway's translation rules. The
create-only tenant creates a pod asking for a whole GPU with each key and value on it.

The scene, on each setup: the tenant's GPUQuota of 100Gi holds one whole card (80Gi) and one
share; a second whole card waits, gated, past the quota. A bystander namespace holds a placed
pod. After every group of writes (one object, one key) the invariants are checked; after each
kind of object and at the end, once the allocator had time to act, again:

- the quota's `status.used` is never below the truth (what the allocations hold, read as the
  gateway should: consumedCapacity, the allocation's own record, else the whole card), and the
  truth never above the quota's `hard`; the waiting pod is still waiting;
- no device is held past its capacity, and every bound pod's claims exist and are allocated;
- nothing of the bystander namespace or of the gateway's namespace changed, and a pod of the
  bystander namespace created at the end translates exactly as one created at the start.

Run on 1.34.4 (no consumable capacity: shares live in the allocation's record) and the newest
setup; the figures (writes tried and admitted, invariants checked) are printed at the end (`-s`).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import pkgutil
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

import dra_gateway
from dra_gateway.devkit.realcluster import Api, path_of
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError
from dra_gateway.kube.quantity import parse_quantity
from e2e.conftest import SETUPS
from e2e.support import (
    NAMESPACE,
    Gateway,
    cards,
    holdings,
    over_capacity,
    pod_claims,
    pods,
    wait_until,
)

JSON = dict[str, Any]
RESOURCE = "resource.k8s.io/v1"
GROUP = "dra-gateway.io/v1alpha1"
TENANT_NS = "adversary"
BYSTANDER_NS = "adversary-bystander"
QUOTA = "adversary-gpu"
PLACE_S = 60.0
# Time the allocator is given to act on a group of writes (its rounds, and the quota status
# are written within a few seconds).
SETTLE_S = 3.0
GI = 1 << 30
# Run where the tenant's writes matter most: 1.34.4 with its defaults (shares recorded in the
# allocation, the API keeping no consumedCapacity) and the newest release.
ADVERSARY_SETUPS = {SETUPS[0][0], SETUPS[-1][0]}


def _constants(pattern: str) -> set[str]:
    """Every module-level string constant of the gateway's modules (the development kit aside)
    that `pattern` matches whole."""
    compiled = re.compile(pattern)
    found: set[str] = set()
    for info in pkgutil.walk_packages(dra_gateway.__path__, "dra_gateway."):
        if ".devkit" in info.name or info.name.endswith("__main__"):
            continue
        module = importlib.import_module(info.name)
        found.update(v for v in vars(module).values()
                     if isinstance(v, str) and compiled.fullmatch(v))
    return found


def gateway_keys() -> list[str]:
    """Every label, annotation or finalizer key the gateway's modules name: each constant
    `dra-gateway.io/<lowercase key>`."""
    keys = _constants(rf"{re.escape(names.DOMAIN)}/[a-z0-9]([a-z0-9.-]*[a-z0-9])?")
    keys.discard(names.API_VERSION)  # an apiVersion, not a key
    return sorted(keys)


def condition_types() -> list[str]:
    """The pod condition types the gateway writes (and may read back): `dra-gateway.io/<Type>`."""
    return sorted(_constants(rf"{re.escape(names.DOMAIN)}/[A-Z][A-Za-z]+"))


def hostile_values(key: str, target: Mapping[str, Any] | None = None) -> list[str]:
    """Values a tenant might write under `key` of `target`: a share record forged to shrink
    what each device of the target's allocation holds to one byte (a card of the scene when
    it has none), the words the gateway's keys take, an empty value, a device list, and a
    clear of every fault until far in the future."""
    results = ((((target or {}).get("status") or {}).get("allocation") or {}).get(
        "devices") or {}).get("results") or [{"request": "gpu", "driver": names.DRIVER,
                                               "pool": "gpu-h100-1", "device": "gpu-0"}]
    forged = json.dumps([{"request": r.get("request"), "driver": r.get("driver"),
                          "pool": r.get("pool"), "device": r.get("device"),
                          "consumedCapacity": {"memory": "1", "cores": "0"}}
                         for r in results])
    return [forged, "true", "never", "allow", names.TRANSLATION_DISABLED, "", "1",
            "gpu-0,gpu-1", "gpu-0=2999-01-01T00:00:00Z", "x" * 70]


@dataclass
class Tally:
    tried: int = 0
    admitted: int = 0
    checks: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    def line(self) -> str:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(self.by_kind.items()))
        return (f"tenant adversary: {self.tried} writes tried ({kinds}), {self.admitted} "
                f"admitted, {self.checks} invariant checks")


# The tenants -------------------------------------------------------------------------------------

def _create(api: Api, path: str, body: Mapping[str, Any]) -> None:
    with contextlib.suppress(ApiError):
        api.create(path, body)


def _tenant(gateway: Gateway, name: str, role: JSON) -> Api:
    """A ServiceAccount `name` of the tenant's namespace bound to `role` there, and its token."""
    api = gateway.api
    rbac = "rbac.authorization.k8s.io/v1"
    _create(api, path_of("v1", "serviceaccounts", namespace=TENANT_NS),
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name}})
    _create(api, path_of(rbac, "rolebindings", namespace=TENANT_NS), {
        "apiVersion": rbac, "kind": "RoleBinding", "metadata": {"name": name}, "roleRef": role,
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": TENANT_NS}]})
    token = gateway.plane.service_account_token(TENANT_NS, name, expiration_s=3600)
    return gateway.plane.api(token)


def _editor(gateway: Gateway) -> Api:
    return _tenant(gateway, "editor", {"apiGroup": "rbac.authorization.k8s.io",
                                       "kind": "ClusterRole", "name": "edit"})


def _pod_creator(gateway: Gateway) -> Api:
    rbac = "rbac.authorization.k8s.io/v1"
    _create(gateway.api, path_of(rbac, "roles", namespace=TENANT_NS), {
        "apiVersion": rbac, "kind": "Role", "metadata": {"name": "pod-creator"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]}]})
    return _tenant(gateway, "pod-creator", {"apiGroup": "rbac.authorization.k8s.io",
                                            "kind": "Role", "name": "pod-creator"})


def allowed(tenant: Api) -> dict[str, set[str]]:
    """resource (with its subresource, "pods/status") -> verbs, as the API server answers the
    tenant's own SelfSubjectRulesReview in its namespace."""
    review = tenant.create(path_of("authorization.k8s.io/v1", "selfsubjectrulesreviews"), {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
        "spec": {"namespace": TENANT_NS}})
    rights: dict[str, set[str]] = {}
    for rule in review["status"].get("resourceRules") or ():
        for resource in rule.get("resources") or ():
            rights.setdefault(resource, set()).update(rule.get("verbs") or ())
    return rights


def may(rights: Mapping[str, set[str]], resource: str, verb: str) -> bool:
    verbs = rights.get(resource, set()) | rights.get("*", set())
    return verb in verbs or "*" in verbs


# The scene ---------------------------------------------------------------------------------------

def _pod(name: str, namespace: str, limits: Mapping[str, str],
         metadata: Mapping[str, Any] | None = None) -> JSON:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, **(metadata or {})},
            "spec": {"containers": [{"name": "main", "image": "example.com/cuda:1",
                                     "resources": {"limits": dict(limits)}}]}}


WHOLE = {"nvidia.com/gpu": "1"}
SHARE = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "4096", "nvidia.com/gpucores": "10"}
def _on_h100(pod: JSON) -> JSON:
    """The whole cards of the scene are H100s (80Gi each): one fills 80Gi of the 100Gi."""
    pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "gpu-h100-1"}
    return pod


def _bound(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("spec") or {}).get("nodeName"))


def _gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == names.SCHEDULING_GATE
               for g in (pod.get("spec") or {}).get("schedulingGates") or ())


@contextlib.contextmanager
def _scene(gateway: Gateway) -> Iterator[Api]:
    api = gateway.api
    for namespace in (TENANT_NS, BYSTANDER_NS):
        api.create(path_of("v1", "namespaces"), {"apiVersion": "v1", "kind": "Namespace",
                                                 "metadata": {"name": namespace}})
    try:
        api.create(path_of(GROUP, "gpuquotas", namespace=TENANT_NS), {
            "apiVersion": GROUP, "kind": "GPUQuota",
            "metadata": {"name": QUOTA, "namespace": TENANT_NS},
            "spec": {"hard": {"memory": "100Gi"}}})
        api.create(path_of("v1", "pods", namespace=TENANT_NS),
                   _on_h100(_pod("whole", TENANT_NS, WHOLE)))
        api.create(path_of("v1", "pods", namespace=TENANT_NS),
                   _on_h100(_pod("share", TENANT_NS, SHARE)))
        api.create(path_of("v1", "pods", namespace=BYSTANDER_NS),
                   _pod("bystander", BYSTANDER_NS, SHARE))

        def placed() -> bool:
            current = pods(api, TENANT_NS) + pods(api, BYSTANDER_NS)
            return len(current) == 3 and all(_bound(p) for p in current)

        wait_until("the scene's pods to be placed", placed, PLACE_S, gateway.check)
        api.create(path_of("v1", "pods", namespace=TENANT_NS),
                   _on_h100(_pod("waiting", TENANT_NS, WHOLE)))

        def held() -> bool:
            pod = api.get(path_of("v1", "pods", namespace=TENANT_NS, name="waiting"))
            return any(c.get("type") == f"{names.DOMAIN}/QuotaExceeded"
                       and c.get("status") == "True"
                       for c in (pod.get("status") or {}).get("conditions") or ())

        wait_until("the second whole card to wait past the quota", held, PLACE_S,
                   gateway.check)

        def counted() -> bool:
            quota = api.get(path_of(GROUP, "gpuquotas", namespace=TENANT_NS, name=QUOTA))
            used = ((quota.get("status") or {}).get("used") or {}).get("memory")
            return _memory(used) == _truth(api) > 0

        wait_until("the quota's status.used to count the tenant's cards", counted, 30,
                   gateway.check)
        yield api
    finally:
        for namespace in (TENANT_NS, BYSTANDER_NS):
            for pod in pods(api, namespace):
                with contextlib.suppress(ApiError):
                    api.delete(path_of("v1", "pods", namespace=namespace,
                                       name=pod["metadata"]["name"]), grace_period_s=0)

        def released() -> bool:
            return not any(pods(api, ns) or any(
                (c.get("status") or {}).get("allocation")
                for c in api.list(path_of(RESOURCE, "resourceclaims", namespace=ns)))
                for ns in (TENANT_NS, BYSTANDER_NS))

        wait_until("the scene's pods to be gone and their claims released", released,
                   PLACE_S, gateway.check)
        for namespace in (TENANT_NS, BYSTANDER_NS):
            with contextlib.suppress(ApiError):
                api.delete(path_of("v1", "namespaces", name=namespace))


# The invariants ----------------------------------------------------------------------------------

def _memory(text: Any) -> int:
    return parse_quantity(str(text or "0")).value()


def _truth(api: Api) -> int:
    """The memory the tenant's allocations hold, read as the gateway should, and a whole
    80Gi card for any pod of its that runs on a legacy request left untranslated."""
    published = cards(api)
    held = sum(h.memory for claim in api.list(path_of(RESOURCE, "resourceclaims",
                                                      namespace=TENANT_NS))
               for h in holdings(claim, published))
    legacy = sum(80 * GI for pod in pods(api, TENANT_NS) if _bound(pod) and any(
        "nvidia.com/gpu" in ((c.get("resources") or {}).get("limits") or {})
        for c in pod["spec"]["containers"]))
    return held + legacy


def _foreign_state(api: Api) -> str:
    """What the tenant must never change: the bystander's pods and claims, the gateway's
    ConfigMaps and its namespace's labels and annotations, the DeviceClasses."""
    def strip(obj: Mapping[str, Any], *keep: str) -> JSON:
        meta = obj.get("metadata") or {}
        return {"name": meta.get("name"), "labels": meta.get("labels"),
                "annotations": meta.get("annotations"),
                "finalizers": meta.get("finalizers"), **{k: obj.get(k) for k in keep}}

    state = {
        "pods": [strip(p, "spec") for p in pods(api, BYSTANDER_NS)],
        "claims": [strip(c, "spec", "status") for c in api.list(
            path_of(RESOURCE, "resourceclaims", namespace=BYSTANDER_NS))],
        "configmaps": [strip(c, "data") for c in api.list(
            path_of("v1", "configmaps", namespace=NAMESPACE))
            if not c["metadata"]["name"].startswith("kube-root-ca")],
        "namespaces": [strip(api.get(path_of("v1", "namespaces", name=n)))
                       for n in (NAMESPACE, BYSTANDER_NS)],
        "deviceclasses": [strip(c, "spec") for c in api.list(
            path_of(RESOURCE, "deviceclasses"))],
    }
    for pod in state["pods"]:  # the kubelet's (KWOK's) own bookkeeping aside
        pod["spec"] = {k: v for k, v in (pod["spec"] or {}).items() if k != "nodeName"}
    return json.dumps(state, sort_keys=True)


@dataclass
class Invariants:
    api: Api
    gateway: Gateway
    tally: Tally
    foreign: str = ""

    def __post_init__(self) -> None:
        self.foreign = _foreign_state(self.api)

    def check(self, after: str) -> None:
        self.tally.checks += 1
        api = self.api
        self.gateway.check()
        truth = _truth(api)
        quota = api.get(path_of(GROUP, "gpuquotas", namespace=TENANT_NS, name=QUOTA))
        used = _memory(((quota.get("status") or {}).get("used") or {}).get("memory"))
        assert truth <= 100 * GI, f"after {after}: the tenant holds {truth} bytes, past 100Gi"
        assert used >= truth, \
            f"after {after}: status.used.memory {used} is below what is held, {truth}"
        waiting = api.get(path_of("v1", "pods", namespace=TENANT_NS, name="waiting"))
        assert _gated(waiting), f"after {after}: the pod past the quota was let go"
        assert not _bound(waiting), f"after {after}: the pod past the quota was bound"
        assert over_capacity(api) == [], f"after {after}: {over_capacity(api)}"
        for pod in pods(api, TENANT_NS) + pods(api, BYSTANDER_NS):
            if not _bound(pod) or (pod.get("metadata") or {}).get("deletionTimestamp"):
                continue
            wanted = len(pod["spec"].get("resourceClaims") or ())
            claims = [c for c in pod_claims(api, pod)
                      if (c.get("status") or {}).get("allocation")]
            assert len(claims) == wanted, \
                f"after {after}: pod {pod['metadata']['name']} runs without its claims"
        assert _foreign_state(api) == self.foreign, \
            f"after {after}: the tenant changed something outside its namespace"

    def settle(self, after: str) -> None:
        time.sleep(SETTLE_S)
        self.check(after)


# The writes --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Target:
    kind: str       # "pods", "resourceclaims", "resourceclaimtemplates"
    path: str


def _targets(api: Api) -> list[Target]:
    """The gateway's objects in the tenant's namespace: its translated pods, their claims and
    the templates the webhook made."""
    found = [Target("pods", path_of("v1", "pods", namespace=TENANT_NS,
                                    name=p["metadata"]["name"]))
             for p in pods(api, TENANT_NS)]
    for plural in KINDS[1:]:
        found += [Target(plural, path_of(RESOURCE, plural, namespace=TENANT_NS,
                                         name=o["metadata"]["name"]))
                  for o in api.list(path_of(RESOURCE, plural, namespace=TENANT_NS))]
    return found


def _try(tally: Tally, kind: str, write: Callable[[], Any]) -> None:
    tally.tried += 1
    tally.by_kind[kind] = tally.by_kind.get(kind, 0) + 1
    try:
        write()
    except ApiError as refused:
        code = refused.code
    else:
        tally.admitted += 1
        return
    # A refusal in words (Forbidden, Invalid, Conflict...), never a server's failure.
    assert code in (400, 403, 404, 409, 422), f"a tenant's write met {code}"


def _merge(tenant: Api, path: str, patch: Mapping[str, Any]) -> Callable[[], Any]:
    return lambda: tenant.request("PATCH", path, dict(patch),
                                  content_type="application/merge-patch+json")


def _label_value(value: str) -> bool:
    return bool(re.fullmatch(r"([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?", value))


KINDS = ("pods", "resourceclaims", "resourceclaimtemplates")


def _edit_writes(tenant: Api, rights: Mapping[str, set[str]], targets: Sequence[Target],
                 keys: Sequence[str], invariants: Invariants, tally: Tally) -> None:
    """In rounds, one hostile value a round: each key written with that value on every target
    the tenant may patch, left in place while the allocator acts on it (a settle), then
    checked; then each key as a finalizer added and taken off, statuses, and the deletions."""
    mine = [t for t in targets if may(rights, t.kind, "patch")]
    for round_ in range(len(hostile_values(keys[0]))):
        for target in mine:
            current = tenant.get(target.path)
            for key in keys:
                value = hostile_values(key, current)[round_]
                _try(tally, target.kind, _merge(tenant, target.path,
                                                {"metadata": {"annotations": {key: value}}}))
                if _label_value(value):
                    _try(tally, target.kind, _merge(tenant, target.path,
                                                    {"metadata": {"labels": {key: value}}}))
            invariants.check(f"the tenant's round {round_} on {target.path}")
        invariants.settle(f"the tenant's round {round_} of writes")
    for target in mine:
        for key in keys:
            current = tenant.get(target.path)["metadata"].get("finalizers") or []
            _try(tally, target.kind, _merge(tenant, target.path, {"metadata": {
                "finalizers": [f for f in current if f != key] + [key]}}))
            _try(tally, target.kind, _merge(tenant, target.path, {"metadata": {
                "finalizers": [f for f in current if f != key]}}))
        invariants.check(f"the tenant's finalizers on {target.path}")
        status = f"{target.kind}/status"
        if may(rights, status, "patch"):
            for condition in condition_types():
                _try(tally, status, _merge(tenant, target.path + "/status", {"status": {
                    "conditions": [{"type": condition, "status": "False",
                                    "reason": "Forged", "message": "forged"}]}}))
            invariants.check(f"the tenant wrote the status of {target.path}")
    for target in targets:
        if target.kind != "pods" and may(rights, target.kind, "delete"):
            # Its pod still runs: the claim (a template's claims) must go on holding.
            _try(tally, f"{target.kind} (delete)", lambda path=target.path: tenant.delete(path))
            invariants.check(f"the tenant deleted {target.path}")
    invariants.settle("the tenant's finalizers, statuses and deletions")


def _rules_writes(tenant: Api, rights: Mapping[str, set[str]], invariants: Invariants,
                  tally: Tally) -> None:
    """A ConfigMap labelled as the gateway's rules, in the tenant's namespace, that would turn
    a whole GPU into nothing at all."""
    if not may(rights, "configmaps", "create"):
        return
    rules = {"apiVersion": names.API_VERSION, "kind": names.KIND_TRANSLATION_RULES,
             "metadata": {"name": "tenant-gpus"},
             "rules": [{"name": "tenant-gpus", "precedence": 1000,
                        "resources": {"nvidia.com/gpu": {}},
                        "device": {"className": "gpu.example.com",
                                   "count": 'r["nvidia.com/gpu"]'}}]}
    _try(tally, "configmaps", lambda: tenant.create(
        path_of("v1", "configmaps", namespace=TENANT_NS), {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "dra-gateway-rules",
                         "labels": {names.RULES_LABEL: names.RULES_LABEL_VALUE}},
            "data": {"rules.yaml": json.dumps(rules)}}))
    invariants.settle("the tenant's rule ConfigMap")


def _creations(creator: Api, keys: Sequence[str], invariants: Invariants,
               tally: Tally) -> None:
    """Pods asking for a whole GPU, each with one key and value on it, as a tenant who may
    only create pods would write them."""
    count = 0
    for key in keys:
        for value in ("true", names.TRANSLATION_DISABLED, hostile_values(key)[0]):
            for slot in ("annotations", "labels"):
                if slot == "labels" and not _label_value(value):
                    continue
                count += 1
                pod = _on_h100(_pod(f"created-{count}", TENANT_NS, WHOLE,
                                    {slot: {key: value}}))
                _try(tally, "pods (create)", lambda pod=pod: creator.create(
                    path_of("v1", "pods", namespace=TENANT_NS), pod))
        invariants.check(f"the tenant created pods with {key}")
    invariants.settle("the tenant's pod creations")


def _translation_of(gateway: Gateway, name: str) -> JSON:
    """How a share pod of the bystander translates (its claims, limits), once it is placed."""
    api = gateway.api
    api.create(path_of("v1", "pods", namespace=BYSTANDER_NS), _pod(name, BYSTANDER_NS, SHARE))
    path = path_of("v1", "pods", namespace=BYSTANDER_NS, name=name)
    wait_until(f"the bystander's pod {name} to be placed", lambda: _bound(api.get(path)),
               PLACE_S, gateway.check)
    pod = api.get(path)
    return {"resourceClaims": [{k: v for k, v in c.items() if k != "name"}
                               for c in pod["spec"].get("resourceClaims") or ()],
            "limits": pod["spec"]["containers"][0]["resources"].get("limits"),
            "claims": pod["spec"]["containers"][0]["resources"].get("claims")}


def test_a_tenant_writing_whatever_its_role_allows_breaks_no_promise(gateway: Gateway) -> None:
    setup = next(s[0] for s in SETUPS
                 if (s[1], s[2]) == (gateway.version, dict(gateway.feature_gates)))
    if setup not in ADVERSARY_SETUPS:
        pytest.skip(f"the tenant adversary runs on {', '.join(sorted(ADVERSARY_SETUPS))}")
    keys = gateway_keys()
    # The list is the gateway's own: the keys it reads on objects tenants write are in it.
    assert {names.ANNOTATION_SHARES, names.ANNOTATION_DEFRAG, names.TRANSLATION_LABEL,
            names.SCHEDULING_GATE, names.ANNOTATION_TRANSLATED} <= set(keys), keys
    tally = Tally()
    with _scene(gateway) as api:
        before = _translation_of(gateway, "probe-before")
        editor = _editor(gateway)
        creator = _pod_creator(gateway)
        rights = allowed(editor)
        # `edit` may patch pods and claims in its namespace: the writes below are not moot.
        assert may(rights, "pods", "patch"), rights
        invariants = Invariants(api, gateway, tally)
        _edit_writes(editor, rights, _targets(api), keys, invariants, tally)
        _rules_writes(editor, rights, invariants, tally)
        creator_rights = allowed(creator)
        assert may(creator_rights, "pods", "create"), creator_rights
        assert not may(creator_rights, "pods", "patch"), creator_rights
        _creations(creator, keys, invariants, tally)
        after = _translation_of(gateway, "probe-after")
        assert after == before, "the tenant changed how another namespace's pods translate"
        invariants.foreign = _foreign_state(api)  # the probes are the test's own
        invariants.settle("every write")
        print(tally.line())
        assert tally.admitted > 0
        assert tally.checks > len(keys)

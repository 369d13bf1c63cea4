from __future__ import annotations

import base64
from typing import Any

import cel
import kubernetes_validate
import pytest
import yaml
from testkit import EXAMPLES

from dra_gateway.devkit.sim.memory import MemoryCluster
from dra_gateway.kube import names
from dra_gateway.kube.resources import (
    MUTATING_WEBHOOK_CONFIGURATIONS,
    VALIDATING_WEBHOOK_CONFIGURATIONS,
)
from dra_gateway.translator.rules import RuleSet, load_rules
from dra_gateway.translator.translate import translate
from dra_gateway.webhook.config import (
    claim_match_conditions,
    configurations,
    match_expression,
    reconcile,
)

from .conftest import hami_pod, plain_pod


@pytest.fixture(scope="module")
def rules() -> RuleSet:
    return load_rules()


def _configs(rules: RuleSet) -> tuple[dict[str, Any], dict[str, Any]]:
    return configurations(rules, service_namespace="dra-gateway",
                          service_name="dra-gateway-webhook", ca_bundle=b"PEM")


def test_both_configurations_pass_the_strict_1_34_schemas(rules: RuleSet) -> None:
    for obj in _configs(rules):
        kubernetes_validate.validate(obj, "1.34", strict=True)


def test_the_configurations_admit_gpu_pods_safely(rules: RuleSet) -> None:
    mutating, validating = _configs(rules)
    hook = mutating["webhooks"][0]
    assert hook["name"] == "mutate.dra-gateway.io"
    assert hook["clientConfig"] == {
        "service": {"namespace": "dra-gateway", "name": "dra-gateway-webhook",
                    "path": "/mutate", "port": 443},
        "caBundle": base64.b64encode(b"PEM").decode()}
    assert hook["sideEffects"] == "NoneOnDryRun"
    assert hook["failurePolicy"] == "Fail"
    assert hook["timeoutSeconds"] == 5
    assert hook["reinvocationPolicy"] == "IfNeeded"
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                              "resources": ["pods"], "scope": "Namespaced"}]
    assert hook["namespaceSelector"] == {"matchExpressions": [{
        "key": "kubernetes.io/metadata.name", "operator": "NotIn",
        "values": ["dra-gateway", "kube-system"]}, {
        "key": "dra-gateway.io/translation", "operator": "DoesNotExist"}]}
    (vhook, *_, rules_hook, claims_hook) = validating["webhooks"]
    assert vhook["clientConfig"]["service"]["path"] == "/validate"
    assert "reinvocationPolicy" not in vhook
    assert vhook["matchConditions"] == hook["matchConditions"]
    assert len(hook["matchConditions"]) == 1
    # Rules ConfigMaps are checked when written, in the gateway's namespace only; Ignore, so a
    # fix can be written while every replica is unready over the broken one.
    assert rules_hook["name"] == "rules.dra-gateway.io"
    assert rules_hook["clientConfig"]["service"]["path"] == "/validate-rules"
    assert rules_hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"],
                                    "operations": ["CREATE", "UPDATE"],
                                    "resources": ["configmaps"], "scope": "Namespaced"}]
    assert rules_hook["objectSelector"] == {"matchLabels": {"dra-gateway.io/rules": "true"}}
    assert rules_hook["namespaceSelector"] == {"matchExpressions": [{
        "key": "kubernetes.io/metadata.name", "operator": "In", "values": ["dra-gateway"]}]}
    assert rules_hook["failurePolicy"] == "Ignore"
    assert rules_hook["sideEffects"] == "None"
    # Natively written claims and templates of gateway classes go to /validate at CREATE.
    assert claims_hook["name"] == "claims.dra-gateway.io"
    assert claims_hook["clientConfig"] == vhook["clientConfig"]
    assert claims_hook["rules"] == [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                                     "operations": ["CREATE"],
                                     "resources": ["resourceclaims", "resourceclaimtemplates"],
                                     "scope": "Namespaced"}]
    # Every namespace but the disabled ones (and those left out of every webhook).
    assert claims_hook["namespaceSelector"] == {"matchExpressions": [
        vhook["namespaceSelector"]["matchExpressions"][0],
        {"key": "dra-gateway.io/translation", "operator": "NotIn", "values": ["disabled"]}]}
    # Ignore: a pod using such a claim is checked at its creation anyway (Fail), and a webhook
    # outage must not refuse every gateway-class claim.
    assert claims_hook["failurePolicy"] == "Ignore"
    assert claims_hook["sideEffects"] == "None"
    assert [c["name"] for c in claims_hook["matchConditions"]] == [
        "gateway-classes", "not-translated-by-the-gateway", "not-made-for-a-pod"]


def _selected(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a namespace with `labels` matches a namespaceSelector's matchExpressions."""
    for expression in selector["matchExpressions"]:
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        if operator == "In" and labels.get(key) not in values:
            return False
        if operator == "NotIn" and key in labels and labels[key] in values:
            return False
        if operator == "Exists" and key not in labels:
            return False
        if operator == "DoesNotExist" and key in labels:
            return False
    return True


@pytest.mark.parametrize("default", ["enabled", "audit"])
@pytest.mark.parametrize(("label", "mutate", "validate"), [
    ("enabled", "/mutate", "/validate"),
    ("audit", "/mutate/audit", "/validate/audit"),
    ("disabled", None, None),
    (None, "default", "default"),
    ("enable", "/mutate/unknown-mode", "/validate/audit"),
    ("", "/mutate/unknown-mode", "/validate/audit"),
])
def test_each_namespace_mode_sends_a_pod_to_exactly_one_path_of_each_configuration(
        rules: RuleSet, default: str, label: str | None, mutate: str | None,
        validate: str | None) -> None:
    mutating, validating = configurations(
        rules, service_namespace="dra-gateway", service_name="dra-gateway-webhook",
        ca_bundle=b"PEM", default_translation=default)
    labels = {"kubernetes.io/metadata.name": "team-a"}
    if label is not None:
        labels["dra-gateway.io/translation"] = label
    for config, wanted in ((mutating, mutate), (validating, validate)):
        if wanted == "default":
            wanted = ("/mutate" if config is mutating else "/validate") + (
                "/audit" if default == "audit" else "")
        paths = [h["clientConfig"]["service"]["path"] for h in config["webhooks"]
                 if h["rules"][0]["resources"] == ["pods"]
                 and _selected(h["namespaceSelector"], labels)]
        assert paths == ([wanted] if wanted else [])
    # The claims webhook follows: every namespace but a disabled one.
    claims = validating["webhooks"][-1]
    assert _selected(claims["namespaceSelector"], labels) == (label != "disabled")


def test_an_unknown_default_translation_mode_is_refused(rules: RuleSet) -> None:
    with pytest.raises(ValueError, match="must be enabled or audit, not 'disabled'"):
        configurations(rules, service_namespace="dra-gateway", service_name="w",
                       ca_bundle=None, default_translation="disabled")


def _matches(rules: RuleSet, pod: dict[str, Any]) -> bool:
    result = cel.evaluate(match_expression(rules), {"object": pod})
    assert isinstance(result, bool)
    return result


def _example_pods() -> list[tuple[str, dict[str, Any]]]:
    """Every pod of the examples, bare or as a workload's template."""
    out = []
    for path in sorted((EXAMPLES / "pods").glob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if not isinstance(doc, dict):
                continue
            if doc.get("kind") == "Pod":
                out.append((f"{path.name}[{i}]", doc))
            for template in _pod_templates(doc):
                out.append((f"{path.name}[{i}] template", {
                    "apiVersion": "v1", "kind": "Pod", "metadata": template.get("metadata", {}),
                    "spec": template["spec"]}))
    return out


def _pod_templates(node: Any) -> list[dict[str, Any]]:
    if isinstance(node, dict):
        if isinstance(node.get("spec"), dict) and "containers" in node["spec"] \
                and node.get("kind") != "Pod":
            return [node]
        return [t for v in node.values() for t in _pod_templates(v)]
    if isinstance(node, list):
        return [t for v in node for t in _pod_templates(v)]
    return []


@pytest.mark.parametrize(("label", "pod"), _example_pods(), ids=[p[0] for p in _example_pods()])
def test_the_match_condition_sends_every_pod_the_translator_changes(
    rules: RuleSet, label: str, pod: dict[str, Any]
) -> None:
    plan = translate(pod, rules)
    if plan.patch or plan.refusal:
        assert _matches(rules, pod), label


def test_the_match_condition_stays_within_the_api_servers_limit(rules: RuleSet) -> None:
    # kube-apiserver refuses a matchConditions expression over 10,240 characters: the
    # configuration would not be written and every pod creation would fail.
    assert len(match_expression(rules)) <= 10_240
    assert len(match_expression(load_rules(EXAMPLES / "rules"))) <= 10_240
    # The claims webhook's conditions, all of them together, as well.
    assert sum(len(c["expression"]) for c in claim_match_conditions()) <= 10_240


def _claim(resource: str, classes: list[str], *, first_available: bool = False,
           **metadata: Any) -> dict[str, Any]:
    requests = [{"name": f"r{i}", "firstAvailable": [{"name": "a", "deviceClassName": c}]}
                if first_available else {"name": f"r{i}", "exactly": {"deviceClassName": c}}
                for i, c in enumerate(classes)]
    spec: dict[str, Any] = {"devices": {"requests": requests}}
    kind = "ResourceClaim" if resource == "resourceclaims" else "ResourceClaimTemplate"
    return {"apiVersion": "resource.k8s.io/v1", "kind": kind,
            "metadata": {"name": "c", "namespace": "team-a", **metadata},
            "spec": spec if kind == "ResourceClaim" else {"spec": spec}}


def _claim_sent(resource: str, obj: dict[str, Any]) -> bool:
    variables = {"object": obj, "request": {"resource": {
        "group": "resource.k8s.io", "version": "v1", "resource": resource}}}
    verdicts = [cel.evaluate(c["expression"], variables) for c in claim_match_conditions()]
    assert all(isinstance(v, bool) for v in verdicts)
    return all(verdicts)


_OWNED = [{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u", "controller": True}]
_MANAGED = {names.LABEL_MANAGED_BY: names.MANAGED_BY}


@pytest.mark.parametrize(("label", "resource", "obj", "sent"), [
    ("claim of the gpu class", "resourceclaims", _claim("resourceclaims", [names.GPU_CLASS]),
     True),
    ("template of the mig class", "resourceclaimtemplates",
     _claim("resourceclaimtemplates", [names.MIG_CLASS]), True),
    ("a gateway class as the second request", "resourceclaims",
     _claim("resourceclaims", ["gpu.nvidia.com", names.GPU_CLASS]), True),
    ("a gateway class in firstAvailable", "resourceclaimtemplates",
     _claim("resourceclaimtemplates", [names.GPU_CLASS], first_available=True), True),
    ("another driver's claim", "resourceclaims", _claim("resourceclaims", ["gpu.nvidia.com"]),
     False),
    ("another driver's template", "resourceclaimtemplates",
     _claim("resourceclaimtemplates", ["gpu.nvidia.com"], first_available=True), False),
    ("a claim without requests", "resourceclaims",
     {"metadata": {"name": "c"}, "spec": {"devices": {}}}, False),
    ("a template without a claim spec", "resourceclaimtemplates",
     {"metadata": {"name": "c"}, "spec": {}}, False),
    ("the gateway's own translation", "resourceclaimtemplates",
     _claim("resourceclaimtemplates", [names.GPU_CLASS], name="dra-gateway-0123abcd",
            labels=_MANAGED), False),
    ("a template labelled as the gateway's under another name", "resourceclaimtemplates",
     _claim("resourceclaimtemplates", [names.GPU_CLASS], labels=_MANAGED), True),
    ("a claim made for a pod from its template", "resourceclaims",
     _claim("resourceclaims", [names.GPU_CLASS], ownerReferences=_OWNED), False),
    ("a claim owned by a pod that is not its controller", "resourceclaims",
     _claim("resourceclaims", [names.GPU_CLASS],
            ownerReferences=[{**_OWNED[0], "controller": False}]), True),
])
def test_the_claims_webhook_sees_only_natively_written_gateway_claims(
        label: str, resource: str, obj: dict[str, Any], sent: bool) -> None:
    assert _claim_sent(resource, obj) is sent, label


def test_the_examples_hold_translatable_pods(rules: RuleSet) -> None:
    assert sum(bool(translate(p, rules).patch) for _, p in _example_pods()) >= 4


def test_the_match_condition_skips_a_gpu_free_pod(rules: RuleSet) -> None:
    assert not _matches(rules, plain_pod())
    bare = plain_pod()
    del bare["spec"]["containers"][0]["resources"]
    assert not _matches(rules, bare)


def test_the_match_condition_sends_init_containers_requests_claims_gates_and_annotations(
    rules: RuleSet,
) -> None:
    init = plain_pod()
    init["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {
        "nvidia.com/mig-1g.5gb": "1"}}}]
    assert _matches(rules, init)
    claims = plain_pod()
    claims["spec"]["resourceClaims"] = [{"name": "x", "resourceClaimName": "y"}]
    assert _matches(rules, claims)
    gated = plain_pod()
    gated["spec"]["schedulingGates"] = [{"name": names.SCHEDULING_GATE}]
    assert _matches(rules, gated)
    annotated = plain_pod()
    annotated["metadata"]["annotations"] = {names.ANNOTATION_TRANSLATED: "{}"}
    assert _matches(rules, annotated)
    other_gate = plain_pod()
    other_gate["spec"]["schedulingGates"] = [{"name": "example.com/wait"}]
    assert not _matches(rules, other_gate)


def test_the_match_condition_follows_the_rules() -> None:
    base = load_rules()
    more = load_rules(EXAMPLES / "rules" / "new-vendor.yaml")
    npu = plain_pod()
    npu["spec"]["containers"][0]["resources"]["limits"]["example.com/npu"] = "1"
    assert not _matches(base, npu)
    assert _matches(more, npu)
    assert _matches(more, hami_pod())


async def test_reconcile_injects_the_ca_bundle_and_is_idempotent(rules: RuleSet) -> None:
    cluster = MemoryCluster()
    assert await reconcile(cluster, rules, ca_bundle=b"PEM") == []  # nothing installed yet
    mutating, validating = configurations(rules, service_namespace="dra-gateway",
                                          service_name="dra-gateway-webhook", ca_bundle=None)
    await cluster.create(MUTATING_WEBHOOK_CONFIGURATIONS, mutating)
    await cluster.create(VALIDATING_WEBHOOK_CONFIGURATIONS, validating)
    assert await reconcile(cluster, rules, ca_bundle=b"PEM") == ["dra-gateway", "dra-gateway"]
    stored = await cluster.get(MUTATING_WEBHOOK_CONFIGURATIONS, "dra-gateway")
    assert stored["webhooks"][0]["clientConfig"]["caBundle"] == base64.b64encode(b"PEM").decode()
    assert await reconcile(cluster, rules, ca_bundle=b"PEM") == []


async def test_reconcile_keeps_the_claims_webhooks_conditions_and_ca_bundle(
        rules: RuleSet) -> None:
    cluster = MemoryCluster()
    _, validating = configurations(rules, service_namespace="dra-gateway",
                                   service_name="dra-gateway-webhook", ca_bundle=None)
    claims_hook = validating["webhooks"][2]
    claims_hook["matchConditions"] = [{"name": "gateway-classes", "expression": "true"}]
    await cluster.create(VALIDATING_WEBHOOK_CONFIGURATIONS, validating)
    assert await reconcile(cluster, rules, ca_bundle=b"PEM") == ["dra-gateway"]
    stored = await cluster.get(VALIDATING_WEBHOOK_CONFIGURATIONS, "dra-gateway")
    (hook,) = [h for h in stored["webhooks"] if h["name"] == "claims.dra-gateway.io"]
    assert hook["matchConditions"] == claim_match_conditions()
    assert hook["clientConfig"]["caBundle"] == base64.b64encode(b"PEM").decode()

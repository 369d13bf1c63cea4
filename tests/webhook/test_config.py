from __future__ import annotations

import base64
from typing import Any

import cel
import kubernetes_validate
import pytest
import yaml
from testkit import EXAMPLES

from dra_gateway.kube import names
from dra_gateway.kube.resources import (
    MUTATING_WEBHOOK_CONFIGURATIONS,
    VALIDATING_WEBHOOK_CONFIGURATIONS,
)
from dra_gateway.kube.sim.memory import MemoryCluster
from dra_gateway.translator.rules import RuleSet, load_rules
from dra_gateway.translator.translate import translate
from dra_gateway.webhook.config import configurations, match_expression, reconcile

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
    (hook,) = mutating["webhooks"]
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
        "values": ["dra-gateway", "kube-system"]}]}
    (vhook, rules_hook) = validating["webhooks"]
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

"""The Mutating- and ValidatingWebhookConfiguration of the gateway, and keeping them current.

Every pod creation in the cluster passes through the API server's webhook dispatch, so the
configurations send the gateway only what it can act on: one `matchConditions` CEL expression,
derived from the loaded rules, ORs together "a container or init container asks for a resource a
rule translates, or any name under the domains of the enabled rules' names" (a typo there is
warned about, translator/typos.py), "the pod carries an annotation a rule reads", "the pod has
resource claims" (their class is only known by reading them) and "the pod carries the
gateway's gate or annotation". With `failurePolicy: Fail` for exactly those pods, a webhook
outage stops GPU pods and nothing else. The namespaceSelector leaves out kube-system and the
gateway's own namespace (a webhook that admits its own replacement pods can deadlock).

Each pod webhook is written once per translation mode of a namespace (ARCHITECTURE.md, "Moving
a live cluster"): `mutate.dra-gateway.io` for namespaces without the label
`dra-gateway.io/translation` (the install's default mode; the name users saw before the label
existed), `enabled.mutate.dra-gateway.io` and `audit.mutate.dra-gateway.io` for those labelled
so, `unknown-mode.mutate.dra-gateway.io` for any other value; `validate.dra-gateway.io`
likewise. Their namespaceSelectors are disjoint, so a pod is sent once, and the path tells the
webhook the mode: the API server reads the namespace's labels at the moment of the pod's
creation, which no mirror in the webhook could match. `disabled` namespaces are selected by
none: the webhook is never called there, nor for their claims.

Validation runs on CREATE only: the allocator lifts the gate with an UPDATE, which a validating
rule about ungated pods would otherwise refuse.

The validating configuration carries a webhook of claims, `claims.dra-gateway.io`: CREATE of
ResourceClaims and ResourceClaimTemplates goes to /validate, which refuses what the GPU policies
can never admit, only when a request names a gateway device class and the object was written
natively (`claim_match_conditions`, fixed: the classes do not follow the rules). Left out, so
that they cost no call: the templates the gateway's /mutate creates (named `dra-gateway-*`,
labelled managed-by dra-gateway; the pod they come from is what /validate checks) and the claims
the claim controller makes for a pod from its template (a controller ownerReference to the pod).
Every other claim never reaches the webhook. Its failurePolicy is Ignore: the check only says
early what would be refused later, since a pod using the claim is checked at its creation
(failurePolicy Fail) and the allocator enforces the rest; with Fail, a webhook outage would
refuse every gateway-class claim, and an install that writes templates beside the chart, before
the webhook serves, would fail.

The validating configuration carries a third webhook, `rules.dra-gateway.io`: CREATE and
UPDATE of ConfigMaps labelled `dra-gateway.io/rules=true` in the gateway's namespace go to
/validate-rules, which refuses rules that would not load. Its failurePolicy is Ignore: replicas
stay unready while a broken rules ConfigMap is in the cluster, and with Fail the fix itself could
then not be written; a ConfigMap written while the webhook is down is still refused at load time.

`reconcile` rewrites the matchConditions (and, given a CA, the caBundle) of the installed
configurations when rules change, through the cluster port; it leaves every other field as the
installer wrote it (a configuration installed before the claims webhook existed is left
without one: upgrading the chart adds it). This module must not answer reviews.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Callable, Iterable
from typing import Any

from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import ApiError, Cluster, Conflict, NotFound
from dra_gateway.kube.resources import (
    MUTATING_WEBHOOK_CONFIGURATIONS,
    VALIDATING_WEBHOOK_CONFIGURATIONS,
    ResourceType,
)
from dra_gateway.translator.rules import RuleSet
from dra_gateway.translator.shapes import TEMPLATE_PREFIX
from dra_gateway.webhook.settings import (
    CLAIMS_WEBHOOK,
    MUTATING_CONFIGURATION,
    MUTATING_WEBHOOK,
    POD_WEBHOOK_MODES,
    RULES_WEBHOOK,
    VALIDATING_CONFIGURATION,
    VALIDATING_WEBHOOK,
)

log = logging.getLogger(__name__)

MATCH_CONDITION_NAME = "gpu-pods"
TIMEOUT_SECONDS = 5
_CONFLICT_RETRIES = 5


def _cel_strings(values: Iterable[str]) -> str:
    # JSON string literals are valid CEL string literals (same escapes for what names contain).
    return "[" + ", ".join(json.dumps(v) for v in sorted(values)) + "]"


def _key_test(var: str, exact: frozenset[str], prefixes: frozenset[str]) -> str:
    tests = []
    if exact:
        tests.append(f"{var} in {_cel_strings(exact)}")
    tests += [f"{var}.startsWith({json.dumps(p)})" for p in sorted(prefixes)]
    return " || ".join(tests) if tests else "false"


def match_expression(rules: RuleSet) -> str:
    """The CEL expression selecting the pods the gateway must see: those asking for a legacy
    name some rule reads, enabled or not (a disabled rule's name gets a warning), or any name
    under the domains of the enabled rules' names (a typo gets a warning)."""
    disabled = rules.disabled_resources
    # Any name under a domain the rules read, too: one no rule reads is likely a typo, which
    # the webhook warns about (translator/typos.py) instead of leaving the pod to wait for ever.
    # The domains cover most exact names, which are written only where they fall outside them.
    domains = {f"{domain}/" for domain in rules.vendor_domains}
    exact = {n for n in rules.legacy_resource_names() | {
        n for n in disabled if not n.endswith("*")} if not n.startswith(tuple(domains))}
    prefixes = {p for p in rules.legacy_resource_prefixes() | {
        n[:-1] for n in disabled if n.endswith("*")} if not p.startswith(tuple(domains))}
    key = _key_test("k", frozenset(exact), frozenset(prefixes | domains))
    # The name test appears once: an API server refuses a condition over 10,240 characters, and
    # the built-in rules read about 150 names (written four times, for limits and requests of
    # containers and init containers, it passed the limit).
    containers = ("(object.spec.containers + (has(object.spec.initContainers) ? "
                  "object.spec.initContainers : []))")
    keys = ("((has(c.resources.limits) ? c.resources.limits.map(k, k) : []) + "
            "(has(c.resources.requests) ? c.resources.requests.map(k, k) : []))")
    annotations = {*rules.annotation_keys(), names.ANNOTATION_TRANSLATED}
    clauses = [
        f"{containers}.exists(c, has(c.resources) && {keys}.exists(k, {key}))",
        f"(has(object.metadata.annotations) && object.metadata.annotations.exists(k, "
        f"k in {_cel_strings(annotations)}))",
        "(has(object.spec.resourceClaims) && size(object.spec.resourceClaims) > 0)",
        f"(has(object.spec.schedulingGates) && object.spec.schedulingGates.exists(g, "
        f"g.name == {json.dumps(names.SCHEDULING_GATE)}))",
    ]
    return " || ".join(clauses)


def match_conditions(rules: RuleSet) -> list[dict[str, str]]:
    return [{"name": MATCH_CONDITION_NAME, "expression": match_expression(rules)}]


def _gateway_request(spec: str) -> str:
    """CEL: a request of the ResourceClaim spec at `spec` names a gateway device class."""
    classes = _cel_strings(names.GATEWAY_CLASSES)
    return (f"(has({spec}.devices) && has({spec}.devices.requests) && "
            f"{spec}.devices.requests.exists(r, "
            f"(has(r.exactly) && r.exactly.deviceClassName in {classes}) || "
            f"(has(r.firstAvailable) && r.firstAvailable.exists(s, "
            f"s.deviceClassName in {classes}))))")


def claim_match_conditions() -> list[dict[str, str]]:
    """The claims webhook's conditions (all must hold; see the module's docstring)."""
    label = json.dumps(names.LABEL_MANAGED_BY)
    return [
        {"name": "gateway-classes", "expression": (
            'request.resource.resource == "resourceclaimtemplates" ? '
            f"(has(object.spec.spec) && {_gateway_request('object.spec.spec')}) : "
            f"{_gateway_request('object.spec')}")},
        {"name": "not-translated-by-the-gateway", "expression": (
            f'!(request.resource.resource == "resourceclaimtemplates" && '
            f"object.metadata.name.startsWith({json.dumps(TEMPLATE_PREFIX)}) && "
            f"has(object.metadata.labels) && {label} in object.metadata.labels && "
            f"object.metadata.labels[{label}] == {json.dumps(names.MANAGED_BY)})")},
        {"name": "not-made-for-a-pod", "expression": (
            "!(has(object.metadata.ownerReferences) && "
            'object.metadata.ownerReferences.exists(o, o.apiVersion == "v1" && '
            'o.kind == "Pod" && has(o.controller) && o.controller))')},
    ]


def claims_webhook(*, client_config: dict[str, Any],
                   namespace_selector: dict[str, Any]) -> dict[str, Any]:
    """The validating webhook of natively written claims (see the module's docstring)."""
    return {
        "name": CLAIMS_WEBHOOK,
        "clientConfig": client_config,
        "rules": [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                   "operations": ["CREATE"],
                   "resources": ["resourceclaims", "resourceclaimtemplates"],
                   "scope": "Namespaced"}],
        "failurePolicy": "Ignore",
        "matchPolicy": "Equivalent",
        "namespaceSelector": namespace_selector,
        "objectSelector": {},
        # It only reads the policies' cache.
        "sideEffects": "None",
        "timeoutSeconds": TIMEOUT_SECONDS,
        "admissionReviewVersions": ["v1"],
        "matchConditions": claim_match_conditions(),
    }


def _namespace_selector(excluded: Iterable[str]) -> dict[str, Any]:
    return {"matchExpressions": [{"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                                  "values": sorted(set(excluded))}]}


def _client_config(service_namespace: str, service_name: str, path: str, port: int,
                   ca_bundle: bytes | None) -> dict[str, Any]:
    config: dict[str, Any] = {"service": {"namespace": service_namespace, "name": service_name,
                                          "path": path, "port": port}}
    if ca_bundle:
        config["caBundle"] = base64.b64encode(ca_bundle).decode("ascii")
    return config


def rules_webhook(*, client_config: dict[str, Any], gateway_namespace: str) -> dict[str, Any]:
    """The validating webhook of rules ConfigMaps (see the module's docstring)."""
    return {
        "name": RULES_WEBHOOK,
        "clientConfig": client_config,
        "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                   "resources": ["configmaps"], "scope": "Namespaced"}],
        "failurePolicy": "Ignore",
        "matchPolicy": "Equivalent",
        "namespaceSelector": {"matchExpressions": [{
            "key": "kubernetes.io/metadata.name", "operator": "In",
            "values": [gateway_namespace]}]},
        "objectSelector": {"matchLabels": {names.RULES_LABEL: names.RULES_LABEL_VALUE}},
        "sideEffects": "None",
        "timeoutSeconds": TIMEOUT_SECONDS,
        "admissionReviewVersions": ["v1"],
    }


def pod_webhook_names(base: str) -> tuple[str, ...]:
    """The pod webhooks of one configuration: `base` for namespaces without the translation
    label, then one per value of it (see `pod_webhooks`)."""
    return (base, *(f"{mode}.{base}" for mode in POD_WEBHOOK_MODES))


def translation_selectors(default_mode: str) -> dict[str, tuple[dict[str, Any], str]]:
    """Per pod webhook mode: the namespace label expressions that select it, and the mode the
    path tells the webhook. Disjoint, so a pod is sent once; `disabled` is sent nowhere."""
    if default_mode not in (names.TRANSLATION_ENABLED, names.TRANSLATION_AUDIT):
        raise ValueError(f"the default translation mode must be {names.TRANSLATION_ENABLED} or "
                         f"{names.TRANSLATION_AUDIT}, not {default_mode!r}")
    key = names.TRANSLATION_LABEL
    return {
        "": ({"matchExpressions": [{"key": key, "operator": "DoesNotExist"}]}, default_mode),
        "enabled": ({"matchExpressions": [{"key": key, "operator": "In",
                                           "values": [names.TRANSLATION_ENABLED]}]},
                    names.TRANSLATION_ENABLED),
        "audit": ({"matchExpressions": [{"key": key, "operator": "In",
                                         "values": [names.TRANSLATION_AUDIT]}]},
                  names.TRANSLATION_AUDIT),
        "unknown-mode": ({"matchExpressions": [
            {"key": key, "operator": "Exists"},
            {"key": key, "operator": "NotIn", "values": list(names.TRANSLATION_MODES)}]},
            "unknown-mode"),
    }


# The path of each mode, per endpoint ("unknown-mode" validates as audit: its pods are admitted
# unchanged, with the warning /mutate gave).
MODE_PATHS = {
    "mutate": {names.TRANSLATION_ENABLED: "/mutate", names.TRANSLATION_AUDIT: "/mutate/audit",
               "unknown-mode": "/mutate/unknown-mode"},
    "validate": {names.TRANSLATION_ENABLED: "/validate",
                 names.TRANSLATION_AUDIT: "/validate/audit",
                 "unknown-mode": "/validate/audit"},
}


def pod_webhooks(endpoint: str, base: str, *, common: dict[str, Any],
                 excluded: dict[str, Any], client_config: Callable[[str], dict[str, Any]],
                 default_mode: str) -> list[dict[str, Any]]:
    """The pod webhooks of `endpoint` (mutate or validate), one per translation mode of a
    namespace (ARCHITECTURE.md, "Moving a live cluster"): the mode is chosen by the API server
    from the namespace's labels when the pod is created, and told to the webhook by the path."""
    out = []
    for prefix, (selector, mode) in translation_selectors(default_mode).items():
        out.append({
            "name": f"{prefix}.{base}" if prefix else base,
            "clientConfig": client_config(MODE_PATHS[endpoint][mode]),
            **common,
            "namespaceSelector": {"matchExpressions": [
                *excluded["matchExpressions"], *selector["matchExpressions"]]},
        })
    return out


def configurations(rules: RuleSet, *, service_namespace: str, service_name: str,
                   ca_bundle: bytes | None, gateway_namespace: str | None = None,
                   excluded_namespaces: Iterable[str] = ("kube-system",), port: int = 443,
                   mutating_name: str = MUTATING_CONFIGURATION,
                   validating_name: str = VALIDATING_CONFIGURATION,
                   default_translation: str = names.TRANSLATION_ENABLED,
                   ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The MutatingWebhookConfiguration and the ValidatingWebhookConfiguration;
    `default_translation`: the mode of namespaces without the translation label."""
    excluded = {*excluded_namespaces, gateway_namespace or service_namespace}
    labels = {names.LABEL_MANAGED_BY: names.MANAGED_BY}
    pod_rule: dict[str, Any] = {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                                "resources": ["pods"], "scope": "Namespaced"}
    common: dict[str, Any] = {
        "rules": [pod_rule],
        "failurePolicy": "Fail",
        "matchPolicy": "Equivalent",
        "namespaceSelector": _namespace_selector(excluded),
        "objectSelector": {},
        "sideEffects": "NoneOnDryRun",
        "timeoutSeconds": TIMEOUT_SECONDS,
        "admissionReviewVersions": ["v1"],
        "matchConditions": match_conditions(rules),
    }

    def client(path: str) -> dict[str, Any]:
        return _client_config(service_namespace, service_name, path, port, ca_bundle)

    # Another webhook may change the pod after ours: run again. A translated pod only gets its
    # scheduling gate back if that webhook dropped it; a GPU request added after the
    # translation is left to /validate, which refuses it with that reason.
    mutating_common = {**common, "reinvocationPolicy": "IfNeeded"}
    mutating = {
        "apiVersion": MUTATING_WEBHOOK_CONFIGURATIONS.api_version,
        "kind": MUTATING_WEBHOOK_CONFIGURATIONS.kind,
        "metadata": {"name": mutating_name, "labels": labels},
        "webhooks": pod_webhooks("mutate", MUTATING_WEBHOOK, common=mutating_common,
                                 excluded=common["namespaceSelector"], client_config=client,
                                 default_mode=default_translation),
    }
    validating = {
        "apiVersion": VALIDATING_WEBHOOK_CONFIGURATIONS.api_version,
        "kind": VALIDATING_WEBHOOK_CONFIGURATIONS.kind,
        "metadata": {"name": validating_name, "labels": labels},
        "webhooks": [
            *pod_webhooks("validate", VALIDATING_WEBHOOK, common=common,
                          excluded=common["namespaceSelector"], client_config=client,
                          default_mode=default_translation),
            rules_webhook(client_config=client("/validate-rules"),
                          gateway_namespace=gateway_namespace or service_namespace),
            claims_webhook(client_config=client("/validate"),
                           namespace_selector={"matchExpressions": [
                               *common["namespaceSelector"]["matchExpressions"],
                               {"key": names.TRANSLATION_LABEL, "operator": "NotIn",
                                "values": [names.TRANSLATION_DISABLED]}]})],
    }
    return mutating, validating


async def reconcile(cluster: Cluster, rules: RuleSet, *,
                    mutating_name: str = MUTATING_CONFIGURATION,
                    validating_name: str = VALIDATING_CONFIGURATION,
                    ca_bundle: bytes | None = None) -> list[str]:
    """Update the installed configurations' matchConditions (and caBundle) for `rules`.

    Only the gateway's own webhooks (by name) are touched. Returns the configurations updated;
    a configuration that is not installed is skipped (the installer owns creating it).
    """
    pods = match_conditions(rules)
    hooks = (*pod_webhook_names(MUTATING_WEBHOOK), *pod_webhook_names(VALIDATING_WEBHOOK))
    wanted = {**dict.fromkeys(hooks, pods), CLAIMS_WEBHOOK: claim_match_conditions()}
    bundle = base64.b64encode(ca_bundle).decode("ascii") if ca_bundle else None
    updated = []
    for rt, name, hook in ((MUTATING_WEBHOOK_CONFIGURATIONS, mutating_name, MUTATING_WEBHOOK),
                           (VALIDATING_WEBHOOK_CONFIGURATIONS, validating_name,
                            VALIDATING_WEBHOOK)):
        if await _reconcile_one(cluster, rt, name, hook, wanted, bundle):
            updated.append(name)
    return updated


async def _reconcile_one(cluster: Cluster, rt: ResourceType, name: str, hook: str,
                         wanted: dict[str, list[dict[str, str]]], bundle: str | None) -> bool:
    for _ in range(_CONFLICT_RETRIES):
        try:
            current = await cluster.get(rt, name)
        except NotFound:
            log.info("webhook configuration not installed, nothing to reconcile",
                     extra={"kind": rt.kind, "object": name})
            return False
        changed = False
        ours = (*pod_webhook_names(hook), CLAIMS_WEBHOOK, RULES_WEBHOOK) \
            if hook == VALIDATING_WEBHOOK else pod_webhook_names(hook)
        for webhook in current.get("webhooks") or ():
            if webhook.get("name") not in ours:
                continue
            conditions = wanted.get(webhook.get("name") or "")
            if conditions is not None and webhook.get("matchConditions") != conditions:
                webhook["matchConditions"] = conditions
                changed = True
            client = webhook.setdefault("clientConfig", {})
            if bundle is not None and client.get("caBundle") != bundle:
                client["caBundle"] = bundle
                changed = True
        if not changed:
            return False
        try:
            await cluster.update(rt, current)
        except Conflict:
            continue  # someone else wrote it meanwhile: read again and redo
        except ApiError as exc:
            log.error("cannot update the webhook configuration",
                      extra={"kind": rt.kind, "object": name, "reason": exc.reason,
                             "error": exc.message})
            raise
        log.info("webhook configuration follows the rules",
                 extra={"kind": rt.kind, "object": name})
        return True
    raise Conflict(f"{rt.kind} {name} kept changing under {_CONFLICT_RETRIES} updates; "
                   f"it will be reconciled at the next rule change")

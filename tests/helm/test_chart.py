"""The Helm chart: lint-clean, valid against Kubernetes 1.34, least privilege, one object a file.

Runs the real `helm` binary (the DRA_GATEWAY_HELM environment variable, else `helm` on PATH) to
lint and render the chart for each supported combination of values, then checks every rendered
object against the strict Kubernetes 1.34 schemas and against the contracts of ARCHITECTURE.md:
names, RBAC of each component, webhook configurations, certificates. Without helm these tests skip,
except in CI (CI=true), where a missing helm is a failure: a chart nobody renders rots.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import json
import os
import shutil
import subprocess
import tempfile
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import Encoding
from cryptography.x509.oid import NameOID

from dra_gateway.kube import names

CHART = Path(__file__).resolve().parents[2] / "helm" / "dra-gateway"
RELEASE = "dra-gateway"
NAMESPACE = "dra-gateway"
KUBE_VERSION = "1.34.0"
CERT_MANAGER_API = "cert-manager.io/v1"

Object = dict[str, Any]


@dataclass(frozen=True)
class Rendered:
    """One object of a render and the template file it came from."""

    source: str  # path below templates/, e.g. "webhook/deployment.yaml"
    obj: Object

    @property
    def kind(self) -> str:
        return str(self.obj["kind"])

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])


# Helm ---------------------------------------------------------------------------------------


def _find_helm() -> str | None:
    configured = os.environ.get("DRA_GATEWAY_HELM")
    if configured:
        return configured
    return shutil.which("helm")


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> HelmRunner:
    path = _find_helm()
    if path is None or not Path(path).is_file():
        reason = ("helm not found: set DRA_GATEWAY_HELM to a helm v3 binary or put helm on PATH"
                  f" (DRA_GATEWAY_HELM={os.environ.get('DRA_GATEWAY_HELM')!r})")
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    return HelmRunner(path, tmp_path_factory.mktemp("helm"))


class HelmRunner:
    """Runs helm with private config/cache dirs and no kubeconfig: rendering never touches a
    real cluster, and lookup() answers empty as on a first install."""

    def __init__(self, path: str, home: Path) -> None:
        self.path = path
        self.home = home
        self.env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": str(home),
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
            "KUBECONFIG": str(home / "no-kubeconfig"),
        }
        self._renders: dict[str, list[Rendered]] = {}
        self._files = 0

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([self.path, *args], capture_output=True, text=True, env=self.env,
                              timeout=50, check=False)

    def values_file(self, values: Object) -> str:
        self._files += 1
        path = self.home / f"values-{self._files}.yaml"
        path.write_text(yaml.safe_dump(values))
        return str(path)

    def template(self, values: Object, *extra: str,
                 namespace: str = NAMESPACE) -> subprocess.CompletedProcess[str]:
        return self.run("template", RELEASE, str(CHART), "--namespace", namespace,
                        "--kube-version", KUBE_VERSION, "--values", self.values_file(values),
                        *extra)

    def render(self, combination: str) -> list[Rendered]:
        """The objects of one named combination, rendered once per session."""
        if combination not in self._renders:
            values, extra = COMBINATIONS[combination]
            result = self.template(values, *extra)
            assert result.returncode == 0, f"{combination}: helm template failed: {result.stderr}"
            self._renders[combination] = parse_render(result.stdout)
        return self._renders[combination]


def parse_render(text: str) -> list[Rendered]:
    out: list[Rendered] = []
    prefix = f"# Source: {CHART.name}/templates/"
    for document in text.split("\n---\n"):
        lines = document.strip("-\n").splitlines()
        sources = [line for line in lines if line.startswith("# Source: ")]
        obj = yaml.safe_load(document.strip("-\n")) if lines else None
        if obj is None:
            continue
        assert len(sources) == 1, document[:200]
        assert sources[0].startswith(prefix), sources[0]
        out.append(Rendered(sources[0][len(prefix):], obj))
    return out


# The combinations of values the chart supports ---------------------------------------------


def _ca_bundle() -> str:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test-ca")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return base64.b64encode(cert.public_bytes(Encoding.PEM)).decode()


CA_BUNDLE = _ca_bundle()
INVENTORY = {
    "driverVersion": "550.54.15",
    "cudaDriverVersion": "12.4",
    "gpus": [{"index": 0, "uuid": "GPU-00000000-0000-0000-0000-000000000001",
              "productName": "NVIDIA H100 80GB HBM3", "memory": "80Gi"}],
}
RULES_MAPPING = {
    "apiVersion": names.API_VERSION,
    "kind": names.KIND_TRANSLATION_RULES,
    "rules": [{"name": "site-gpu", "disabled": True}],
}
RULES_TEXT = f"apiVersion: {names.API_VERSION}\nkind: {names.KIND_TRANSLATION_RULES}\nrules: []\n"

MONITORING_API = "monitoring.coreos.com/v1"
COMBINATIONS: dict[str, tuple[Object, tuple[str, ...]]] = {
    "default": ({}, ()),
    "cert-manager": ({"certificates": {"mode": "cert-manager"}},
                     ("--api-versions", CERT_MANAGER_API)),
    "cert-manager-cluster-issuer": (
        {"certificates": {"mode": "cert-manager",
                          "certManager": {"issuerRef": {"name": "corp-ca",
                                                        "kind": "ClusterIssuer"}}}},
        ("--api-versions", CERT_MANAGER_API)),
    "existing-secret": ({"certificates": {"mode": "secret",
                                          "secret": {"name": "corp-webhook-tls",
                                                     "caBundle": CA_BUNDLE}}}, ()),
    "inventory": ({"nodePlugin": {"discovery": "inventory", "inventory": INVENTORY}}, ()),
    "rules": ({"rules": {"site.yaml": RULES_MAPPING, "raw.yaml": RULES_TEXT}}, ()),
    "single-replica-ignore": ({"webhook": {"replicas": 1, "failurePolicy": "Ignore",
                                           "podDisruptionBudget": {"enabled": False}},
                               "allocator": {"replicas": 1,
                                             "podDisruptionBudget": {"enabled": False}}}, ()),
    "external-webhook": ({"webhook": {"url": "https://localhost:9443/"},
                          "certificates": {"mode": "secret",
                                           "secret": {"name": "local-webhook-tls",
                                                      "caBundle": CA_BUNDLE}}}, ()),
    "client-auth": ({"webhook": {"clientAuth": {"enabled": True, "caBundle": CA_BUNDLE}},
                     "allocator": {"releaseOnUninstall": False},
                     "admissionPolicies": {"enabled": False}}, ()),
    "monitoring": ({"monitoring": {"podMonitors": True, "prometheusRule": True,
                                   "dashboard": {"enabled": True}}}, ()),
    "hardened-node-plugin": ({"nodePlugin": {"privileged": False, "runtimeClassName": "nvidia"},
                              "webhook": {"excludeNamespaces": ["monitoring"]},
                              "deviceClasses": {"create": False}}, ()),
}


def by_kind(objects: list[Rendered], kind: str) -> list[Rendered]:
    return [r for r in objects if r.kind == kind]


def one(objects: list[Rendered], kind: str, component: str | None = None) -> Object:
    found = [r.obj for r in by_kind(objects, kind)
             if component is None or component_of(r.obj) == component]
    assert len(found) == 1, f"expected one {kind} of {component}, found {len(found)}"
    return found[0]


def component_of(obj: Object) -> str | None:
    labels = obj["metadata"].get("labels") or {}
    value = labels.get("app.kubernetes.io/component")
    return None if value is None else str(value)


def container(objects: list[Rendered], kind: str, component: str) -> Object:
    containers = one(objects, kind, component)["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1
    result: Object = containers[0]
    return result


# Lint and schema validation -----------------------------------------------------------------


@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
def test_lint_strict_passes(helm: HelmRunner, combination: str) -> None:
    values, _ = COMBINATIONS[combination]
    result = helm.run("lint", "--strict", str(CHART), "--namespace", NAMESPACE,
                      "--kube-version", KUBE_VERSION, "--values", helm.values_file(values))
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
def test_every_object_is_valid_against_kubernetes_1_34_strict(helm: HelmRunner,
                                                              combination: str) -> None:
    objects = helm.render(combination)
    assert objects
    for rendered in objects:
        if rendered.obj["apiVersion"] in (CERT_MANAGER_API, MONITORING_API):
            # No schema of cert-manager's or the Prometheus Operator's CRDs ships with
            # kubernetes_validate; the cert-manager tests below and test_monitoring.py check
            # those objects field by field.
            continue
        try:
            kubernetes_validate.validate(rendered.obj, "1.34", strict=True)
        except kubernetes_validate.ValidationError as err:
            path = ".".join(str(p) for p in err.path)
            pytest.fail(f"{rendered.source}: {rendered.kind}/{rendered.name}: {path}: "
                        f"{err.message}")


def test_chart_refuses_kubernetes_older_than_1_34(helm: HelmRunner) -> None:
    result = helm.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                      "--kube-version", "1.33.5")
    assert result.returncode != 0
    assert "chart requires kubeVersion: >=1.34.0-0" in result.stderr


def test_chart_accepts_vendor_builds_of_1_34(helm: HelmRunner) -> None:
    result = helm.run("template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                      "--kube-version", "v1.34.1-gke.1200")
    assert result.returncode == 0, result.stderr


# Structure of the chart ---------------------------------------------------------------------


def template_files() -> list[str]:
    root = CHART / "templates"
    return sorted(str(p.relative_to(root)) for p in root.rglob("*")
                  if p.is_file() and p.suffix == ".yaml")


def test_each_template_file_renders_one_object_at_most(helm: HelmRunner) -> None:
    rendered_somewhere: set[str] = set()
    for combination in COMBINATIONS:
        counts = Counter(r.source for r in helm.render(combination))
        crowded = {source: n for source, n in counts.items() if n > 1}
        assert not crowded, f"{combination}: template files with several objects: {crowded}"
        rendered_somewhere |= set(counts)
    # Every template renders in some combination (no dead files), except the validation.
    assert sorted(rendered_somewhere) == [f for f in template_files() if f != "validate.yaml"]


def test_object_names_are_unique_per_kind_and_namespace(helm: HelmRunner) -> None:
    for combination in COMBINATIONS:
        keys = Counter((r.kind, r.obj["metadata"].get("namespace"), r.name)
                       for r in helm.render(combination))
        assert [k for k, n in keys.items() if n > 1] == [], combination


# The one pair of objects outside the release namespace: the node plugin's right to record
# Events about its Node where Node Events live.
IN_DEFAULT = {("Role", "node-plugin/events-role.yaml"),
              ("RoleBinding", "node-plugin/events-rolebinding.yaml")}


def test_namespaced_objects_live_in_the_release_namespace(helm: HelmRunner) -> None:
    cluster_wide = {"ClusterRole", "ClusterRoleBinding", "DeviceClass",
                    "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
                    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}
    for combination in COMBINATIONS:
        for r in helm.render(combination):
            namespace = r.obj["metadata"].get("namespace")
            expected = (None if r.kind in cluster_wide else
                        "default" if (r.kind, r.source) in IN_DEFAULT else NAMESPACE)
            assert namespace == expected, (r.source, combination)


def _key_lines(node: yaml.Node, path: str = "") -> Iterator[tuple[str, int]]:
    """(dotted path, line) of every mapping key reached through mappings only: entries of a
    list are examples of one value, described by the comment of the list's key."""
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            dotted = f"{path}.{key.value}" if path else str(key.value)
            yield dotted, key.start_mark.line
            yield from _key_lines(value, dotted)


def test_every_value_is_commented() -> None:
    text = (CHART / "values.yaml").read_text()
    lines = text.splitlines()
    uncommented = []
    root = yaml.compose(text)
    assert root is not None
    for dotted, line in _key_lines(root):
        previous = lines[line - 1].strip() if line > 0 else ""
        if not previous.startswith("#") and " #" not in lines[line]:
            uncommented.append(f"{dotted} (line {line + 1})")
    assert uncommented == []


def test_every_value_is_in_the_schema() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    missing = []

    def walk(value: Any, node: Object, path: str) -> None:
        if not isinstance(value, dict) or "properties" not in node:
            return
        for key, item in value.items():
            if key not in node["properties"]:
                missing.append(f"{path}{key}")
            else:
                walk(item, node["properties"][key], f"{path}{key}.")

    walk(values, schema, "")
    assert missing == []
    assert schema.get("additionalProperties") is False


def test_schema_offers_exactly_the_allocators_policies() -> None:
    from dra_gateway.allocator.planner import STRATEGIES

    schema = json.loads((CHART / "values.schema.json").read_text())
    policy = schema["properties"]["allocator"]["properties"]["policy"]
    assert sorted(policy["enum"]) == sorted(STRATEGIES)
    strategy = schema["properties"]["allocator"]["properties"]["strategy"]
    assert sorted(strategy["enum"]) == sorted(STRATEGIES)


@pytest.mark.parametrize(("allocator", "expected"), [
    ({"strategy": "binpack"}, "binpack"),
    ({"policy": "spread"}, "spread"),  # the value's former name is still honoured
    ({"strategy": "binpack", "policy": "spread"}, "spread"),  # and wins when set
])
def test_the_allocators_packing_strategy_comes_from_strategy_or_its_former_name_policy(
        helm: HelmRunner, allocator: Object, expected: str) -> None:
    result = helm.template({"allocator": allocator})
    assert result.returncode == 0, result.stderr
    args = container(parse_render(result.stdout), "Deployment", "allocator")["args"]
    assert args[args.index("--strategy") + 1] == expected
    assert "--policy" not in args


def test_the_allocators_workers_come_from_allocator_workers(helm: HelmRunner) -> None:
    args = container(helm.render("default"), "Deployment", "allocator")["args"]
    assert args[args.index("--workers") + 1] == "16"
    result = helm.template({"allocator": {"workers": 32}})
    assert result.returncode == 0, result.stderr
    args = container(parse_render(result.stdout), "Deployment", "allocator")["args"]
    assert args[args.index("--workers") + 1] == "32"
    refused = helm.template({"allocator": {"workers": 0}})
    assert refused.returncode != 0
    assert "/allocator/workers" in refused.stderr


def test_schema_refuses_an_unknown_value_with_its_path(helm: HelmRunner) -> None:
    result = helm.template({"webhook": {"replica": 3}, "certificates": {"mode": "vault"}})
    assert result.returncode != 0
    assert "at '/webhook': additional properties 'replica' not allowed" in result.stderr
    assert "value must be one of 'helm', 'cert-manager', 'secret'" in result.stderr


# The validation template ---------------------------------------------------------------------


def test_validation_lists_every_problem_with_its_fix(helm: HelmRunner) -> None:
    result = helm.template({
        "certificates": {"mode": "secret"},
        "webhook": {"replicas": 2, "podDisruptionBudget": {"minAvailable": 2}},
        "nodePlugin": {"discovery": "inventory"},
    })
    assert result.returncode != 0
    assert "3 problems in the values of dra-gateway:\n" in result.stderr
    assert ("- certificates.secret.name: empty with certificates.mode=secret; create a "
            "kubernetes.io/tls Secret with tls.crt and tls.key in namespace dra-gateway and set "
            "certificates.secret.name to its name, or use certificates.mode=helm") in result.stderr
    assert ("- webhook.podDisruptionBudget.minAvailable: 2 with webhook.replicas 2 would block "
            "every node drain; set minAvailable below replicas (e.g. replicas 2, minAvailable 1) "
            "or podDisruptionBudget.enabled=false") in result.stderr
    assert ("- nodePlugin.inventory: empty with nodePlugin.discovery=inventory; set it to an "
            "inventory document (gpus: [...]) or use nodePlugin.discovery=nvml") in result.stderr


@pytest.mark.parametrize(
    ("values", "extra", "namespace", "message"),
    [
        pytest.param({"certificates": {"mode": "cert-manager"}}, (), NAMESPACE,
                     "certificates.mode: cert-manager, but the cluster does not serve "
                     "cert-manager.io/v1; install cert-manager first, or use "
                     "certificates.mode=helm", id="cert-manager-missing"),
        pytest.param({"certificates": {"mode": "secret", "secret": {"name": "tls"}}}, (),
                     NAMESPACE,
                     "certificates.secret.caBundle: empty and Secret dra-gateway/tls has no "
                     "ca.crt (or cannot be read, as in helm template); set "
                     "certificates.secret.caBundle", id="secret-without-ca"),
        pytest.param({"nodePlugin": {"inventory": INVENTORY}}, (), NAMESPACE,
                     "nodePlugin.inventory: set, but nodePlugin.discovery is nvml and would "
                     "ignore it", id="inventory-without-inventory-discovery"),
        pytest.param({"nodePlugin": {"discovery": "inventory", "inventory": INVENTORY,
                                     "migOnDemand": {"enabled": True}}}, (), NAMESPACE,
                     "nodePlugin.migOnDemand.enabled: true with nodePlugin.discovery=inventory; "
                     "instances are made through NVML, so use nodePlugin.discovery=nvml or set "
                     "migOnDemand.enabled=false", id="mig-on-demand-without-nvml"),
        pytest.param({"allocator": {"replicas": 1}}, (), NAMESPACE,
                     "allocator.podDisruptionBudget.minAvailable: 1 with allocator.replicas 1 "
                     "would block every node drain", id="allocator-budget"),
        pytest.param({"certificates": {"helm": {"validityDays": 30, "renewBeforeDays": 30}}},
                     (), NAMESPACE,
                     "certificates.helm.renewBeforeDays: 30 is not below "
                     "certificates.helm.validityDays 30, so every upgrade would renew the "
                     "certificate and roll the webhook", id="renewal-window-covers-validity"),
        pytest.param({"webhook": {"rollingUpdate": {"maxUnavailable": "0%", "maxSurge": 0}}},
                     (), NAMESPACE,
                     "webhook.rollingUpdate: maxUnavailable and maxSurge are both 0, so a "
                     "rollout could replace no pod; set maxSurge to 1 (a new webhook pod is "
                     "ready before an old one stops)", id="rollout-that-cannot-move"),
        pytest.param({}, (), "default",
                     "release namespace default: the webhook never sees pods of its own "
                     "namespace, so pods there would not be translated; install into a namespace "
                     "of its own: helm install dra-gateway helm/dra-gateway -n dra-gateway "
                     "--create-namespace", id="default-namespace"),
    ],
)
def test_validation_refuses_a_combination_that_cannot_work(
        helm: HelmRunner, values: Object, extra: tuple[str, ...], namespace: str,
        message: str) -> None:
    result = helm.template(values, *extra, namespace=namespace)
    assert result.returncode != 0
    assert "1 problem in the values of dra-gateway:\n- " + message in result.stderr


# RBAC -----------------------------------------------------------------------------------------
# What each component's code sends through the cluster port (kube/cluster/port.py; its informers
# list and watch), verb for verb: a grant no code uses is a finding here, and the e2e tier's
# test_least_privilege.py reads the same rights back from a real API server.

Grant = tuple[str, str, str, str, str]  # (scope, apiGroup, resource, verb, resourceName or "*")

NS = "Role"
CLUSTER = "ClusterRole"
EVENTS_CREATE = {(CLUSTER, "", "events", "create", "*")}


def _grants(scope: str, groups: list[str], resources: list[str], verbs: list[str],
            names_: list[str] | None = None) -> set[Grant]:
    return {(scope, g, r, v, n) for g in groups for r in resources for v in verbs
            for n in (names_ or ["*"])}


EXPECTED_RBAC: dict[str, set[Grant]] = {
    "webhook": (
        _grants(NS, [""], ["configmaps"], ["list", "watch"])  # an informer of rules
        | _grants(CLUSTER, ["resource.k8s.io"], ["resourceclaimtemplates"], ["get", "create"])
        | _grants(CLUSTER, ["resource.k8s.io"], ["resourceclaims"], ["get"])
        | _grants(CLUSTER, ["resource.k8s.io"], ["deviceclasses"], ["list", "watch"])
        | _grants(CLUSTER, ["dra-gateway.io"], ["gpuquotas", "gpusharingpolicies"],
                  ["list", "watch"])
        | _grants(CLUSTER, [""], ["namespaces"], ["list", "watch"])
        # The gateway driver's slices, for the models a request can reach (allowedModels).
        | _grants(CLUSTER, ["resource.k8s.io"], ["resourceslices"], ["list", "watch"])
        # An Event on pods left gated while no allocator leads: the allocator's Lease, by
        # name, and the pods bound to no node (webhook.gatedEventAfterSeconds; 0 drops both).
        | _grants(NS, ["coordination.k8s.io"], ["leases"], ["list", "watch"],
                  [names.ALLOCATOR_LEASE])
        | _grants(CLUSTER, [""], ["pods"], ["list", "watch"])
        # Its own two configurations, read and updated by name (webhook/config.py).
        | _grants(CLUSTER, ["admissionregistration.k8s.io"],
                  ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"],
                  ["get", "update"], [RELEASE])
        | EVENTS_CREATE
    ),
    "allocator": (
        # Patch only (the gate's removal is a JSON patch); which change the
        # ValidatingAdmissionPolicy allocator-pod-writes narrows further.
        _grants(CLUSTER, [""], ["pods"], ["get", "list", "watch", "patch"])
        # Its finalizer and shares annotation by patch; the allocation by a status update,
        # which 1.36 authorises on resourceclaims/binding as well.
        | _grants(CLUSTER, ["resource.k8s.io"], ["resourceclaims"],
                  ["get", "list", "watch", "patch"])
        | _grants(CLUSTER, ["resource.k8s.io"], ["resourceclaims/status",
                                                 "resourceclaims/binding"], ["update"])
        | _grants(CLUSTER, ["resource.k8s.io"], ["resourceslices", "deviceclasses"],
                  ["list", "watch"])
        # An administrator's device taints, added to the slices' devices (from 1.37).
        | _grants(CLUSTER, ["resource.k8s.io"], ["devicetaintrules"], ["list", "watch"])
        | _grants(CLUSTER, [""], ["nodes"], ["list", "watch"])
        | _grants(CLUSTER, [""], ["events"], ["create", "patch"])
        | _grants(CLUSTER, [""], ["pods/status"], ["patch"])
        | _grants(CLUSTER, ["dra-gateway.io"], ["gpuquotas", "gpusharingpolicies"],
                  ["list", "watch"])
        | _grants(CLUSTER, ["dra-gateway.io"], ["gpuquotas/status"], ["patch"])
        | _grants(CLUSTER, [""], ["namespaces"], ["list", "watch"])
        # Volcano's and the coscheduling plugin's PodGroups, for their minMember.
        | _grants(CLUSTER, ["scheduling.volcano.sh", "scheduling.x-k8s.io"], ["podgroups"],
                  ["list", "watch"])
        | _grants(CLUSTER, ["scheduling.k8s.io"], ["podgroups", "workloads"], ["list", "watch"])
        | _grants(CLUSTER, ["jobset.x-k8s.io"], ["jobsets"], ["list", "watch"])
        | _grants(CLUSTER, ["kubeflow.org"], ["pytorchjobs", "tfjobs", "mpijobs", "xgboostjobs",
                                              "paddlejobs", "jaxjobs"], ["list", "watch"])
        | _grants(NS, ["coordination.k8s.io"], ["leases"], ["create"])
        | _grants(NS, ["coordination.k8s.io"], ["leases"], ["get", "update"],
                  ["dra-gateway-allocator"])
        # Defrag's holds and moves (dra-gateway-defrag), read; written with
        # allocator.defrag.enabled or allocator.preemption.enabled (on by default: it holds
        # the devices it frees there), which also evict and read PodDisruptionBudgets.
        | _grants(NS, [""], ["configmaps"], ["get", "list", "watch"], ["dra-gateway-defrag"])
        | _grants(NS, [""], ["configmaps"], ["create"])
        | _grants(NS, [""], ["configmaps"], ["patch"], ["dra-gateway-defrag"])
        | _grants(CLUSTER, [""], ["pods/eviction"], ["create"])
        | _grants(CLUSTER, ["policy"], ["poddisruptionbudgets"], ["list"])
    ),
    "node-plugin": (
        _grants(CLUSTER, ["resource.k8s.io"], ["resourceclaims"], ["get"])
        | _grants(CLUSTER, ["resource.k8s.io"], ["resourceslices"],
                  ["list", "watch", "create", "update", "delete"])
        | _grants(CLUSTER, [""], ["nodes"], ["get"])
        | _grants(CLUSTER, [""], ["nodes/status"], ["patch"])
        # Events on its Node when a device turns unhealthy or healthy again, in namespace
        # default only (the Role node-plugin-events there).
        | _grants(NS, [""], ["events"], ["create"])
    ),
}


def test_each_component_is_granted_exactly_its_verbs(helm: HelmRunner) -> None:
    objects = helm.render("default")
    granted: dict[str, set[Grant]] = defaultdict(set)
    for r in objects:
        if r.kind not in (NS, CLUSTER):
            continue
        component = component_of(r.obj)
        assert component is not None, r.source
        for rule in r.obj["rules"]:
            granted[component] |= _grants(r.kind, rule["apiGroups"], rule["resources"],
                                          rule["verbs"], rule.get("resourceNames"))
    for component, expected in EXPECTED_RBAC.items():
        assert sorted(granted[component] - expected) == [], f"{component}: more than needed"
        assert sorted(expected - granted[component]) == [], f"{component}: missing grants"
    assert set(granted) == set(EXPECTED_RBAC)


def test_without_gated_pod_events_the_webhook_neither_watches_the_lease_nor_pods(
        helm: HelmRunner) -> None:
    from dra_gateway.cli import build_parser

    result = helm.template({"webhook": {"gatedEventAfterSeconds": 0}})
    assert result.returncode == 0, result.stderr
    objects = parse_render(result.stdout)
    granted: set[Grant] = set()
    for r in objects:
        if r.kind in (NS, CLUSTER) and component_of(r.obj) == "webhook":
            for rule in r.obj["rules"]:
                granted |= _grants(r.kind, rule["apiGroups"], rule["resources"], rule["verbs"],
                                   rule.get("resourceNames"))
    assert granted == EXPECTED_RBAC["webhook"] - (
        _grants(NS, ["coordination.k8s.io"], ["leases"], ["list", "watch"],
                [names.ALLOCATOR_LEASE])
        | _grants(CLUSTER, [""], ["pods"], ["list", "watch"]))
    args = container(objects, "Deployment", "webhook")["args"]
    assert args[args.index("--gated-event-after") + 1] == "0s"
    assert build_parser().parse_args(args).gated_event_after == 0
    refused = helm.template({"webhook": {"gatedEventAfterSeconds": -1}})
    assert refused.returncode != 0
    assert "gatedEventAfterSeconds" in refused.stderr, refused.stderr


def test_each_role_is_bound_to_its_own_components_service_account(helm: HelmRunner) -> None:
    objects = helm.render("default")
    accounts = {component_of(r.obj): r.name for r in by_kind(objects, "ServiceAccount")}
    assert set(accounts) == set(EXPECTED_RBAC)
    bindings = by_kind(objects, "ClusterRoleBinding") + by_kind(objects, "RoleBinding")
    bound = {(r.obj["roleRef"]["kind"], r.obj["metadata"].get("namespace"),
              r.obj["roleRef"]["name"]) for r in bindings}
    roles = {(r.kind, r.obj["metadata"].get("namespace"), r.name)
             for r in by_kind(objects, NS) + by_kind(objects, CLUSTER)}
    assert bound == roles
    for r in bindings:
        component = component_of(r.obj)
        assert r.obj["roleRef"]["name"] in (accounts[component], f"{accounts[component]}-events")
        assert r.obj["subjects"] == [{"kind": "ServiceAccount", "name": accounts[component],
                                      "namespace": NAMESPACE}]
    for kind, component in (("Deployment", "webhook"), ("Deployment", "allocator"),
                            ("DaemonSet", "node-plugin")):
        spec = one(objects, kind, component)["spec"]["template"]["spec"]
        assert spec["serviceAccountName"] == accounts[component]


# Webhook and certificates ---------------------------------------------------------------------


RULES_HOOK = "rules.dra-gateway.io"
CLAIMS_HOOK = "claims.dra-gateway.io"


def _webhooks(objects: list[Rendered]) -> list[tuple[Object, Object]]:
    """The pod webhooks (mutate, validate); the rules ConfigMap check is `_rules_hook`'s, the
    claims check `_claims_hook`'s."""
    return [(r.obj, hook) for kind in ("MutatingWebhookConfiguration",
                                       "ValidatingWebhookConfiguration")
            for r in by_kind(objects, kind) for hook in r.obj["webhooks"]
            if hook["name"] not in (RULES_HOOK, CLAIMS_HOOK)]


def _claims_hook(objects: list[Rendered]) -> Object:
    (hook,) = [h for h in one(objects, "ValidatingWebhookConfiguration")["webhooks"]
               if h["name"] == CLAIMS_HOOK]
    result: Object = hook
    return result


def _rules_hook(objects: list[Rendered]) -> Object:
    (hook,) = [h for h in one(objects, "ValidatingWebhookConfiguration")["webhooks"]
               if h["name"] == RULES_HOOK]
    result: Object = hook
    return result


def test_rules_config_maps_are_checked_when_written_in_the_release_namespace(
        helm: HelmRunner) -> None:
    from dra_gateway.translator.rules import load_rules
    from dra_gateway.webhook.config import configurations

    objects = helm.render("default")
    hook = _rules_hook(objects)
    _, webhook_side = configurations(load_rules(), service_namespace=NAMESPACE,
                                     service_name=f"{RELEASE}-webhook", ca_bundle=None)
    (expected,) = [h for h in webhook_side["webhooks"] if h["name"] == RULES_HOOK]
    # Same webhook as the webhook's own configuration prints, clientConfig aside.
    assert {k: v for k, v in hook.items() if k != "clientConfig"} == {
        k: v for k, v in expected.items() if k != "clientConfig"}
    assert hook["clientConfig"]["service"]["path"] == "/validate-rules"
    assert hook["clientConfig"]["caBundle"] == one(objects, "Secret")["data"]["ca.crt"]


def test_native_gateway_claims_and_templates_are_checked_at_create(helm: HelmRunner) -> None:
    from dra_gateway.translator.rules import load_rules
    from dra_gateway.webhook.config import claim_match_conditions, configurations

    objects = helm.render("default")
    hook = _claims_hook(objects)
    _, webhook_side = configurations(load_rules(), service_namespace=NAMESPACE,
                                     service_name=f"{RELEASE}-webhook", ca_bundle=None)
    (expected,) = [h for h in webhook_side["webhooks"] if h["name"] == CLAIMS_HOOK]
    # Same webhook as the webhook's own configuration prints and keeps, clientConfig and the
    # order of the namespaces left out aside: the conditions the chart installs are those
    # reconcile would write.
    aside = ("clientConfig", "namespaceSelector")
    assert {k: v for k, v in hook.items() if k not in aside} == {
        k: v for k, v in expected.items() if k not in aside}
    assert hook["matchConditions"] == claim_match_conditions()
    assert hook["rules"] == [{"apiGroups": ["resource.k8s.io"], "apiVersions": ["v1"],
                              "operations": ["CREATE"],
                              "resources": ["resourceclaims", "resourceclaimtemplates"],
                              "scope": "Namespaced"}]
    (validate,) = [h for _, h in _webhooks(objects) if h["name"] == "validate.dra-gateway.io"]
    assert hook["clientConfig"] == validate["clientConfig"]
    # Every namespace the pod webhooks may see, but those whose translation is disabled.
    assert hook["namespaceSelector"] == {"matchExpressions": [
        validate["namespaceSelector"]["matchExpressions"][0],
        {"key": "dra-gateway.io/translation", "operator": "NotIn", "values": ["disabled"]}]}
    # The namespaces left out follow webhook.excludeNamespaces like the pod webhooks'.
    hook = _claims_hook(helm.render("hardened-node-plugin"))
    assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == [
        "kube-system", NAMESPACE, "monitoring"]


def test_webhook_configurations_send_pod_creates_safely(helm: HelmRunner) -> None:
    objects = helm.render("default")
    hooks = _webhooks(objects)
    assert [(c["kind"], h["name"], h["clientConfig"]["service"]["path"]) for c, h in hooks] == [
        ("MutatingWebhookConfiguration", "mutate.dra-gateway.io", "/mutate"),
        ("MutatingWebhookConfiguration", "enabled.mutate.dra-gateway.io", "/mutate"),
        ("MutatingWebhookConfiguration", "audit.mutate.dra-gateway.io", "/mutate/audit"),
        ("MutatingWebhookConfiguration", "unknown-mode.mutate.dra-gateway.io",
         "/mutate/unknown-mode"),
        ("ValidatingWebhookConfiguration", "validate.dra-gateway.io", "/validate"),
        ("ValidatingWebhookConfiguration", "enabled.validate.dra-gateway.io", "/validate"),
        ("ValidatingWebhookConfiguration", "audit.validate.dra-gateway.io", "/validate/audit"),
        ("ValidatingWebhookConfiguration", "unknown-mode.validate.dra-gateway.io",
         "/validate/audit"),
    ]
    service = one(objects, "Service", "webhook")
    for config, hook in hooks:
        assert config["metadata"]["name"] == RELEASE
        assert hook["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"],
                                  "operations": ["CREATE"], "resources": ["pods"],
                                  "scope": "Namespaced"}]
        assert hook["sideEffects"] == "NoneOnDryRun"
        assert hook["failurePolicy"] == "Fail"
        assert hook["timeoutSeconds"] == 5
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["namespaceSelector"]["matchExpressions"][0] == {
            "key": "kubernetes.io/metadata.name", "operator": "NotIn",
            "values": ["kube-system", NAMESPACE]}
        assert [c["name"] for c in hook["matchConditions"]] == ["gpu-pods"]
        assert hook["clientConfig"]["service"] == {
            "name": service["metadata"]["name"], "namespace": NAMESPACE,
            "path": hook["clientConfig"]["service"]["path"], "port": 443}
    assert all(h.get("reinvocationPolicy") == ("IfNeeded" if c["kind"].startswith("Mutating")
                                                 else None) for c, h in hooks)


@pytest.mark.parametrize("default", ["enabled", "audit"])
def test_pod_webhooks_per_translation_mode_are_those_the_webhook_writes(
        helm: HelmRunner, default: str) -> None:
    from dra_gateway.translator.rules import load_rules
    from dra_gateway.webhook.config import configurations

    result = helm.template({"webhook": {"translation": {"default": default}}})
    assert result.returncode == 0, result.stderr
    objects = parse_render(result.stdout)
    written = configurations(load_rules(), service_namespace=NAMESPACE,
                             service_name=f"{RELEASE}-webhook", ca_bundle=None,
                             default_translation=default)
    def canonical(selector: Object) -> list[Object]:
        # The order of the namespaces left out is the chart's own.
        return [{**e, "values": sorted(e["values"])} if "values" in e else e
                for e in selector["matchExpressions"]]

    expected = [(h["name"], h["clientConfig"]["service"]["path"],
                 canonical(h["namespaceSelector"]))
                for config in written for h in config["webhooks"]
                if h["name"] not in (RULES_HOOK, CLAIMS_HOOK)]
    assert [(h["name"], h["clientConfig"]["service"]["path"], canonical(h["namespaceSelector"]))
            for _, h in _webhooks(objects)] == expected


def test_an_unknown_default_translation_mode_fails_with_the_fix(helm: HelmRunner) -> None:
    # The schema says so before any template runs.
    result = helm.template({"webhook": {"translation": {"default": "disabled"}}})
    assert result.returncode != 0
    assert "/webhook/translation/default" in result.stderr
    assert "'enabled', 'audit'" in result.stderr


def _pod(*, limits: dict[str, str] | None = None, requests: dict[str, str] | None = None,
         init: bool = False, annotations: dict[str, str] | None = None,
         claims: bool = False, gate: str | None = None) -> Object:
    resources: Object = {}
    if limits:
        resources["limits"] = limits
    if requests:
        resources["requests"] = requests
    worker: Object = {"name": "main", "image": "busybox"}
    spec: Object = {"containers": [dict(worker)]}
    if resources:
        (spec.setdefault("initContainers", []) if init else spec["containers"]).append(
            {"name": "gpu", "image": "cuda", "resources": resources})
    if claims:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]
    if gate:
        spec["schedulingGates"] = [{"name": gate}]
    metadata: Object = {"name": "p", "namespace": "team-a"}
    if annotations:
        metadata["annotations"] = annotations
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


def _sent(expression: str, pod: Object) -> bool:
    import cel

    return bool(cel.evaluate(expression, {"object": pod}))


def _chart_expression(helm: HelmRunner) -> str:
    _, hook = _webhooks(helm.render("default"))[0]
    conditions = hook["matchConditions"]
    assert len(conditions) == 1
    return str(conditions[0]["expression"])


def test_default_match_condition_leaves_ordinary_pods_alone(helm: HelmRunner) -> None:
    expression = _chart_expression(helm)
    ordinary = [
        _pod(),
        _pod(limits={"cpu": "2", "memory": "1Gi", "hugepages-2Mi": "64Mi"},
             requests={"ephemeral-storage": "1Gi"}),
        _pod(annotations={"kubectl.kubernetes.io/default-container": "main",
                          "prometheus.io/scrape": "true"}),
        _pod(gate="example.com/other-gate"),
    ]
    assert [_sent(expression, pod) for pod in ordinary] == [False] * len(ordinary)


def test_default_match_condition_covers_what_the_webhook_will_select(helm: HelmRunner) -> None:
    # Until the webhook narrows the conditions to its rules, the chart's must send at least
    # every pod the webhook's own expression (built-in rules) would.
    from dra_gateway.translator.rules import load_rules
    from dra_gateway.webhook.config import MATCH_CONDITION_NAME, match_expression

    assert MATCH_CONDITION_NAME == "gpu-pods"
    rules = load_rules()
    webhook_expression = match_expression(rules)
    resources = sorted(rules.legacy_resource_names()) + [
        f"{prefix}1g.10gb" for prefix in sorted(rules.legacy_resource_prefixes())]
    pods = [_pod(limits={name: "1"}) for name in resources]
    pods += [_pod(requests={name: "1"}, init=True) for name in resources]
    pods += [_pod(annotations={key: "x"}) for key in sorted(rules.annotation_keys())]
    pods += [_pod(annotations={names.ANNOTATION_TRANSLATED: "x"}), _pod(claims=True),
             _pod(gate=names.SCHEDULING_GATE), _pod(limits={"example.com/fpga": "1"})]
    chart_expression = _chart_expression(helm)
    missed = [pod for pod in pods
              if _sent(webhook_expression, pod) and not _sent(chart_expression, pod)]
    assert missed == []
    assert sum(_sent(webhook_expression, pod) for pod in pods) >= len(resources) * 2


def test_webhook_configurations_have_the_names_the_webhook_reconciles(helm: HelmRunner) -> None:
    from dra_gateway.webhook.settings import MUTATING_CONFIGURATION, VALIDATING_CONFIGURATION

    # Another release name changes every namespaced name but not these two.
    result = helm.run("template", "gpu-gateway", str(CHART), "--namespace", NAMESPACE,
                      "--kube-version", KUBE_VERSION)
    assert result.returncode == 0, result.stderr
    objects = parse_render(result.stdout)
    assert one(objects, "MutatingWebhookConfiguration")["metadata"]["name"] == (
        MUTATING_CONFIGURATION)
    assert one(objects, "ValidatingWebhookConfiguration")["metadata"]["name"] == (
        VALIDATING_CONFIGURATION)
    rules = one(objects, "ClusterRole", "webhook")["rules"]
    named = [rule for rule in rules if "resourceNames" in rule]
    assert [rule["resourceNames"] for rule in named] == [
        sorted({MUTATING_CONFIGURATION, VALIDATING_CONFIGURATION})]
    service = one(objects, "Service", "webhook")
    assert service["metadata"]["name"] == "gpu-gateway-dra-gateway-webhook"


def test_webhook_url_points_both_configurations_outside_the_cluster(helm: HelmRunner) -> None:
    hooks = _webhooks(helm.render("external-webhook"))
    assert [hook["clientConfig"] for _, hook in hooks] == [
        {"url": f"https://localhost:9443{path}", "caBundle": CA_BUNDLE} for path in (
            "/mutate", "/mutate", "/mutate/audit", "/mutate/unknown-mode",
            "/validate", "/validate", "/validate/audit", "/validate/audit")]
    assert _rules_hook(helm.render("external-webhook"))["clientConfig"] == {
        "url": "https://localhost:9443/validate-rules", "caBundle": CA_BUNDLE}


def test_schema_refuses_a_webhook_url_the_api_server_would_not_call(helm: HelmRunner) -> None:
    for url in ("http://localhost:9443", "https://localhost:9443/?q=1", "localhost:9443"):
        result = helm.template({"webhook": {"url": url}})
        assert result.returncode != 0, url
        assert "/webhook/url" in result.stderr, result.stderr


def test_excluded_namespaces_add_to_the_fixed_ones(helm: HelmRunner) -> None:
    for _, hook in _webhooks(helm.render("hardened-node-plugin")):
        values = hook["namespaceSelector"]["matchExpressions"][0]["values"]
        assert values == ["kube-system", NAMESPACE, "monitoring"]


def test_webhook_service_reaches_the_https_port_of_its_pods(helm: HelmRunner) -> None:
    objects = helm.render("default")
    service = one(objects, "Service", "webhook")
    deployment = one(objects, "Deployment", "webhook")
    assert service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]
    assert service["spec"]["ports"] == [{"name": "https", "port": 443, "targetPort": "https",
                                         "protocol": "TCP"}]
    webhook = container(objects, "Deployment", "webhook")
    assert webhook["ports"] == [{"name": "https", "containerPort": 8443, "protocol": "TCP"},
                                {"name": "probes", "containerPort": 8080, "protocol": "TCP"}]
    # Probes in plain HTTP on their own port: client certificates may be required on https.
    assert webhook["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "probes",
                                                    "scheme": "HTTP"}
    assert webhook["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "probes",
                                                   "scheme": "HTTP"}
    assert deployment["spec"]["replicas"] == 2
    budget = one(objects, "PodDisruptionBudget", "webhook")
    assert budget["spec"] == {"minAvailable": 1,
                              "selector": deployment["spec"]["selector"]}


def test_an_upgrade_never_leaves_fewer_ready_webhooks_than_replicas(helm: HelmRunner) -> None:
    objects = helm.render("default")
    deployment = one(objects, "Deployment", "webhook")["spec"]
    # failurePolicy Fail: any moment without a ready webhook refuses every GPU pod creation.
    assert one(objects, "MutatingWebhookConfiguration")["webhooks"][0]["failurePolicy"] == "Fail"
    assert deployment["replicas"] == 2
    assert deployment["strategy"] == {"type": "RollingUpdate",
                                      "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    # A drain or an eviction may take one of the two, never both.
    budget = one(objects, "PodDisruptionBudget", "webhook")["spec"]
    assert budget == {"minAvailable": 1, "selector": deployment["selector"]}
    result = helm.template({"webhook": {"replicas": 4, "rollingUpdate": {
        "maxUnavailable": "25%", "maxSurge": "50%"}}})
    assert result.returncode == 0, result.stderr
    (custom,) = [r.obj for r in parse_render(result.stdout)
                 if r.kind == "Deployment" and component_of(r.obj) == "webhook"]
    assert custom["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": "25%",
                                                           "maxSurge": "50%"}


def test_schema_refuses_a_rollout_bound_that_is_neither_a_count_nor_a_percentage(
        helm: HelmRunner) -> None:
    for bad in (-1, "one", "25"):
        result = helm.template({"webhook": {"rollingUpdate": {"maxUnavailable": 0,
                                                              "maxSurge": bad}}})
        assert result.returncode != 0, bad
        assert "/webhook/rollingUpdate/maxSurge" in result.stderr, result.stderr


def test_helm_mode_certificate_is_one_ca_shared_by_secret_and_configurations(
        helm: HelmRunner) -> None:
    objects = helm.render("default")
    secret = one(objects, "Secret")
    assert secret["type"] == "kubernetes.io/tls"
    bundles = {hook["clientConfig"]["caBundle"] for _, hook in _webhooks(objects)}
    assert bundles == {secret["data"]["ca.crt"]}
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    leaf = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    leaf.verify_directly_issued_by(ca)
    host = f"{RELEASE}-webhook.{NAMESPACE}.svc"
    sans = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [
        f"{RELEASE}-webhook", f"{RELEASE}-webhook.{NAMESPACE}", host]
    annotations = secret["metadata"]["annotations"]
    assert annotations["dra-gateway.io/issued-for"] == host
    not_after = datetime.datetime.fromisoformat(annotations["dra-gateway.io/not-after"])
    assert abs(not_after - leaf.not_valid_after_utc) < datetime.timedelta(hours=1)
    # cert-manager's order of lifetimes: a 90-day serving certificate, a longer-lived CA.
    left = leaf.not_valid_after_utc - datetime.datetime.now(datetime.UTC)
    assert datetime.timedelta(days=89) < left <= datetime.timedelta(days=90)
    assert ca.not_valid_after_utc - datetime.datetime.now(datetime.UTC) > datetime.timedelta(
        days=3649)
    deployment = one(objects, "Deployment", "webhook")
    volumes = deployment["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": secret["metadata"]["name"]}} in volumes
    # The pods roll when (and only when) the certificate changes.
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert set(annotations) == {"checksum/tls"}


@pytest.mark.parametrize("combination", ["cert-manager", "cert-manager-cluster-issuer"])
def test_cert_manager_mode_issues_the_certificate_and_injects_its_ca(
        helm: HelmRunner, combination: str) -> None:
    objects = helm.render(combination)
    assert by_kind(objects, "Secret") == []
    certificate = next(c.obj for c in by_kind(objects, "Certificate")
                       if not c.obj["spec"].get("isCA"))
    assert certificate["apiVersion"] == CERT_MANAGER_API
    service = f"{RELEASE}-webhook"
    spec = certificate["spec"]
    assert spec["dnsNames"] == [service, f"{service}.{NAMESPACE}",
                                f"{service}.{NAMESPACE}.svc"]
    assert set(spec["usages"]) == {"server auth", "digital signature"}
    for config, hook in _webhooks(objects):
        assert config["metadata"]["annotations"] == {
            "cert-manager.io/inject-ca-from": f"{NAMESPACE}/{certificate['metadata']['name']}"}
        assert "caBundle" not in hook["clientConfig"]
    volumes = one(objects, "Deployment", "webhook")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": spec["secretName"]}} in volumes
    issuers = {i.name: i.obj["spec"] for i in by_kind(objects, "Issuer")}
    if combination == "cert-manager":
        # A self-signed Issuer signs a long-lived CA, whose Issuer signs the serving certificate:
        # its renewals then leave the injected caBundle alone (a self-signed serving certificate
        # is its own CA, and every renewal failed admissions until the pods reloaded it).
        assert len(issuers) == 2
        self_signed = next(name for name, s in issuers.items() if s == {"selfSigned": {}})
        ca_issuer = next(name for name, s in issuers.items() if "ca" in s)
        ca = next(c.obj for c in by_kind(objects, "Certificate")
                  if c.obj["spec"].get("isCA"))
        assert ca["spec"]["issuerRef"] == {"name": self_signed, "kind": "Issuer",
                                           "group": "cert-manager.io"}
        assert issuers[ca_issuer] == {"ca": {"secretName": ca["spec"]["secretName"]}}
        assert ca["spec"]["privateKey"]["rotationPolicy"] == "Never"
        assert "cert sign" in ca["spec"]["usages"]
        assert spec["issuerRef"] == {"name": ca_issuer, "kind": "Issuer",
                                     "group": "cert-manager.io"}
        assert ca["spec"]["secretName"] != spec["secretName"]
    else:
        assert issuers == {}
        assert spec["issuerRef"] == {"name": "corp-ca", "kind": "ClusterIssuer",
                                     "group": "cert-manager.io"}


def test_existing_secret_mode_mounts_it_and_trusts_the_given_ca(helm: HelmRunner) -> None:
    objects = helm.render("existing-secret")
    assert by_kind(objects, "Secret") == []
    assert by_kind(objects, "Certificate") == []
    assert {hook["clientConfig"]["caBundle"] for _, hook in _webhooks(objects)} == {CA_BUNDLE}
    volumes = one(objects, "Deployment", "webhook")["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "corp-webhook-tls"}} in volumes


# Containers -----------------------------------------------------------------------------------


def test_webhook_and_allocator_run_unprivileged_on_a_read_only_root(helm: HelmRunner) -> None:
    objects = helm.render("default")
    for component in ("webhook", "allocator"):
        context = container(objects, "Deployment", component)["securityContext"]
        assert context["runAsNonRoot"] is True
        assert context["runAsUser"] != 0
        assert context["readOnlyRootFilesystem"] is True
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}


def test_command_lines_are_those_of_the_components(helm: HelmRunner) -> None:
    objects = helm.render("default")
    assert container(objects, "Deployment", "webhook")["args"] == [
        "webhook", "--listen", "0.0.0.0:8443", "--tls-dir", "/tls", "--cluster", "kube",
        "--namespace", NAMESPACE, "--log-level", "info", "--probe-listen", "0.0.0.0:8080",
        "--review-deadline", "4", "--gated-event-after", "120s", "--pod-opt-out", "labelled"]
    assert container(objects, "Deployment", "allocator")["args"] == [
        "allocator", "--cluster", "kube", "--namespace", NAMESPACE, "--strategy", "default",
        "--workers", "16", "--metrics-address", ":8080"]
    assert container(objects, "DaemonSet", "node-plugin")["args"] == [
        "node-plugin", "serve", "--nvml", "--node-name", "$(NODE_NAME)",
        "--instance", "$(POD_UID)", "--cluster", "kube",
        "--plugins-dir", "/var/lib/kubelet/plugins",
        "--registry-dir", "/var/lib/kubelet/plugins_registry", "--cdi-dir", "/var/run/cdi",
        "--state-dir", "/var/lib/dra-gateway", "--sharing", "exclusive",
        "--recovery-seconds", "600", "--admin-check-seconds", "10",
        "--hami-library", "/usr/local/vgpu/libvgpu.so",
        "--metrics-address", ":8080", "--pod-resources-socket",
        "/var/lib/kubelet/pod-resources/kubelet.sock", "--legacy-poll-interval", "2",
        "--log-level", "INFO"]


def test_an_ipv6_listen_address_binds_every_ipv6_address(helm: HelmRunner) -> None:
    from dra_gateway.cli import build_parser

    result = helm.template({"webhook": {"listenAddress": "::"}})
    assert result.returncode == 0, result.stderr
    args = container(parse_render(result.stdout), "Deployment", "webhook")["args"]
    assert args[args.index("--listen") + 1] == "[::]:8443"
    assert build_parser().parse_args(args).listen == ("::", 8443)


@pytest.mark.parametrize("combination", sorted(COMBINATIONS))
@pytest.mark.parametrize(("kind", "component"), [("Deployment", "webhook"),
                                                 ("Deployment", "allocator"),
                                                 ("DaemonSet", "node-plugin")])
def test_command_lines_parse_with_the_dra_gateway_cli(helm: HelmRunner, combination: str,
                                                       kind: str, component: str) -> None:
    from dra_gateway.cli import build_parser

    spec = container(helm.render(combination), kind, component)
    args = [a.replace("$(NODE_NAME)", "node-a") for a in spec["args"]]
    parsed = build_parser().parse_args(args)
    assert callable(parsed.func)


@pytest.mark.parametrize(("value", "flag", "parsed"), [
    (None, None, None), ("auto", None, None), (True, "--consumable-capacity", True),
    (False, "--no-consumable-capacity", False)])
def test_node_plugin_detects_consumable_capacity_unless_a_value_forces_it(
        helm: HelmRunner, value: Any, flag: str | None, parsed: bool | None) -> None:
    from dra_gateway.cli import build_parser

    values = {} if value is None else {"nodePlugin": {"consumableCapacity": value}}
    result = helm.template(values)
    assert result.returncode == 0, result.stderr
    objects = parse_render(result.stdout)
    args = container(objects, "DaemonSet", "node-plugin")["args"]
    assert [a for a in args if a.endswith("consumable-capacity")] == ([flag] if flag else [])
    node_args = [a.replace("$(NODE_NAME)", "node-a") for a in args]
    assert build_parser().parse_args(node_args).consumable_capacity is parsed
    # Detection is a dry-run create of a ResourceSlice: the plugin's role must allow it.
    role = one(objects, CLUSTER, "node-plugin")
    assert any("resourceslices" in rule["resources"] and "create" in rule["verbs"]
               for rule in role["rules"])


@pytest.mark.parametrize(("values", "label"), [
    ({"enabled": True}, "gpu.dra-gateway.io/mig-on-demand"),
    ({"enabled": True, "nodeLabel": ""}, None),
    ({"enabled": True, "nodePrivileged": False}, "gpu.dra-gateway.io/mig-on-demand")])
def test_mig_on_demand_passes_its_flags_and_the_mig_config_capability(
        helm: HelmRunner, values: Object, label: str | None) -> None:
    """On, the plugin gets --mig-on-demand (and the label, unless every node), NVIDIA's runtime
    is told to expose the mig-config capability, and an unprivileged plugin gets CAP_SYS_ADMIN,
    which that capability needs; off (the default), none of it."""
    from dra_gateway.cli import build_parser

    privileged = values.pop("nodePrivileged", True)
    result = helm.template({"nodePlugin": {"migOnDemand": values, "privileged": privileged}})
    assert result.returncode == 0, result.stderr
    plugin = container(parse_render(result.stdout), "DaemonSet", "node-plugin")
    parsed = build_parser().parse_args([a.replace("$(NODE_NAME)", "node-a")
                                        for a in plugin["args"]])
    assert parsed.mig_on_demand is True
    assert parsed.mig_on_demand_label == (label or "")
    assert {"name": "NVIDIA_MIG_CONFIG_DEVICES", "value": "all"} in plugin["env"]
    security = plugin["securityContext"]
    assert security.get("privileged") is True or security["capabilities"]["add"] == ["SYS_ADMIN"]

    default = container(helm.render("default"), "DaemonSet", "node-plugin")
    assert "--mig-on-demand" not in default["args"]
    assert all(e["name"] != "NVIDIA_MIG_CONFIG_DEVICES" for e in default["env"])


def test_schema_refuses_a_consumable_capacity_other_than_auto_true_or_false(
        helm: HelmRunner) -> None:
    result = helm.template({"nodePlugin": {"consumableCapacity": "on"}})
    assert result.returncode != 0
    assert "consumableCapacity" in result.stderr


def test_node_plugin_mounts_host_directories_at_their_host_paths(helm: HelmRunner) -> None:
    objects = helm.render("default")
    plugin = container(objects, "DaemonSet", "node-plugin")
    spec = one(objects, "DaemonSet", "node-plugin")["spec"]["template"]["spec"]
    host_paths = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert set(host_paths.values()) == {"/var/lib/kubelet/plugins_registry",
                                        "/var/lib/kubelet/plugins", "/var/run/cdi",
                                        "/var/lib/dra-gateway",
                                        "/var/lib/kubelet/pod-resources",
                                        # HAMi-core's folder: the plugin looks for the library
                                        "/usr/local/vgpu"}
    mounts = {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}
    for name, path in host_paths.items():
        assert mounts[name] == path
    assert {m["name"]: m.get("readOnly", False) for m in plugin["volumeMounts"]}["hami-core"]
    assert {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}} in (
        plugin["env"])
    assert plugin["securityContext"]["privileged"] is True
    assert spec["priorityClassName"] == "system-cluster-critical"
    # A rolling update starts the new pod beside the old one, each on sockets of its own UID.
    assert one(objects, "DaemonSet", "node-plugin")["spec"]["updateStrategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}}
    assert {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}} in (
        plugin["env"])
    assert plugin["args"][plugin["args"].index("--instance") + 1] == "$(POD_UID)"


def test_node_plugin_reads_the_kubelets_pod_resources_read_only_unless_turned_off(
        helm: HelmRunner) -> None:
    from dra_gateway.cli import build_parser

    plugin = container(helm.render("default"), "DaemonSet", "node-plugin")
    mount = {m["name"]: m for m in plugin["volumeMounts"]}["pod-resources"]
    assert mount == {"name": "pod-resources", "mountPath": "/var/lib/kubelet/pod-resources",
                     "readOnly": True}
    result = helm.template({"nodePlugin": {"kubeletDir": "/data/kubelet/",
                                           "legacyCoexistence": {"pollIntervalSeconds": 0.5}}})
    assert result.returncode == 0, result.stderr
    args = container(parse_render(result.stdout), "DaemonSet", "node-plugin")["args"]
    parsed = build_parser().parse_args([a.replace("$(NODE_NAME)", "n") for a in args])
    assert (parsed.legacy_coexistence, str(parsed.pod_resources_socket),
            parsed.legacy_poll_interval) == (True, "/data/kubelet/pod-resources/kubelet.sock", 0.5)

    result = helm.template({"nodePlugin": {"legacyCoexistence": {"enabled": False}}})
    assert result.returncode == 0, result.stderr
    objects = parse_render(result.stdout)
    plugin = container(objects, "DaemonSet", "node-plugin")
    assert "--no-legacy-coexistence" in plugin["args"]
    assert "--pod-resources-socket" not in plugin["args"]
    volumes = one(objects, "DaemonSet", "node-plugin")["spec"]["template"]["spec"]["volumes"]
    assert "pod-resources" not in {v["name"] for v in volumes}

    result = helm.template({"nodePlugin": {"legacyCoexistence": {"pollIntervalSeconds": 0}}})
    assert result.returncode != 0
    assert "pollIntervalSeconds" in result.stderr


def test_unprivileged_node_plugin_keeps_no_capability(helm: HelmRunner) -> None:
    objects = helm.render("hardened-node-plugin")
    context = container(objects, "DaemonSet", "node-plugin")["securityContext"]
    assert "privileged" not in context
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["allowPrivilegeEscalation"] is False
    spec = one(objects, "DaemonSet", "node-plugin")["spec"]["template"]["spec"]
    assert spec["runtimeClassName"] == "nvidia"
    assert by_kind(objects, "DeviceClass") == []


def test_inventory_mode_publishes_the_inventory_instead_of_nvml(helm: HelmRunner) -> None:
    objects = helm.render("inventory")
    config_map = one(objects, "ConfigMap", "node-plugin")
    assert yaml.safe_load(config_map["data"]["inventory.yaml"]) == INVENTORY
    plugin = container(objects, "DaemonSet", "node-plugin")
    assert "--nvml" not in plugin["args"]
    index = plugin["args"].index("--inventory")
    assert plugin["args"][index + 1] == "/etc/dra-gateway/inventory/inventory.yaml"
    assert {"name": "inventory", "mountPath": "/etc/dra-gateway/inventory",
            "readOnly": True} in plugin["volumeMounts"]
    assert "NVIDIA_VISIBLE_DEVICES" not in {e["name"] for e in plugin["env"]}
    spec = one(objects, "DaemonSet", "node-plugin")["spec"]["template"]
    assert {"name": "inventory", "configMap": {"name": config_map["metadata"]["name"]}} in (
        spec["spec"]["volumes"])
    assert "checksum/inventory" in spec["metadata"]["annotations"]


# DeviceClasses and rules -----------------------------------------------------------------------


def test_device_classes_select_the_gateways_devices_by_type(helm: HelmRunner) -> None:
    classes = {r.name: r.obj["spec"] for r in by_kind(helm.render("default"), "DeviceClass")}
    assert classes == {
        names.GPU_CLASS: {"selectors": [{"cel": {"expression": (
            f"device.driver == '{names.DRIVER}' && "
            f"device.attributes['{names.DRIVER}'].{names.ATTR_TYPE} == 'gpu'")}}]},
        names.MIG_CLASS: {"selectors": [{"cel": {"expression": (
            f"device.driver == '{names.DRIVER}' && "
            f"device.attributes['{names.DRIVER}'].{names.ATTR_TYPE} == 'mig'")}}]},
    }


def test_device_classes_are_those_the_node_plugin_prints(helm: HelmRunner) -> None:
    # Installed by the chart or by `dra-gateway node-plugin device-classes | kubectl apply`, a
    # class must not differ: the two installers would otherwise rewrite each other's spec.
    from dra_gateway.node_plugin.deviceclasses import device_classes

    charted = {r.name: r.obj["spec"] for r in by_kind(helm.render("default"), "DeviceClass")}
    assert charted == {c["metadata"]["name"]: c["spec"] for c in device_classes()}


def test_rules_config_map_is_labelled_and_carries_each_document(helm: HelmRunner) -> None:
    assert by_kind(helm.render("default"), "ConfigMap") == []
    config_map = one(helm.render("rules"), "ConfigMap", "webhook")
    assert config_map["metadata"]["labels"][names.RULES_LABEL] == names.RULES_LABEL_VALUE
    assert sorted(config_map["data"]) == ["raw.yaml", "site.yaml"]
    assert yaml.safe_load(config_map["data"]["site.yaml"]) == RULES_MAPPING
    assert config_map["data"]["raw.yaml"] == RULES_TEXT


# Upgrades: lookup() against a running API server -----------------------------------------------
# `helm template --dry-run=server` answers lookup() from the cluster of its kubeconfig; the
# project's in-memory cluster served over loopback stands in for the one being upgraded.


def _tls_secret(*, issued_for: str, not_after: datetime.datetime,
                name: str = f"{RELEASE}-webhook-tls") -> Object:
    return {
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": NAMESPACE, "annotations": {
            "dra-gateway.io/issued-for": issued_for,
            "dra-gateway.io/not-after": not_after.strftime("%Y-%m-%dT%H:%M:%SZ")}},
        "data": {"ca.crt": CA_BUNDLE, "tls.crt": base64.b64encode(b"old cert").decode(),
                 "tls.key": base64.b64encode(b"old key").decode()},
    }


async def _render_against(helm: HelmRunner, objects: list[Object],
                          values: Object | None = None) -> list[Rendered]:
    from dra_gateway.devkit.sim.memory import MemoryCluster
    from dra_gateway.devkit.sim.server import serve
    from dra_gateway.kube.resources import NAMESPACES, SECRETS

    cluster = MemoryCluster()
    try:
        await cluster.create(NAMESPACES, {"apiVersion": "v1", "kind": "Namespace",
                                          "metadata": {"name": NAMESPACE}})
        for obj in objects:
            await cluster.create(SECRETS, obj, namespace=NAMESPACE)
        kubeconfig = helm.home / "kubeconfig"
        async with serve(cluster, kubeconfig=kubeconfig):
            process = await asyncio.create_subprocess_exec(
                helm.path, "template", RELEASE, str(CHART), "--namespace", NAMESPACE,
                "--kube-version", KUBE_VERSION, "--dry-run=server",
                "--values", helm.values_file(values or {}),
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                env={**helm.env, "KUBECONFIG": str(kubeconfig)})
            stdout, stderr = await asyncio.wait_for(process.communicate(), 50)
    finally:
        await cluster.close()
    assert process.returncode == 0, stderr.decode()
    return parse_render(stdout.decode())


HOST = f"{RELEASE}-webhook.{NAMESPACE}.svc"


async def test_upgrade_keeps_a_valid_certificate(helm: HelmRunner) -> None:
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=300)
    existing = _tls_secret(issued_for=HOST, not_after=later)
    objects = await _render_against(helm, [existing])
    secret = one(objects, "Secret")
    assert secret["data"] == existing["data"]
    assert secret["metadata"]["annotations"] == existing["metadata"]["annotations"]
    assert {hook["clientConfig"]["caBundle"] for _, hook in _webhooks(objects)} == {CA_BUNDLE}


@pytest.mark.parametrize(
    ("issued_for", "days_left"),
    [pytest.param(HOST, 29, id="within-renewBeforeDays"),
     pytest.param(HOST, -1, id="expired"),
     pytest.param(f"{RELEASE}-webhook.elsewhere.svc", 300, id="issued-for-another-service")],
)
async def test_upgrade_renews_a_certificate_that_is_due_or_foreign(
        helm: HelmRunner, issued_for: str, days_left: int) -> None:
    not_after = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=days_left)
    objects = await _render_against(helm, [_tls_secret(issued_for=issued_for,
                                                       not_after=not_after)])
    secret = one(objects, "Secret")
    assert secret["data"]["ca.crt"] != CA_BUNDLE
    assert secret["metadata"]["annotations"]["dra-gateway.io/issued-for"] == HOST
    leaf = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    new_ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    leaf.verify_directly_issued_by(new_ca)
    # The configurations trust the new CA and, until the webhook pods serve the new certificate,
    # the old one (a bundle of the new CA only failed the admissions old pods still answered).
    bundles = {hook["clientConfig"]["caBundle"] for _, hook in _webhooks(objects)}
    assert len(bundles) == 1
    trusted = x509.load_pem_x509_certificates(base64.b64decode(bundles.pop()))
    old_ca = x509.load_pem_x509_certificate(base64.b64decode(CA_BUNDLE))
    assert trusted == [new_ca, old_ca]


async def test_upgrade_renewing_a_secret_without_a_ca_trusts_the_new_ca_only(
        helm: HelmRunner) -> None:
    not_after = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=10)
    existing = _tls_secret(issued_for=HOST, not_after=not_after)
    existing["data"]["ca.crt"] = base64.b64encode(b"not a certificate").decode()
    objects = await _render_against(helm, [existing])
    secret = one(objects, "Secret")
    bundles = {hook["clientConfig"]["caBundle"] for _, hook in _webhooks(objects)}
    assert bundles == {secret["data"]["ca.crt"]}


async def test_secret_mode_reads_the_ca_from_the_existing_secret(helm: HelmRunner) -> None:
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(days=300)
    existing = _tls_secret(issued_for=HOST, not_after=later, name="corp-webhook-tls")
    objects = await _render_against(
        helm, [existing], {"certificates": {"mode": "secret",
                                            "secret": {"name": "corp-webhook-tls"}}})
    assert by_kind(objects, "Secret") == []
    assert {hook["clientConfig"]["caBundle"] for _, hook in _webhooks(objects)} == {CA_BUNDLE}


# NOTES.txt ------------------------------------------------------------------------------------


def _notes(helm: HelmRunner, values: Object, *extra: str) -> str:
    """NOTES.txt as `helm install` prints it. helm template leaves NOTES out, so a copy of the
    chart renders it through tpl() in a probe template."""
    chart = Path(tempfile.mkdtemp(dir=helm.home)) / CHART.name
    shutil.copytree(CHART, chart)
    (chart / "files").mkdir()
    (chart / "templates" / "NOTES.txt").rename(chart / "files" / "NOTES.txt")
    (chart / "templates" / "notes-probe.yaml").write_text(
        'notes: {{ tpl (.Files.Get "files/NOTES.txt") . | toJson }}\n')
    result = helm.run("template", RELEASE, str(chart), "--namespace", NAMESPACE,
                      "--kube-version", KUBE_VERSION, "--values", helm.values_file(values),
                      "--show-only", "templates/notes-probe.yaml", *extra)
    assert result.returncode == 0, result.stderr
    return str(yaml.safe_load(result.stdout)["notes"])


def test_notes_say_how_to_check_the_install(helm: HelmRunner) -> None:
    notes = _notes(helm, {})
    objects = helm.render("default")
    for kind, component in (("Deployment", "webhook"), ("Deployment", "allocator")):
        name = one(objects, kind, component)["metadata"]["name"]
        assert f"kubectl -n {NAMESPACE} rollout status deployment/{name}" in notes
    assert "Certificates: helm (generated by the chart, valid 90 days" in notes
    assert "run `helm upgrade` within 60 days, or use cert-manager" in notes
    assert "WARNING" not in notes


def test_notes_say_where_the_uninstall_names_the_pods_still_on_gateway_claims(
        helm: HelmRunner) -> None:
    notes = _notes(helm, {})
    job = one(helm.render("default"), "Job", "allocator-release")["metadata"]["name"]
    assert "On `helm uninstall`, a pre-delete Job first lets go of the gateway's claims" in notes
    assert f"kubectl -n {NAMESPACE} logs job/{job}\n" in notes + "\n"
    assert "logs job/" not in _notes(helm, {"allocator": {"releaseOnUninstall": False}})


def test_notes_say_which_namespaces_are_translated_and_which_audited(helm: HelmRunner) -> None:
    enabled = " ".join(_notes(helm, {}).split())
    assert ("in namespaces labelled dra-gateway.io/translation=enabled or without that label "
            "are translated into DRA claims") in enabled
    assert "In namespaces labelled audit, they are admitted unchanged" in enabled
    audit = " ".join(_notes(helm, {"webhook": {"translation": {"default": "audit"}}}).split())
    assert ("in namespaces labelled dra-gateway.io/translation=enabled are translated into "
            "DRA claims") in audit
    assert ("In namespaces labelled audit or without the label "
            "(webhook.translation.default=audit), they are admitted unchanged") in audit
    assert "read `dra-gateway migrate plan`" in audit


def test_notes_warn_about_a_fragile_webhook(helm: HelmRunner) -> None:
    notes = _notes(helm, COMBINATIONS["single-replica-ignore"][0])
    assert "WARNING: failurePolicy Ignore: while the webhook is unreachable" in notes
    notes = _notes(helm, {"webhook": {"replicas": 1, "podDisruptionBudget": {"enabled": False}}})
    assert "WARNING: one webhook replica with failurePolicy Fail" in notes


# Client certificates, allocator probes, uninstall and admission policies ----------------------


def test_client_auth_requires_the_api_servers_certificate_and_keeps_probes_reachable(
        helm: HelmRunner) -> None:
    objects = helm.render("client-auth")
    webhook = container(objects, "Deployment", "webhook")
    args = webhook["args"]
    assert args[args.index("--client-ca") + 1] == "/client-ca/ca.crt"
    assert {"name": "client-ca", "mountPath": "/client-ca", "readOnly": True} in \
        webhook["volumeMounts"]
    config_map = one(objects, "ConfigMap", "webhook")
    assert config_map["data"] == {"ca.crt": base64.b64decode(CA_BUNDLE).decode()}
    spec = one(objects, "Deployment", "webhook")["spec"]["template"]["spec"]
    assert {"name": "client-ca", "configMap": {"name": config_map["metadata"]["name"]}} in \
        spec["volumes"]
    assert webhook["readinessProbe"]["httpGet"]["port"] == "probes"
    assert not by_kind(objects, "Job")
    assert not by_kind(objects, "ValidatingAdmissionPolicy")


def test_client_auth_without_its_ca_is_refused_with_the_fix(helm: HelmRunner) -> None:
    result = helm.template({"webhook": {"clientAuth": {"enabled": True, "caBundle": ""}}})
    assert result.returncode != 0
    assert ("webhook.clientAuth.caBundle: empty with webhook.clientAuth.enabled=true; set it to "
            "the base64 PEM of the CA that signed the API server's client certificate, or set "
            "webhook.clientAuth.enabled=false") in result.stderr


def test_the_allocator_serves_metrics_and_is_probed_there(helm: HelmRunner) -> None:
    allocator = container(helm.render("default"), "Deployment", "allocator")
    assert allocator["ports"] == [{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]
    assert allocator["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert allocator["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}


def test_the_node_plugin_is_probed_where_it_serves_metrics(helm: HelmRunner) -> None:
    plugin = container(helm.render("default"), "DaemonSet", "node-plugin")
    assert plugin["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert plugin["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert "--metrics-address" in plugin["args"]


def test_uninstall_releases_every_claim_with_the_allocators_rights(helm: HelmRunner) -> None:
    from dra_gateway.cli import build_parser

    objects = helm.render("default")
    job = one(objects, "Job", "allocator-release")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    # Its log is the uninstall's report: kept after success, until its TTL runs out.
    assert job["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == \
        "before-hook-creation"
    assert job["spec"]["ttlSecondsAfterFinished"] == 3600
    spec = job["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == one(objects, "ServiceAccount", "allocator")[
        "metadata"]["name"]
    (release,) = spec["containers"]
    assert release["args"] == ["allocator", "--cluster", "kube", "--release-all"]
    assert build_parser().parse_args(release["args"]).release_all is True
    assert release["securityContext"]["readOnlyRootFilesystem"] is True


def _selects(selector: Object, labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_the_release_jobs_pod_is_no_allocator_replica(helm: HelmRunner) -> None:
    # Counted by the allocator's PodDisruptionBudget (a pod that ends, making the budget's
    # minAvailable meet a replica that is not one), scraped by its PodMonitor (no metrics
    # port) and matched by its Deployment's selector, it was taken for the allocator.
    objects = helm.render("monitoring")
    labels = one(objects, "Job", "allocator-release")["spec"]["template"]["metadata"]["labels"]
    assert labels["app.kubernetes.io/component"] == "allocator-release"
    selectors = {
        "PodDisruptionBudget": one(objects, "PodDisruptionBudget", "allocator")["spec"]["selector"],
        "PodMonitor": one(objects, "PodMonitor", "allocator")["spec"]["selector"],
        "Deployment": one(objects, "Deployment", "allocator")["spec"]["selector"]}
    for kind, selector in selectors.items():
        assert not _selects(selector, labels), kind
        pod = one(objects, "Deployment", "allocator")["spec"]["template"]["metadata"]["labels"]
        assert _selects(selector, pod), kind  # the allocator's own pods still are


def _policies(objects: list[Rendered]) -> dict[str, Object]:
    return {r.name.removeprefix(f"{RELEASE}-"): r.obj
            for r in by_kind(objects, "ValidatingAdmissionPolicy")}


def test_every_admission_policy_is_bound_to_deny(helm: HelmRunner) -> None:
    objects = helm.render("default")
    policies = _policies(objects)
    assert sorted(policies) == ["allocation-gate", "allocator-pod-writes", "claim-allocation",
                                "claim-finalizer", "node-plugin-events", "node-plugin-slices",
                                "node-plugin-status", "webhook-configurations"]
    bindings = {r.obj["spec"]["policyName"]: r.obj["spec"]
                for r in by_kind(objects, "ValidatingAdmissionPolicyBinding")}
    assert bindings == {f"{RELEASE}-{name}": {"policyName": f"{RELEASE}-{name}",
                                              "validationActions": ["Deny"]}
                        for name in policies}
    for version in ("1.34", "1.37"):
        for r in by_kind(objects, "ValidatingAdmissionPolicy") + by_kind(
                objects, "ValidatingAdmissionPolicyBinding"):
            kubernetes_validate.validate(r.obj, version, strict=True)


def _admitted(policy: Object, request: Object) -> bool | None:
    """What the policy says of the request: None when it does not match, else whether every
    validation holds (offline CEL: the logic, not the API server's cost checks)."""
    import cel

    for condition in policy["spec"].get("matchConditions") or ():
        if not cel.evaluate(condition["expression"], request):
            return None
    variables: Object = {}
    for variable in policy["spec"].get("variables") or ():
        variables[variable["name"]] = cel.evaluate(variable["expression"],
                                                   {**request, "variables": variables})
    return all(cel.evaluate(v["expression"], {**request, "variables": variables})
               for v in policy["spec"]["validations"])


def _sa(component: str) -> str:
    return f"system:serviceaccount:{NAMESPACE}:{RELEASE}-{component}"


def _gated(gated: bool) -> Object:
    spec: Object = {"containers": [{"name": "c", "image": "cuda"}]}
    if gated:
        spec["schedulingGates"] = [{"name": names.SCHEDULING_GATE}]
    return {"metadata": {"name": "p", "namespace": "team-a"}, "spec": spec}


def test_only_the_allocator_removes_the_allocation_gate(helm: HelmRunner) -> None:
    policy = _policies(helm.render("default"))["allocation-gate"]

    def removal(user: str, *, after: bool = False) -> bool | None:
        return _admitted(policy, {"object": _gated(after), "oldObject": _gated(True),
                                  "request": {"userInfo": {"username": user}}})

    assert removal("alice") is False  # a tenant's pod update dropping the gate
    assert removal(_sa("webhook")) is False
    assert removal(_sa("allocator")) is True
    assert removal("alice", after=True) is None  # the gate stays: not this policy's business


def _running_pod() -> Object:
    """A gated pod as the API server holds it: the webhook's gate after another system's,
    labels, an owner, tolerations, and a status with the scheduler's condition."""
    return {
        "metadata": {"name": "p", "namespace": "kube-system", "labels": {"app": "x"},
                     "annotations": {"a": "b"}, "finalizers": ["example.com/keep"],
                     "ownerReferences": [{"apiVersion": "v1", "kind": "ReplicationController",
                                          "name": "rc", "uid": "1", "controller": True}]},
        "spec": {"containers": [{"name": "c", "image": "cuda:1"}],
                 "initContainers": [{"name": "i", "image": "init:1"}],
                 "schedulingGates": [{"name": "kueue.x-k8s.io/admission"},
                                     {"name": names.SCHEDULING_GATE}],
                 "tolerations": [{"key": "gpu", "operator": "Exists"}],
                 "terminationGracePeriodSeconds": 30,
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "t"}]},
        "status": {"phase": "Pending",
                   "conditions": [{"type": "PodScheduled", "status": "False",
                                   "reason": "SchedulingGated"}],
                   "resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": "p-gpu"}]}}


def test_the_allocator_only_removes_its_gate_and_writes_its_own_pod_conditions(
        helm: HelmRunner) -> None:
    import copy

    policy = _policies(helm.render("default"))["allocator-pod-writes"]

    def write(change: Any, *, subresource: str = "",
              user: str = _sa("allocator")) -> bool | None:
        old = _running_pod()
        new = copy.deepcopy(old)
        change(new)
        request: Object = {"userInfo": {"username": user}}
        if subresource:  # the API server sends no subResource for the pod itself
            request["subResource"] = subresource
        return _admitted(policy, {"object": new, "oldObject": old, "request": request})

    def ungate(pod: Object) -> None:  # allocator/writes.py remove_gate
        del pod["spec"]["schedulingGates"][1]

    def condition(kind: str, reason: str = "QuotaExceeded", status: str = "True") -> Any:
        def write_it(pod: Object) -> None:  # allocator/conditions.py, eviction/evict.py
            pod["status"]["conditions"].append({"type": kind, "status": status,
                                                "reason": reason, "message": "m"})
        return write_it

    assert write(ungate) is True
    assert write(lambda pod: None) is True  # nothing changed
    for kind in ("QuotaExceeded", "WaitingForGates", "Preemption", "PodGroup"):
        assert write(condition(f"{names.DOMAIN}/{kind}"), subresource="status") is True, kind
    for reason, status in (("PreemptionByDraGateway", "True"),
                           ("DeviceFailureByDraGateway", "True"), ("EvictionRefused", "False")):
        assert write(condition("DisruptionTarget", reason, status), subresource="status") is True

    def image(pod: Object) -> None:
        pod["spec"]["containers"][0]["image"] = "attacker/miner:1"

    def init_image(pod: Object) -> None:
        pod["spec"]["initContainers"][0]["image"] = "attacker/miner:1"

    def other_gate(pod: Object) -> None:
        del pod["spec"]["schedulingGates"][0]

    def add_gate(pod: Object) -> None:
        pod["spec"]["schedulingGates"].append({"name": "example.com/hold"})

    def tolerate(pod: Object) -> None:
        pod["spec"]["tolerations"].append({"operator": "Exists"})

    def deadline(pod: Object) -> None:
        pod["spec"]["activeDeadlineSeconds"] = 1

    def grace(pod: Object) -> None:
        pod["spec"]["terminationGracePeriodSeconds"] = 0

    def node_selector(pod: Object) -> None:
        pod["spec"]["nodeSelector"] = {"kubernetes.io/hostname": "elsewhere"}

    def affinity(pod: Object) -> None:
        pod["spec"]["affinity"] = {"nodeAffinity": {}}

    def label(pod: Object) -> None:
        pod["metadata"]["labels"]["app"] = "y"

    def annotate(pod: Object) -> None:
        pod["metadata"]["annotations"]["a"] = "c"

    def owner(pod: Object) -> None:
        del pod["metadata"]["ownerReferences"]

    def finalize(pod: Object) -> None:
        pod["metadata"]["finalizers"] = []

    for change in (image, init_image, other_gate, add_gate, tolerate, deadline, grace,
                   node_selector, affinity, label, annotate, owner, finalize):
        assert write(change) is False, change.__name__
        assert write(change, user="alice") is None, change.__name__  # not this policy's

    def scheduled(pod: Object) -> None:
        pod["status"]["conditions"][0]["status"] = "True"

    def phase(pod: Object) -> None:
        pod["status"]["phase"] = "Failed"

    def claims(pod: Object) -> None:
        pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"] = "someone-elses"

    for change in (scheduled, phase, claims, condition("Ready"),
                   condition("DisruptionTarget", "PreemptionByScheduler"), label):
        assert write(change, subresource="status") is False, change


def test_each_node_plugin_records_events_about_its_own_node_only(helm: HelmRunner) -> None:
    policy = _policies(helm.render("default"))["node-plugin-events"]

    def event(node: str, *, kind: str = "Node", extra: Object | None = None,
              user: str = _sa("node-plugin")) -> bool | None:
        obj = {"metadata": {"name": f"{node}.1", "namespace": "default"},
               "involvedObject": {"apiVersion": "v1", "kind": kind, "name": node}}
        bound = {"authentication.kubernetes.io/node-name": ["node-a"]}
        return _admitted(policy, {"object": obj, "oldObject": None, "request": {
            "operation": "CREATE",
            "userInfo": {"username": user, "extra": bound if extra is None else extra}}})

    assert event("node-a") is True
    assert event("node-b") is False
    assert event("node-a", kind="Pod") is False
    assert event("node-a", extra={}) is False  # a token bound to no pod
    assert event("node-b", user="system:serviceaccount:kube-system:other") is None


def _claim(device_class: str, *, allocated: bool) -> Object:
    claim: Object = {"metadata": {"name": "c", "namespace": "team-a"},
                     "spec": {"devices": {"requests": [
                         {"name": "gpu", "exactly": {"deviceClassName": device_class}}]}}}
    if allocated:
        claim["status"] = {"allocation": {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.dra-gateway.io", "pool": "n", "device": "gpu-0"}]}}}
    return claim


def test_only_the_allocator_writes_allocations_of_gateway_classes(helm: HelmRunner) -> None:
    policy = _policies(helm.render("default"))["claim-allocation"]

    def write(user: str, device_class: str = names.GPU_CLASS, *, before: bool = False,
              after: bool = True) -> bool | None:
        return _admitted(policy, {
            "object": _claim(device_class, allocated=after),
            "oldObject": _claim(device_class, allocated=before),
            "request": {"userInfo": {"username": user}}})

    assert write("alice") is False
    assert write("system:kube-scheduler") is False  # it must not allocate gateway claims
    assert write(_sa("allocator")) is True
    assert write("alice", before=True, after=False) is False  # nor clear one
    assert write("alice", before=True, after=True) is None  # reservedFor only
    assert write("alice", "gpu.nvidia.com") is None  # another driver's class


def test_only_the_allocator_takes_its_finalizer_off_a_claim(helm: HelmRunner) -> None:
    policy = _policies(helm.render("default"))["claim-finalizer"]

    def write(user: str, before: list[str], after: list[str],
              groups: tuple[str, ...] = ()) -> bool | None:
        claim = _claim(names.GPU_CLASS, allocated=True)
        old = {**claim, "metadata": {**claim["metadata"], "finalizers": before}}
        new = {**claim, "metadata": {**claim["metadata"], "finalizers": after}}
        return _admitted(policy, {"object": new, "oldObject": old, "request": {
            "userInfo": {"username": user, "groups": list(groups)}}})

    gateway = [names.FINALIZER]
    # A tenant with `edit` taking it off, to delete the claim under its running pod.
    assert write("alice", gateway, []) is False
    assert write("alice", ["example.com/keep", *gateway], ["example.com/keep"]) is False
    assert write(_sa("webhook"), gateway, []) is False
    assert write(_sa("allocator"), gateway, []) is True  # its release
    assert write("admin", gateway, [], groups=("system:masters",)) is True
    assert write("alice", gateway, [*gateway, "example.com/keep"]) is None  # kept
    assert write("alice", [], ["example.com/keep"]) is None


def _slice(node: str) -> Object:
    return {"metadata": {"name": f"{node}-gpu"}, "spec": {"nodeName": node,
                                                           "driver": "gpu.dra-gateway.io"}}


def test_each_node_plugin_writes_only_its_own_nodes_slices_and_status(
        helm: HelmRunner) -> None:
    policies = _policies(helm.render("default"))
    bound = {"authentication.kubernetes.io/node-name": ["node-a"]}

    def slices(operation: str, node: str, *, extra: Object | None = None,
               user: str = _sa("node-plugin")) -> bool | None:
        obj = None if operation == "DELETE" else _slice(node)
        old = _slice(node) if operation != "CREATE" else None
        return _admitted(policies["node-plugin-slices"], {
            "object": obj, "oldObject": old, "request": {
                "operation": operation,
                "userInfo": {"username": user, "extra": bound if extra is None else extra}}})

    for operation in ("CREATE", "UPDATE", "DELETE"):
        assert slices(operation, "node-a") is True, operation
        assert slices(operation, "node-b") is False, operation
    assert slices("CREATE", "node-a", extra={}) is False  # a token not bound to a pod
    assert slices("CREATE", "node-b", user="system:serviceaccount:kube-system:other") is None

    def status(node: str) -> bool | None:
        return _admitted(policies["node-plugin-status"], {
            "object": {"metadata": {"name": node}}, "oldObject": {"metadata": {"name": node}},
            "request": {"userInfo": {"username": _sa("node-plugin"), "extra": bound}}})

    assert status("node-a") is True
    assert status("node-b") is False


def test_the_webhook_changes_only_ca_bundle_and_match_conditions(helm: HelmRunner) -> None:
    import copy

    objects = helm.render("default")
    policy = _policies(objects)["webhook-configurations"]
    current = one(objects, "ValidatingWebhookConfiguration")

    def update(change: Any, user: str = _sa("webhook")) -> bool | None:
        new = copy.deepcopy(current)
        change(new)
        return _admitted(policy, {"object": new, "oldObject": current,
                                  "request": {"userInfo": {"username": user}}})

    def reconcile(new: Object) -> None:
        new["webhooks"][0]["matchConditions"] = [{"name": "gpu-pods", "expression": "true"}]
        new["webhooks"][0]["clientConfig"]["caBundle"] = "bmV3"

    def redirect(new: Object) -> None:
        new["webhooks"][0]["clientConfig"] = {"url": "https://attacker.example/validate"}

    def widen(new: Object) -> None:
        new["webhooks"][0]["namespaceSelector"] = {}

    def drop(new: Object) -> None:
        del new["webhooks"][1]

    def ignore(new: Object) -> None:
        new["webhooks"][0]["failurePolicy"] = "Ignore"

    assert update(reconcile) is True
    for change in (redirect, widen, drop, ignore):
        assert update(change) is False, change.__name__
    assert update(redirect, user="cluster-admin") is None


def test_the_allocators_defrag_is_off_by_default_and_granted_only_when_on(
        helm: HelmRunner) -> None:
    objects = helm.render("default")
    args = container(objects, "Deployment", "allocator")["args"]
    assert "--defrag" not in args
    assert "--no-preemption" not in args  # preemption is on by default
    # With preemption off, budgets are not read; with the drain of failed devices off too,
    # nothing may evict.
    result = helm.template({"allocator": {"preemption": {"enabled": False}}})
    assert result.returncode == 0, result.stderr
    objects = parse_render(result.stdout)
    assert "--no-preemption" in container(objects, "Deployment", "allocator")["args"]
    rules = one(objects, "ClusterRole", "allocator")["rules"]
    assert {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]} in rules
    assert not any("poddisruptionbudgets" in rule["resources"] for rule in rules)
    result = helm.template({"allocator": {"preemption": {"enabled": False},
                                          "healthEviction": {"enabled": False}}})
    assert result.returncode == 0, result.stderr
    objects = parse_render(result.stdout)
    assert "--no-health-eviction" in container(objects, "Deployment", "allocator")["args"]
    granted = [rule for rule in one(objects, "ClusterRole", "allocator")["rules"]
               if "pods/eviction" in rule["resources"]]
    assert granted == []
    role = one(objects, "Role", "allocator")["rules"]
    assert not any(set(rule["verbs"]) & {"create", "patch", "update"} and
                   rule["resources"] == ["configmaps"] for rule in role)
    result = helm.template({"allocator": {"defrag": {"enabled": True, "after": "2m",
                                                     "movesPerHour": 4}}})
    assert result.returncode == 0, result.stderr
    objects = parse_render(result.stdout)
    args = container(objects, "Deployment", "allocator")["args"]
    assert args[args.index("--defrag-after") + 1] == "2m"
    assert args[args.index("--defrag-moves-per-hour") + 1] == "4"
    assert args[args.index("--defrag-hold") + 1] == "10m"
    rules = one(objects, "ClusterRole", "allocator")["rules"]
    assert {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]} in rules
    role = one(objects, "Role", "allocator")["rules"]
    assert {"apiGroups": [""], "resources": ["configmaps"],
            "resourceNames": ["dra-gateway-defrag"], "verbs": ["patch"]} in role
    refused = helm.template({"allocator": {"defrag": {"after": "soon"}}})
    assert refused.returncode != 0
    assert "/allocator/defrag/after" in refused.stderr


def test_group_domain_labels_reach_the_allocator_and_bad_keys_are_refused(
        helm: HelmRunner) -> None:
    args = container(helm.render("default"), "Deployment", "allocator")["args"]
    assert "--group-domain-label" not in args
    result = helm.template({"allocator": {"groupDomainLabels": [
        "example.com/rack", "topology.kubernetes.io/zone"]}})
    assert result.returncode == 0, result.stderr
    args = container(parse_render(result.stdout), "Deployment", "allocator")["args"]
    at = args.index("--group-domain-label")
    assert args[at:at + 4] == ["--group-domain-label", "example.com/rack",
                               "--group-domain-label", "topology.kubernetes.io/zone"]
    refused = helm.template({"allocator": {"groupDomainLabels": ["a rack"]}})
    assert refused.returncode != 0
    assert "groupDomainLabels" in refused.stderr

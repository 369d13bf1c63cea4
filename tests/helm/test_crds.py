"""The policy CRDs the chart ships: valid for the API servers we support, true to the models.

Each CRD must be a valid CustomResourceDefinition for Kubernetes 1.34 and 1.37 (strict), each
example policy must validate against its CRD's structural schema (as the API server would check
it) and load with the policy models, and the schema's enums must be the models' choices, so the
two cannot drift apart.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import jsonschema
import kubernetes_validate
import pytest
import yaml

from dra_gateway.kube.models import ENFORCEMENTS
from dra_gateway.kube.resources import GPU_QUOTAS, GPU_SHARING_POLICIES
from dra_gateway.policy.models import Admission, IsolationMode, parse_quota, parse_sharing

ROOT = Path(__file__).resolve().parents[2]
CRDS = ROOT / "helm" / "dra-gateway" / "crds"
EXAMPLES = ROOT / "examples" / "policies"


def _crd(kind: str) -> dict[str, Any]:
    for path in sorted(CRDS.glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        if crd["spec"]["names"]["kind"] == kind:
            return dict(crd)
    raise AssertionError(f"no CRD of kind {kind} in {CRDS}")


def _schema(kind: str) -> dict[str, Any]:
    (version,) = _crd(kind)["spec"]["versions"]
    return dict(version["schema"]["openAPIV3Schema"])


def _examples() -> list[dict[str, Any]]:
    found = [doc for path in sorted(EXAMPLES.glob("*.yaml"))
             for doc in yaml.safe_load_all(path.read_text()) if doc]
    assert len(found) >= 5, f"expected the example policies in {EXAMPLES}, found {len(found)}"
    return found


@pytest.mark.parametrize("version", ["1.34", "1.37"])
@pytest.mark.parametrize("kind", ["GPUQuota", "GPUSharingPolicy"])
def test_the_crd_is_valid_for_the_supported_kubernetes(kind: str, version: str) -> None:
    kubernetes_validate.validate(_crd(kind), version, strict=True)


@pytest.mark.parametrize(("kind", "rt"), [("GPUQuota", GPU_QUOTAS),
                                          ("GPUSharingPolicy", GPU_SHARING_POLICIES)])
def test_the_crd_names_what_the_embedded_api_serves(kind: str, rt: Any) -> None:
    crd = _crd(kind)
    assert crd["metadata"]["name"] == f"{rt.plural}.{rt.group}"
    assert crd["spec"]["group"] == rt.group
    assert crd["spec"]["names"]["plural"] == rt.plural
    assert crd["spec"]["scope"] == ("Namespaced" if rt.namespaced else "Cluster")
    (version,) = crd["spec"]["versions"]
    assert version["name"] == rt.version
    assert ("status" in version.get("subresources", {})) == rt.has_status
    assert version["additionalPrinterColumns"][-1]["name"] == "Age"


def test_every_example_validates_against_its_crd_and_loads() -> None:
    parsers = {"GPUQuota": parse_quota, "GPUSharingPolicy": parse_sharing}
    for document in _examples():
        jsonschema.validate(document, _schema(document["kind"]))
        parsers[document["kind"]](document)


@pytest.mark.parametrize(("kind", "patch", "where"), [
    ("GPUQuota", {"spec": {"hard": {"memory": "12 Gi"}}}, "memory"),
    ("GPUQuota", {"spec": {"hard": {}}}, "hard"),
    ("GPUQuota", {"spec": {"hard": {"cores": 1}, "admission": "Deny"}}, "admission"),
    ("GPUQuota", {"spec": {"hard": {"cores": 1},
                           "scope": {"deviceClassNames": ["gpu.nvidia.com"]}}},
     "deviceClassNames"),
    ("GPUSharingPolicy", {"spec": {"allowedEnforcement": ["cuda"]}}, "allowedEnforcement"),
    ("GPUSharingPolicy", {"spec": {"isolation": {"mode": "Tenant"}}}, "mode"),
    ("GPUSharingPolicy", {"spec": {"maxClaimsPerDevice": 0}}, "maxClaimsPerDevice"),
])
def test_the_schema_refuses_what_the_models_refuse(kind: str, patch: dict[str, Any],
                                                   where: str) -> None:
    document = {"apiVersion": "dra-gateway.io/v1alpha1", "kind": kind,
                "metadata": {"name": "x", "namespace": "team-a"}, **patch}
    with pytest.raises(jsonschema.ValidationError) as caught:
        jsonschema.validate(document, _schema(kind))
    assert where in "/".join(str(p) for p in caught.value.absolute_path) + caught.value.message
    parser = parse_quota if kind == "GPUQuota" else parse_sharing
    with pytest.raises(ValueError, match=where):
        parser(document)


def test_the_schema_enums_are_the_models_choices() -> None:
    quota = _schema("GPUQuota")["properties"]["spec"]["properties"]
    sharing = _schema("GPUSharingPolicy")["properties"]["spec"]["properties"]
    assert quota["admission"]["enum"] == list(get_args(Admission))
    assert sharing["allowedEnforcement"]["items"]["enum"] == list(ENFORCEMENTS)
    assert sharing["isolation"]["properties"]["mode"]["enum"] == list(get_args(IsolationMode))


_JUNCTORS = ("anyOf", "allOf", "oneOf", "not")


def structural_problems(schema: Any, path: str = "") -> list[str]:
    """What kube-apiserver's structural-schema check refuses, for the rules our CRDs can break.

    Every node states its type (unless it is an int-or-string or preserves unknown fields),
    and inside anyOf/allOf/oneOf/not no branch may state a type, a description or a default:
    those belong to the node itself. The one exception is the int-or-string form, whose anyOf
    is exactly [{type: integer}, {type: string}] with nothing else in the branches.
    """
    problems: list[str] = []
    if not isinstance(schema, dict):
        return problems
    int_or_string = schema.get("x-kubernetes-int-or-string") is True
    if not int_or_string and "type" not in schema and not schema.get(
            "x-kubernetes-preserve-unknown-fields") and path:
        problems.append(f"{path}: type must be set")
    for junctor in _JUNCTORS:
        branches = schema.get(junctor)
        if branches is None:
            continue
        for i, branch in enumerate(branches if isinstance(branches, list) else [branches]):
            where = f"{path}.{junctor}[{i}]"
            allowed_types = int_or_string and junctor == "anyOf" and branch in (
                {"type": "integer"}, {"type": "string"})
            for key in ("type", "description", "default", "nullable"):
                if key in branch and not allowed_types:
                    problems.append(f"{where}.{key}: must be empty to be structural")
            if int_or_string and junctor == "anyOf" and not allowed_types:
                problems.append(f"{where}: an int-or-string anyOf holds only the two types")
    for name, child in (schema.get("properties") or {}).items():
        problems += structural_problems(child, f"{path}.properties[{name}]")
    if isinstance(schema.get("items"), dict):
        problems += structural_problems(schema["items"], f"{path}.items")
    if isinstance(schema.get("additionalProperties"), dict):
        problems += structural_problems(schema["additionalProperties"],
                                        f"{path}.additionalProperties")
    return problems


@pytest.mark.parametrize("kind", ["GPUQuota", "GPUSharingPolicy"])
def test_the_crd_schema_is_structural(kind: str) -> None:
    # A real API server refuses a CRD whose schema is not structural; kubernetes-validate's
    # schemas of CustomResourceDefinition do not check that, so it is checked here.
    assert structural_problems(_schema(kind)) == []


def test_the_structural_check_sees_a_typed_branch() -> None:
    bad = {"type": "object", "properties": {"memory": {
        "x-kubernetes-int-or-string": True,
        "anyOf": [{"type": "integer", "minimum": 0}, {"type": "string"}]}}}
    assert structural_problems(bad) == [
        ".properties[memory].anyOf[0].type: must be empty to be structural",
        ".properties[memory].anyOf[0]: an int-or-string anyOf holds only the two types"]

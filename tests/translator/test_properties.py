"""Properties over generated pods: idempotence, nothing unrelated touched, determinism."""

from __future__ import annotations

import copy
import json
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dra_gateway.kube import names
from dra_gateway.translator.rules import load_rules
from dra_gateway.translator.translate import CLAIM_NAME, translate

from .translator_support import checked

# Valid requests of each protocol, plus resources no rule knows.
LEGACY = st.one_of(
    st.builds(lambda n: {"nvidia.com/gpu": n}, st.integers(1, 8)),
    st.builds(lambda n, m, c: {"nvidia.com/gpu": n, "nvidia.com/gpumem": m,
                               "nvidia.com/gpucores": c},
              st.integers(1, 4), st.integers(1, 81920), st.integers(1, 100)),
    st.builds(lambda p: {"nvidia.com/gpumem-percentage": p}, st.integers(1, 100)),
    st.builds(lambda c, r: {"koordinator.sh/gpu-core": c, "koordinator.sh/gpu-memory-ratio": r},
              st.integers(1, 100), st.integers(1, 100)),
    st.builds(lambda g: {"aliyun.com/gpu-mem": g}, st.integers(1, 80)),
    st.builds(lambda p, n: {f"nvidia.com/mig-{p}": n},
              st.sampled_from(["1g.5gb", "2g.10gb", "3g.40gb"]), st.integers(1, 4)),
    st.builds(lambda n: {"amd.com/gpu": n}, st.integers(1, 8)),
    st.builds(lambda n: {"example.com/fpga": n}, st.integers(0, 3)),
    st.just({}),
)
OTHER = st.dictionaries(st.sampled_from(["cpu", "memory", "ephemeral-storage"]),
                        st.sampled_from(["1", "500m", "2Gi", "100Mi"]), max_size=3)
WHERE = st.sampled_from(["limits", "requests", "both"])
TEXT = st.text(st.characters(codec="utf-8"), max_size=20)
ANNOTATIONS = st.dictionaries(
    st.sampled_from(["nvidia.com/use-gputype", "nvidia.com/nouse-gpuuuid", "nvidia.com/numa-bind",
                     "hami.io/gpu-scheduler-policy", "team", "example.com/note"]),
    TEXT, max_size=4)


@st.composite
def containers(draw: st.DrawFn, prefix: str, max_size: int) -> list[dict[str, Any]]:
    out = []
    for i in range(draw(st.integers(0 if prefix == "init" else 1, max_size))):
        legacy, other, where = draw(LEGACY), draw(OTHER), draw(WHERE)
        resources: dict[str, Any] = {}
        if where in ("limits", "both") and (legacy or other):
            resources["limits"] = {**other, **legacy}
        if where in ("requests", "both") and (legacy or other):
            resources["requests"] = {**other, **{k: str(v) for k, v in legacy.items()}}
        container: dict[str, Any] = {"name": f"{prefix}-{i}", "image": "example.com/x:1",
                                     "env": [{"name": "MODE", "value": draw(TEXT)}]}
        if resources:
            container["resources"] = resources
        out.append(container)
    return out


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": "p", "namespace": "ns", "labels": {"app": "x"}}
    annotations = draw(ANNOTATIONS)
    empty_map = draw(st.booleans())
    if annotations or empty_map:
        metadata["annotations"] = annotations
    spec: dict[str, Any] = {"containers": draw(containers("main", 3))}
    init = draw(containers("init", 2))
    if init:
        spec["initContainers"] = init
    if draw(st.booleans()):
        spec["resourceClaims"] = [{"name": "fpga", "resourceClaimTemplateName": "fpga"}]
    if draw(st.booleans()):
        spec["schedulingGates"] = [{"name": "example.com/wait"}]
    if draw(st.booleans()):
        spec["nodeSelector"] = {"nvidia.com/gpu.product": draw(TEXT)}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}


# Loaded once for the module rather than taken from a fixture: hypothesis prints every argument
# of a failing example, and a rule set with a warm cache makes that output unreadable.
RULES = load_rules()

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(pods())
def test_translation_is_idempotent(original: dict[str, Any]) -> None:
    plan = translate(original, RULES)
    if plan.refusal is not None:
        return
    patched = checked(plan, original)
    again = translate(patched, RULES)
    assert (again.patch, again.templates, again.refusal) == ([], [], None)


def _strip_gateway_changes(patched: dict[str, Any], original: dict[str, Any]) -> dict[str, Any]:
    out = copy.deepcopy(patched)
    annotations = out["metadata"].get("annotations", {})
    record = json.loads(annotations.pop(names.ANNOTATION_TRANSLATED, '{"containers": {}}'))
    if "annotations" not in original["metadata"] and not annotations:
        out["metadata"].pop("annotations", None)
    spec = out["spec"]
    for key, ours in (("resourceClaims", CLAIM_NAME), ("schedulingGates", names.SCHEDULING_GATE)):
        if key in spec:
            spec[key] = [item for item in spec[key] if item["name"] != ours]
            if not spec[key] and key not in original["spec"]:
                del spec[key]
    for key in ("initContainers", "containers"):
        for container in spec.get(key, []):
            resources = container.get("resources")
            if resources is None:
                continue
            if "claims" in resources:
                resources["claims"] = [c for c in resources["claims"] if c["name"] != CLAIM_NAME]
                if not resources["claims"]:
                    del resources["claims"]
    return {"out": out, "record": record}


@SETTINGS
@given(pods())
def test_only_the_gateways_fields_change(original: dict[str, Any]) -> None:
    plan = translate(original, RULES)
    if plan.refusal is not None:
        assert plan.patch == []
        return
    stripped = _strip_gateway_changes(checked(plan, original), original)
    expected = copy.deepcopy(original)
    for key in ("initContainers", "containers"):
        for container in expected["spec"].get(key, []):
            entry = stripped["record"]["containers"].get(container["name"])
            if entry is None:
                continue
            resources = container["resources"]
            for section in ("limits", "requests"):
                for resource in entry.get(section, {}):
                    del resources[section][resource]
                if section in resources and not resources[section]:
                    del resources[section]
    assert stripped["out"] == expected


@SETTINGS
@given(pods())
def test_cached_and_fresh_plans_are_identical(original: dict[str, Any]) -> None:
    cached = translate(original, RULES)
    RULES.cache.clear()
    fresh = translate(original, RULES)
    assert cached == fresh


JUNK = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                 st.floats(allow_nan=True), TEXT, st.lists(st.integers(), max_size=2),
                 st.dictionaries(TEXT, st.integers(), max_size=2))
LEGACY_NAMES = st.sampled_from([
    "nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores", "koordinator.sh/gpu-core",
    "koordinator.sh/gpu-memory", "koordinator.sh/gpu.shared", "aliyun.com/gpu-mem",
    "tke.cloud.tencent.com/qgpu-core", "nvidia.com/mig-1g.5gb", "amd.com/gpu"])


@SETTINGS
@given(st.dictionaries(LEGACY_NAMES, JUNK, min_size=1, max_size=3),
       st.dictionaries(LEGACY_NAMES, JUNK, max_size=2), ANNOTATIONS)
def test_any_value_gives_a_plan_or_a_refusal_never_an_error(
        limits: dict[str, Any], requests: dict[str, Any],
        annotations: dict[str, str]) -> None:
    original = {"metadata": {"name": "p", "annotations": annotations},
                "spec": {"containers": [{"name": "c", "resources": {
                    "limits": limits, "requests": requests}}]}}
    plan = translate(original, RULES)
    if plan.refusal is None:
        checked(plan, original)
    else:
        assert plan.refusal.message.startswith('container "c": ')
        assert plan.patch == []

"""What the gateway writes, against what each real API server accepts (kube/api_rules.py).

Kubernetes 1.38 validates fields earlier releases stored as given (`consumedCapacity`, capacity
requests, a device's node selector, `version` attributes). On every release of the tier:

- random legacy pods are translated by the built-in rules, placed by the planner on devices the
  node plugin builds from random GPUs, and every object that makes is written to the API server
  with `dryRun=All` (the ResourceSlices, the ResourceClaimTemplates, each claim's
  `status.allocation`, written as the allocator): the server accepts all of them, and neither
  the strict schemas of 1.37 (`kubernetes-validate` has none of 1.38 yet) nor the gateway's
  own checks find anything in them;
- values on both sides of each rule are written the same way: the server accepts every value
  the gateway's checks accept, and from 1.38 it refuses exactly the values they refuse.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator, Mapping
from typing import Any

import kubernetes_validate
import pytest

from dra_gateway.allocator.planner import ClusterState, PlannerSettings, plan_pod
from dra_gateway.devkit.realcluster import Api, path_of
from dra_gateway.kube import names
from dra_gateway.kube.api_rules import (
    allocation_problems,
    capacity_problems,
    claim_spec_problems,
    slice_problems,
    version_problem,
)
from dra_gateway.kube.cluster.port import ApiError
from dra_gateway.node_plugin.deviceclasses import device_classes
from dra_gateway.node_plugin.devices import DeviceOptions, devices_of
from dra_gateway.node_plugin.facts import GpuFacts, NodeFacts
from dra_gateway.node_plugin.publish import build_slices
from dra_gateway.translator.rules import load_rules
from dra_gateway.translator.translate import translate
from e2e.support import NAMESPACE as GATEWAY_NAMESPACE
from e2e.support import Gateway

JSON = dict[str, Any]
NAMESPACE = "api-rules"
RESOURCE = "resource.k8s.io/v1"
GiB = 1 << 30
DRY_RUN = {"dryRun": "All"}
OTHER_DRIVER = "api-rules.example.com"


def _minor(gateway: Gateway) -> int:
    return int(gateway.version.split(".")[1])


@pytest.fixture(scope="module")
def api(gateway: Gateway) -> Iterator[Api]:
    api = gateway.api
    api.create(path_of("v1", "namespaces"), {"apiVersion": "v1", "kind": "Namespace",
                                             "metadata": {"name": NAMESPACE}})
    yield api
    api.delete(path_of("v1", "namespaces", name=NAMESPACE))


def _refusal(call: Any) -> str | None:
    """None when the call succeeds, else the API server's message."""
    try:
        call()
    except ApiError as exc:
        if exc.code not in (400, 422):
            raise
        return exc.message
    return None


# Random objects of the gateway ------------------------------------------------------------------

_PRODUCTS = (("NVIDIA H100 80GB HBM3", 80), ("NVIDIA A100-SXM4-40GB", 40),
             ("Tesla T4", 16), ("NVIDIA L4", 24))


def _random_gpus(rng: random.Random, node: str) -> NodeFacts:
    gpus = []
    for index in range(rng.randint(1, 4)):
        product, memory = rng.choice(_PRODUCTS)
        driver = rng.choice(["535.104.05", "570.86.15", f"{'9' * 18}.0",
                             f"{rng.randint(1, 999)}.{rng.randint(0, 999)}"])
        gpus.append(GpuFacts(index=index, uuid=f"GPU-{uuid.UUID(int=rng.getrandbits(128))}",
                             product_name=product, memory=memory * GiB, minor=index,
                             driver_version=driver, cuda_compute_capability="9.0",
                             cuda_driver_version="12.4", numa_node=index // 2,
                             pcie_root=f"pci0000:{index // 2:02x}"))
    return NodeFacts(gpus=tuple(gpus))


def _random_container(rng: random.Random, n: int) -> JSON:
    limits: dict[str, str]
    shape = rng.choice(["whole", "hami", "hami-percent", "koordinator", "gpushare", "qgpu"])
    if shape == "whole":
        limits = {"nvidia.com/gpu": str(rng.randint(1, 2))}
    elif shape == "hami":
        limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": str(rng.randint(256, 40000)),
                  "nvidia.com/gpucores": str(rng.randint(1, 100))}
    elif shape == "hami-percent":
        limits = {"nvidia.com/gpu": "1",
                  "nvidia.com/gpumem-percentage": str(rng.randint(1, 100))}
    elif shape == "koordinator":
        limits = {"koordinator.sh/gpu-core": str(rng.randint(1, 100)),
                  "koordinator.sh/gpu-memory-ratio": str(rng.randint(1, 100))}
    elif shape == "gpushare":
        limits = {"aliyun.com/gpu-mem": str(rng.randint(1, 40))}
    else:
        limits = {"tke.cloud.tencent.com/qgpu-core": str(5 * rng.randint(1, 20)),
                  "tke.cloud.tencent.com/qgpu-memory": str(rng.randint(1, 40))}
    return {"name": f"c{n}", "image": "busybox",
            "resources": {"limits": limits, "requests": dict(limits)}}


def _random_pod(rng: random.Random, n: int) -> JSON:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"p{n}", "namespace": NAMESPACE, "uid": f"uid-p{n}"},
            "spec": {"containers": [_random_container(rng, i)
                                    for i in range(rng.randint(1, 2))]}}


def _node(name: str) -> JSON:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "uid": f"uid-{name}"},
            "status": {"allocatable": {"cpu": "64", "memory": "256Gi", "pods": "110"}}}


def test_every_object_made_from_random_pods_is_accepted(gateway: Gateway, api: Api) -> None:
    rng = random.Random(1_38)
    native = gateway.consumable_capacity
    options = DeviceOptions(default_sharing="shared", consumable_capacity=native)
    state = ClusterState(PlannerSettings(consumable_capacity=native))
    for device_class in device_classes():
        state.set_device_class(device_class)
    slices: list[JSON] = []
    for n in range(12):
        node = f"api-rules-{n}"
        state.set_node(_node(node))
        for piece in build_slices(node_name=node, driver=names.DRIVER,
                                  devices=devices_of(_random_gpus(rng, node), options),
                                  generation=1, node_uid=None):
            state.set_slice(piece)
            slices.append(piece)
    rules = load_rules()
    templates: list[JSON] = []
    claims: list[JSON] = []
    refused_by_rules = 0
    for n in range(60):
        pod = _random_pod(rng, n)
        translation = translate(pod, rules)
        if translation.refusal is not None or not translation.templates:
            refused_by_rules += 1
            continue
        templates += translation.templates
        pod_claims = [{"apiVersion": RESOURCE, "kind": "ResourceClaim",
                       "metadata": {"name": f"p{n}-{i}", "namespace": NAMESPACE,
                                    "uid": f"uid-p{n}-{i}"},
                       "spec": template["spec"]["spec"]}
                      for i, template in enumerate(translation.templates)]
        plan = plan_pod(state, pod, pod_claims)
        if plan.node_name is None:
            continue
        state.assume(pod, plan)
        for claim in pod_claims:
            claims.append({**claim, "status": {"allocation": plan.allocations[
                claim["metadata"]["uid"]]}})
    assert len(claims) >= 30, (len(claims), refused_by_rules)

    # The strict schemas of the newest release kubernetes-validate ships (1.37: it has none of
    # 1.38 yet), then 1.38's own rules, then the server itself.
    for obj in [*slices, *templates, *claims]:
        kubernetes_validate.validate(obj, "1.37", strict=True)
    problems = [p for s in slices for p in slice_problems(s)]
    problems += [p for t in templates for p in claim_spec_problems(t["spec"]["spec"])]
    problems += [p for c in claims for p in allocation_problems(c["status"]["allocation"])]
    assert problems == []

    refused: list[str] = []
    for piece in slices:
        # Under another driver's name: the chart's admission policies let only a node's own
        # plugin write the gateway's slices; what 1.38 validates, the devices, is unchanged.
        piece = {**piece, "spec": {**piece["spec"], "driver": OTHER_DRIVER}}
        why = _refusal(lambda piece=piece: api.request(
            "POST", path_of(RESOURCE, "resourceslices"), piece, query=DRY_RUN))
        if why:
            refused.append(f"ResourceSlice {piece['metadata']['name']}: {why}")
    for template in {t["metadata"]["name"]: t for t in templates}.values():
        why = _refusal(lambda template=template: api.request(
            "POST", path_of(RESOURCE, "resourceclaimtemplates", namespace=NAMESPACE),
            {**template, "metadata": {**template["metadata"], "namespace": NAMESPACE}},
            query=DRY_RUN))
        if why:
            refused.append(f"ResourceClaimTemplate {template['metadata']['name']}: {why}")
    allocator = _allocator_api(gateway)
    for claim in claims:
        refused += _write_allocation(api, allocator, claim)
    assert refused == []


def _allocator_api(gateway: Gateway) -> Api:
    """The API as the allocator's ServiceAccount: the chart's admission policies let only the
    allocator write the allocation of a claim of the gateway's classes."""
    return gateway.plane.api(gateway.plane.service_account_token(
        GATEWAY_NAMESPACE, gateway.service_accounts["allocator"]))


def _write_allocation(api: Api, allocator: Api, claim: Mapping[str, Any]) -> list[str]:
    """Create the claim, then write its allocation as the allocator with dryRun=All; the
    refusals, named."""
    name = claim["metadata"]["name"]
    body = {"apiVersion": RESOURCE, "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE}, "spec": claim["spec"]}
    path = path_of(RESOURCE, "resourceclaims", namespace=NAMESPACE, name=name)
    try:
        created = api.create(path_of(RESOURCE, "resourceclaims", namespace=NAMESPACE), body)
    except ApiError as exc:
        return [f"ResourceClaim {name}: {exc.message}"]
    try:
        update = {**created, "status": claim["status"]}
        why = _refusal(lambda: allocator.request("PUT", path + "/status", update,
                                                 query=DRY_RUN))
        return [f"ResourceClaim {name} status.allocation: {why}"] if why else []
    finally:
        api.delete(path)


# Both sides of each rule ------------------------------------------------------------------------

CAPACITIES: tuple[Mapping[str, str], ...] = (
    {"memory": "4Gi", "cores": "30"},
    {"memory": "0", "gpu.dra-gateway.io/cores": "1"},
    {f"c{i}": "1" for i in range(32)},
    {"memory": "-1"},
    {"cores": "-500m", "memory": "1Gi"},
    {"a/b/c": "1"},
    {"9lives": "1"},
    {"mem-ory": "1"},
    {"x" * 33: "1"},
    {"Example.com/memory": "1"},
    {"-example.com/memory": "1"},
    {"example..com/memory": "1"},
    {f"c{i}": "1" for i in range(33)},
)


def _claim_with_capacity(name: str, requests: Mapping[str, str]) -> JSON:
    return {"apiVersion": RESOURCE, "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": names.GPU_CLASS, "capacity": {"requests": dict(requests)}}}]}}}


def _agreement(gateway: Gateway, cases: list[tuple[str, list[str], str | None]]) -> None:
    """Each case: (what, the gateway's problems, the server's refusal). Every value the gateway
    accepts is accepted; from 1.38 every value it refuses is refused too."""
    wrong = [f"{what}: the gateway accepts it, the server refused: {refused}"
             for what, problems, refused in cases if not problems and refused]
    if _minor(gateway) >= 38:
        wrong += [f"{what}: the gateway refuses it ({problems}), the server accepted it"
                  for what, problems, refused in cases if problems and not refused]
    assert wrong == []


def test_capacity_requests_are_refused_as_the_gateway_refuses_them(
        gateway: Gateway, api: Api) -> None:
    cases = []
    for n, requests in enumerate(CAPACITIES):
        claim = _claim_with_capacity(f"requests-{n}", requests)
        refused = _refusal(lambda claim=claim: api.request(
            "POST", path_of(RESOURCE, "resourceclaims", namespace=NAMESPACE), claim,
            query=DRY_RUN))
        cases.append((f"capacity.requests {dict(requests)}",
                      capacity_problems(requests, "requests"), refused))
    _agreement(gateway, cases)


def test_consumed_capacity_is_refused_as_the_gateway_refuses_it(
        gateway: Gateway, api: Api) -> None:
    cases = []
    allocator = _allocator_api(gateway)
    for n, consumed in enumerate(CAPACITIES):
        claim = _claim_with_capacity(f"consumed-{n}", {"memory": "1Gi", "cores": "1"})
        allocation = {
            "devices": {"results": [{
                "request": "gpu", "driver": names.DRIVER, "pool": "node-a", "device": "gpu-0",
                "shareID": str(uuid.UUID(int=n + 1)), "consumedCapacity": dict(consumed)}]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": ["node-a"]}]}]}}
        refused = _write_allocation(api, allocator,
                                    {**claim, "status": {"allocation": allocation}})
        cases.append((f"consumedCapacity {dict(consumed)}", allocation_problems(allocation),
                      "; ".join(refused) or None))
    _agreement(gateway, cases)


VERSIONS = ("1.2.3", f"{'9' * 18}.0.0", "1.2.3-rc.1+b.5", f"{'9' * 19}.0.0", f"1.{'1' * 19}.0",
            f"1.2.3-{'1' * 19}")


def test_version_attributes_are_refused_as_the_gateway_refuses_them(
        gateway: Gateway, api: Api) -> None:
    cases = []
    for n, version in enumerate(VERSIONS):
        piece = {"apiVersion": RESOURCE, "kind": "ResourceSlice",
                 "metadata": {"name": f"api-rules-version-{n}"},
                 "spec": {"driver": OTHER_DRIVER, "nodeName": "node-a",
                          "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
                          "devices": [{"name": "d0", "attributes": {
                              "driverVersion": {"version": version}}}]}}
        refused = _refusal(lambda piece=piece: api.request(
            "POST", path_of(RESOURCE, "resourceslices"), piece, query=DRY_RUN))
        problem = version_problem(version)
        cases.append((f"version {version}", [problem] if problem else [], refused))
    _agreement(gateway, cases)

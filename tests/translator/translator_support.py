"""Builders and checks shared by the translator tests."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest

from dra_gateway.translator.shapes import template_name
from dra_gateway.translator.translate import TranslationPlan


def ctr(name: str, limits: dict[str, Any] | None = None,
        requests: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    container: dict[str, Any] = {"name": name, "image": "example.com/app:1"}
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = dict(limits)
    if requests is not None:
        resources["requests"] = dict(requests)
    if resources:
        container["resources"] = resources
    container.update(extra)
    return container


def pod(*containers: dict[str, Any], init: tuple[dict[str, Any], ...] = (),
        annotations: dict[str, str] | None = None, namespace: str | None = "team-a",
        name: str = "p", **spec: Any) -> dict[str, Any]:
    metadata: dict[str, Any] = {"name": name}
    if namespace is not None:
        metadata["namespace"] = namespace
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    body: dict[str, Any] = {"containers": list(containers)}
    if init:
        body["initContainers"] = list(init)
    body.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


def checked(plan: TranslationPlan, original: dict[str, Any]) -> dict[str, Any]:
    """The pod after the plan's patch; every template validated against strict 1.34."""
    for template in plan.templates:
        kubernetes_validate.validate(template, "1.34", strict=True)
        assert template["metadata"]["name"] == template_name(template["spec"])
    return jsonpatch.apply_patch(copy.deepcopy(original), plan.patch)  # type: ignore[no-any-return]


def only_request(plan: TranslationPlan) -> dict[str, Any]:
    (template,) = plan.templates
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    return request  # type: ignore[no-any-return]


def parameters_of(plan: TranslationPlan, request: str) -> dict[str, Any] | None:
    (template,) = plan.templates
    for entry in template["spec"]["spec"]["devices"].get("config", []):
        if entry["requests"] == [request]:
            assert entry["opaque"]["driver"] == "gpu.dra-gateway.io"
            return entry["opaque"]["parameters"]  # type: ignore[no-any-return]
    return None


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`dra-gateway ARGS...` in process: exit code, standard output, standard error."""
    from dra_gateway.cli import main

    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


def mig_device(*, memory: str, parent: str) -> Any:
    """The CEL view of a gateway MIG instance with `memory` and the parent card's UUID."""
    from dra_gateway.kube.cel import device_view

    return device_view("gpu.dra-gateway.io", {
        "name": "mig-0", "attributes": {"parentUUID": {"string": parent}},
        "capacity": {"memory": {"value": memory}}})


def gpu_device(**attributes: str) -> Any:
    """The CEL view of a gateway card with these string attributes."""
    from dra_gateway.kube.cel import device_view

    return device_view("gpu.dra-gateway.io", {
        "name": "gpu-0", "attributes": {k: {"string": v} for k, v in attributes.items()}})

"""AdmissionReview v1 in and out: parse a request body, build a response body.

Parsing is the only validation a review gets on the hot path: the checks the API server's own
contract guarantees are made once, cheaply, on plain dicts (no models), and anything else is a
`BadReview` whose message is one line naming what was wrong. Responses are built as dicts and
serialised with orjson.

It must not decide anything about pods: that is `mutation` and `validation`.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import orjson

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
_POD_RESOURCE: Final = "pods"


class BadReview(ValueError):
    """The body is not an AdmissionReview v1 for a pod this webhook can answer (HTTP 400)."""


@dataclass(frozen=True, slots=True)
class Review:
    """The parts of an AdmissionRequest the webhook reads."""

    uid: str
    operation: str
    namespace: str
    name: str
    sub_resource: str
    dry_run: bool
    object: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a pod is not admitted: HTTP-style code, a Status reason and the user's message."""

    code: int
    reason: str
    message: str


def _describe(value: Any) -> str:
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "a list"
    if value is None:
        return "null"
    return f"a {type(value).__name__}"


def parse(body: bytes) -> Review:
    """The review in `body`; raises BadReview with a one-line reason."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadReview(f"the body is not valid JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise BadReview(f"the body is {_describe(data)}, not an AdmissionReview object")
    if data.get("apiVersion") != API_VERSION or data.get("kind") != KIND:
        raise BadReview(
            f"the body is apiVersion {data.get('apiVersion')!r} kind {data.get('kind')!r}; "
            f"this webhook serves {API_VERSION} {KIND} (set admissionReviewVersions: [v1])"
        )
    request = data.get("request")
    if not isinstance(request, dict):
        raise BadReview("the AdmissionReview has no request object")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise BadReview("the AdmissionReview request has no uid")
    resource = request.get("resource")
    kind = request.get("kind")
    if not (isinstance(resource, dict) and resource.get("group") == ""
            and resource.get("resource") == _POD_RESOURCE
            and isinstance(kind, dict) and kind.get("kind") == "Pod"):
        raise BadReview(
            f"request {uid} is for {_resource_text(resource)}, not pods; this webhook serves "
            f"pods only: fix the webhook configuration's rules"
        )
    operation = request.get("operation")
    if not isinstance(operation, str):
        raise BadReview(f"request {uid} has no operation")
    obj = request.get("object")
    if operation in ("CREATE", "UPDATE"):
        if not isinstance(obj, dict):
            raise BadReview(f"request {uid} ({operation}) carries {_describe(obj)} as its object, "
                            f"not a pod")
        if obj.get("kind", "Pod") != "Pod" or not isinstance(obj.get("spec"), dict):
            raise BadReview(f"request {uid} carries an object that is not a pod with a spec")
    else:
        obj = {}
    namespace = request.get("namespace") or ""
    name = request.get("name") or ""
    sub_resource = request.get("subResource") or ""
    if not isinstance(namespace, str) or not isinstance(name, str) \
            or not isinstance(sub_resource, str):
        raise BadReview(f"request {uid}: namespace, name and subResource must be strings")
    return Review(
        uid=uid,
        operation=operation,
        namespace=namespace,
        name=name,
        sub_resource=sub_resource,
        dry_run=request.get("dryRun") is True,
        object=obj,
    )


def _is_str_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, str) for v in value.values())


def _containers_problem(spec: dict[str, Any], key: str) -> str | None:
    containers = spec.get(key)
    if containers is None:
        return None
    if not isinstance(containers, list):
        return f"spec.{key} is not a list"
    for i, container in enumerate(containers):
        if not isinstance(container, dict) or not isinstance(container.get("name", ""), str):
            return f"spec.{key}[{i}] is not a container with a name"
        resources = container.get("resources")
        if resources is None:
            continue
        if not isinstance(resources, dict):
            return f"spec.{key}[{i}].resources is not an object"
        for part in ("limits", "requests"):
            amounts = resources.get(part)
            if amounts is not None and not (isinstance(amounts, dict) and all(
                    isinstance(v, str | int | float) and not isinstance(v, bool)
                    for v in amounts.values())):
                return f"spec.{key}[{i}].resources.{part} is not a map of quantities"
        claims = resources.get("claims")
        if claims is not None and not (isinstance(claims, list)
                                       and all(isinstance(c, dict) for c in claims)):
            return f"spec.{key}[{i}].resources.claims is not a list of objects"
    return None


def check_pod_shape(review: Review) -> None:
    """Raise BadReview when the review's pod could not have come from an API server."""
    if review.object:
        problem = pod_shape_problem(review.object)
        if problem:
            raise BadReview(f"request {review.uid}: the pod's {problem}; it is not a valid Pod")


def pod_shape_problem(pod: dict[str, Any]) -> str | None:
    """What makes `pod` unlike any Pod the API server could send, or None.

    The API server decodes a pod into its typed form before admission, so a real review always
    passes; this keeps hand-made or corrupted bodies (a container that is a string, a limit that
    is a list) out of the decisions, which may then rely on the types. Only the fields the
    decisions read are checked, to stay cheap.
    """
    meta = pod.get("metadata", {})
    if not isinstance(meta, dict):
        return "metadata is not an object"
    for key in ("name", "generateName", "namespace"):
        if not isinstance(meta.get(key, ""), str):
            return f"metadata.{key} is not a string"
    for key in ("annotations", "labels"):
        if meta.get(key) is not None and not _is_str_map(meta[key]):
            return f"metadata.{key} is not a map of strings"
    spec = pod["spec"]
    if not isinstance(spec.get("containers"), list):
        return "spec.containers is not a list"
    for key in ("containers", "initContainers"):
        problem = _containers_problem(spec, key)
        if problem:
            return problem
    if spec.get("nodeSelector") is not None and not _is_str_map(spec["nodeSelector"]):
        return "spec.nodeSelector is not a map of strings"
    for key in ("resourceClaims", "schedulingGates"):
        items = spec.get(key)
        if items is not None and not (isinstance(items, list) and all(
                isinstance(i, dict) and isinstance(i.get("name", ""), str)
                and all(isinstance(v, str) for v in i.values() if v is not None)
                for i in items)):
            return f"spec.{key} is not a list of objects with string fields"
    return None


def _resource_text(resource: Any) -> str:
    if not isinstance(resource, dict):
        return "no resource"
    group = resource.get("group") or "core"
    return f"resource {resource.get('resource')!r} of group {group!r}"


def encode_patch(patch: Sequence[Mapping[str, Any]]) -> str:
    """An RFC 6902 patch as the base64 text the response carries."""
    return base64.b64encode(orjson.dumps(patch)).decode("ascii")


def response(uid: str, *, allowed: bool = True, patch: str | None = None,
             refusal: Refusal | None = None, warnings: Sequence[str] = (),
             audit: Mapping[str, str] | None = None) -> bytes:
    """The response body; `patch` is already base64 (see `encode_patch`)."""
    answer: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if patch is not None:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = patch
    if refusal is not None:
        answer["status"] = {"code": refusal.code, "reason": refusal.reason,
                            "message": refusal.message}
    if warnings:
        answer["warnings"] = list(warnings)
    if audit:
        answer["auditAnnotations"] = dict(audit)
    return orjson.dumps({"apiVersion": API_VERSION, "kind": KIND, "response": answer})

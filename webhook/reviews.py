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

from dra_gateway.translator.pods import pod_shape_problem

API_VERSION: Final = "admission.k8s.io/v1"
KIND: Final = "AdmissionReview"
_POD_RESOURCE: Final = "pods"
_CONFIG_MAP_RESOURCE: Final = "configmaps"
_RESOURCE_GROUP: Final = "resource.k8s.io"
# What /validate answers besides pods: ResourceClaims and templates written natively.
CLAIM_RESOURCES: Final = {"resourceclaims": "ResourceClaim",
                          "resourceclaimtemplates": "ResourceClaimTemplate"}


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
    resource: str = _POD_RESOURCE  # the request's resource: pods, resourceclaims, ...


@dataclass(frozen=True, slots=True)
class Denial:
    """Why a review is answered `allowed: false`: HTTP-style code, a Status reason and the
    user's message. A translator's `Refusal` (the rules refuse a pod's request) is one cause of
    several (a policy, a timeout, a template squatted, an internal error)."""

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
    """The pod review in `body`; raises BadReview with a one-line reason."""
    return _parse(body, resource_name=_POD_RESOURCE, kind_name="Pod")


def parse_validation(body: bytes) -> Review:
    """The review /validate answers: of a pod, or of a resource.k8s.io ResourceClaim or
    ResourceClaimTemplate (`Review.resource` says which); raises BadReview."""
    return _parse(body, resource_name=_POD_RESOURCE, kind_name="Pod",
                  claims_too=True)


def parse_config_map(body: bytes) -> Review:
    """The ConfigMap review in `body` (the rules check); raises BadReview."""
    return _parse(body, resource_name=_CONFIG_MAP_RESOURCE, kind_name="ConfigMap")


def _claim_resource(resource: Any, kind: Any) -> str | None:
    """"resourceclaims" or "resourceclaimtemplates" when the request is for one of them."""
    if not (isinstance(resource, dict) and isinstance(kind, dict)
            and resource.get("group") == _RESOURCE_GROUP):
        return None
    name = resource.get("resource")
    if isinstance(name, str) and CLAIM_RESOURCES.get(name) == kind.get("kind"):
        return name
    return None


def _parse(body: bytes, *, resource_name: str, kind_name: str,
           claims_too: bool = False) -> Review:
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
    claim = _claim_resource(resource, kind) if claims_too else None
    if claim is not None:
        resource_name, kind_name = claim, CLAIM_RESOURCES[claim]
    elif not (isinstance(resource, dict) and resource.get("group") == ""
              and resource.get("resource") == resource_name
              and isinstance(kind, dict) and kind.get("kind") == kind_name):
        served = (f"{resource_name}, resourceclaims and resourceclaimtemplates" if claims_too
                  else f"{resource_name} only")
        raise BadReview(
            f"request {uid} is for {_resource_text(resource)}, not {resource_name}; this "
            f"webhook serves {served}: fix the webhook configuration's rules"
        )
    operation = request.get("operation")
    if not isinstance(operation, str):
        raise BadReview(f"request {uid} has no operation")
    obj = request.get("object")
    if operation in ("CREATE", "UPDATE"):
        if not isinstance(obj, dict):
            raise BadReview(f"request {uid} ({operation}) carries {_describe(obj)} as its object, "
                            f"not a {'pod' if kind_name == 'Pod' else kind_name}")
        if kind_name == "Pod" and (obj.get("kind", "Pod") != "Pod"
                                   or not isinstance(obj.get("spec"), dict)):
            raise BadReview(f"request {uid} carries an object that is not a pod with a spec")
        if kind_name != "Pod" and obj.get("kind", kind_name) != kind_name:
            raise BadReview(f"request {uid} carries an object that is not a {kind_name}")
        if kind_name in CLAIM_RESOURCES.values() and not isinstance(obj.get("spec"), dict):
            raise BadReview(f"request {uid} carries a {kind_name} without a spec")
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
        resource=resource_name,
    )


def display_name(kind: str, namespace: str, meta: Mapping[str, Any]) -> str:
    """How messages name an object under review: "pod team-a/train-0" ("name*" when only
    generateName is known)."""
    name = meta.get("name") or (f"{meta['generateName']}*" if meta.get("generateName")
                                else "<unnamed>")
    return f"{kind} {namespace}/{name}" if namespace else f"{kind} {name}"


def check_pod_shape(review: Review) -> None:
    """Raise BadReview when the review's pod could not have come from an API server."""
    if review.object:
        problem = pod_shape_problem(review.object)
        if problem:
            raise BadReview(f"request {review.uid}: the pod's {problem}; it is not a valid Pod")


def _resource_text(resource: Any) -> str:
    if not isinstance(resource, dict):
        return "no resource"
    group = resource.get("group") or "core"
    return f"resource {resource.get('resource')!r} of group {group!r}"


def encode_patch(patch: Sequence[Mapping[str, Any]]) -> str:
    """An RFC 6902 patch as the base64 text the response carries."""
    return base64.b64encode(orjson.dumps(patch)).decode("ascii")


def response(uid: str, *, allowed: bool = True, patch: str | None = None,
             denial: Denial | None = None, warnings: Sequence[str] = (),
             audit: Mapping[str, str] | None = None) -> bytes:
    """The response body; `patch` is already base64 (see `encode_patch`)."""
    answer: dict[str, Any] = {"uid": uid, "allowed": allowed}
    if patch is not None:
        answer["patchType"] = "JSONPatch"
        answer["patch"] = patch
    if denial is not None:
        answer["status"] = {"code": denial.code, "reason": denial.reason,
                            "message": denial.message}
    if warnings:
        answer["warnings"] = list(warnings)
    if audit:
        answer["auditAnnotations"] = dict(audit)
    return orjson.dumps({"apiVersion": API_VERSION, "kind": KIND, "response": answer})

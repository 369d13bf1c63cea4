"""Admission webhooks for the embedded API server, called as kube-apiserver calls them.

The embedded default runs the gateway's webhook as a separate process; for a pod created through
the embedded API to be translated, that API must call the webhooks registered in the cluster's
MutatingWebhookConfigurations and ValidatingWebhookConfigurations, exactly as a real API server
would: rule, namespace-selector, object-selector and matchConditions (CEL) matching, an
AdmissionReview v1 round trip, JSON patches, `reinvocationPolicy: IfNeeded` (once),
`failurePolicy`, `timeoutSeconds`, caBundle verification, and the same refusal wording.
This module decides and calls; it stores nothing and must not be used in front of a real API.

Differences from kube-apiserver, each for the embedded setting:
- `clientConfig.service` cannot resolve cluster DNS, so a service is looked up in the
  `services` map ("namespace/name" -> "host:port") given at start; the TLS name checked is
  still `<name>.<namespace>.svc`, so the certificate of a real deployment works;
- `clientConfig.url` may also be `http://` (kube-apiserver requires https) so tests and local
  runs can skip certificates;
- there is no authorizer: `request.userInfo` names the embedded client and matchConditions
  cannot use `authorizer`;
- validating webhooks are called one after another rather than in parallel.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import aiohttp
import jsonpatch  # type: ignore[import-untyped,unused-ignore]

from dra_gateway.devkit.sim.selectors import label_selector_matches
from dra_gateway.kube import objects
from dra_gateway.kube.cel import CelError, compile_expression
from dra_gateway.kube.cluster.port import ApiError, Cluster, NotFound, Object
from dra_gateway.kube.resources import (
    MUTATING_WEBHOOK_CONFIGURATIONS,
    NAMESPACES,
    VALIDATING_WEBHOOK_CONFIGURATIONS,
    ResourceType,
)

log = logging.getLogger(__name__)

Operation = Literal["CREATE", "UPDATE", "DELETE"]
DEFAULT_TIMEOUT_S = 10
USER_INFO = {"username": "system:dra-gateway:embedded", "groups": ["system:authenticated"]}
_OPTIONS_KIND = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}


@dataclass(frozen=True, slots=True)
class AdmissionRequest:
    rt: ResourceType
    operation: Operation
    namespace: str | None
    name: str
    object: Object | None
    old_object: Object | None
    dry_run: bool

    def review(self, uid: str, obj: Object | None) -> dict[str, Any]:
        group, version = self.rt.group, self.rt.version
        kind = {"group": group, "version": version, "kind": self.rt.kind}
        resource = {"group": group, "version": version, "resource": self.rt.plural}
        request: dict[str, Any] = {
            "uid": uid, "kind": kind, "resource": resource, "requestKind": kind,
            "requestResource": resource, "name": self.name, "operation": self.operation,
            "userInfo": USER_INFO, "object": obj, "oldObject": self.old_object,
            "dryRun": self.dry_run,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": _OPTIONS_KIND[self.operation]},
        }
        if self.namespace:
            request["namespace"] = self.namespace
        return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": request}


def rule_matches(rule: Mapping[str, Any], rt: ResourceType, operation: Operation) -> bool:
    """One RuleWithOperations against a main resource (subresources are not admitted here)."""
    def has(field: str, value: str) -> bool:
        listed = rule.get(field) or []
        return "*" in listed or value in listed

    resources = rule.get("resources") or []
    scope = rule.get("scope") or "*"
    return (has("operations", operation) and has("apiGroups", rt.group)
            and has("apiVersions", rt.version)
            and ("*" in resources or rt.plural in resources or f"{rt.plural}/*" in resources)
            and (scope == "*" or (scope == "Namespaced") == rt.namespaced))


class Admission:
    """The admission chain of the embedded API server over `cluster`'s webhook configurations.

    Use as `async with Admission(cluster, services=...) as admission:` (it owns an HTTP session).
    """

    def __init__(self, cluster: Cluster, *, services: Mapping[str, str] | None = None) -> None:
        self.cluster = cluster
        self.services = dict(services or {})
        self._session: aiohttp.ClientSession | None = None
        self._ssl: dict[str, ssl.SSLContext] = {}

    async def __aenter__(self) -> Admission:
        self._session = aiohttp.ClientSession(trust_env=False)
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def wants(self, rt: ResourceType, operation: Operation) -> bool:
        """Whether any registered webhook has a rule for this resource and operation."""
        if rt in (MUTATING_WEBHOOK_CONFIGURATIONS, VALIDATING_WEBHOOK_CONFIGURATIONS):
            return False  # as upstream: configurations are never admitted by webhooks
        for config_rt in (MUTATING_WEBHOOK_CONFIGURATIONS, VALIDATING_WEBHOOK_CONFIGURATIONS):
            for config in (await self.cluster.list(config_rt)).items:
                for hook in config.get("webhooks") or []:
                    if any(rule_matches(r, rt, operation) for r in hook.get("rules") or []):
                        return True
        return False

    async def admit(self, request: AdmissionRequest) -> Object | None:
        """The object after mutating webhooks; raises the API error a refusal becomes."""
        if not await self.wants(request.rt, request.operation):
            return request.object
        obj = request.object
        mutating = await self._hooks(MUTATING_WEBHOOK_CONFIGURATIONS, request, obj)
        called: list[tuple[dict[str, Any], Object | None]] = []
        for hook in mutating:
            if await self._selected(hook, request, obj):
                before = obj
                obj = await self._call(hook, request, obj, mutating=True)
                called.append((hook, before))
        # reinvocationPolicy IfNeeded: a webhook that saw an object later changed runs once more.
        for hook, seen in called:
            if hook.get("reinvocationPolicy") == "IfNeeded" and seen != obj and obj is not None:
                obj = await self._call(hook, request, obj, mutating=True)
        for hook in await self._hooks(VALIDATING_WEBHOOK_CONFIGURATIONS, request, obj):
            if await self._selected(hook, request, obj):
                await self._call(hook, request, obj, mutating=False)
        return obj

    async def _hooks(self, config_rt: ResourceType, request: AdmissionRequest,
                     obj: Object | None) -> list[dict[str, Any]]:
        hooks: list[dict[str, Any]] = []
        configs = sorted((await self.cluster.list(config_rt)).items,
                         key=lambda c: str(c["metadata"]["name"]))
        for config in configs:
            for hook in config.get("webhooks") or []:
                if any(rule_matches(r, request.rt, request.operation)
                       for r in hook.get("rules") or []):
                    hooks.append(hook)
        return hooks

    async def _selected(self, hook: Mapping[str, Any], request: AdmissionRequest,
                        obj: Object | None) -> bool:
        if request.rt.namespaced and request.namespace:
            labels: dict[str, str] = {"kubernetes.io/metadata.name": request.namespace}
            try:
                namespace = await self.cluster.get(NAMESPACES, request.namespace)
                labels.update(objects.labels(namespace))
            except NotFound:
                pass  # the embedded cluster does not require namespaces to exist
            if not label_selector_matches(hook.get("namespaceSelector"), labels):
                return False
        object_selector = hook.get("objectSelector")
        if object_selector:
            candidates = [o for o in (obj, request.old_object) if o is not None]
            if not any(label_selector_matches(object_selector,
                                              objects.labels(o))
                       for o in candidates):
                return False
        for condition in hook.get("matchConditions") or []:
            variables = {"object": obj, "oldObject": request.old_object,
                         "request": request.review("", obj)["request"]}
            try:
                expression = compile_expression(
                    str(condition.get("expression")), variables=variables,
                    what=f'webhook "{hook.get("name")}" matchConditions '
                         f'"{condition.get("name")}"')
                verdict = expression.evaluate(variables)
            except CelError as exc:
                if hook.get("failurePolicy", "Fail") == "Ignore":
                    return False
                raise ApiError(f'failed calling webhook "{hook.get("name")}": '
                               f"matchCondition error: {exc}", code=500,
                               reason="InternalError") from None
            if verdict is not True:
                return False
        return True

    async def _call(self, hook: Mapping[str, Any], request: AdmissionRequest,
                    obj: Object | None, *, mutating: bool) -> Object | None:
        name = str(hook.get("name"))
        uid = str(uuid.uuid4())
        try:
            response = await self._post(hook, request.review(uid, obj))
        except _CallFailed as exc:
            if hook.get("failurePolicy", "Fail") == "Ignore":
                log.warning("admission: webhook %s failed and is ignored: %s", name, exc)
                return obj
            raise ApiError(f'Internal error occurred: failed calling webhook "{name}": {exc}',
                           code=500, reason="InternalError") from None
        if response.get("uid") != uid:
            raise ApiError(f'Internal error occurred: failed calling webhook "{name}": expected '
                           f'response.uid="{uid}", got "{response.get("uid")}"', code=500,
                           reason="InternalError")
        if not response.get("allowed"):
            status = response.get("status") or {}
            message = status.get("message") or status.get("reason") or ""
            code = int(status.get("code") or 400)
            text = f'admission webhook "{name}" denied the request'
            raise ApiError(f"{text}: {message}" if message else f"{text} without explanation",
                           code=code, reason=str(status.get("reason") or "BadRequest"))
        patch = response.get("patch")
        if not mutating or not patch:
            return obj
        if response.get("patchType") != "JSONPatch":
            raise ApiError(f'Internal error occurred: webhook "{name}" sent patchType '
                           f'"{response.get("patchType")}"; only "JSONPatch" is allowed',
                           code=500, reason="InternalError")
        try:
            operations = json.loads(base64.b64decode(patch))
            patched: Object = jsonpatch.JsonPatch(operations).apply(obj)
        except (ValueError, TypeError, jsonpatch.JsonPatchException,
                jsonpatch.JsonPointerException) as exc:
            raise ApiError(f'Internal error occurred: webhook "{name}" sent a patch that '
                           f"cannot be applied: {exc}", code=500,
                           reason="InternalError") from None
        return patched

    async def _post(self, hook: Mapping[str, Any], review: dict[str, Any]) -> dict[str, Any]:
        if self._session is None:
            raise RuntimeError("Admission must be entered (`async with`) before use")
        config = hook.get("clientConfig") or {}
        url, server_name = self._endpoint(config)
        ssl_context = self._context(config.get("caBundle")) if url.startswith("https:") else None
        timeout = aiohttp.ClientTimeout(total=float(hook.get("timeoutSeconds")
                                                    or DEFAULT_TIMEOUT_S))
        try:
            async with self._session.post(url, json=review, timeout=timeout,
                                          ssl=ssl_context if ssl_context else True,
                                          server_hostname=server_name) as reply:
                if reply.status != 200:
                    text = (await reply.text())[:300]
                    raise _CallFailed(f'Post "{url}": HTTP {reply.status}: {text}')
                body = await reply.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise _CallFailed(f'failed to call webhook: Post "{url}": '
                              f"{type(exc).__name__}: {exc}") from None
        response = body.get("response") if isinstance(body, dict) else None
        if not isinstance(response, dict):
            raise _CallFailed(f'Post "{url}": the reply is not an AdmissionReview with a '
                              "response")
        return response

    def _endpoint(self, config: Mapping[str, Any]) -> tuple[str, str | None]:
        if config.get("url"):
            return str(config["url"]), None
        service = config.get("service") or {}
        key = f"{service.get('namespace')}/{service.get('name')}"
        address = self.services.get(key)
        if address is None:
            raise _CallFailed(f'service "{key}" is not known to the embedded API server: start '
                              f"it with --webhook-service {key}=HOST:PORT")
        path = service.get("path") or "/"
        return (f"https://{address}{path}",
                f"{service.get('name')}.{service.get('namespace')}.svc")

    def _context(self, ca_bundle: str | None) -> ssl.SSLContext | None:
        if not ca_bundle:
            return None
        context = self._ssl.get(ca_bundle)
        if context is None:
            try:
                pem = base64.b64decode(ca_bundle).decode("ascii")
                context = ssl.create_default_context(cadata=pem)
            except (ValueError, ssl.SSLError) as exc:
                raise _CallFailed(f"the caBundle is not a base64 PEM certificate: {exc}") \
                    from None
            self._ssl[ca_bundle] = context
        return context


class _CallFailed(Exception):
    """A webhook could not be called or answered nonsense (failurePolicy decides)."""


__all__ = ["Admission", "AdmissionRequest", "rule_matches"]

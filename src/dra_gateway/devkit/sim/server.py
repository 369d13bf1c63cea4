"""The cluster port served over HTTP as the subset of the Kubernetes REST API the project uses.

This is the embedded default's API server: components, kubectl-like tools and the official
Python clients talk to it exactly as they talk to a real cluster (paths, verbs, watch streams,
`metav1.Status` errors, discovery, the OpenAPI v3 documents of `openapi`, Tables for
`kubectl get` from `tables`, a simplified server-side apply). It translates HTTP to `Cluster`
calls and back and holds no state of its own; semantics (versions, conflicts, validation) belong
to the cluster behind it, except what the API server does while decoding a request and in its
registry, before storage: unknown fields under `fieldValidation`, and the gateway's CRD schemas
(`crds`, `structural`: pruning, defaults, validation and CEL rules) on every write of those
kinds over HTTP (the in-memory cluster called directly, the tests' fake, stays lenient).
It must not be exposed beyond loopback without a token: it has no authorization.

The REST surface stays one table of paths and verbs: split by verb, it would be scattered.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hmac
import logging
import os
import ssl
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import yaml
from aiohttp import web

from dra_gateway.devkit.sim import crds, openapi, structural, tables
from dra_gateway.devkit.sim.admission import Admission, AdmissionRequest
from dra_gateway.devkit.sim.errors import invalid
from dra_gateway.devkit.sim.patching import (
    apply_patch,
    copy_object,
    strategic_merge_patch,
)
from dra_gateway.devkit.sim.patching import merge_patch as merge_patch_of
from dra_gateway.kube import objects
from dra_gateway.kube.cluster.port import (
    ApiError,
    BadRequest,
    Cluster,
    Conflict,
    NotFound,
    Object,
    PatchType,
    WatchEvent,
)
from dra_gateway.kube.files import atomic_write
from dra_gateway.kube.resources import ALL, ResourceType

log = logging.getLogger(__name__)

KUBERNETES_VERSION = {"major": "1", "minor": "34", "gitVersion": "v1.34.0-dra-gateway",
                      "gitCommit": "", "gitTreeState": "clean", "buildDate": "",
                      "goVersion": "", "compiler": "python", "platform": "linux/amd64"}

_PATCH_TYPES: dict[str, PatchType] = {
    "application/json-patch+json": "json",
    "application/merge-patch+json": "merge",
    "application/strategic-merge-patch+json": "strategic",
}
_VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]
# The short names upstream's discovery gives the built-in kinds served here.
_SHORT_NAMES: dict[ResourceType, tuple[str, ...]] = {
    rt: names for rt in ALL for (group, plural), names in {
        ("", "pods"): ("po",), ("", "nodes"): ("no",), ("", "namespaces"): ("ns",),
        ("", "configmaps"): ("cm",), ("", "events"): ("ev",),
        ("policy", "poddisruptionbudgets"): ("pdb",),
    }.items() if (rt.group, rt.plural) == (group, plural)}
_FIELD_VALIDATION = ("Ignore", "Warn", "Strict")
_BY_PATH: dict[tuple[str, str, str], ResourceType] = {
    (rt.group, rt.version, rt.plural): rt for rt in ALL
}

CLUSTER_KEY = web.AppKey("cluster", Cluster)
TOKEN_KEY = web.AppKey("token", str)
STOPPING_KEY = web.AppKey("stopping", asyncio.Event)
ADMISSION_KEY: web.AppKey[Admission | None] = web.AppKey("admission")
# Patches re-read and re-admit the object when another writer got in between.
_PATCH_ATTEMPTS = 5
# How often an idle watch checks that its client is still there.
_LIVENESS_CHECK_S = 2.0


def _json(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _error(exc: ApiError) -> web.Response:
    status = dict(exc.status)
    status.setdefault("code", exc.code)
    return _json(status, status=exc.code)


def _status_error(code: int, reason: str, message: str) -> web.Response:
    return _error(ApiError(message, code=code, reason=reason))


# Discovery -------------------------------------------------------------------------------------

def _groups() -> dict[str, list[str]]:
    groups: dict[str, list[str]] = {}
    for rt in ALL:
        versions = groups.setdefault(rt.group, [])
        if rt.version not in versions:
            versions.append(rt.version)
    return groups


def _resource_list(group: str, version: str) -> dict[str, Any] | None:
    resources: list[dict[str, Any]] = []
    for rt in ALL:
        if rt.group != group or rt.version != version:
            continue
        resource = {"name": rt.plural, "singularName": rt.kind.lower(),
                    "namespaced": rt.namespaced, "kind": rt.kind, "verbs": _VERBS}
        definition = crds.definition(rt)
        if definition is not None:
            resource.update(singularName=definition.singular,
                            shortNames=list(definition.short_names),
                            categories=list(definition.categories))
        elif rt in _SHORT_NAMES:
            resource["shortNames"] = list(_SHORT_NAMES[rt])
        resources.append(resource)
        if rt.has_status:
            resources.append({"name": f"{rt.plural}/status", "singularName": "",
                              "namespaced": rt.namespaced, "kind": rt.kind,
                              "verbs": ["get", "patch", "update"]})
    if not resources:
        return None
    return {"kind": "APIResourceList", "apiVersion": "v1",
            "groupVersion": f"{group}/{version}" if group else version, "resources": resources}


def _api_group(group: str, versions: list[str]) -> dict[str, Any]:
    listed = [{"groupVersion": f"{group}/{v}", "version": v} for v in versions]
    return {"kind": "APIGroup", "apiVersion": "v1", "name": group, "versions": listed,
            "preferredVersion": listed[0]}


# Requests --------------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class _Target:
    rt: ResourceType
    namespace: str | None
    name: str | None
    subresource: str | None


def _target(segments: list[str]) -> _Target | None:
    """Parse `/api/v1/...` or `/apis/<group>/<version>/...` into a resource target."""
    if len(segments) >= 2 and segments[0] == "api":
        group, version, rest = "", segments[1], segments[2:]
    elif len(segments) >= 3 and segments[0] == "apis":
        group, version, rest = segments[1], segments[2], segments[3:]
    else:
        return None
    namespace: str | None = None
    if (len(rest) >= 3 and rest[0] == "namespaces"
            and (group, version, rest[2]) in _BY_PATH
            and _BY_PATH[(group, version, rest[2])].namespaced):
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        return None
    rt = _BY_PATH.get((group, version, rest[0]))
    if rt is None:
        return None
    name = rest[1] if len(rest) >= 2 else None
    subresource = rest[2] if len(rest) == 3 else None
    return _Target(rt, namespace, name, subresource)


async def _body(request: web.Request) -> Any:
    raw = await request.read()
    if not raw:
        raise BadRequest("the request has no body: send the object as JSON")
    content_type = request.content_type
    try:
        if content_type in ("application/yaml", "application/x-yaml",
                            "application/apply-patch+yaml"):
            return yaml.safe_load(raw)
        return orjson.loads(raw)
    except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
        raise BadRequest(f"the request body is not valid "
                         f"{'YAML' if 'yaml' in content_type else 'JSON'}: {exc}") from None


def _flag(query: Mapping[str, str], name: str) -> bool:
    return query.get(name, "").lower() in ("true", "1")


def _dry_run(query: Mapping[str, str]) -> bool:
    value = query.get("dryRun")
    if value is None:
        return False
    if value != "All":
        raise BadRequest(f'unsupported dryRun value "{value}": the only supported value is "All"')
    return True


def _field_validation(query: Mapping[str, str]) -> str:
    value = query.get("fieldValidation") or "Ignore"
    if value not in _FIELD_VALIDATION:
        raise BadRequest(f'fieldValidation "{value}" is not supported: use one of '
                         + ", ".join(_FIELD_VALIDATION))
    return value


def _unknown_fields(rt: ResourceType, obj: Object) -> list[str]:
    definition = crds.definition(rt)
    if definition is not None:
        return structural.unknown_fields(definition.schema, obj, custom=True)
    described = openapi.schema_of(rt)
    if described is None:
        return []
    schema, components = described
    return structural.unknown_fields(schema, obj, resolve=openapi.resolver(components))


def _decoded(rt: ResourceType, obj: Object, old: Object | None, query: Mapping[str, str],
             warnings: list[str], subresource: str | None) -> Object:
    """The object as the API server decodes a write: unknown fields refused (Strict), warned
    about (Warn) or dropped (custom resources, whose schema prunes them; a built-in kind's
    decoding into Go types drops them, which the simulator leaves to the components' own
    checks); a custom resource's defaults filled in."""
    mode = _field_validation(query)
    if mode != "Ignore":
        known = set(_unknown_fields(rt, old)) if old is not None else set()
        unknown = [f for f in _unknown_fields(rt, obj) if f not in known]
        if unknown and mode == "Strict":
            listed = ", ".join(f'unknown field "{f}"' for f in unknown)
            raise BadRequest(f'{rt.kind} in version "{rt.version}" cannot be handled as a '
                             f"{rt.kind}: strict decoding error: {listed}")
        warnings.extend(f'unknown field "{f}"' for f in unknown)
    definition = crds.definition(rt)
    if definition is None:
        return obj
    decoded: Object = structural.default(definition.schema,
                                         structural.prune(definition.schema, obj))
    if subresource is None and old is not None and "status" in old:
        decoded["status"] = old["status"]  # the main resource leaves status alone
    return decoded


def _validated(rt: ResourceType, obj: Object, old: Object | None,
               subresource: str | None) -> None:
    """Refuse a custom resource its CRD's schema or rules refuse (Invalid, as upstream)."""
    definition = crds.definition(rt)
    if definition is None:
        return
    errors = structural.validate(definition.schema, obj, old, status=subresource == "status")
    if errors:
        raise invalid(rt, str(objects.meta(obj).get("name") or ""), errors)


def _warned(response: web.Response, warnings: list[str]) -> web.Response:
    """The response with a `Warning` header per warning, as kubectl prints them."""
    for warning in warnings:
        escaped = warning.replace("\\", "\\\\").replace('"', '\\"')
        response.headers.add("Warning", f'299 - "{escaped}"')
    return response


class _Handler:
    def __init__(self, app: web.Application) -> None:
        self.app = app

    @property
    def cluster(self) -> Cluster:
        return self.app[CLUSTER_KEY]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        token = self.app[TOKEN_KEY]
        path = request.path.rstrip("/") or "/"
        if path in ("/healthz", "/livez", "/readyz"):
            return web.Response(text="ok")
        if token:
            sent = request.headers.get("Authorization", "")
            if not hmac.compare_digest(sent.encode(), f"Bearer {token}".encode()):
                return _status_error(401, "Unauthorized", "Unauthorized: send the bearer token "
                                     "of the kubeconfig written by `dra-gateway cluster serve`")
        try:
            return await self._dispatch(request, path)
        except ApiError as exc:
            return _error(exc)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a server must answer, whatever the bug
            log.exception("internal error serving %s %s", request.method, request.path)
            return _status_error(500, "InternalError",
                                 f"internal error serving {request.method} {request.path}: "
                                 f"{type(exc).__name__}: {exc}")

    async def _dispatch(self, request: web.Request, path: str) -> web.StreamResponse:
        segments = [s for s in path.split("/") if s]
        if request.method == "GET":
            discovered = self._discovery(request, segments)
            if discovered is not None:
                return discovered
        target = _target(segments)
        if target is None:
            raise NotFound(f"the server could not find the requested resource ({request.method} "
                           f"{request.path})")
        rt, name = target.rt, target.name
        query = request.query
        method = request.method
        if (target.subresource == "eviction" and rt.plural == "pods"
                and request.method == "POST" and target.name and target.namespace):
            # The Eviction API (policy/v1); the simulator has no disruption controller.
            body = await _body(request)
            preconditions = ((body or {}).get("deleteOptions") or {}).get("preconditions") \
                if isinstance(body, dict) else None
            await self.cluster.evict(target.name, namespace=target.namespace,
                                     uid=(preconditions or {}).get("uid"))
            return _json({"apiVersion": "v1", "kind": "Status", "metadata": {},
                          "status": "Success", "code": 201}, status=201)
        if target.subresource is not None and (target.subresource != "status"
                                               or not rt.has_status):
            raise NotFound(f"the server could not find the requested resource: {rt.plural} "
                           f'have no subresource "{target.subresource}"')
        if name is None:
            if method == "GET":
                if _flag(query, "watch"):
                    return await self._watch(request, target)
                listed = await self.cluster.list(
                    rt, namespace=target.namespace, label_selector=query.get("labelSelector"),
                    field_selector=query.get("fieldSelector"))
                if tables.wants_table(request.headers.get("Accept", "")):
                    return _json(tables.table(
                        rt, listed.items, resource_version=listed.resource_version,
                        include_object=query.get("includeObject", "Metadata")))
                return _json({"apiVersion": rt.api_version, "kind": rt.list_kind,
                              "metadata": {"resourceVersion": listed.resource_version},
                              "items": listed.items})
            if method == "POST":
                if rt.namespaced and target.namespace is None:
                    raise BadRequest(f"create {rt.plural} under /namespaces/<namespace>/"
                                     f"{rt.plural}: the type is namespaced")
                obj = await _body(request)
                if not isinstance(obj, dict):
                    raise BadRequest(f"the body must be a {rt.kind} object")
                warnings: list[str] = []
                created = await self._create(rt, obj, target.namespace, query, warnings)
                return _warned(_json(created, status=201), warnings)
            raise ApiError(f"{method} is not supported on the {rt.plural} collection",
                           code=405, reason="MethodNotAllowed")
        if rt.namespaced and target.namespace is None:
            raise NotFound(f"the server could not find the requested resource: {rt.plural} are "
                           "namespaced; use /namespaces/<namespace>/" + rt.plural + "/" + name)
        if method == "GET":
            got = await self.cluster.get(rt, name, namespace=target.namespace)
            if tables.wants_table(request.headers.get("Accept", "")):
                return _json(tables.table(rt, [got], resource_version=objects.resource_version(
                    got), include_object=query.get("includeObject", "Metadata")))
            return _json(got)
        if method in ("PUT", "PATCH", "DELETE") and "dryRun" in query:
            raise BadRequest(f"dryRun is supported on create only, not on {method}")
        if method == "PUT":
            obj = await _body(request)
            if not isinstance(obj, dict):
                raise BadRequest(f"the body must be a {rt.kind} object")
            in_body = objects.meta(obj).get("name")
            if in_body != name:
                raise BadRequest(f"the name of the object ({in_body}) does not match the name "
                                 f"on the URL ({name})")
            warnings = []
            old = await self.cluster.get(rt, name, namespace=target.namespace)
            obj = _decoded(rt, obj, old, query, warnings, target.subresource)
            admission = self.app[ADMISSION_KEY]
            if (admission is not None and target.subresource is None
                    and await admission.wants(rt, "UPDATE")):
                obj = await admission.admit(AdmissionRequest(
                    rt, "UPDATE", target.namespace, name, obj, old, False)) or obj
            _validated(rt, obj, old, target.subresource)
            return _warned(_json(await self.cluster.update(
                rt, obj, namespace=target.namespace, subresource=target.subresource)), warnings)
        if method == "PATCH":
            content_type = request.content_type
            if content_type == "application/apply-patch+yaml":
                return await self._apply(request, target, name)
            patch_type = _PATCH_TYPES.get(content_type)
            if patch_type is None:
                raise ApiError(f'the patch content type "{content_type}" is not supported: use '
                               + ", ".join([*_PATCH_TYPES, "application/apply-patch+yaml"]),
                               code=415, reason="UnsupportedMediaType")
            if patch_type == "strategic" and crds.definition(rt) is not None:
                raise ApiError(f'the body of the request was in an unknown format - accepted '
                               f'media types include: {", ".join(openapi._CUSTOM_PATCH_TYPES)}',
                               code=415, reason="UnsupportedMediaType")
            patch = await _body(request)
            admission = self.app[ADMISSION_KEY]
            wants = (admission is not None and target.subresource is None
                     and await admission.wants(rt, "UPDATE"))
            if (wants or crds.definition(rt) is not None
                    or _field_validation(query) != "Ignore"):
                warnings = []
                patched = await self._patch(rt, name, target.namespace, target.subresource,
                                            lambda current: apply_patch(
                                                current, copy_object(patch), patch_type),
                                            query, warnings, admission if wants else None)
                return _warned(_json(patched), warnings)
            return _json(await self.cluster.patch(rt, name, patch, namespace=target.namespace,
                                                  patch_type=patch_type,
                                                  subresource=target.subresource))
        if method == "DELETE":
            if target.subresource is not None:
                raise ApiError("DELETE is not supported on a subresource", code=405,
                               reason="MethodNotAllowed")
            precondition = await self._delete_precondition(request)
            admission = self.app[ADMISSION_KEY]
            if admission is not None and await admission.wants(rt, "DELETE"):
                old = await self.cluster.get(rt, name, namespace=target.namespace)
                await admission.admit(AdmissionRequest(rt, "DELETE", target.namespace, name,
                                                       None, old, False))
            deleted = await self.cluster.delete(rt, name, namespace=target.namespace,
                                                resource_version=precondition)
            if deleted is None:
                return _json({"apiVersion": "v1", "kind": "Status", "metadata": {},
                              "status": "Success", "details": {"name": name,
                                                               "kind": rt.plural}})
            pending = bool(objects.finalizers(deleted))
            return _json(deleted, status=202 if pending else 200)
        raise ApiError(f"{method} is not supported on {rt.plural}", code=405,
                       reason="MethodNotAllowed")

    async def _admit_create(self, admission: Admission, rt: ResourceType, obj: Object,
                            namespace: str | None, dry_run: bool) -> Object:
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise BadRequest(f"metadata of a {rt.kind} must be a JSON object")
        if rt.namespaced and namespace and not meta.get("namespace"):
            meta["namespace"] = namespace  # webhooks see the namespace of the URL, as upstream
        obj.setdefault("apiVersion", rt.api_version)
        obj.setdefault("kind", rt.kind)
        # A generated name is not known yet: webhooks see "" (admission/v1).
        admitted = await admission.admit(AdmissionRequest(
            rt, "CREATE", namespace, str(meta.get("name") or ""), obj, None, dry_run))
        return admitted if admitted is not None else obj

    async def _create(self, rt: ResourceType, obj: Object, namespace: str | None,
                      query: Mapping[str, str], warnings: list[str]) -> Object:
        """A create as the API server handles it: decoding (unknown fields, a custom
        resource's pruning and defaults), mutating admission, validation, storage."""
        dry_run = _dry_run(query)
        obj = _decoded(rt, obj, None, query, warnings, None)
        admission = self.app[ADMISSION_KEY]
        if admission is not None and await admission.wants(rt, "CREATE"):
            obj = await self._admit_create(admission, rt, obj, namespace, dry_run)
        _validated(rt, obj, None, None)
        return await self.cluster.create(rt, obj, namespace=namespace, dry_run=dry_run)

    async def _patch(self, rt: ResourceType, name: str, namespace: str | None,
                     subresource: str | None, change: Callable[[Object], Object],
                     query: Mapping[str, str], warnings: list[str],
                     admission: Admission | None) -> Object:
        """Patch, decode, admit and validate the patched object, store it if nothing changed
        meanwhile."""
        for _ in range(_PATCH_ATTEMPTS):
            current = await self.cluster.get(rt, name, namespace=namespace)
            patched = change(copy_object(current))
            patched.setdefault("metadata", {})["resourceVersion"] = (
                objects.resource_version(patched) or current["metadata"]["resourceVersion"])
            found: list[str] = []
            patched = _decoded(rt, patched, current, query, found, subresource)
            if admission is not None:
                patched = await admission.admit(AdmissionRequest(
                    rt, "UPDATE", namespace, name, patched, current, False)) or patched
            _validated(rt, patched, current, subresource)
            try:
                stored = await self.cluster.update(rt, patched, namespace=namespace,
                                                   subresource=subresource)
            except Conflict:
                if (patched.get("metadata") or {}).get("resourceVersion") != \
                        current["metadata"]["resourceVersion"]:
                    raise  # the patch itself carried a stale resourceVersion
                continue
            warnings.extend(found)
            return stored
        raise Conflict(f"the patch of {rt.plural} \"{name}\" kept conflicting with other "
                       "writers; retry it")

    async def _apply(self, request: web.Request, target: _Target,
                     name: str) -> web.Response:
        """Server-side apply, simplified: the applied configuration is created, or merged
        into the live object (by the lists' merge keys for built-in kinds, as a merge patch
        for custom resources). There are no managed fields: a field left out of the applied
        configuration is kept, not removed, and no conflict between managers is reported."""
        rt = target.rt
        applied = await _body(request)
        if not isinstance(applied, dict):
            raise BadRequest(f"the applied configuration must be a {rt.kind} object")
        if objects.meta(applied).get("name") not in (None, name):
            raise BadRequest(f"the name of the object ({objects.meta(applied).get('name')}) "
                             f"does not match the name on the URL ({name})")
        applied.setdefault("metadata", {})["name"] = name
        applied["metadata"].pop("managedFields", None)
        query = request.query
        warnings: list[str] = []
        try:
            await self.cluster.get(rt, name, namespace=target.namespace)
        except NotFound:
            if target.subresource is not None:
                raise
            created = await self._create(rt, applied, target.namespace, query, warnings)
            return _warned(_json(created, status=201), warnings)
        merge = merge_patch_of if crds.definition(rt) is not None else strategic_merge_patch
        admission = self.app[ADMISSION_KEY]
        wants = (admission is not None and target.subresource is None
                 and await admission.wants(rt, "UPDATE"))

        def change(current: Object) -> Object:
            result: Object = merge(current, copy_object(applied))
            result["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            return result

        patched = await self._patch(rt, name, target.namespace, target.subresource, change,
                                    query, warnings, admission if wants else None)
        return _warned(_json(patched), warnings)

    async def _delete_precondition(self, request: web.Request) -> str | None:
        raw = await request.read()
        if not raw:
            return None
        try:
            options = orjson.loads(raw)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"the DeleteOptions body is not valid JSON: {exc}") from None
        if not isinstance(options, dict):
            raise BadRequest("the DeleteOptions body must be a JSON object")
        if options.get("dryRun"):
            raise BadRequest("dryRun is supported on create only, not on DELETE")
        preconditions = options.get("preconditions") or {}
        if preconditions.get("uid"):
            raise BadRequest("a uid precondition on delete is not supported: use "
                             "preconditions.resourceVersion")
        value = preconditions.get("resourceVersion")
        return str(value) if value else None

    def _discovery(self, request: web.Request, segments: list[str]) -> web.Response | None:
        if segments == ["version"]:
            return _json(KUBERNETES_VERSION)
        if segments[:2] == ["openapi", "v3"]:
            if len(segments) == 2:
                return web.Response(body=openapi.index(), content_type="application/json")
            rest = segments[2:]
            doc = None
            if len(rest) == 2 and rest[0] == "api":
                doc = openapi.document("", rest[1])
            elif len(rest) == 3 and rest[0] == "apis":
                doc = openapi.document(rest[1], rest[2])
            if doc is None:
                raise NotFound(f"the server could not find the requested resource (GET "
                               f"{request.path})")
            return web.Response(body=doc, content_type="application/json")
        if segments == ["api"]:
            return _json({"kind": "APIVersions", "versions": ["v1"],
                          "serverAddressByClientCIDRs": [
                              {"clientCIDR": "0.0.0.0/0", "serverAddress": request.host}]})
        if segments == ["apis"]:
            return _json({"kind": "APIGroupList", "apiVersion": "v1", "groups": [
                _api_group(g, v) for g, v in _groups().items() if g]})
        if len(segments) == 2 and segments[0] == "api":
            listed = _resource_list("", segments[1])
            if listed is None:
                raise NotFound(f"the server could not find the requested resource (GET "
                               f"{request.path}): API version {segments[1]} is not served")
            return _json(listed)
        if len(segments) == 2 and segments[0] == "apis":
            versions = _groups().get(segments[1])
            if not versions or not segments[1]:
                raise NotFound(f"the server could not find the requested resource (GET "
                               f"{request.path}): API group {segments[1]} is not served")
            return _json(_api_group(segments[1], versions))
        if len(segments) == 3 and segments[0] == "apis":
            listed = _resource_list(segments[1], segments[2])
            if listed is None:
                raise NotFound(f"the server could not find the requested resource (GET "
                               f"{request.path}): {segments[1]}/{segments[2]} is not served")
            return _json(listed)
        return None

    async def _watch(self, request: web.Request, target: _Target) -> web.StreamResponse:
        query = request.query
        timeout: float | None = None
        if query.get("timeoutSeconds"):
            try:
                timeout = float(query["timeoutSeconds"])
            except ValueError:
                raise BadRequest(f'invalid timeoutSeconds "{query["timeoutSeconds"]}": expected '
                                 "a number of seconds") from None
        # Selectors and the resourceVersion are checked here, before the stream starts, so a
        # bad one is an HTTP error; expiry arrives in the stream as an ERROR event.
        events = self.cluster.watch(
            target.rt, namespace=target.namespace, resource_version=query.get("resourceVersion"),
            label_selector=query.get("labelSelector"), field_selector=query.get("fieldSelector"),
            timeout_seconds=timeout)
        as_table = tables.wants_table(request.headers.get("Accept", ""))
        include = query.get("includeObject", "Metadata")
        response = web.StreamResponse(headers={"Content-Type": "application/json",
                                               "Cache-Control": "no-cache"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        stopping = self.app[STOPPING_KEY]
        stop = asyncio.ensure_future(stopping.wait())
        try:
            async with contextlib.aclosing(events) as stream:  # type: ignore[type-var]
                while True:
                    # The next event runs as its own task so this loop can notice, between
                    # events, a client that went away or a server that is stopping.
                    upcoming = asyncio.ensure_future(_next_event(stream))
                    while not upcoming.done():
                        await asyncio.wait({upcoming, stop}, timeout=_LIVENESS_CHECK_S,
                                           return_when=asyncio.FIRST_COMPLETED)
                        transport = request.transport
                        if stop.done() or transport is None or transport.is_closing():
                            upcoming.cancel()
                            with contextlib.suppress(asyncio.CancelledError, ApiError):
                                await upcoming
                            return response
                    try:
                        event = upcoming.result()
                    except ApiError as exc:
                        status = dict(exc.status)
                        status.setdefault("code", exc.code)
                        await response.write(orjson.dumps({"type": "ERROR", "object": status})
                                             + b"\n")
                        break
                    if event is None:
                        break
                    shown = event.object
                    if as_table and event.type != "BOOKMARK":
                        shown = tables.table(target.rt, [shown], include_object=include,
                                             resource_version=objects.resource_version(shown))
                    await response.write(orjson.dumps(
                        {"type": event.type, "object": shown}) + b"\n")
            await response.write_eof()
        except ConnectionResetError:
            pass  # the client went away: the watch just ends
        finally:
            stop.cancel()
        return response


async def _next_event(stream: AsyncIterator[WatchEvent]) -> WatchEvent | None:
    try:
        return await anext(stream)
    except StopAsyncIteration:
        return None


async def _stop_watches(app: web.Application) -> None:
    """On shutdown, end open watch streams instead of waiting for their timeouts."""
    app[STOPPING_KEY].set()


def create_app(cluster: Cluster, *, token: str | None = None,
               admission: Admission | None = None) -> web.Application:
    """The API server application over `cluster`; with `token`, requests need that bearer.

    With `admission` (entered by the caller), creates, updates, patches and deletes of main
    resources go through the admission webhooks registered in the cluster.
    """
    app = web.Application(client_max_size=16 * 1024 * 1024)
    app[CLUSTER_KEY] = cluster
    app[TOKEN_KEY] = token or ""
    app[ADMISSION_KEY] = admission
    app[STOPPING_KEY] = asyncio.Event()
    app.router.add_route("*", "/{tail:.*}", _Handler(app).handle)
    app.on_shutdown.append(_stop_watches)
    return app


@dataclass(frozen=True, slots=True)
class Server:
    """A running API server: where it listens and the token clients must send (if any)."""

    url: str
    host: str
    port: int
    token: str | None


@contextlib.asynccontextmanager
async def serve(cluster: Cluster, *, host: str = "127.0.0.1", port: int = 0,
                token: str | None = None,
                kubeconfig: str | os.PathLike[str] | None = None,
                admission: bool = True,
                webhook_services: Mapping[str, str] | None = None,
                tls: ssl.SSLContext | None = None,
                ca_data: bytes | None = None) -> AsyncIterator[Server]:
    """Serve `cluster` over HTTP on `host:port` (0 picks a free port) until the block exits;
    over HTTPS with `tls` (its serving context), the kubeconfig trusting `ca_data` (PEM): kubectl
    sends no token to a plain-HTTP server.

    With `kubeconfig`, a kubeconfig for the server (and `token`) is written there once it
    listens. With `admission`, the webhooks registered in the cluster are called as
    kube-apiserver calls them; `webhook_services` maps their `clientConfig.service`
    ("namespace/name") to a "host:port". Leaving the block ends open watch streams and stops
    listening; the cluster stays usable (closing it is the caller's business).
    """
    async with contextlib.AsyncExitStack() as stack:
        chain = None
        if admission:
            chain = await stack.enter_async_context(
                Admission(cluster, services=webhook_services))
        yield await stack.enter_async_context(
            _listen(create_app(cluster, token=token, admission=chain), host, port, token,
                    kubeconfig, tls, ca_data))


@contextlib.asynccontextmanager
async def _listen(app: web.Application, host: str, port: int, token: str | None,
                  kubeconfig: str | os.PathLike[str] | None, tls: ssl.SSLContext | None,
                  ca_data: bytes | None) -> AsyncIterator[Server]:
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=5.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, ssl_context=tls)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        shown = f"[{bound_host}]" if ":" in bound_host else bound_host
        url = f"{'https' if tls is not None else 'http'}://{shown}:{bound_port}"
        if kubeconfig is not None:
            write_kubeconfig(kubeconfig, url, token, ca_data=ca_data)
        yield Server(url=url, host=bound_host, port=bound_port, token=token)
    finally:
        await runner.cleanup()


def kubeconfig_document(server_url: str, token: str | None = None, *,
                        name: str = "dra-gateway",
                        ca_data: bytes | None = None) -> dict[str, Any]:
    """A kubeconfig document with one cluster (trusting `ca_data`, PEM, when given), one user,
    one context, selected."""
    user: dict[str, Any] = {"token": token} if token else {}
    cluster: dict[str, Any] = {"server": server_url}
    if ca_data is not None:
        cluster["certificate-authority-data"] = base64.b64encode(ca_data).decode()
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": cluster}],
        "users": [{"name": name, "user": user}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name,
                                                "namespace": "default"}}],
        "current-context": name,
        "preferences": {},
    }


def write_kubeconfig(path: str | os.PathLike[str], server_url: str,
                     token: str | None = None, *, ca_data: bytes | None = None) -> None:
    """Write a kubeconfig for `server_url` (readable by its owner only: it may hold a token)."""
    text = yaml.safe_dump(kubeconfig_document(server_url, token, ca_data=ca_data),
                          sort_keys=False)
    # Atomic: clients started alongside the server wait for this file and must never read it
    # half written; and a file left from an earlier run must not keep a wider mode.
    atomic_write(Path(path), text.encode("utf-8"), mode=0o600)

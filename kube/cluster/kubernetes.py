"""The cluster port on a real Kubernetes API, through kubernetes-asyncio.

Authentication (tokens, client certificates, exec plugins, in-cluster service accounts), TLS
and connection pooling are the official client's: each request takes its credentials from
`ApiClient.update_params_for_auth` and goes out on the connections of the client's own
connector. This adapter builds paths from `ResourceType`, sends and parses JSON itself (objects
stay plain dicts, serialised once with orjson, no model conversion on hot paths), streams
watches line by line and turns error responses into the port's `ApiError` subclasses. The
proxy the environment names for the API server (HTTPS_PROXY, NO_PROXY) is read once, not per
request: the client's session reads it, and ~/.netrc, on every request through a worker
thread, which was a sixth of the allocator's event loop under load. It must not hold cluster
state or retry on its own: callers decide what a Conflict or an Expired means to them.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp
import orjson
from aiohttp.helpers import get_env_proxy_for_url
from kubernetes_asyncio import client as k8s_client
from kubernetes_asyncio import config as k8s_config
from yarl import URL

from dra_gateway.kube import objects
from dra_gateway.kube.cluster.port import (
    ApiError,
    BadRequest,
    EventType,
    NotKubernetes,
    Object,
    ObjectList,
    PatchType,
    ServedVersions,
    WatchEvent,
)
from dra_gateway.kube.resources import PODS, ResourceType

_CONTENT_TYPES: dict[PatchType, str] = {
    "json": "application/json-patch+json",
    "merge": "application/merge-patch+json",
    "strategic": "application/strategic-merge-patch+json",
}
_EVENT_TYPES: frozenset[str] = frozenset({"ADDED", "MODIFIED", "DELETED", "BOOKMARK"})
# Requests other than watches: long enough for a big list, short enough to notice a dead API.
DEFAULT_REQUEST_TIMEOUT_S = 60.0


class KubernetesCluster:
    """The `Cluster` port over an `ApiClient` (which this object then owns and closes)."""

    def __init__(self, api: Any, *, request_timeout: float = DEFAULT_REQUEST_TIMEOUT_S) -> None:
        self._api = api
        self._timeout = request_timeout
        self._session: aiohttp.ClientSession | None = None
        self._options: dict[str, Any] = {}  # every request's proxy and TLS server name

    @property
    def host(self) -> str:
        return str(self._api.configuration.host)

    @classmethod
    async def from_kubeconfig(cls, path: str | None = None, *,
                              context: str | None = None) -> KubernetesCluster:
        """Connect with a kubeconfig file (None: $KUBECONFIG or ~/.kube/config)."""
        configuration = k8s_client.Configuration()
        await k8s_config.load_kube_config(config_file=path, context=context,
                                          client_configuration=configuration,
                                          persist_config=False)
        return cls(k8s_client.ApiClient(configuration=configuration))

    @classmethod
    def in_cluster(cls) -> KubernetesCluster:
        """Connect with the pod's service account, as every in-cluster component does."""
        configuration = k8s_client.Configuration()
        k8s_config.load_incluster_config(  # type: ignore[no-untyped-call]
            client_configuration=configuration)
        return cls(k8s_client.ApiClient(configuration=configuration))

    # Requests -----------------------------------------------------------------------------------

    def _connection(self) -> aiohttp.ClientSession:
        """A session on the client's connector that reads nothing from the environment per
        request, with the proxy the client's own session would use (its configuration's, else
        the environment's for the API server), settled once."""
        if self._session is None:
            rest = self._api.rest_client
            configuration = self._api.configuration
            self._session = aiohttp.ClientSession(
                connector=rest.pool_manager.connector, connector_owner=False, trust_env=False,
                read_bufsize=2**21)  # as the client's: big watch events
            if configuration.proxy:
                self._options = {"proxy": configuration.proxy}
                if configuration.proxy_headers:
                    self._options["proxy_headers"] = configuration.proxy_headers
            else:
                try:
                    proxy, proxy_auth = get_env_proxy_for_url(URL(configuration.host))
                except LookupError:
                    pass
                else:
                    self._options = {"proxy": proxy, "proxy_auth": proxy_auth}
            if configuration.tls_server_name:
                self._options["server_hostname"] = configuration.tls_server_name
        return self._session

    async def _send(self, method: str, path: str, *, query: Mapping[str, str] | None = None,
                    body: Any = None, content_type: str = "application/json",
                    request_timeout: Any = None) -> Any:
        """Send one request and return the raw aiohttp response (caller releases it)."""
        api = self._api
        headers = {**api.default_headers, "Accept": "application/json",
                   "Content-Type": content_type}
        queries = list((query or {}).items())
        timeout = request_timeout if request_timeout is not None else self._timeout
        if not isinstance(timeout, aiohttp.ClientTimeout):
            timeout = aiohttp.ClientTimeout(total=timeout)
        try:
            session = self._connection()
            await api.update_params_for_auth(headers, queries, ["BearerToken"])
            url = api.configuration.host + path
            if queries:
                url += "?" + urlencode(queries)
            return await session.request(
                method, url, headers=headers, timeout=timeout,
                data=None if body is None else orjson.dumps(body), **self._options)
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise ApiError(f"cannot reach the Kubernetes API at {self.host} ({method} {path}): "
                           f"{type(exc).__name__}: {exc}; check the kubeconfig's server and "
                           "that the API server is running", code=503,
                           reason="ServiceUnavailable") from None

    async def _call(self, method: str, path: str, *, query: Mapping[str, str] | None = None,
                    body: Any = None, content_type: str = "application/json") -> Any:
        status, raw = await self._exchange(method, path, query=query, body=body,
                                           content_type=content_type)
        if status >= 400:
            raise _error(status, raw, method, path)
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            raise ApiError(f"the Kubernetes API answered {method} {path} with something other "
                           f"than JSON: {raw[:200]!r}") from None

    async def _exchange(self, method: str, path: str, *,
                        query: Mapping[str, str] | None = None, body: Any = None,
                        content_type: str = "application/json") -> tuple[int, bytes]:
        """One request's status and body, read whole."""
        response = await self._send(method, path, query=query, body=body,
                                    content_type=content_type)
        try:
            return response.status, await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApiError(f"the Kubernetes API at {self.host} broke off {method} {path}: "
                           f"{type(exc).__name__}: {exc}", code=503,
                           reason="ServiceUnavailable") from None
        finally:
            response.release()

    async def verify(self, groups: Sequence[tuple[str, str, str]] = ()) -> str:
        """Check that the endpoint is a Kubernetes API server serving each (group, version,
        what it is for) of `groups`; return its version. Raises NotKubernetes saying what it
        found instead (an empty cluster and a server that is not one must not look alike)."""
        fix = ("point --kubeconfig (or $KUBECONFIG) at a Kubernetes API server "
               "(kubectl cluster-info shows the one a kubeconfig names)")
        status, raw = await self._exchange("GET", "/version")
        if status in (401, 403):
            # A Kubernetes API server that will not talk to these credentials: say so as such.
            raise _error(status, raw, "GET", "/version")
        try:
            version = orjson.loads(raw) if status == 200 else None
        except orjson.JSONDecodeError:
            version = None
        if not isinstance(version, dict) or not isinstance(version.get("gitVersion"), str):
            text = " ".join(raw[:200].decode("utf-8", "replace").split())[:80]
            said = f"HTTP {status}" + (f" {text!r}" if text else "") if status != 200 else \
                f"something other than a Kubernetes version: {text!r}"
            raise NotKubernetes(f"{self.host} does not serve the Kubernetes API: GET /version "
                                f"answered {said}; {fix}", code=status if status >= 400 else None)
        git_version: str = version["gitVersion"]
        if not groups:
            return git_version
        status, raw = await self._exchange("GET", "/apis")
        try:
            listed = orjson.loads(raw) if status == 200 else None
        except orjson.JSONDecodeError:
            listed = None
        groups_listed = listed.get("groups") if isinstance(listed, dict) else None
        served = {(str(g.get("name")), str(v.get("version")))
                  for g in (groups_listed if isinstance(groups_listed, list) else ())
                  if isinstance(g, dict)
                  for v in g.get("versions") or () if isinstance(v, dict)}
        for group, group_version, why in groups:
            if (group, group_version) not in served:
                raise NotKubernetes(
                    f"the Kubernetes API at {self.host} ({git_version}) does not serve "
                    f"{group}/{group_version}, which {why}", code=404)
        return git_version

    # The port -----------------------------------------------------------------------------------

    async def get(self, rt: ResourceType, name: str, *, namespace: str | None = None) -> Object:
        obj: Object = await self._call("GET", _object_path(rt, name, namespace))
        return obj

    async def list(self, rt: ResourceType, *, namespace: str | None = None,
                   label_selector: str | None = None,
                   field_selector: str | None = None) -> ObjectList:
        query = _selectors(label_selector, field_selector)
        body = await self._call("GET", rt.path(namespace=namespace if rt.namespaced else None),
                                query=query)
        items: list[Object] = body.get("items") or []
        # Lists omit each item's apiVersion and kind; the port always carries them.
        for item in items:
            item.setdefault("apiVersion", rt.api_version)
            item.setdefault("kind", rt.kind)
        return ObjectList(items=items,
                          resource_version=objects.resource_version(body))

    def watch(self, rt: ResourceType, *, namespace: str | None = None,
              resource_version: str | None = None, label_selector: str | None = None,
              field_selector: str | None = None,
              timeout_seconds: float | None = None) -> AsyncIterator[WatchEvent]:
        query = {"watch": "true", **_selectors(label_selector, field_selector)}
        if resource_version:
            query["resourceVersion"] = resource_version
        if timeout_seconds is not None:
            query["timeoutSeconds"] = str(max(1, math.ceil(timeout_seconds)))
        path = rt.path(namespace=namespace if rt.namespaced else None)
        return self._watch(path, query, timeout_seconds)

    async def _watch(self, path: str, query: dict[str, str],
                     timeout_seconds: float | None) -> AsyncIterator[WatchEvent]:
        # No read timeout: a quiet watch is healthy. The server ends it after timeoutSeconds;
        # the client-side total is a backstop with some slack for a slow server.
        total = None if timeout_seconds is None else timeout_seconds + 30
        response = await self._send("GET", path, query=query,
                                    request_timeout=aiohttp.ClientTimeout(total=total))
        try:
            if response.status >= 400:
                raise _error(response.status, await response.read(), "GET", path)
            buffer = b""
            try:
                async for chunk in response.content.iter_any():
                    buffer += chunk
                    # Split ourselves: objects such as big ResourceSlices exceed the line
                    # length aiohttp's readline accepts.
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        event = _event(line, path)
                        if event is not None:
                            yield event
            except (aiohttp.ClientPayloadError, aiohttp.ClientConnectionError,
                    TimeoutError):
                # The stream ended early (server restart, connection cut): like a timeout,
                # the caller resumes from the last resourceVersion it saw.
                return
            event = _event(buffer, path)
            if event is not None:
                yield event
        finally:
            response.release()

    async def create(self, rt: ResourceType, obj: Object, *, namespace: str | None = None,
                     dry_run: bool = False) -> Object:
        ns = _namespace(rt, obj, namespace)
        created: Object = await self._call("POST", rt.path(namespace=ns), body=_with_type(rt, obj),
                                           query={"dryRun": "All"} if dry_run else None)
        return created

    async def update(self, rt: ResourceType, obj: Object, *, namespace: str | None = None,
                     subresource: str | None = None) -> Object:
        ns = _namespace(rt, obj, namespace)
        name = objects.name(obj)
        if not name:
            raise BadRequest(f"a {rt.kind} to update needs metadata.name")
        updated: Object = await self._call(
            "PUT", _object_path(rt, str(name), ns, subresource), body=_with_type(rt, obj))
        return updated

    async def patch(self, rt: ResourceType, name: str, patch: Any, *,
                    namespace: str | None = None, patch_type: PatchType = "merge",
                    subresource: str | None = None) -> Object:
        content_type = _CONTENT_TYPES.get(patch_type)
        if content_type is None:
            raise BadRequest(f"unsupported patch type {patch_type!r}: use json, merge or "
                             "strategic")
        patched: Object = await self._call("PATCH",
                                           _object_path(rt, name, namespace, subresource),
                                           body=patch, content_type=content_type)
        return patched

    async def delete(self, rt: ResourceType, name: str, *, namespace: str | None = None,
                     resource_version: str | None = None) -> Object | None:
        body = None
        if resource_version:
            body = {"apiVersion": "v1", "kind": "DeleteOptions",
                    "preconditions": {"resourceVersion": resource_version}}
        result = await self._call("DELETE", _object_path(rt, name, namespace), body=body)
        if isinstance(result, dict) and result.get("kind") == "Status":
            return None  # some types answer a completed delete with a Status only
        deleted: Object = result
        return deleted

    async def evict(self, name: str, *, namespace: str, uid: str | None = None) -> None:
        body: dict[str, Any] = {"apiVersion": "policy/v1", "kind": "Eviction",
                                "metadata": {"name": name, "namespace": namespace}}
        if uid:
            body["deleteOptions"] = {"preconditions": {"uid": uid}}
        await self._call("POST", _object_path(PODS, name, namespace, "eviction"), body=body)

    async def server_time(self) -> datetime:
        # GET /version: answered to every client (system:public-info-viewer), reads nothing.
        response = await self._send("GET", "/version")
        try:
            if response.status >= 400:
                raise _error(response.status, await response.read(), "GET", "/version")
            date = response.headers.get("Date")
        finally:
            response.release()
        try:
            served = parsedate_to_datetime(date) if date else None
        except (TypeError, ValueError):
            served = None
        if served is None:
            raise ApiError(f"the Kubernetes API at {self.host} answered GET /version without a "
                           f"readable Date header ({date!r}): its time cannot be read; a proxy "
                           "in between may drop the header")
        return served.astimezone(UTC) if served.tzinfo else served.replace(tzinfo=UTC)

    async def server_version(self) -> Object:
        version: Object = await self._call("GET", "/version")
        return version

    async def served_versions(self) -> ServedVersions:
        core = await self._call("GET", "/api")
        served: ServedVersions = {"": [str(v) for v in core.get("versions") or ()]}
        listed = await self._call("GET", "/apis")
        for group in listed.get("groups") or ():
            if isinstance(group, dict):
                served[str(group.get("name"))] = [str(v.get("version"))
                                                  for v in group.get("versions") or ()
                                                  if isinstance(v, dict)]
        return served

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()  # not the connector: the client's, closed below
        await self._api.close()


def _object_path(rt: ResourceType, name: str, namespace: str | None,
                 subresource: str | None = None) -> str:
    if not name:
        raise BadRequest(f"a name is required to address a single {rt.kind}")
    if rt.namespaced and not namespace:
        raise BadRequest(f'{rt.plural} "{name}": a namespace is required for namespaced '
                         f"{rt.kind} objects")
    return rt.path(namespace=namespace if rt.namespaced else None, name=quote(name, safe=""),
                   subresource=subresource)


def _namespace(rt: ResourceType, obj: Object, namespace: str | None) -> str | None:
    if not rt.namespaced:
        return None
    ns = namespace or objects.namespace(obj)
    if not ns:
        raise BadRequest(f"a namespace is required for namespaced {rt.kind} objects: pass "
                         "namespace= or set metadata.namespace")
    return str(ns)


def _with_type(rt: ResourceType, obj: Object) -> Object:
    """The object with apiVersion and kind filled in (the API server requires them)."""
    if obj.get("apiVersion") and obj.get("kind"):
        return obj
    return {**obj, "apiVersion": obj.get("apiVersion") or rt.api_version,
            "kind": obj.get("kind") or rt.kind}


def _selectors(label_selector: str | None, field_selector: str | None) -> dict[str, str]:
    query: dict[str, str] = {}
    if label_selector:
        query["labelSelector"] = label_selector
    if field_selector:
        query["fieldSelector"] = field_selector
    return query


def _error(code: int, raw: bytes, method: str, path: str) -> ApiError:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        body = None
    if isinstance(body, dict) and body.get("kind") == "Status":
        return ApiError.from_status(body, code=code)
    text = raw[:300].decode("utf-8", "replace").strip()
    return ApiError.from_status({"code": code, "message": f"{method} {path}: HTTP {code}"
                                                          + (f": {text}" if text else "")},
                                code=code)


def _event(line: bytes, path: str) -> WatchEvent | None:
    line = line.strip()
    if not line:
        return None
    try:
        body = orjson.loads(line)
    except orjson.JSONDecodeError:
        raise ApiError(f"the watch on {path} sent a line that is not JSON: {line[:200]!r}") \
            from None
    type_ = body.get("type")
    obj = body.get("object")
    if type_ == "ERROR":
        raise ApiError.from_status(obj if isinstance(obj, dict) else {})
    if type_ not in _EVENT_TYPES or not isinstance(obj, dict):
        raise ApiError(f"the watch on {path} sent an event of unknown type {type_!r}")
    event_type: EventType = type_
    return WatchEvent(event_type, obj)

"""Making the translator's ResourceClaimTemplates exist, and knowing which classes they use.

A translated pod points at content-named templates; the pod must not be admitted before they
exist, or the claim controller would fail to make its claims. `Templates.ensure` creates each
template through the cluster port unless a bounded TTL cache already knows it, shares one
create among concurrent admissions of the same template, and gives up after a bounded time with
`TemplateUnavailable`, whose message tells the user to retry. A dry run creates nothing
(`sideEffects: NoneOnDryRun`).

AlreadyExists is not taken on trust: the name is a hash of the spec, learnable from a dry run,
so anyone who may create templates in the namespace can make one first under that name with
another class or `allocationMode: All`. The stored template is read and must carry the
gateway's managed-by label and the same spec (API defaults applied); otherwise the pod is
refused with `TemplateConflict`, which names the template, what differs and the fix.

The TTL bounds how long a template deleted behind the webhook's back stays believed to exist;
reading it before every admission was rejected as one API round trip per pod. A namespace's
deletion (seen by the webhook's namespace mirror) forgets its templates at once
(`forget_namespace`): a namespace re-created under the same name gets its templates again.

`Templates.classes` answers /validate's question "which device classes does this template or
claim use?" from stored objects only: what the API server returned when ensure() created or
checked a template, or one read through the port, cached the same way. The translator's own
spec never answers it.

It must not decide whether a pod is admitted; mutation and validation do.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from cachetools import TTLCache

from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.port import AlreadyExists, ApiError, Cluster, NotFound, Object
from dra_gateway.kube.quantity import QuantityError, parse_quantity
from dra_gateway.kube.resources import RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS, ResourceType
from dra_gateway.policy.amounts import RequestShape, requests_of
from dra_gateway.webhook.metrics import Metrics

log = logging.getLogger(__name__)

Key = tuple[str, str, str]  # (kind, namespace, name)


class TemplateUnavailable(Exception):
    """A template could not be made to exist in time; the message is for the user."""


class TemplateConflict(TemplateUnavailable):
    """A template of the name this pod needs exists but is not the gateway's: retrying does not
    help until it is deleted; the message names it, what differs and the fix."""


def device_classes(spec: Mapping[str, Any]) -> frozenset[str]:
    """Device classes named by a ResourceClaim spec (`exactly` and `firstAvailable`)."""
    found: set[str] = set()
    devices = spec.get("devices")
    requests = devices.get("requests") if isinstance(devices, dict) else None
    for request in requests if isinstance(requests, list) else ():
        if not isinstance(request, dict):
            continue
        exactly = request.get("exactly")
        if isinstance(exactly, dict) and isinstance(exactly.get("deviceClassName"), str):
            found.add(exactly["deviceClassName"])
        for sub in request.get("firstAvailable") or ():
            if isinstance(sub, dict) and isinstance(sub.get("deviceClassName"), str):
                found.add(sub["deviceClassName"])
    return frozenset(found)


def _template_classes(template: Mapping[str, Any]) -> frozenset[str]:
    spec = template.get("spec")
    inner = spec.get("spec") if isinstance(spec, dict) else None
    return device_classes(inner) if isinstance(inner, dict) else frozenset()


def _template_requests(template: Mapping[str, Any]) -> tuple[RequestShape, ...]:
    spec = template.get("spec")
    inner = spec.get("spec") if isinstance(spec, dict) else None
    return tuple(requests_of(inner)) if isinstance(inner, dict) else ()


def _defaulted_exactly(request: dict[str, Any]) -> None:
    # What the API server fills in (resource/v1 defaults.go), so a stored template compares
    # equal to the one the translator asked for.
    request.setdefault("allocationMode", "ExactCount")
    if request["allocationMode"] == "ExactCount":
        request.setdefault("count", 1)
    for toleration in request.get("tolerations") or ():
        if isinstance(toleration, dict):
            toleration.setdefault("operator", "Equal")
    capacity = request.get("capacity")
    amounts = capacity.get("requests") if isinstance(capacity, dict) else None
    if isinstance(amounts, dict):
        for key, value in amounts.items():
            with contextlib.suppress(QuantityError, TypeError):
                amounts[key] = str(parse_quantity(value))


def comparable_spec(template: Mapping[str, Any]) -> Any:
    """A template's `spec` with the API server's defaults applied and quantities canonical."""
    spec = copy.deepcopy(template.get("spec"))
    inner = spec.get("spec") if isinstance(spec, dict) else None
    devices = inner.get("devices") if isinstance(inner, dict) else None
    requests = devices.get("requests") if isinstance(devices, dict) else None
    for request in requests if isinstance(requests, list) else ():
        if not isinstance(request, dict):
            continue
        if isinstance(request.get("exactly"), dict):
            _defaulted_exactly(request["exactly"])
        for sub in request.get("firstAvailable") or ():
            if isinstance(sub, dict):
                _defaulted_exactly(sub)
    return spec


def _describe_classes(template: Mapping[str, Any]) -> str:
    spec = template.get("spec")
    inner = spec.get("spec") if isinstance(spec, dict) else None
    devices = inner.get("devices") if isinstance(inner, dict) else None
    requests = devices.get("requests") if isinstance(devices, dict) else None
    parts = []
    for index, request in enumerate(requests if isinstance(requests, list) else ()):
        exactly = request.get("exactly") if isinstance(request, dict) else None
        if isinstance(exactly, dict):
            parts.append(f"spec.spec.devices.requests[{index}] asks for device class "
                         f"{exactly.get('deviceClassName')!r} with allocationMode "
                         f"{exactly.get('allocationMode', 'ExactCount')}")
    return "; ".join(parts) or "it asks for other devices"


def conflict(stored: Mapping[str, Any], wanted: Mapping[str, Any], namespace: str) -> str | None:
    """Why the stored template under the wanted name is not the gateway's, or None when it is."""
    name = objects.name(wanted)
    where = f"ResourceClaimTemplate {namespace}/{name}"
    fix = (f"delete it (kubectl delete resourceclaimtemplate -n {namespace} {name}) and create "
           f"the pod again: dra-gateway then creates the template this pod was translated to")
    label = objects.labels(stored).get(names.LABEL_MANAGED_BY)
    if label != names.MANAGED_BY:
        return (f"the {where} this pod needs already exists but was not made by dra-gateway "
                f"(metadata.labels[{names.LABEL_MANAGED_BY!r}] is "
                f"{label!r}, not {names.MANAGED_BY!r}), so the pod was not admitted; {fix}")
    if comparable_spec(stored) != comparable_spec(wanted):
        return (f"the {where} this pod needs already exists with another spec than dra-gateway "
                f"translated the pod to ({_describe_classes(stored)}), so the pod was not "
                f"admitted; {fix}")
    return None


class Templates:
    def __init__(self, cluster: Cluster, metrics: Metrics, *, timeout: float = 2.0,
                 cache_size: int = 8192, ttl: float = 300.0) -> None:
        self._cluster = cluster
        self._metrics = metrics
        self._timeout = timeout
        # What is known to exist, with the device classes each uses.
        self._known: TTLCache[Key, frozenset[str]] = TTLCache(cache_size, ttl)
        self._inflight: dict[Key, asyncio.Future[frozenset[str]]] = {}
        # What quotas and sharing policies read (policy.amounts), kept beside the classes.
        self._requests: TTLCache[Key, tuple[RequestShape, ...]] = TTLCache(cache_size, ttl)

    def cached_requests(self, kind: str, namespace: str,
                        name: str) -> tuple[RequestShape, ...] | None:
        """Gateway-class requests of a template or claim already known, without I/O."""
        return self._requests.get((kind, namespace, name))

    def forget(self) -> None:
        self._known.clear()
        self._requests.clear()

    def forget_namespace(self, namespace: str) -> None:
        """The namespace was deleted: its templates went with it, and one re-created under the
        same name must not be believed to have them."""
        for cache in (self._known, self._requests):
            for key in [k for k in list(cache.keys()) if k[1] == namespace]:
                cache.pop(key, None)

    async def ensure(self, templates: Sequence[Mapping[str, Any]], namespace: str, *,
                     dry_run: bool, deadline: float) -> int:
        """Make every template exist in `namespace`; returns how many were created.

        `deadline` is the review's, in time.monotonic() seconds: reached first, it raises
        TimeoutError for the review to answer; this call's own timeout raises
        TemplateUnavailable naming the template and what to do.
        """
        missing = [t for t in templates
                   if ("template", namespace, t["metadata"]["name"]) not in self._known]
        if not missing or dry_run:
            return 0
        created = 0
        now = time.monotonic()
        own = now + self._timeout
        try:
            async with asyncio.timeout(min(own, deadline) - now):
                # One after the other: the translator makes one template per pod, and a gather
                # would leave the others running unsupervised when one fails.
                for template in missing:
                    created += await self._ensure_one(template, namespace)
        except TimeoutError:
            if deadline <= own:
                raise
            self._metrics.template_creates.labels("failed").inc()
            names = ", ".join(t["metadata"]["name"] for t in missing)
            raise TemplateUnavailable(
                f"the ResourceClaimTemplate {namespace}/{names} for this pod could not be "
                f"created within {self._timeout:g}s; the pod was not admitted and can be "
                f"retried (controllers retry on their own)"
            ) from None
        return created

    async def _ensure_one(self, template: Mapping[str, Any], namespace: str) -> bool:
        name = template["metadata"]["name"]
        key: Key = ("template", namespace, name)
        pending = self._inflight.get(key)
        if pending is not None:
            # Another admission is creating the same template: wait for its answer.
            await asyncio.shield(pending)
            return False
        future: asyncio.Future[frozenset[str]] = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            created, stored = await self._create(template, namespace)
        except BaseException as exc:
            # Waiters must see a refusal they can answer with, never this task's cancellation
            # (that would cancel their own requests).
            shared = exc if isinstance(exc, TemplateUnavailable) else TemplateUnavailable(
                f"the creation of ResourceClaimTemplate {namespace}/{name} for this pod was "
                f"interrupted; the pod was not admitted and can be retried (controllers retry "
                f"on their own)")
            future.set_exception(shared)
            # Consumed here so a waiter-less failure is not reported as never retrieved.
            future.exception()
            raise
        else:
            # What the API server holds, not what the translator meant: /validate answers
            # from these.
            classes = _template_classes(stored)
            future.set_result(classes)
            self._known[key] = classes
            self._requests[key] = _template_requests(stored)
            return created
        finally:
            del self._inflight[key]

    async def _create(self, template: Mapping[str, Any], namespace: str) -> tuple[bool, Object]:
        """(created, the stored template); raises TemplateConflict or TemplateUnavailable."""
        name = template["metadata"]["name"]
        try:
            stored = await self._cluster.create(RESOURCE_CLAIM_TEMPLATES, dict(template),
                                                namespace=namespace)
        except AlreadyExists:
            return False, await self._existing(template, namespace)
        except ApiError as exc:
            self._metrics.template_creates.labels("failed").inc()
            log.warning("cannot create ResourceClaimTemplate",
                        extra={"namespace": namespace, "template": name, "reason": exc.reason,
                               "error": exc.message})
            raise TemplateUnavailable(
                f"the ResourceClaimTemplate {namespace}/{name} for this pod could not be created "
                f"({exc.reason}: {exc.message}); the pod was not admitted and can be retried "
                f"(controllers retry on their own)"
            ) from None
        except Exception as exc:
            # A transport failure (connection refused, TLS, ...): as retryable as an API error.
            self._metrics.template_creates.labels("failed").inc()
            log.warning("cannot reach the API server to create a ResourceClaimTemplate",
                        exc_info=True, extra={"namespace": namespace, "template": name})
            raise TemplateUnavailable(
                f"the ResourceClaimTemplate {namespace}/{name} for this pod could not be created "
                f"(the API server could not be reached: {type(exc).__name__}); the pod was not "
                f"admitted and can be retried (controllers retry on their own)"
            ) from None
        self._metrics.template_creates.labels("created").inc()
        return True, stored

    async def _existing(self, template: Mapping[str, Any], namespace: str) -> Object:
        """The stored template of the wanted name, checked to be the gateway's."""
        name = template["metadata"]["name"]
        try:
            stored = await self._cluster.get(RESOURCE_CLAIM_TEMPLATES, name, namespace=namespace)
        except ApiError as exc:
            # Deleted between the create and the read, or unreadable: retryable either way.
            self._metrics.template_creates.labels("failed").inc()
            raise TemplateUnavailable(
                f"the ResourceClaimTemplate {namespace}/{name} for this pod exists but could not "
                f"be read ({exc.reason}: {exc.message}); the pod was not admitted and can be "
                f"retried (controllers retry on their own)") from None
        problem = conflict(stored, template, namespace)
        if problem is not None:
            self._metrics.template_creates.labels("conflict").inc()
            log.warning("a ResourceClaimTemplate under a gateway name is not the gateway's",
                        extra={"namespace": namespace, "template": name, "error": problem})
            raise TemplateConflict(problem)
        self._metrics.template_creates.labels("exists").inc()
        return stored

    async def classes(self, namespace: str, *, deadline: float, template: str | None = None,
                      claim: str | None = None) -> frozenset[str] | None:
        """Device classes of a template or claim, or None when it does not exist (yet).

        A read past `deadline` (the review's, in time.monotonic() seconds) raises TimeoutError.
        """
        rt: ResourceType
        if template is not None:
            key: Key = ("template", namespace, template)
            rt, name = RESOURCE_CLAIM_TEMPLATES, template
        elif claim is not None:
            key, rt, name = ("claim", namespace, claim), RESOURCE_CLAIMS, claim
        else:
            raise ValueError("classes() needs a template or a claim name")
        if key in self._known and key in self._requests:
            return self._known[key]
        try:
            async with asyncio.timeout(deadline - time.monotonic()):
                obj = await self._cluster.get(rt, name, namespace=namespace)
        except NotFound:
            # Not cached: it may be created a moment later (a template made by hand).
            return None
        except ApiError as exc:
            log.warning("cannot read a pod's claim or template; its classes are unknown",
                        extra={"namespace": namespace, "kind": rt.kind, "object": name,
                               "reason": exc.reason, "error": exc.message})
            return None
        spec = obj.get("spec")
        found = (_template_classes(obj) if rt is RESOURCE_CLAIM_TEMPLATES
                 else device_classes(spec) if isinstance(spec, dict) else frozenset())
        self._known[key] = found
        self._requests[key] = (_template_requests(obj) if rt is RESOURCE_CLAIM_TEMPLATES
                               else tuple(requests_of(spec)) if isinstance(spec, dict) else ())
        return found

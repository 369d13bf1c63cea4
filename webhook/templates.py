"""Making the translator's ResourceClaimTemplates exist, and knowing which classes they use.

A translated pod points at content-named templates; the pod must not be admitted before they
exist, or the claim controller would fail to make its claims. `Templates.ensure` creates each
template through the cluster port unless a bounded TTL cache already knows it, treats
AlreadyExists as success (the name is a hash of the spec, so an existing one is the same
template), shares one create among concurrent admissions of the same template, and gives up
after a bounded time with `TemplateUnavailable`, whose message tells the user to retry. A dry
run creates nothing (`sideEffects: NoneOnDryRun`).

The TTL bounds how long a template deleted behind the webhook's back stays believed to exist;
reading it before every admission was rejected as one API round trip per pod.

`Templates.classes` answers /validate's question "which device classes does this template or
claim use?", from what ensure() created or from one read through the port, cached the same way.

It must not decide whether a pod is admitted; mutation and validation do.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from cachetools import TTLCache

from dra_gateway.kube.cluster.port import AlreadyExists, ApiError, Cluster, NotFound
from dra_gateway.kube.resources import RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS, ResourceType
from dra_gateway.policy.amounts import RequestShape, requests_of
from dra_gateway.webhook.metrics import Metrics

log = logging.getLogger(__name__)

Key = tuple[str, str, str]  # (kind, namespace, name)


class TemplateUnavailable(Exception):
    """A template could not be made to exist in time; the message is for the user."""


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

    def cached_classes(self, kind: str, namespace: str, name: str) -> frozenset[str] | None:
        """Classes of a template ("template") or claim ("claim") already known, without I/O."""
        return self._known.get((kind, namespace, name))

    def cached_requests(self, kind: str, namespace: str,
                        name: str) -> tuple[RequestShape, ...] | None:
        """Gateway-class requests of a template or claim already known, without I/O."""
        return self._requests.get((kind, namespace, name))

    def forget(self) -> None:
        self._known.clear()
        self._requests.clear()

    async def ensure(self, templates: Sequence[Mapping[str, Any]], namespace: str, *,
                     dry_run: bool) -> int:
        """Make every template exist in `namespace`; returns how many were created.

        Raises TemplateUnavailable naming the template and what to do.
        """
        missing = [t for t in templates
                   if ("template", namespace, t["metadata"]["name"]) not in self._known]
        if not missing or dry_run:
            return 0
        created = 0
        try:
            async with asyncio.timeout(self._timeout):
                # One after the other: the translator makes one template per pod, and a gather
                # would leave the others running unsupervised when one fails.
                for template in missing:
                    created += await self._ensure_one(template, namespace)
        except TimeoutError:
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
        classes = _template_classes(template)
        try:
            created = await self._create(template, namespace)
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
            future.set_result(classes)
            self._known[key] = classes
            self._requests[key] = _template_requests(template)
            return created
        finally:
            del self._inflight[key]

    async def _create(self, template: Mapping[str, Any], namespace: str) -> bool:
        name = template["metadata"]["name"]
        try:
            await self._cluster.create(RESOURCE_CLAIM_TEMPLATES, dict(template),
                                       namespace=namespace)
        except AlreadyExists:
            self._metrics.template_creates.labels("exists").inc()
            return False
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
        return True

    async def classes(self, namespace: str, *, template: str | None = None,
                      claim: str | None = None) -> frozenset[str] | None:
        """Device classes of a template or claim, or None when it does not exist (yet)."""
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

"""What the webhook knows of the ResourceClaimTemplates and ResourceClaims a pod names: the
device classes and requests of each.

`pod_claims` reads, once per review, which template or claim each entry of the pod's
`spec.resourceClaims` names (`ClaimSource`) and the device classes of each, through the
`ClaimSpecCache`; `/mutate` hands the result to the translator as its `ClassLookup`, `/validate`
to its checks together with the requests the GPU policies read.

`ClaimSpecCache` answers "which device classes (and which requests) does this template or claim
use?" from stored objects only: what the API server returned when `TemplateMaker.ensure` created
or checked a template (`remember_template`), or one read through the port, cached in a bounded
TTL cache. The translator's own spec never answers it. A namespace's deletion (seen by the
webhook's namespace mirror) forgets its entries at once (`forget_namespace`).

It must not decide whether a pod is admitted; mutation and validation do.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from cachetools import TTLCache

from dra_gateway.kube.cluster.port import ApiError, Cluster, NotFound
from dra_gateway.kube.objects import CLAIM_SOURCE_KINDS, ClaimSource, claim_source
from dra_gateway.kube.resources import RESOURCE_CLAIM_TEMPLATES, RESOURCE_CLAIMS, ResourceType
from dra_gateway.policy.amounts import RequestShape, requests_of
from dra_gateway.translator.translate import ClassLookup

log = logging.getLogger(__name__)

Key = tuple[str, str, str]  # (kind, namespace, name); kind as in ClaimSource


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


def template_classes(template: Mapping[str, Any]) -> frozenset[str]:
    spec = template.get("spec")
    inner = spec.get("spec") if isinstance(spec, dict) else None
    return device_classes(inner) if isinstance(inner, dict) else frozenset()


def _template_requests(template: Mapping[str, Any]) -> tuple[RequestShape, ...]:
    spec = template.get("spec")
    inner = spec.get("spec") if isinstance(spec, dict) else None
    return tuple(requests_of(inner)) if isinstance(inner, dict) else ()


def claim_sources(pod: Mapping[str, Any]) -> tuple[ClaimSource | None, ...]:
    """Per entry of the pod's spec.resourceClaims, the template or claim it names
    (`kube.objects.claim_source`: a template first), None for an entry naming neither."""
    claims = pod["spec"].get("resourceClaims")
    if not isinstance(claims, list):
        return ()
    return tuple(map(claim_source, claims))


class ClaimSpecCache:
    """The device classes and requests of the templates and claims pods name, by (kind,
    namespace, name), for a bounded time."""

    def __init__(self, cluster: Cluster, *, cache_size: int = 8192, ttl: float = 300.0) -> None:
        self._cluster = cluster
        # What is known to exist, with the device classes each uses.
        self._known: TTLCache[Key, frozenset[str]] = TTLCache(cache_size, ttl)
        # What quotas and sharing policies read (policy.amounts), kept beside the classes.
        self._requests: TTLCache[Key, tuple[RequestShape, ...]] = TTLCache(cache_size, ttl)

    def knows_template(self, namespace: str, name: str) -> bool:
        """Whether the template is known to exist."""
        return ("template", namespace, name) in self._known

    def remember_template(self, namespace: str, name: str, stored: Mapping[str, Any], *,
                          classes: frozenset[str]) -> None:
        """Keep what the API server holds of a template (not what the translator meant), with
        its `classes` (`template_classes(stored)`, which the caller has handed on already)."""
        key: Key = ("template", namespace, name)
        self._known[key] = classes
        self._requests[key] = _template_requests(stored)

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
        found = (template_classes(obj) if rt is RESOURCE_CLAIM_TEMPLATES
                 else device_classes(spec) if isinstance(spec, dict) else frozenset())
        self._known[key] = found
        self._requests[key] = (_template_requests(obj) if rt is RESOURCE_CLAIM_TEMPLATES
                               else tuple(requests_of(spec)) if isinstance(spec, dict) else ())
        return found


@dataclass(frozen=True, slots=True)
class PodClaims:
    """What a pod's own claims are made from, and the device classes of each (None where an
    entry names neither a template nor a claim, or it does not exist yet), in the order of
    its spec.resourceClaims."""

    namespace: str
    sources: tuple[ClaimSource | None, ...]
    classes: tuple[frozenset[str] | None, ...]

    def class_lookup(self) -> ClassLookup:
        """The translator's view of these classes."""
        known = {(CLAIM_SOURCE_KINDS[source[0]], source[1]): found
                 for source, found in zip(self.sources, self.classes, strict=True)
                 if source is not None}

        def lookup(kind: str, namespace: str, name: str) -> Collection[str] | None:
            return known.get((kind, name))
        return lookup

    def requests(self, cache: ClaimSpecCache) -> tuple[tuple[RequestShape, ...] | None, ...]:
        """The gateway-class requests of each claim, from what reading the classes stored."""
        return tuple(None if source is None else
                     cache.cached_requests(source[0], self.namespace, source[1])
                     for source in self.sources)


async def pod_claims(cache: ClaimSpecCache, namespace: str, pod: Mapping[str, Any], *,
                     deadline: float) -> PodClaims:
    """The device classes of each pod claim's template or claim, read through `cache`; reads
    end at `deadline`."""
    sources = claim_sources(pod)
    classes: list[frozenset[str] | None] = []
    for source in sources:
        if source is None:
            classes.append(None)
        elif source[0] == "template":
            classes.append(await cache.classes(namespace, template=source[1], deadline=deadline))
        else:
            classes.append(await cache.classes(namespace, claim=source[1], deadline=deadline))
    return PodClaims(namespace, sources, tuple(classes))

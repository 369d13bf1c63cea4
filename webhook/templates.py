"""Making the translator's ResourceClaimTemplates exist.

A translated pod points at content-named templates; the pod must not be admitted before they
exist, or the claim controller would fail to make its claims. `TemplateMaker.ensure` creates
each template through the cluster port unless the `ClaimSpecCache` (`claimspecs.py`) already
knows it, shares one create among concurrent admissions of the same template, and gives up
after a bounded time with `TemplateUnavailable`, whose message tells the user to retry. A dry
run creates nothing (`sideEffects: NoneOnDryRun`).

AlreadyExists is not taken on trust: the name is a hash of the spec, learnable from a dry run,
so anyone who may create templates in the namespace can make one first under that name with
another class or `allocationMode: All`. The stored template is read and must carry the
gateway's managed-by label and the same spec (API defaults applied); otherwise the pod is
refused with `TemplateConflict`, which names the template, what differs and the fix.

What the API server returned when ensure() created or checked a template is kept in the
`ClaimSpecCache`, which /mutate and /validate read (the classes of a pod's own claims). Its TTL
bounds how long a template deleted behind the webhook's back stays believed to exist; reading
it before every admission was rejected as one API round trip per pod. A namespace's deletion
forgets its templates at once (`ClaimSpecCache.forget_namespace`): a namespace re-created under
the same name gets its templates again.

It must not decide whether a pod is admitted; mutation and validation do.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from dra_gateway.kube import names, objects
from dra_gateway.kube.cluster.port import AlreadyExists, ApiError, Cluster, Object
from dra_gateway.kube.quantity import QuantityError, parse_quantity
from dra_gateway.kube.resources import RESOURCE_CLAIM_TEMPLATES
from dra_gateway.webhook.claimspecs import ClaimSpecCache, Key, template_classes
from dra_gateway.webhook.metrics import Metrics

log = logging.getLogger(__name__)

class TemplateUnavailable(Exception):
    """A template could not be made to exist in time; the message is for the user."""


class TemplateConflict(TemplateUnavailable):
    """A template of the name this pod needs exists but is not the gateway's: retrying does not
    help until it is deleted; the message names it, what differs and the fix."""


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


def _device_requests(spec: Any) -> list[dict[str, Any]]:
    """The `exactly` and `firstAvailable` requests of a template's spec, in order."""
    inner = spec.get("spec") if isinstance(spec, dict) else None
    devices = inner.get("devices") if isinstance(inner, dict) else None
    requests = devices.get("requests") if isinstance(devices, dict) else None
    found = []
    for request in requests if isinstance(requests, list) else ():
        if not isinstance(request, dict):
            continue
        if isinstance(request.get("exactly"), dict):
            found.append(request["exactly"])
        found.extend(sub for sub in request.get("firstAvailable") or () if isinstance(sub, dict))
    return found


def comparable_spec(template: Mapping[str, Any]) -> Any:
    """A template's `spec` with the API server's defaults applied and quantities canonical."""
    spec = copy.deepcopy(template.get("spec"))
    for request in _device_requests(spec):
        _defaulted_exactly(request)
    return spec


def _as_the_server_keeps(wanted: Any, stored: Any) -> Any:
    """The translated spec without the consumable-capacity requests where the stored template
    has none at all: an API server whose DRAConsumableCapacity gate is off (the default before
    1.36) drops `capacity` from every request it stores. The share itself is in the gateway's
    opaque configuration, which the allocator and the node plugin enforce, so only that
    field's absence is forgiven; any other difference still refuses the pod."""
    if any("capacity" in request for request in _device_requests(stored)):
        return wanted
    kept = copy.deepcopy(wanted)
    for request in _device_requests(kept):
        request.pop("capacity", None)
    return kept


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
    theirs = comparable_spec(stored)
    ours = _as_the_server_keeps(comparable_spec(wanted), theirs)
    if ours != theirs:
        return (f"the {where} this pod needs already exists with another spec than dra-gateway "
                f"translated the pod to ({_describe_classes(stored)}; "
                f"{_first_difference(theirs, ours, 'spec')}), so the pod was not "
                f"admitted; {fix}")
    return None


def _first_difference(stored: Any, wanted: Any, path: str) -> str:
    """Where the stored spec first departs from the translated one, for the refusal."""
    if isinstance(stored, dict) and isinstance(wanted, dict):
        for key in sorted(set(stored) | set(wanted)):
            if stored.get(key) != wanted.get(key):
                return _first_difference(stored.get(key), wanted.get(key), f"{path}.{key}")
    if isinstance(stored, list) and isinstance(wanted, list) and len(stored) == len(wanted):
        for index, (left, right) in enumerate(zip(stored, wanted, strict=True)):
            if left != right:
                return _first_difference(left, right, f"{path}[{index}]")
    def text(value: Any) -> str:
        return "absent" if value is None else json.dumps(value, sort_keys=True)

    return f"{path}: stored {text(stored)}, translated {text(wanted)}"


class TemplateMaker:
    """Makes the templates of translated pods exist, keeping what the API server holds of each
    in the `ClaimSpecCache` it is given."""

    def __init__(self, cluster: Cluster, metrics: Metrics, specs: ClaimSpecCache, *,
                 timeout: float = 2.0) -> None:
        self._cluster = cluster
        self._metrics = metrics
        self._timeout = timeout
        self._specs = specs
        self._inflight: dict[Key, asyncio.Future[frozenset[str]]] = {}

    async def ensure(self, templates: Sequence[Mapping[str, Any]], namespace: str, *,
                     dry_run: bool, deadline: float) -> int:
        """Make every template exist in `namespace`; returns how many were created.

        `deadline` is the review's, in time.monotonic() seconds: reached first, it raises
        TimeoutError for the review to answer; this call's own timeout raises
        TemplateUnavailable naming the template and what to do.
        """
        missing = [t for t in templates
                   if not self._specs.knows_template(namespace, t["metadata"]["name"])]
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
            # What the API server holds, not what the translator meant: /mutate and /validate
            # answer from these. The waiters are answered first, so nothing the cache reads
            # afterwards can leave them hanging.
            classes = template_classes(stored)
            future.set_result(classes)
            self._specs.remember_template(namespace, name, stored, classes=classes)
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

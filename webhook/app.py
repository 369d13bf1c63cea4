"""The webhook's aiohttp application: thin handlers over the decision modules.

`create_app(settings, cluster)` builds an app serving POST /mutate and POST /validate
(AdmissionReview v1 of pods; /validate also of ResourceClaims and ResourceClaimTemplates of
gateway classes), the same for namespaces in audit mode (/mutate/audit, /validate/audit) and
with a translation label of unknown value (/mutate/unknown-mode), POST /validate-rules (of
rules ConfigMaps), GET /healthz, GET /readyz and GET /metrics. `create_probe_app(state)`
serves the last three alone, in plain HTTP on a port of their own, so that the admission port
can require client certificates without breaking the kubelet's probes or Prometheus. A handler
reads the body, parses it (`reviews`), calls one decision (`mutation`, `validation`), and maps
the outcome to a response: a malformed review is HTTP 400 with a one-line reason; a denial is
`allowed: false` with a Status; an unexpected failure inside a decision is `allowed: false`
with a generic message, logged with the request UID and the stack, and the server keeps serving.

Background work (`background`) lives in `cleanup_ctx`. The app holds no package-level state;
what handlers and background tasks share is a `WebhookState` (`state`) reached through a typed
AppKey.

This module must not translate, decide policy or talk to Kubernetes itself.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from aiohttp import web

from dra_gateway.certs.generate import CERT_FILE, KEY_FILE
from dra_gateway.certs.tls import CertificateReloader
from dra_gateway.kube import names
from dra_gateway.kube.cluster.port import Cluster
from dra_gateway.policy.admission import ModelLookup
from dra_gateway.policy.amounts import RequestShape
from dra_gateway.policy.profiles import ModelReach, model_lookup
from dra_gateway.webhook import mutation, reviews, ruleadmission
from dra_gateway.webhook.allocatorwatch import GatedPodEvents
from dra_gateway.webhook.background import background
from dra_gateway.webhook.claimspecs import ClaimSpecCache, PodClaims, pod_claims
from dra_gateway.webhook.deviceclasses import DeviceClassWatch
from dra_gateway.webhook.deviceprofiles import DeviceProfileWatch
from dra_gateway.webhook.legacypods import RecentLegacyPods, legacy_charges
from dra_gateway.webhook.metrics import Metrics
from dra_gateway.webhook.policywatch import PolicyWatch
from dra_gateway.webhook.reviews import BadReview, Denial, Review
from dra_gateway.webhook.rulestore import RuleStore
from dra_gateway.webhook.settings import MAX_BODY_BYTES, WebhookSettings
from dra_gateway.webhook.state import STATE, WebhookState
from dra_gateway.webhook.templates import TemplateConflict, TemplateMaker, TemplateUnavailable
from dra_gateway.webhook.translation import NAMESPACE_UNKNOWN, NamespaceMode, held_back
from dra_gateway.webhook.validation import (
    DEFAULT_CHECKS,
    ClaimUnderReview,
    PodCheck,
    PodUnderReview,
    Validator,
    check_claim,
)

log = logging.getLogger(__name__)

INTERNAL_ERROR = Denial(500, "InternalError",
                         "the dra-gateway webhook failed to process this pod; it was not admitted "
                         "and can be retried (the webhook's logs carry the request UID)")
NOT_READY = Denial(503, "ServiceUnavailable",
                    "the dra-gateway webhook has no translation rules loaded yet; the pod was not "
                    "admitted and can be retried")
RETRY_LATER_CODE = 503
CONFLICT_CODE = 409
# Where the API server sends the pods of namespaces whose translation is not simply enabled
# (webhook/config.py chooses by namespaceSelector).
MUTATE_AUDIT_PATH = "/mutate/audit"
MUTATE_UNKNOWN_PATH = "/mutate/unknown-mode"
VALIDATE_AUDIT_PATH = "/validate/audit"




def create_app(settings: WebhookSettings, cluster: Cluster, *,
               tls: CertificateReloader | None = None,
               checks: Sequence[PodCheck] = DEFAULT_CHECKS) -> web.Application:
    """The webhook app. `tls` is the reloader of the serving context when the caller serves
    TLS (readiness then needs its certificate); `checks` are /validate's checks of a pod."""
    metrics = Metrics()
    claim_specs = ClaimSpecCache(cluster, cache_size=settings.template_cache_size,
                                 ttl=settings.template_cache_ttl)
    state = WebhookState(
        settings=settings,
        cluster=cluster,
        metrics=metrics,
        store=RuleStore(settings, cluster, metrics),
        claim_specs=claim_specs,
        templates=TemplateMaker(cluster, metrics, claim_specs,
                                timeout=settings.template_timeout),
        validator=Validator(checks),
        plans=mutation.PlanCache(settings.plan_cache_size),
        device_classes=DeviceClassWatch(cluster, metrics, retry_delay=settings.watch_retry_delay),
        policies=PolicyWatch(cluster, retry_delay=settings.watch_retry_delay),
        device_profiles=DeviceProfileWatch(cluster, retry_delay=settings.watch_retry_delay),
        reach=ModelReach(),
        legacy=RecentLegacyPods(settings.legacy_grace),
        tls=tls,
    )
    if settings.gated_event_after > 0:
        state.gated_events = GatedPodEvents(
            cluster, metrics, namespace=settings.namespace, threshold=settings.gated_event_after,
            retry_delay=settings.watch_retry_delay)
    state.device_classes.on_change = lambda _: state.extended_logged.clear()
    state.policies.on_namespace_deleted = state.claim_specs.forget_namespace
    # One byte over the limit is enough to know a body is too large; aiohttp's own 413 is
    # turned into the 400 the API server expects for bad input.
    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app[STATE] = state
    app.router.add_post("/mutate", _mutate)
    app.router.add_post(MUTATE_AUDIT_PATH, _mutate_audit)
    app.router.add_post(MUTATE_UNKNOWN_PATH, _mutate_unknown)
    app.router.add_post("/validate", _validate)
    app.router.add_post(VALIDATE_AUDIT_PATH, _validate_audit)
    app.router.add_post("/validate-rules", _validate_rules)
    app.router.add_get("/healthz", _healthz)
    app.router.add_get("/readyz", _readyz)
    app.router.add_get("/metrics", _metrics)
    app.cleanup_ctx.append(background)
    return app


def create_probe_app(app: web.Application) -> web.Application:
    """/healthz, /readyz and /metrics of `app`, to serve in plain HTTP on a port of their own:
    with client certificates required on the admission port, the kubelet's probes and
    Prometheus (which have none) could not reach them there."""
    probes = web.Application()
    probes[STATE] = app[STATE]
    probes.router.add_get("/healthz", _healthz)
    probes.router.add_get("/readyz", _readyz)
    probes.router.add_get("/metrics", _metrics)
    return probes


# ---- handlers ----------------------------------------------------------------------------------


def _bad_request(state: WebhookState, endpoint: str, reason: str) -> web.Response:
    state.metrics.bad_requests.labels(endpoint).inc()
    return web.Response(status=400, text=reason.replace("\n", " ") + "\n")


async def _read(request: web.Request) -> bytes:
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise BadReview(f"the body is larger than {MAX_BODY_BYTES} bytes, the most an "
                        f"AdmissionReview may be") from None


async def _mutate(request: web.Request) -> web.Response:
    return await _serve(request, "mutate")


async def _mutate_audit(request: web.Request) -> web.Response:
    return await _serve(request, "mutate", names.TRANSLATION_AUDIT)


async def _mutate_unknown(request: web.Request) -> web.Response:
    return await _serve(request, "mutate", NAMESPACE_UNKNOWN)


async def _validate(request: web.Request) -> web.Response:
    return await _serve(request, "validate")


async def _validate_audit(request: web.Request) -> web.Response:
    return await _serve(request, "validate", names.TRANSLATION_AUDIT)


async def _validate_rules(request: web.Request) -> web.Response:
    return await _serve(request, "validate-rules")


async def _serve(request: web.Request, endpoint: str,
                 mode: NamespaceMode = names.TRANSLATION_ENABLED) -> web.Response:
    """Answer one review; `mode`: the translation mode of the review's namespace, which the
    path says (the configurations' namespaceSelectors choose it, `webhook/config.py`)."""
    state = request.app[STATE]
    started = time.perf_counter()
    try:
        body_read = await _read(request)
        review = (reviews.parse_config_map(body_read) if endpoint == "validate-rules"
                  else reviews.parse_validation(body_read) if endpoint == "validate"
                  else reviews.parse(body_read))
    except BadReview as exc:
        return _bad_request(state, endpoint, str(exc))
    # Bounded below the API server's timeoutSeconds: past it the answer is lost anyway, and the
    # API reads (a claim's classes, a template's creation) would hold on for the client's own
    # 60 s. Only those reads wait, so only they carry the deadline: a review answered from the
    # caches schedules no timer. (time.monotonic, not the loop's clock: asyncio's
    # get_running_loop asks the kernel for the process id on every call.)
    deadline = time.monotonic() + state.settings.review_deadline
    try:
        if endpoint == "mutate":
            body = await _answer_mutate(state, review, mode, deadline)
        elif endpoint == "validate-rules":
            body = _answer_validate_rules(state, review)
        else:
            body = await _answer_validate(state, review, mode, deadline)
    except BadReview as exc:
        return _bad_request(state, endpoint, str(exc))
    except TimeoutError:
        log.warning("admission review ran past its deadline", extra={
            "uid": review.uid, "endpoint": endpoint, "namespace": review.namespace,
            "pod": review.name, "deadline": state.settings.review_deadline})
        body = _refuse(state, endpoint, review, Denial(
            RETRY_LATER_CODE, "Timeout",
            f"the dra-gateway webhook could not read what it needs from the API server within "
            f"{state.settings.review_deadline:g}s; the object was not admitted and can be "
            f"retried (controllers retry on their own)"))
    except Exception:
        state.metrics.internal_errors.labels(endpoint).inc()
        state.metrics.outcome(endpoint, "error")
        log.exception("admission review failed", extra={
            "uid": review.uid, "endpoint": endpoint, "namespace": review.namespace,
            "pod": review.name})
        body = reviews.response(review.uid, allowed=False, denial=INTERNAL_ERROR)
    state.metrics.latency_of[endpoint].observe(time.perf_counter() - started)
    return web.Response(body=body, content_type="application/json")


def _refuse(state: WebhookState, endpoint: str, review: Review, denial: Denial,
            warnings: Sequence[str] = ()) -> bytes:
    state.metrics.refusals.labels(endpoint, denial.reason).inc()
    state.metrics.outcome(endpoint, "refused")
    if review.resource in reviews.CLAIM_RESOURCES:
        log.info("claim refused", extra={"uid": review.uid, "endpoint": endpoint,
                                         "namespace": review.namespace,
                                         "resource": review.resource, "object": review.name,
                                         "reason": denial.reason, "refusal": denial.message})
    else:
        log.info("pod refused", extra={"uid": review.uid, "endpoint": endpoint,
                                       "namespace": review.namespace, "pod": review.name,
                                       "reason": denial.reason, "refusal": denial.message})
    return reviews.response(review.uid, allowed=False, denial=denial, warnings=warnings)


def _claim_requests(state: WebhookState, claims: PodClaims
                    ) -> tuple[tuple[RequestShape, ...] | None, ...]:
    """The gateway-class requests of each pod claim, from what reading `claims` stored."""
    if state.policies.catalog.empty:
        return ()
    return claims.requests(state.claim_specs)


def _models(state: WebhookState) -> ModelLookup:
    """Which models a request's selectors reach on the cards published now (from the mirrors,
    evaluated only when a namespace's sharing rules restrict models, and remembered)."""
    return model_lookup(state.reach, state.device_profiles.profiles,
                        state.device_classes.selectors)


def _opt_out_granted(state: WebhookState, namespace: str) -> bool:
    """Whether pods of `namespace` may hold themselves back from translation (--pod-opt-out)."""
    if state.settings.pod_opt_out == "everywhere":
        return True
    return state.policies.namespace_label(namespace, names.POD_OPT_OUT_LABEL) == \
        names.POD_OPT_OUT_ALLOWED


def _namespace(review: Review) -> str:
    meta = review.object.get("metadata")
    ns = meta.get("namespace") if isinstance(meta, dict) else None
    return review.namespace or (ns if isinstance(ns, str) else "")


async def _answer_mutate(state: WebhookState, review: Review, mode: NamespaceMode,
                         deadline: float) -> bytes:
    if review.operation != "CREATE" or review.sub_resource:
        state.metrics.outcome("mutate", "allowed")
        return reviews.response(review.uid)
    rules = state.store.rules
    if rules is None:
        return _refuse(state, "mutate", review, NOT_READY)
    namespace = _namespace(review)
    pod = review.object
    generation = (state.store.generation, state.device_classes.generation)
    label = state.policies.namespace_label(namespace, names.TRANSLATION_LABEL) \
        if mode == NAMESPACE_UNKNOWN else None
    opt_out = _opt_out_granted(state, namespace)
    # Read per review, so a policy changed a moment ago counts at once (the cache keys on it).
    mig_shares = state.policies.catalog.sharing_for(namespace).mig_shares
    key = state.plans.key(pod, namespace, (f"{mode}={label}" if label is not None else mode)
                          + (":opt-out" if opt_out else "") + (":mig" if mig_shares else ""))
    decision = state.plans.get(key, generation) if key is not None else None
    if decision is None:
        state.metrics.plan_miss.inc()
        reviews.check_pod_shape(review)
        # Natively written claims: their classes tell whether a gateway-class one is gated.
        claims = await pod_claims(state.claim_specs, namespace, pod, deadline=deadline)
        decision = mutation.decide(pod, namespace, rules, class_lookup=claims.class_lookup(),
                                   extended=state.device_classes.extended, mode=mode,
                                   namespace_label=label, opt_out=opt_out,
                                   mig_shares=mig_shares)
        if key is not None:
            state.plans.put(key, generation, decision)
    else:
        state.metrics.plan_hit.inc()
    if decision.denial is not None:
        return _refuse(state, "mutate", review, decision.denial, decision.warnings)
    if decision.templates:
        try:
            await state.templates.ensure(decision.templates, namespace, dry_run=review.dry_run,
                                         deadline=deadline)
        except TemplateConflict as exc:
            # Not retryable: the squatted name stays until someone deletes the template.
            return _refuse(state, "mutate", review, Denial(CONFLICT_CODE, "AlreadyExists",
                                                            str(exc)))
        except TemplateUnavailable as exc:
            return _refuse(state, "mutate", review,
                           Denial(RETRY_LATER_CODE, "ServiceUnavailable", str(exc)))
    for rule in decision.rules_applied:
        state.metrics.translated(rule)
    for rule in decision.would_apply:
        state.metrics.audit_translations.labels(rule).inc()
    if decision.mode != names.TRANSLATION_ENABLED:
        state.metrics.held_back.labels(decision.mode).inc()
    if decision.extended:
        _record_extended_uses(state, review, decision)
    for item in decision.untranslated:
        state.metrics.untranslated.labels(item.resource, item.rule).inc()
    state.metrics.outcome("mutate", "patched" if decision.patch else "allowed")
    return reviews.response(review.uid, patch=decision.patch, warnings=decision.warnings,
                            audit=decision.audit)


def _record_extended_uses(state: WebhookState, review: Review, decision: mutation.Mutation) -> None:
    """Count and log the legacy names a DeviceClass declares that this pod asks for."""
    for use in decision.extended:
        state.metrics.extended_resources.labels(use.resource, use.device_class,
                                                use.action).inc()
        seen = (use.resource, use.device_class, use.rule, use.action)
        level = logging.DEBUG if seen in state.extended_logged else logging.INFO
        state.extended_logged.add(seen)
        log.log(level, "legacy resource left to kube-scheduler: a DeviceClass declares it as "
                "spec.extendedResourceName" if use.action == "deferred" else
                "legacy resource translated although a DeviceClass declares it as "
                "spec.extendedResourceName (the rule says extendedResourceNames: translate)",
                extra={"uid": review.uid, "namespace": review.namespace, "pod": review.name,
                       "container": use.container, "resource": use.resource,
                       "deviceClass": use.device_class, "rule": use.rule,
                       "resources": list(use.resources)})


async def _answer_validate(state: WebhookState, review: Review, mode: NamespaceMode,
                           deadline: float) -> bytes:
    if review.operation != "CREATE" or review.sub_resource:
        state.metrics.outcome("validate", "allowed")
        return reviews.response(review.uid)
    if review.resource in reviews.CLAIM_RESOURCES:
        # Needs no rules: only the GPU policies, from the watch's cache.
        verdict = check_claim(ClaimUnderReview(
            resource=review.resource, obj=review.object, namespace=_namespace(review),
            policies=state.policies.catalog, models=_models(state)))
        if verdict.denial is not None:
            return _refuse(state, "validate", review, verdict.denial)
        state.metrics.outcome("validate", "allowed")
        return reviews.response(review.uid)
    rules = state.store.rules
    if rules is None:
        return _refuse(state, "validate", review, NOT_READY)
    reviews.check_pod_shape(review)
    namespace = _namespace(review)
    catalog = state.policies.catalog
    extended = state.device_classes.extended
    # A pod a legacy plugin will serve counts against the namespace's quotas (both worlds).
    legacy = legacy_charges(
        review.object, rules, extended,
        card_memory=state.device_profiles.profiles.smallest_card_memory(),
    ) if catalog.quotas_for(namespace) else ()
    claims = await pod_claims(state.claim_specs, namespace, review.object, deadline=deadline)
    under_review = PodUnderReview(
        pod=review.object, namespace=namespace, rules=rules, claim_classes=claims.classes,
        enforce=state.settings.enforce, extended=extended,
        translation=held_back(review.object, namespace, mode,
                              opt_out=_opt_out_granted(state, namespace)),
        claim_requests=_claim_requests(state, claims),
        policies=catalog, models=_models(state), legacy_charges=legacy,
        legacy_recent=state.legacy.of(namespace) if legacy else ())
    verdict = state.validator.check(under_review)
    if verdict.denial is not None:
        return _refuse(state, "validate", review, verdict.denial)
    if legacy and not review.dry_run:
        meta = review.object.get("metadata")
        uid = meta.get("uid") if isinstance(meta, dict) else None
        state.legacy.add(namespace, str(uid or review.uid), legacy)
    state.metrics.outcome("validate", "allowed")
    return reviews.response(review.uid)


def _answer_validate_rules(state: WebhookState, review: Review) -> bytes:
    if state.settings.watch_config_maps and not state.config_maps_synced:
        # Checked against the ConfigMaps in force, which are not known yet.
        return _refuse(state, "validate-rules", review, NOT_READY)
    verdict = ruleadmission.decide(review, state.store, namespace=state.settings.namespace)
    if verdict.denial is not None:
        return _refuse(state, "validate-rules", review, verdict.denial)
    state.metrics.outcome("validate-rules", "allowed")
    return reviews.response(review.uid)


async def _healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


def _certificate_in_place(state: WebhookState) -> bool:
    if state.tls is not None:
        return state.tls.loaded
    tls_dir = state.settings.tls_dir
    return tls_dir is None or ((tls_dir / CERT_FILE).is_file() and (tls_dir / KEY_FILE).is_file())


async def _readyz(request: web.Request) -> web.Response:
    state = request.app[STATE]
    missing = []
    if state.store.rules is None:
        missing.append("no translation rules loaded")
    if state.settings.watch_config_maps and not state.config_maps_synced:
        missing.append("rule ConfigMaps not read yet")
    # Serving rules other than the ConfigMaps say would make replicas disagree.
    missing.extend(state.store.problems)
    if state.settings.watch_device_classes and not state.device_classes.synced:
        missing.append(state.device_classes.problem or "DeviceClasses not read yet")
    if state.settings.watch_policies and not state.policies.synced:
        missing.append(state.policies.problem or "GPU policies not read yet")
    if state.settings.watch_policies and not state.device_profiles.synced:
        missing.append(state.device_profiles.problem or "ResourceSlices not read yet")
    if not _certificate_in_place(state):
        missing.append("no serving certificate in place")
    if missing:
        return web.Response(status=503, text="not ready: " + "; ".join(missing) + "\n")
    return web.Response(text="ok\n")


async def _metrics(request: web.Request) -> web.Response:
    body = request.app[STATE].metrics.exposition()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4"})

"""What /validate refuses at once: requests that can never be admitted, and Refuse-mode quotas.

`check_admission` looks at the gateway-class requests of a pod's claims (or of one native
ResourceClaim or template) and returns every violation, so the user fixes them in one go:

- a sharing rule the request breaks by itself: a share in an exclusive namespace or in one
  whose shares are MIG instances, a share below the minimum, a share without compute where
  compute is required, an enforcement mode not allowed, selectors that match only cards of
  models not allowed (whole cards and MIG instances too; the caller says which models they
  reach, `models`);
- a quota the request exceeds by itself (it could never be placed), and, for a quota with
  `spec.admission: Refuse`, one it exceeds given the usage the allocator last wrote in the
  quota's status (ResourceQuota's behaviour); with the default `Queue` the pod waits instead.

Only what the request surely costs counts here (`quotas.least_cost`, the allocator's reading
without the card it lands on): memory given as a percent of the card, a whole
card's memory and the card a selector-scoped quota would count are known only once allocated,
so the allocator (authoritative) enforces those. Isolation depends on who holds the card, and
the allowed models on the card the allocator picks among those the selectors match: both are
the allocator's beyond the refusal above. A ResourceClaimTemplate costs nothing until a pod
uses it (the pod is checked then), so its caller leaves out the usage check
(`over_usage=False`). `check_legacy` judges a pod a legacy device plugin serves against the
same quotas, which count it with the translated pods (policy.legacyusage). Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from dra_gateway.kube import names
from dra_gateway.policy.amounts import Amounts, DeviceCharge, RequestShape, format_amount
from dra_gateway.policy.quotas import Quota, exceeded_message, least_cost, over
from dra_gateway.policy.sharing import SharingRules

# The models of the cards a request's selectors reach when the rules allow none of them (it can
# never be admitted), else None (an allowed one, no card, or cannot tell): policy.profiles.
ModelLookup = Callable[[RequestShape, SharingRules], frozenset[str | None] | None]


@dataclass(frozen=True, slots=True)
class Violation:
    reason: str  # a short CamelCase word, counted in metrics
    message: str
    policy: str  # "GPUQuota team-a/team-a-gpu" or "GPUSharingPolicy isolated"


@dataclass(frozen=True, slots=True)
class QuotaState:
    """A quota and the usage the allocator last wrote in its status."""

    quota: Quota
    used: Amounts


def _models_text(models: Iterable[str | None]) -> str:
    return ", ".join(sorted(m if m is not None else "cards without a productName"
                            for m in models))


def _allowed_text(rules: SharingRules) -> str:
    if len(rules.models) == 1:
        return ", ".join(rules.models[0])
    return " and ".join(f"[{', '.join(patterns)}]" for patterns in rules.models)


def _model(what: str, field: str | None, claim_place: str | None, rules: SharingRules,
           shape: RequestShape, models: ModelLookup) -> Violation | None:
    """ModelForbidden when every card the request's selectors match is of a model the rules
    forbid; nothing when it matches none (the cards may come later), an allowed one, or when
    the profiles cannot tell (the allocator decides per card). Its field is named even in a
    pod's message: which claim of the pod, and which request of its spec, select the cards."""
    reach = models(shape, rules)
    if not reach:
        return None
    place = field or (f"{claim_place}.devices.requests[{shape.index}]" if claim_place
                      else None)
    where = f"{what}: request {shape.name!r}" + (f" ({place})" if place else "")
    policy = rules.named()
    verb = "does" if len(rules.policies) == 1 else "do"
    return Violation("ModelForbidden", (
        f"{where} can run only on {_models_text(reach)}, which {policy} {verb} not allow "
        f"(allowedModels: {_allowed_text(rules)}); ask for an allowed model"), policy)


def _sharing(what: str, rules: SharingRules, claims: Sequence[Sequence[RequestShape]],
             fields: Mapping[str, str], models: ModelLookup | None,
             places: Sequence[str] | None) -> list[Violation]:
    out: list[Violation] = []
    policy = rules.named()
    for number, shapes in enumerate(claims):
        for shape in shapes:
            field = fields.get(shape.name)
            if rules.models and models is not None:
                forbidden = _model(what, field, places[number] if places is not None
                                   and number < len(places) else None, rules, shape, models)
                if forbidden is not None:
                    out.append(forbidden)
            where = f"{what}: request {shape.name!r}" + (f" ({field})" if field else "")
            if shape.later_shares and (rules.exclusive or rules.mig_shares):
                out.append(_later_share(where, shape.later_shares, rules, policy))
            if shape.whole or shape.class_name != names.GPU_CLASS:
                continue
            if rules.exclusive:
                out.append(Violation("SharingForbidden", (
                    f"{where} asks for a share of a GPU, but {policy} makes the namespace "
                    f"exclusive (whole cards only); ask for whole GPUs"), policy))
                continue
            if rules.mig_shares:
                out.append(Violation("MIGRequired", (
                    f"{where} asks for a share of a GPU, but {policy} serves the namespace's "
                    f"shares with MIG instances (shares.servedBy: MIG); ask for a MIG instance "
                    f"(deviceClassName {names.MIG_CLASS}) or a whole GPU, or use the legacy "
                    f"names, which are translated to MIG instances"), policy))
                continue
            if rules.min_memory is not None and shape.memory is not None \
                    and shape.memory < rules.min_memory:
                out.append(Violation("ShareTooSmall", (
                    f"{where} asks for memory={format_amount('memory', shape.memory)} per GPU, "
                    f"below the minimum share memory="
                    f"{format_amount('memory', rules.min_memory)} of {policy}"), policy))
            if rules.min_cores is not None and shape.cores is not None \
                    and shape.cores < rules.min_cores:
                out.append(Violation("ShareTooSmall", (
                    f"{where} asks for cores={shape.cores} per GPU, below the minimum share "
                    f"cores={rules.min_cores} of {policy}"), policy))
            if rules.require_cores and shape.cores is None:
                out.append(Violation("ComputeRequired", (
                    f"{where} asks for a share of GPU memory without compute (cores), but "
                    f"{policy} requires compute with every share; add a cores request"),
                    policy))
            if rules.enforcement is not None and shape.enforcement not in rules.enforcement:
                allowed = ", ".join(sorted(rules.enforcement))
                out.append(Violation("EnforcementForbidden", (
                    f"{where} is enforced by {shape.enforcement!r}, but {policy} allows only "
                    f"{allowed} (allowedEnforcement)"), policy))
    return out


def _later_share(where: str, later: Sequence[str], rules: SharingRules,
                 policy: str) -> Violation:
    """A share of a card offered as a later firstAvailable alternative, where the rules
    forbid shares: the allocator may fall back to it, so it is judged as the first."""
    offered = ", ".join(repr(name) for name in later)
    plural = "s" if len(later) > 1 else ""
    if rules.exclusive:
        return Violation("SharingForbidden", (
            f"{where} offers a share of a GPU (firstAvailable alternative{plural} {offered}), "
            f"but {policy} makes the namespace exclusive (whole cards only); offer whole GPUs"),
            policy)
    return Violation("MIGRequired", (
        f"{where} offers a share of a GPU (firstAvailable alternative{plural} {offered}), but "
        f"{policy} serves the namespace's shares with MIG instances (shares.servedBy: MIG); "
        f"offer MIG instances (deviceClassName {names.MIG_CLASS}) or whole GPUs"), policy)


def check_admission(*, what: str, claims: Sequence[Sequence[RequestShape]],
                    quotas: Sequence[QuotaState], sharing: SharingRules,
                    fields: Mapping[str, str] | None = None,
                    over_usage: bool = True,
                    charged: Sequence[Sequence[RequestShape]] | None = None,
                    models: ModelLookup | None = None,
                    places: Sequence[str] | None = None,
                    ) -> list[Violation]:
    """Every violation of the namespace's sharing rules and quotas by these claims.

    `claims` holds the gateway-class requests of each claim; `what` names the object in
    messages ("pod team-a/train-0"); `fields`, when the object is one claim spec, maps each
    request's name to its field path ("spec.devices.requests[0]"), named in the messages.
    `over_usage=False` leaves out Refuse-mode quotas' check against current usage (for what
    holds nothing by itself: a ResourceClaimTemplate). `charged`, when given, holds the claims
    the object adds to the namespace's usage, a subset of `claims`: a pod's claims made from
    its templates, not the ResourceClaims it names, which exist already (counted in the usage
    once allocated, and checked when they were created), so the usage check counts only
    `charged` while the "never fits" check still counts every claim.

    `models`, when given, says which models a request's selectors reach on the cluster's cards
    when the rules allow none of them (policy.profiles; None otherwise, or when it cannot
    tell); it is asked only when the namespace's sharing rules restrict models. `places`, one
    per claim, names where each claim's spec is ("spec.resourceClaims[0] ResourceClaimTemplate
    x: spec.spec"), so that a message about a request names its field where `fields` does not.
    """
    paths = fields or {}
    out = _sharing(what, sharing, claims, paths, models, places) if not sharing.empty else []
    for state in quotas:
        quota = state.quota
        if quota.scoped_by_device:
            continue
        asked = least_cost(quota, claims, shares_take_cards=True)
        policy = f"GPUQuota {quota.namespace}/{quota.name}"
        counted = [paths[s.name] for shapes in claims for s in shapes
                   if s.class_name in quota.classes and s.name in paths]
        subject = f"{what} ({', '.join(counted)})" if counted else what
        never = over(quota, asked, Amounts())
        if never:
            out.append(Violation("QuotaNeverFits", (
                f"{subject}: {exceeded_message(quota, asked, state.used, never)}; the request "
                f"alone is more than the quota allows, so it could never run: ask for less "
                f"or raise spec.hard"), policy))
            continue
        if quota.refuse and over_usage:
            adds = asked if charged is None else least_cost(quota, charged,
                                                            shares_take_cards=True)
            exceeded = over(quota, adds, state.used)
            if exceeded:
                out.append(Violation("QuotaExceeded", (
                    f"{subject}: {exceeded_message(quota, adds, state.used, exceeded)}"),
                    policy))
    return out


def check_legacy(*, what: str, charges: Sequence[DeviceCharge], quotas: Sequence[QuotaState],
                 recent: Sequence[Sequence[DeviceCharge]] = ()) -> list[Violation]:
    """The quotas a pod left on legacy GPU names would take past their hard amounts.

    `charges` are what the pod costs (policy.legacyusage); `recent`, the charges of legacy pods
    of the namespace admitted a moment ago that the quotas' status may not count yet. A legacy
    device plugin serves the pod: it cannot wait for quota as a translated pod does, so every
    quota refuses it, whatever its `spec.admission`.
    """
    out: list[Violation] = []
    for state in quotas:
        quota = state.quota
        asked = quota.amounts(charges)
        if asked.claims == 0:
            continue  # the quota counts none of it (another class, a device selector)
        used = state.used
        for pending in recent:
            used = used + quota.amounts(pending)
        exceeded = over(quota, asked, used)
        if not exceeded:
            continue
        fix = ("ask for less or raise spec.hard" if over(quota, asked, Amounts()) else
               "wait for GPU pods of the namespace to end, or raise spec.hard")
        out.append(Violation("QuotaExceeded", (
            f"{what} keeps its legacy GPU requests, which a legacy device plugin serves and "
            f"GPUQuota {quota.namespace}/{quota.name} counts together with the namespace's "
            f"translated pods: {exceeded_message(quota, asked, used, exceeded)}; {fix}"),
            f"GPUQuota {quota.namespace}/{quota.name}"))
    return out
